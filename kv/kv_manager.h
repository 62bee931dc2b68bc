// kv_manager: the KV-cache manager actor — kv_core inside a strand_actor shell (logger "kv").
//
// The scheduler sends one kv_batch per step and gets a kv_batch_result back; stats and the
// debug audit are messages too. Every call takes any completion token (callback, use_future,
// use_awaitable) and completes on the caller's executor with error_code first. "No room" and
// preemption are ordinary results inside kv_batch_result, never errors. A caller bug in a batch
// (an op on an unknown sequence, a begin on a live one, a commit past what was reserved) answers
// boost::system::errc::invalid_argument and is logged at error; the ops before it in the batch
// have taken effect (each op is atomic), so the scheduler should treat it as fatal.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "actors/strand_actor.h"
#include "kv/kv_core.h"
#include "messages/kv_messages.h"

namespace anvil::kv {

class kv_manager : public actors::strand_actor {
 public:
  // Throws std::invalid_argument for a config kv_core cannot run (at start-up: an edge).
  kv_manager(actors::asio::any_io_executor ex, const kv_config& config, std::size_t mailbox_capacity = 4096);
  ~kv_manager() = default;

  // Applies one step's ops in order; completes with (error_code, kv_batch_result). The scheduler's
  // step loop sends one batch at a time: exempt from the mailbox bound (actors::admission), so
  // other senders filling the mailbox never refuse a step.
  template <class Token>
  auto async_apply(kv_batch batch, Token&& token) {
    return ask<kv_batch_result, actors::admission::exempt>(std::forward<Token>(token),
                                [this, b = std::move(batch)]() -> actors::outcome<kv_batch_result> { return run(b); });
  }

  // The ledger and counters; completes with (error_code, kv_stats).
  template <class Token>
  auto async_stats(Token&& token) {
    return ask<kv_stats>(std::forward<Token>(token), [this] { return core_.stats(); });
  }

  // kv_core::check(): completes with (error_code, std::string), the string empty when consistent.
  template <class Token>
  auto async_check(Token&& token) {
    return ask<std::string>(std::forward<Token>(token), [this] { return audit(); });
  }

 private:
  actors::outcome<kv_batch_result> run(const kv_batch& batch);  // on the strand
  std::string audit();                                          // on the strand

  kv_core core_;  // strand only
};

}  // namespace anvil::kv

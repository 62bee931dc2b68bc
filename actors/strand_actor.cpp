#include "actors/strand_actor.h"

#include <cassert>

#include <spdlog/logger.h>

#include "actors/log.h"

namespace anvil::actors {

strand_actor::strand_actor(asio::any_io_executor ex, actor_options opts)
    : strand_(asio::make_strand(std::move(ex))), opts_(std::move(opts)), log_(anvil::log::get(opts_.name)) {}

strand_actor::~strand_actor() {
  // Destroying an actor with accepted work would leave passes pointing at freed memory.
  assert(gate_.in_flight() == 0 && "stop an actor and wait for async_stop before destroying it");
}

in_flight strand_actor::admit(error_code& refused, admission a) noexcept {
  if (!gate_.try_enter()) {
    refused = make_error_code(errc::stopped);
    return {};
  }
  in_flight pass(this);
  if (queued_.fetch_add(1, std::memory_order_relaxed) >= opts_.mailbox_capacity && a == admission::bounded) {
    queued_.fetch_sub(1, std::memory_order_relaxed);
    refused = make_error_code(errc::busy);
    return {};  // `pass` leaves the gate on the way out
  }
  return pass;
}

void strand_actor::leave() noexcept {
  if (!gate_.leave()) return;
  asio::post(strand_, [this] {
    log_->debug("{}: stopped, all in-flight work drained", opts_.name);
    // Take the waiters out first: once the last one is answered its caller may destroy us.
    std::vector<reply<void>> waiters = std::move(stop_waiters_);
    stop_waiters_.clear();
    for (auto& w : waiters) w(error_code{});
  });
}

}  // namespace anvil::actors

// strand_actor: the shell every actor (scheduler, KV manager, sampler, GPU worker) is built on.
//
// An actor is private state plus a strand: every message runs on the strand, one at a time, in
// the order it was accepted, so the state needs no locks. Public methods are `async_*` templates
// in Asio's completion-token style, built with ask() / ask_later(): the same call works with a
// callback, `use_future` (blocking callers) or `use_awaitable` (coroutines), and the completion
// always runs on the caller's executor (the handler's associated executor), never on the strand
// and never inside the initiating call.
//
// Admission, in this order: a stopping actor answers errc::stopped; a full mailbox (messages
// accepted but not yet run) answers errc::busy instead of growing without limit. async_stop()
// closes the gate, waits until every accepted message has run and every pending reply has been
// sent, then completes. A reply<R> dropped without an answer completes with errc::dropped, so a
// caller can never wait forever. Stop an actor (and let its stop complete) before destroying it
// or its execution context.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/any_completion_executor.hpp>
#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/system/result.hpp>
#include <spdlog/fwd.h>

#include "actors/error.h"
#include "actors/gate.h"

namespace anvil::actors {

namespace asio = boost::asio;

// Completion signature of a reply carrying R: void(error_code, R), or void(error_code) for void.
template <class R>
struct reply_sig {
  using type = void(error_code, R);
};
template <>
struct reply_sig<void> {
  using type = void(error_code);
};
template <class R>
using reply_signature = typename reply_sig<R>::type;

// What a message body may return instead of a bare R, to fail with an expected error.
template <class R>
using outcome = boost::system::result<R, error_code>;

// How a message is admitted: `bounded` takes a mailbox slot (errc::busy when none is left);
// `exempt` is for messages whose sender bounds them itself — the scheduler's step loop has one
// KV batch or sample batch in flight at a time, and opens and closes one per request — so that
// other senders filling the mailbox can never refuse them. Both are refused by a stopping actor.
enum class admission { bounded, exempt };

struct actor_options {
  std::string name = "actor";           // logger name; also tags the actor's log lines
  std::size_t mailbox_capacity = 4096;  // accepted-but-not-yet-run messages; beyond it, errc::busy
};

class strand_actor;

// Holds the actor's gate open: one per accepted message, moved into its reply, released when the
// reply is sent. An empty pass holds nothing.
class in_flight {
 public:
  in_flight() = default;
  in_flight(in_flight&& o) noexcept : actor_(std::exchange(o.actor_, nullptr)) {}
  in_flight& operator=(in_flight&& o) noexcept {
    if (this != &o) {
      release();
      actor_ = std::exchange(o.actor_, nullptr);
    }
    return *this;
  }
  ~in_flight() { release(); }
  explicit operator bool() const noexcept { return actor_ != nullptr; }
  inline void release() noexcept;

 private:
  friend class strand_actor;
  explicit in_flight(strand_actor* a) noexcept : actor_(a) {}
  strand_actor* actor_ = nullptr;
};

// A pending answer to one caller. Move-only. Calling it posts the caller's handler to the
// caller's executor (whose context is kept running until then) and releases the in-flight pass.
template <class R>
class reply {
 public:
  using signature = reply_signature<R>;

  template <class Handler>
  reply(Handler&& h, const asio::any_io_executor& fallback, in_flight pass)
      : work_(asio::prefer(asio::get_associated_executor(h, fallback), asio::execution::outstanding_work.tracked)),
        relay_(fallback),
        handler_(std::forward<Handler>(h)),
        pass_(std::move(pass)) {}
  reply(reply&&) noexcept = default;
  reply& operator=(reply&& o) noexcept {
    if (this != &o) {
      if (handler_) fail(make_error_code(errc::dropped));
      work_ = std::move(o.work_);
      relay_ = std::move(o.relay_);
      handler_ = std::move(o.handler_);
      pass_ = std::move(o.pass_);
    }
    return *this;
  }
  ~reply() {
    if (handler_) fail(make_error_code(errc::dropped));
  }

  // True until answered.
  explicit operator bool() const noexcept { return static_cast<bool>(handler_); }

  // Answers with ec and, for non-void R, the value.
  template <class... V>
  void operator()(error_code ec, V&&... value) {
    static_assert(sizeof...(V) == (std::is_void_v<R> ? 0 : 1), "reply<R> takes (ec) for void, else (ec, R)");
    // Never inline and never on the actor's strand: post to the relay (the actor's own context,
    // outside the strand), then dispatch to the handler's executor. Two hops, because the
    // executor of a type-erased handler cannot be asked for blocking.never directly.
    asio::post(relay_, [work = std::move(work_), h = std::move(handler_), ec, ... v = std::forward<V>(value)]() mutable {
      asio::dispatch(work, [h = std::move(h), ec, ... v = std::move(v)]() mutable { std::move(h)(ec, std::move(v)...); });
    });
    work_ = {};
    pass_.release();
  }

  // Answers with an error (and a value-initialised R).
  void fail(error_code ec) {
    if constexpr (std::is_void_v<R>) {
      (*this)(ec);
    } else {
      static_assert(std::is_default_constructible_v<R>, "reply<R>::fail needs a default-constructible R");
      (*this)(ec, R{});
    }
  }

 private:
  // The handler's executor with outstanding work tracked, so its context keeps running until the
  // answer. any_completion_executor also holds the executor of a type-erased handler.
  asio::any_completion_executor work_;
  asio::any_io_executor relay_;
  asio::any_completion_handler<signature> handler_;
  in_flight pass_;
};

class strand_actor {
 public:
  using executor_type = asio::strand<asio::any_io_executor>;

  strand_actor(const strand_actor&) = delete;
  strand_actor& operator=(const strand_actor&) = delete;

  executor_type get_executor() const noexcept { return strand_; }
  const std::string& name() const noexcept { return opts_.name; }
  std::size_t mailbox_depth() const noexcept { return queued_.load(std::memory_order_relaxed); }
  std::size_t in_flight_count() const noexcept { return gate_.in_flight(); }
  bool stopping() const noexcept { return gate_.is_closed(); }

  // Refuses new messages from now on, waits until everything accepted has run and been answered,
  // then completes with (error_code). Safe to call more than once; every call completes.
  template <class Token>
  auto async_stop(Token&& token) {
    return asio::async_initiate<Token, void(error_code)>(
        [this](auto handler) {
          reply<void> done(std::move(handler), strand_.get_inner_executor(), in_flight{});
          asio::post(strand_, [this, done = std::move(done)]() mutable {
            if (gate_.close()) {
              done(error_code{});
            } else {
              stop_waiters_.push_back(std::move(done));
            }
          });
        },
        token);
  }

 protected:
  strand_actor(asio::any_io_executor ex, actor_options opts);
  ~strand_actor();

  // One request/response message: fn() runs on the strand and returns R, or outcome<R> to fail
  // with an expected error; the token completes with (error_code, R).
  template <class R, admission A = admission::bounded, class Token, class Fn>
  auto ask(Token&& token, Fn&& fn) {
    return ask_later<R, A>(std::forward<Token>(token), [f = std::forward<Fn>(fn)](reply<R> r) mutable {
      using ret = std::invoke_result_t<Fn&>;
      if constexpr (std::is_same_v<ret, outcome<R>>) {
        outcome<R> o = f();
        if (!o) {
          r.fail(o.error());
        } else if constexpr (std::is_void_v<R>) {
          r(error_code{});
        } else {
          r(error_code{}, std::move(*o));
        }
      } else if constexpr (std::is_void_v<R>) {
        f();
        r(error_code{});
      } else {
        r(error_code{}, f());
      }
    });
  }

  // A message answered now or later: fn(reply<R>) runs on the strand and may keep the reply
  // (e.g. until a step completes). The actor counts it in flight until it is answered.
  template <class R, admission A = admission::bounded, class Token, class Fn>
  auto ask_later(Token&& token, Fn&& fn) {
    return asio::async_initiate<Token, reply_signature<R>>(
        [this](auto handler, auto f) {
          error_code refused;
          in_flight pass = admit(refused, A);
          reply<R> r(std::move(handler), strand_.get_inner_executor(), std::move(pass));
          if (refused) {
            r.fail(refused);
            return;
          }
          asio::post(strand_, [this, f = std::move(f), r = std::move(r)]() mutable {
            queued_.fetch_sub(1, std::memory_order_relaxed);
            f(std::move(r));
          });
        },
        token, std::forward<Fn>(fn));
  }

  // A one-way message: fn() runs on the strand. Returns errc::stopped or errc::busy if refused.
  template <class Fn>
  error_code tell(Fn&& fn) {
    error_code refused;
    in_flight pass = admit(refused);
    if (refused) return refused;
    asio::post(strand_, [this, f = std::forward<Fn>(fn), pass = std::move(pass)]() mutable {
      queued_.fetch_sub(1, std::memory_order_relaxed);
      f();
    });
    return {};
  }

  // A one-way message that only ends work the actor holds (a cancel). Unlike tell(), it is taken
  // past a full mailbox and while a stop is still draining, so the work it would end never runs on
  // for want of a slot; it is refused (errc::stopped) only once the actor has stopped. It takes no
  // mailbox slot: the caller bounds how many it sends (the engine sends one per request at most).
  template <class Fn>
  error_code tell_urgent(Fn&& fn) {
    if (!gate_.try_enter_undrained()) return make_error_code(errc::stopped);
    asio::post(strand_, [f = std::forward<Fn>(fn), pass = in_flight(this)]() mutable { f(); });
    return {};
  }

  // Holds the gate open without a message: for work the actor drives itself (a step loop), so
  // that async_stop waits for it. While a stop is draining, work that an accepted message starts
  // is held too (the stop waits for it); empty only once the actor has stopped.
  in_flight hold() noexcept { return gate_.try_enter_undrained() ? in_flight(this) : in_flight{}; }

  spdlog::logger& log() const noexcept { return *log_; }

 private:
  friend class in_flight;

  // Enters the gate and takes a mailbox slot (counted, but not bounded, for an exempt message); on
  // refusal sets `refused` and returns an empty pass.
  in_flight admit(error_code& refused, admission a = admission::bounded) noexcept;
  // Called by in_flight::release(); wakes the stop waiters when the last pass of a closed gate goes.
  void leave() noexcept;

  executor_type strand_;
  actor_options opts_;
  std::shared_ptr<spdlog::logger> log_;
  gate gate_;
  std::atomic<std::size_t> queued_{0};
  std::vector<reply<void>> stop_waiters_;  // strand only
};

inline void in_flight::release() noexcept {
  if (strand_actor* a = std::exchange(actor_, nullptr)) a->leave();
}

}  // namespace anvil::actors

// A small actor for the toolkit's tests: records values, counts concurrent entries (there must
// never be more than one), and can hold replies to answer them later.
#pragma once

#include <atomic>
#include <cstddef>
#include <utility>
#include <vector>

#include "actors/strand_actor.h"

namespace anvil::actors::testing {

class recorder_actor : public strand_actor {
 public:
  recorder_actor(asio::any_io_executor ex, std::size_t mailbox_capacity = 4096)
      : strand_actor(std::move(ex), {"recorder", mailbox_capacity}) {}
  ~recorder_actor() = default;

  // Appends v; completes with the number of values seen so far.
  template <class Token>
  auto async_record(int v, Token&& token) {
    return ask<std::size_t>(std::forward<Token>(token), [this, v] {
      enter();
      seen_.push_back(v);
      leave();
      return seen_.size();
    });
  }

  // One-way variant of async_record.
  error_code record(int v) {
    return tell([this, v] {
      enter();
      seen_.push_back(v);
      leave();
    });
  }

  // async_record, exempt from the mailbox bound (admission::exempt).
  template <class Token>
  auto async_record_exempt(int v, Token&& token) {
    return ask<std::size_t, admission::exempt>(std::forward<Token>(token), [this, v] {
      seen_.push_back(v);
      return seen_.size();
    });
  }
  // record, as an urgent message (tell_urgent).
  error_code record_urgent(int v) {
    return tell_urgent([this, v] { seen_.push_back(v); });
  }
  template <class Token>
  auto async_seen(Token&& token) {
    return ask<std::vector<int>>(std::forward<Token>(token), [this] { return seen_; });
  }

  // Fails with the given error when v < 0 (an expected failure returned as a value).
  template <class Token>
  auto async_checked(int v, Token&& token) {
    return ask<int>(std::forward<Token>(token), [v]() -> outcome<int> {
      if (v < 0) return make_error_code(errc::busy);
      return v * 2;
    });
  }

  // Keeps the reply; it is answered by async_release_all or dropped by async_drop_all.
  template <class Token>
  auto async_hold(Token&& token) {
    return ask_later<int>(std::forward<Token>(token), [this](reply<int> r) { held_.push_back(std::move(r)); });
  }

  template <class Token>
  auto async_release_all(int v, Token&& token) {
    return ask<std::size_t>(std::forward<Token>(token), [this, v] {
      const std::size_t n = held_.size();
      for (auto& r : held_) r(error_code{}, v);
      held_.clear();
      return n;
    });
  }

  template <class Token>
  auto async_drop_all(Token&& token) {
    return ask<void>(std::forward<Token>(token), [this] { held_.clear(); });
  }

  // Answers the held replies from an event that reaches the strand without being a new request,
  // as a completion from another actor bound to this strand does. Such events still run while
  // the actor stops: they are how in-flight work finishes.
  void event_answer_held(int v) {
    asio::post(get_executor(), [this, v] {
      for (auto& r : held_) r(error_code{}, v);
      held_.clear();
    });
  }

  int max_concurrent() const { return max_concurrent_.load(); }

 private:
  void enter() {
    const int now = ++inside_;
    int seen = max_concurrent_.load();
    while (now > seen && !max_concurrent_.compare_exchange_weak(seen, now)) {
    }
  }
  void leave() { --inside_; }

  std::vector<int> seen_;
  std::vector<reply<int>> held_;
  std::atomic<int> inside_{0};
  std::atomic<int> max_concurrent_{0};
};

}  // namespace anvil::actors::testing

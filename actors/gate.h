// gate: counts work in flight and closes for good on stop (Seastar's gate). Lock-free: callers
// on any thread enter and leave; whoever closes learns whether work is still in flight, and the
// last leave after a close learns that it drained the gate. One atomic word holds both the
// closed bit and the count, so no enter can slip in after a close has seen the count at zero.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace anvil::actors {

class gate {
 public:
  // Enters unless closed. Every successful enter must be matched by one leave().
  bool try_enter() noexcept {
    std::uint64_t s = state_.load(std::memory_order_relaxed);
    do {
      if (s & closed_bit) return false;
    } while (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire, std::memory_order_relaxed));
    return true;
  }

  // Enters unless closed and drained: while a close still waits for work in flight, more work
  // that this work starts may join it (and the close waits for that too). Matched by leave().
  bool try_enter_undrained() noexcept {
    std::uint64_t s = state_.load(std::memory_order_relaxed);
    do {
      if (s == closed_bit) return false;
    } while (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire, std::memory_order_relaxed));
    return true;
  }

  // Returns true when this leave drained a closed gate (the count reached zero after close()).
  bool leave() noexcept {
    const std::uint64_t before = state_.fetch_sub(1, std::memory_order_acq_rel);
    return before == (closed_bit | 1);
  }

  // Closes the gate (idempotent). Returns true when nothing is in flight at that moment.
  bool close() noexcept {
    const std::uint64_t before = state_.fetch_or(closed_bit, std::memory_order_acq_rel);
    return (before & ~closed_bit) == 0;
  }

  bool is_closed() const noexcept { return state_.load(std::memory_order_acquire) & closed_bit; }
  std::size_t in_flight() const noexcept {
    return static_cast<std::size_t>(state_.load(std::memory_order_acquire) & ~closed_bit);
  }

 private:
  static constexpr std::uint64_t closed_bit = std::uint64_t{1} << 63;
  std::atomic<std::uint64_t> state_{0};
};

}  // namespace anvil::actors

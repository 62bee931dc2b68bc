// counting_resource: a memory_resource that counts the allocations passing through it to its
// upstream. The CPU worker's device memory (DESIGN.md, the one rule) is its arena — the KV pool,
// the forward pass's scratch and the logits — and every byte of it is allocated from one of
// these, so the worker's allocation count is measured, not declared; a test hands the worker an
// upstream of its own and counts from outside, as the CUDA test interposes cudaMalloc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory_resource>

namespace anvil::gpu_worker {

class counting_resource final : public std::pmr::memory_resource {
 public:
  // `upstream` must outlive this resource and everything allocated from it.
  explicit counting_resource(std::pmr::memory_resource* upstream = std::pmr::new_delete_resource())
      : upstream_(upstream) {}

  std::uint64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }
  std::size_t bytes_in_use() const { return bytes_in_use_.load(std::memory_order_relaxed); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment) override {
    void* p = upstream_->allocate(bytes, alignment);
    allocations_.fetch_add(1, std::memory_order_relaxed);
    bytes_in_use_.fetch_add(bytes, std::memory_order_relaxed);
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment) override {
    upstream_->deallocate(p, bytes, alignment);
    bytes_in_use_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override { return this == &other; }

  std::pmr::memory_resource* upstream_;
  std::atomic<std::uint64_t> allocations_{0};
  std::atomic<std::size_t> bytes_in_use_{0};
};

}  // namespace anvil::gpu_worker

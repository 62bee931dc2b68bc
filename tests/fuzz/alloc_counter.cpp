// Every allocation carries a header with its size, so delete knows what it frees whether or not
// the caller used sized delete. Aligned requests put the header in a whole alignment unit.
#include "tests/fuzz/alloc_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace anvil::fuzz::alloc_counter {
namespace {

std::atomic<std::size_t> live{0}, base{0}, peak{0}, biggest{0};

void raise(std::atomic<std::size_t>& a, std::size_t v) {
  for (std::size_t cur = a.load(std::memory_order_relaxed); v > cur && !a.compare_exchange_weak(cur, v);) {
  }
}

constexpr std::size_t header = alignof(std::max_align_t);

void* allocate(std::size_t n, std::size_t align) {
  raise(biggest, n);
  if (n > (std::size_t(1) << 48)) return nullptr;  // no machine has it; and pad + n must not wrap
  const std::size_t pad = align > header ? align : header;
  void* raw = align > header ? std::aligned_alloc(align, (pad + n + align - 1) / align * align) : std::malloc(pad + n);
  if (!raw) return nullptr;
  auto* p = static_cast<unsigned char*>(raw) + pad;
  reinterpret_cast<std::size_t*>(p)[-1] = n;
  reinterpret_cast<std::size_t*>(p)[-2] = pad;
  raise(peak, live.fetch_add(n) + n);
  return p;
}

void release(void* ptr) noexcept {
  if (!ptr) return;
  auto* p = static_cast<unsigned char*>(ptr);
  live.fetch_sub(reinterpret_cast<std::size_t*>(p)[-1]);
  std::free(p - reinterpret_cast<std::size_t*>(p)[-2]);
}

void* allocate_or_throw(std::size_t n, std::size_t align) {
  if (void* p = allocate(n, align)) return p;
  throw std::bad_alloc();
}

}  // namespace

void reset() {
  biggest = 0;
  base = live.load();
  peak = base.load();
}
std::size_t largest() { return biggest; }
std::size_t peak_growth() { return peak - base; }

}  // namespace anvil::fuzz::alloc_counter

namespace ac = anvil::fuzz::alloc_counter;

void* operator new(std::size_t n) { return ac::allocate_or_throw(n, 0); }
void* operator new[](std::size_t n) { return ac::allocate_or_throw(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return ac::allocate_or_throw(n, std::size_t(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return ac::allocate_or_throw(n, std::size_t(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return ac::allocate(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return ac::allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return ac::allocate(n, std::size_t(a)); }
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return ac::allocate(n, std::size_t(a)); }
void operator delete(void* p) noexcept { ac::release(p); }
void operator delete[](void* p) noexcept { ac::release(p); }
void operator delete(void* p, std::size_t) noexcept { ac::release(p); }
void operator delete[](void* p, std::size_t) noexcept { ac::release(p); }
void operator delete(void* p, std::align_val_t) noexcept { ac::release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { ac::release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { ac::release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { ac::release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { ac::release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { ac::release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { ac::release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { ac::release(p); }

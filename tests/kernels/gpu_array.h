// A typed device array with sentinel guards on both sides (the float-only guarded_buffer of
// op_check.h, generalised to the f16 KV cache, index arrays and raw records).
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gpu_runtime.h"

namespace anvil::kernels::testing {

template <class T>
class guarded_array {
 public:
  static constexpr std::size_t guard_bytes = 256;
  static constexpr unsigned char sentinel = 0xa5;

  explicit guarded_array(std::size_t n) : n_(n) {
    const std::size_t bytes = n_ * sizeof(T) + 2 * guard_bytes;
    const hipError_t e = hipMalloc(&base_, bytes);
    if (e != hipSuccess) throw std::runtime_error(std::string("hipMalloc: ") + hipGetErrorString(e));
    const std::vector<unsigned char> init(bytes, sentinel);
    if (hipMemcpy(base_, init.data(), bytes, hipMemcpyHostToDevice) != hipSuccess) throw std::runtime_error("hipMemcpy");
  }
  explicit guarded_array(const std::vector<T>& host) : guarded_array(host.size()) { upload(host); }
  ~guarded_array() { (void)hipFree(base_); }
  guarded_array(const guarded_array&) = delete;
  guarded_array& operator=(const guarded_array&) = delete;

  T* data() const { return reinterpret_cast<T*>(base_ + guard_bytes); }
  std::size_t size() const { return n_; }

  void upload(const std::vector<T>& host) {
    if (host.size() != n_) throw std::runtime_error("guarded_array::upload: size mismatch");
    if (n_ && hipMemcpy(data(), host.data(), n_ * sizeof(T), hipMemcpyHostToDevice) != hipSuccess) {
      throw std::runtime_error("guarded_array::upload: hipMemcpy");
    }
  }
  // Every byte of the body set to the sentinel (a NaN for floats), so unwritten elements show.
  void poison() {
    const std::vector<unsigned char> bytes(n_ * sizeof(T), sentinel);
    if (n_ && hipMemcpy(data(), bytes.data(), bytes.size(), hipMemcpyHostToDevice) != hipSuccess) {
      throw std::runtime_error("guarded_array::poison: hipMemcpy");
    }
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ && hipMemcpy(host.data(), data(), n_ * sizeof(T), hipMemcpyDeviceToHost) != hipSuccess) {
      throw std::runtime_error("guarded_array::download: hipMemcpy");
    }
    return host;
  }
  bool guards_intact() const {
    std::vector<unsigned char> all(n_ * sizeof(T) + 2 * guard_bytes);
    if (hipMemcpy(all.data(), base_, all.size(), hipMemcpyDeviceToHost) != hipSuccess) return false;
    for (std::size_t i = 0; i < guard_bytes; ++i) {
      if (all[i] != sentinel || all[guard_bytes + n_ * sizeof(T) + i] != sentinel) return false;
    }
    return true;
  }

 private:
  unsigned char* base_ = nullptr;
  std::size_t n_;
};

}  // namespace anvil::kernels::testing

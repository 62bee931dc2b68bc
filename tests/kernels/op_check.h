// Helpers for GPU-vs-CPU-reference op tests (in the manner of llama.cpp's test-backend-ops):
// device buffers with sentinel guards on both sides to catch out-of-bounds writes, a poisoned
// body to catch elements never written, and the normalised mean squared error.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gpu_runtime.h"

namespace anvil::kernels::testing {

#define ANVIL_GPU_CHECK(expr)                                                                   \
  do {                                                                                          \
    const hipError_t anvil_err_ = (expr);                                                       \
    ASSERT_EQ(anvil_err_, hipSuccess) << #expr << ": " << hipGetErrorString(anvil_err_);        \
  } while (0)

// A float buffer on the device with `guard` sentinel elements before and after it.
class guarded_buffer {
 public:
  static constexpr std::size_t guard = 64;
  static constexpr std::uint32_t sentinel_bits = 0x7fc0beefu;  // a NaN payload nothing computes

  explicit guarded_buffer(std::size_t n) : n_(n) {
    const hipError_t e = hipMalloc(&base_, (n_ + 2 * guard) * sizeof(float));
    if (e != hipSuccess) throw std::runtime_error(std::string("hipMalloc: ") + hipGetErrorString(e));
    std::vector<float> init(n_ + 2 * guard, sentinel());
    upload_raw(init);
  }
  ~guarded_buffer() { (void)hipFree(base_); }
  guarded_buffer(const guarded_buffer&) = delete;
  guarded_buffer& operator=(const guarded_buffer&) = delete;

  float* data() const { return base_ + guard; }
  std::size_t size() const { return n_; }

  void upload(const std::vector<float>& host) {
    ASSERT_EQ(host.size(), n_);
    ANVIL_GPU_CHECK(hipMemcpy(data(), host.data(), n_ * sizeof(float), hipMemcpyHostToDevice));
  }
  // Fills the body with the sentinel too, so an element the kernel never writes stays NaN.
  void poison() { upload(std::vector<float>(n_, sentinel())); }

  std::vector<float> download() const {
    std::vector<float> host(n_);
    EXPECT_EQ(hipMemcpy(host.data(), data(), n_ * sizeof(float), hipMemcpyDeviceToHost), hipSuccess);
    return host;
  }

  // True when both guard regions still hold the sentinel.
  bool guards_intact() const {
    std::vector<float> all(n_ + 2 * guard);
    if (hipMemcpy(all.data(), base_, all.size() * sizeof(float), hipMemcpyDeviceToHost) != hipSuccess) return false;
    for (std::size_t i = 0; i < guard; ++i) {
      if (bits(all[i]) != sentinel_bits || bits(all[guard + n_ + i]) != sentinel_bits) return false;
    }
    return true;
  }

 private:
  static float sentinel() {
    float f;
    std::memcpy(&f, &sentinel_bits, sizeof f);
    return f;
  }
  static std::uint32_t bits(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  }
  void upload_raw(const std::vector<float>& host) {
    ANVIL_GPU_CHECK(hipMemcpy(base_, host.data(), host.size() * sizeof(float), hipMemcpyHostToDevice));
  }

  float* base_ = nullptr;
  std::size_t n_;
};

// sum((out - ref)^2) / sum(ref^2); NaN anywhere gives NaN (which fails any `<` check).
inline double nmse(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = double(out[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0 ? num / den : num;
}

inline std::vector<float> random_vector(std::size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Fails the test with a clear message when the machine has no usable GPU.
inline void require_device() {
  int n = 0;
  const hipError_t e = hipGetDeviceCount(&n);
  ASSERT_TRUE(e == hipSuccess && n > 0) << "no usable GPU (" << hipGetErrorString(e)
                                        << "): tests labelled `gpu` run on a GPU machine only";
}

// The 8-bit activation form the quantized GEMV reads (kernels/gpu_quant_dot.h quantize_x8), on
// the host, bit for bit: rows of `cols` floats -> q [rows * cols] and ds [rows * cols / 16] pairs
// {d, d * sum of the 16 q}, per 32-element block d = max|x| / 127, q = rint(x / d).
struct x8_host {
  std::vector<std::int8_t> q;
  std::vector<float> ds;
};
inline x8_host quantize_x8_host(const std::vector<float>& x) {
  x8_host r;
  r.q.resize(x.size());
  r.ds.resize(x.size() / 16 * 2);
  for (std::size_t b = 0; b + 32 <= x.size(); b += 32) {
    float amax = 0.f;
    for (std::size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    for (std::size_t h = b; h < b + 32; h += 16) {
      int sum = 0;
      for (std::size_t i = h; i < h + 16; ++i) {
        const int q = int(std::rint(x[i] * id));
        r.q[i] = static_cast<std::int8_t>(q);
        sum += q;
      }
      r.ds[h / 16 * 2] = d;
      r.ds[h / 16 * 2 + 1] = d * float(sum);
    }
  }
  return r;
}

}  // namespace anvil::kernels::testing

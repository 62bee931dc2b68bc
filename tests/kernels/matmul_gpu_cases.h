// Shared by the GEMV, GEMM and embedding GPU tests: random GGUF weights quantized with the
// reference quantizers (model/quant/quant.h), a device byte buffer for them, and the per-output
// comparison "error relative to the row's |W|.|x| scale" the matmul tolerances are stated in.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gpu_runtime.h"
#include "model/quant/quant.h"
#include "tests/kernels/op_check.h"

namespace anvil::kernels::testing {

using model::ggml_type;

inline const std::vector<ggml_type>& gpu_weight_types() {
  static const std::vector<ggml_type> types = {
      ggml_type::F32,  ggml_type::F16,  ggml_type::BF16, ggml_type::Q8_0,   ggml_type::Q4_0,   ggml_type::Q4_K,
      ggml_type::Q5_K, ggml_type::Q6_K, ggml_type::Q4_1, ggml_type::Q5_0,   ggml_type::Q5_1,   ggml_type::Q2_K,
      ggml_type::Q3_K, ggml_type::IQ4_NL, ggml_type::IQ4_XS, ggml_type::MXFP4};
  return types;
}

inline std::string type_name(ggml_type t) { return std::string(model::info(t).name); }

// A weight [rows][cols] as GGUF stores it, and its dequantized values (the reference's view).
struct host_weight {
  ggml_type type;
  std::int64_t rows = 0, cols = 0;
  std::size_t row_bytes = 0;
  std::vector<std::uint8_t> bytes;
  std::vector<float> values;  // dequantize_row of every row

  host_weight(ggml_type t, std::int64_t r, std::int64_t c, std::mt19937& rng) : type(t), rows(r), cols(c) {
    row_bytes = *model::row_bytes(t, c);
    bytes.resize(row_bytes * std::size_t(r));
    values.resize(std::size_t(r * c));
    // Rows of different magnitudes, with an offset, so that scales and mins both matter.
    std::uniform_real_distribution<float> mag(0.05f, 2.f), off(-0.3f, 0.3f), u(-1.f, 1.f);
    std::vector<float> src(static_cast<std::size_t>(c));
    for (std::int64_t i = 0; i < r; ++i) {
      const float m = mag(rng), o = off(rng);
      for (auto& v : src) v = m * (u(rng) + o);
      model::quantize_row(t, src.data(), bytes.data() + std::size_t(i) * row_bytes, c);
      model::dequantize_row(t, bytes.data() + std::size_t(i) * row_bytes, values.data() + i * c, c);
    }
  }
};

// Device bytes (no guards: inputs only), 256-byte aligned by the allocator.
class device_bytes {
 public:
  // Rounded up to 16 bytes, as the worker's weights are: the MXFP4 dot reads the aligned word
  // holding a block's last byte (gpu_quant_dot.h).
  explicit device_bytes(std::size_t n) : n_(n) {
    const hipError_t e = hipMalloc(&p_, (n_ + 15) / 16 * 16 + 16);
    if (e != hipSuccess) throw std::runtime_error(std::string("hipMalloc: ") + hipGetErrorString(e));
  }
  ~device_bytes() { (void)hipFree(p_); }
  device_bytes(const device_bytes&) = delete;
  device_bytes& operator=(const device_bytes&) = delete;
  void upload(const void* src, std::size_t n) {
    ASSERT_LE(n, n_);
    ANVIL_GPU_CHECK(hipMemcpy(p_, src, n, hipMemcpyHostToDevice));
  }
  void* data() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  std::size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  std::size_t n_;
};

// Largest |out - ref| / scale over the outputs y[t, o], where scale = sum_i |W[o,i]| |x[t,i]|
// (+ |bias|): the error of a dot product relative to the size of its terms. NaN if any output
// is NaN (a poisoned element never written).
inline double max_scaled_error(const std::vector<float>& out, const std::vector<float>& ref, const host_weight& w,
                               const std::vector<float>& x, const float* bias, std::int64_t n_tokens) {
  double worst = 0;
  for (std::int64_t t = 0; t < n_tokens; ++t) {
    for (std::int64_t o = 0; o < w.rows; ++o) {
      double scale = bias ? std::fabs(double(bias[o])) : 0.0;
      const float* wr = w.values.data() + o * w.cols;
      const float* xr = x.data() + t * w.cols;
      for (std::int64_t i = 0; i < w.cols; ++i) scale += std::fabs(double(wr[i]) * double(xr[i]));
      const std::size_t k = std::size_t(t * w.rows + o);
      const double err = std::fabs(double(out[k]) - double(ref[k]));
      if (std::isnan(err)) return err;
      worst = std::max(worst, err / (scale > 0 ? scale : 1.0));
    }
  }
  return worst;
}

}  // namespace anvil::kernels::testing

// The FP8 GEMM path (kernels/gemm_fp8.h) against its host reference: the quantization of x and of
// a weight's copy bit for bit (codes and scale, fp8_quantize_tensor_ref), and the GEMM against the
// exact f32 product of the decoded codes (what cuBLASLt multiplies), with biases, ragged token
// counts, a group sharing one quantization, and a token whose NaN / infinity stays its own.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gemm.h"
#include "kernels/gemm_fp8.h"
#include "kernels/matmul.h"
#include "tests/kernels/matmul_gpu_cases.h"

namespace anvil::kernels::testing {
namespace {

void require_fp8() {
  require_device();
  if (::testing::Test::HasFatalFailure()) return;
  int dev = 0;
  ASSERT_EQ(hipGetDevice(&dev), hipSuccess);
  if (!gemm_fp8_supported(dev)) GTEST_SKIP() << "no FP8 tensor cores or cuBLASLt on this device";
}

// Equal codes, where every NaN is one NaN and -0 is 0 (the conversion instruction keeps the sign
// of a negative zero, e.g. a Q6_K code of 32 times a negative scale; the host encoder drops it).
bool same_code(std::uint8_t a, std::uint8_t b) {
  const bool nan_a = (a & 0x7F) == 0x7F, nan_b = (b & 0x7F) == 0x7F;
  if (nan_a || nan_b) return nan_a && nan_b;
  return (a & 0x7F) == 0 && (b & 0x7F) == 0 ? true : a == b;
}

struct quantized {
  std::vector<std::uint8_t> codes;
  float scale = 0.f;
};

quantized download(const device_bytes& codes, std::size_t n, const float* scale_dev) {
  quantized q;
  q.codes.resize(n);
  EXPECT_EQ(hipMemcpy(q.codes.data(), codes.data(), n, hipMemcpyDeviceToHost), hipSuccess);
  EXPECT_EQ(hipMemcpy(&q.scale, scale_dev, sizeof(float), hipMemcpyDeviceToHost), hipSuccess);
  return q;
}

void expect_codes_equal(const quantized& got, const std::vector<std::uint8_t>& want_codes, float want_scale) {
  EXPECT_EQ(got.scale, want_scale);
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < want_codes.size(); ++i) {
    if (!same_code(got.codes[i], want_codes[i]) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << "first at " << first << ": got " << int(got.codes[first]) << ", want " << int(want_codes[first]);
}

// x's quantization: values over many binades (subnormal codes included), a row of zeros, an
// outlier row that sets the scale, and a row with NaN and infinities that must not.
TEST(GemmFp8Gpu, QuantizationMatchesTheReferenceBitForBit) {
  require_fp8();
  if (HasFatalFailure() || IsSkipped()) return;
  std::mt19937 rng(8);
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{1, 16}, {37, 4096}, {300, 1028}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    std::vector<float> x = random_vector(std::size_t(rows * cols), rng, -1.f, 1.f);
    std::uniform_real_distribution<float> e(-14.f, 3.f);
    for (float& v : x) v *= std::exp2(e(rng));
    if (rows > 2) {
      for (std::int64_t i = 0; i < cols; ++i) x[std::size_t(cols + i)] = 0.f;        // row 1: zeros
      x[std::size_t(2 * cols + 3)] = 1000.f;                                          // row 2: the outlier
      x[std::size_t(rows * cols - 1)] = std::numeric_limits<float>::quiet_NaN();     // last row: NaN, ±inf
      x[std::size_t(rows * cols - 2)] = std::numeric_limits<float>::infinity();
      x[std::size_t(rows * cols - 3)] = -std::numeric_limits<float>::infinity();
    }
    std::vector<std::uint8_t> want(x.size());
    const float want_scale = fp8_quantize_tensor_ref(x.data(), std::int64_t(x.size()), want.data());
    if (rows > 2) {
      EXPECT_EQ(want_scale, 1000.f / 448.f);
    }
    guarded_buffer dx(x.size()), dscale(1), drow_max{std::size_t(rows)};
    dx.upload(x);
    device_bytes codes(x.size());
    ANVIL_GPU_CHECK(launch_quantize_fp8(dx.data(), rows, cols, codes.as<std::uint8_t>(), dscale.data(), drow_max.data(), nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    expect_codes_equal(download(codes, x.size(), dscale.data()), want, want_scale);
    EXPECT_TRUE(dscale.guards_intact());
    EXPECT_TRUE(drow_max.guards_intact());
  }
  // What it refuses: rows not a multiple of 4 values, misaligned x; nothing launched.
  guarded_buffer dx(64), s(1), r(4);
  device_bytes codes(64);
  EXPECT_EQ(launch_quantize_fp8(dx.data(), 4, 6, codes.as<std::uint8_t>(), s.data(), r.data(), nullptr), hipErrorInvalidValue);
  EXPECT_EQ(launch_quantize_fp8(dx.data() + 1, 4, 8, codes.as<std::uint8_t>(), s.data(), r.data(), nullptr), hipErrorInvalidValue);
}

// A weight's copy is the reference quantization of its f16-rounded dequantized values.
TEST(GemmFp8Gpu, WeightCopyMatchesTheReference) {
  require_fp8();
  if (HasFatalFailure() || IsSkipped()) return;
  for (const ggml_type t : {ggml_type::Q4_K, ggml_type::Q6_K, ggml_type::Q8_0, ggml_type::F16}) {
    SCOPED_TRACE(type_name(t));
    std::mt19937 rng(unsigned(t) + 3);
    const host_weight w(t, 70, 512, rng);
    std::vector<float> halves(w.values.size());
    for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = model::f16_to_f32(model::f32_to_f16(w.values[i]));
    std::vector<std::uint8_t> want(halves.size());
    const float want_scale = fp8_quantize_tensor_ref(halves.data(), std::int64_t(halves.size()), want.data());
    device_bytes dw(w.bytes.size()), scratch(halves.size() * 2), copy(fp8_matrix_bytes(w.cols, w.rows));
    dw.upload(w.bytes.data(), w.bytes.size());
    ANVIL_GPU_CHECK(launch_make_fp8_matrix(t, dw.data(), w.cols, w.rows, scratch.data(), scratch.size(), copy.data(), nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    const fp8_matrix m = fp8_matrix_at(copy.data(), w.cols, w.rows);
    EXPECT_EQ(static_cast<const void*>(m.codes), copy.data());
    expect_codes_equal(download(copy, halves.size(), m.scale), want, want_scale);
  }
}

// A stacked copy (q/k/v or gate/up as one matrix) is the reference quantization of the parts'
// f16-rounded values one after the other, one scale for all; made through a scratch that holds
// only the widest quantized part (each part is dequantized twice: maxima, then codes).
TEST(GemmFp8Gpu, StackedCopyIsTheReferenceOfThePartsTogether) {
  require_fp8();
  if (HasFatalFailure() || IsSkipped()) return;
  std::mt19937 rng(77);
  constexpr std::int64_t in = 512;
  const std::vector<host_weight> parts = {host_weight(ggml_type::Q4_K, 70, in, rng), host_weight(ggml_type::Q6_K, 40, in, rng),
                                          host_weight(ggml_type::F16, 30, in, rng)};
  std::vector<float> halves;
  std::vector<std::unique_ptr<device_bytes>> dws;
  std::vector<fp8_stack_part> stack;
  std::int64_t out = 0;
  for (const host_weight& w : parts) {
    for (const float v : w.values) halves.push_back(model::f16_to_f32(model::f32_to_f16(v)));
    dws.push_back(std::make_unique<device_bytes>(w.bytes.size()));
    dws.back()->upload(w.bytes.data(), w.bytes.size());
    stack.push_back({.type = w.type, .w = dws.back()->data(), .out = w.rows});
    out += w.rows;
  }
  std::vector<std::uint8_t> want(halves.size());
  const float want_scale = fp8_quantize_tensor_ref(halves.data(), std::int64_t(halves.size()), want.data());
  device_bytes scratch(std::size_t(70 * in * 2)), copy(fp8_matrix_bytes(in, out));
  ANVIL_GPU_CHECK(launch_make_fp8_stacked(stack, in, scratch.data(), scratch.size(), copy.data(), nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  const fp8_matrix m = fp8_matrix_at(copy.data(), in, out);
  expect_codes_equal(download(copy, halves.size(), m.scale), want, want_scale);
  EXPECT_EQ(launch_make_fp8_stacked(stack, in, scratch.data(), scratch.size() - 2, copy.data(), nullptr),
            hipErrorInvalidValue);  // the widest quantized part does not fit the scratch
}

// The exact product of the decoded operands: y[t, o] = (sw sx) sum_i dec(W[o, i]) dec(x[t, i]) + b[o].
std::vector<float> decoded_product(const std::vector<std::uint8_t>& wc, float sw, const std::vector<std::uint8_t>& xc,
                                   float sx, const float* bias, std::int64_t out, std::int64_t in, std::int64_t nt) {
  std::vector<float> y(std::size_t(nt * out));
  for (std::int64_t t = 0; t < nt; ++t) {
    for (std::int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (std::int64_t i = 0; i < in; ++i) {
        s += double(fp8_e4m3_decode(wc[std::size_t(o * in + i)])) * double(fp8_e4m3_decode(xc[std::size_t(t * in + i)]));
      }
      y[std::size_t(t * out + o)] = float(s * double(sw) * double(sx)) + (bias ? bias[o] : 0.f);
    }
  }
  return y;
}

// Three weights on one x (the worker's q, k, v): each output against the decoded product (only
// the summation order differs) and, loosely, against the f32 reference of the GGUF weight.
TEST(GemmFp8Gpu, GroupMatchesTheDecodedProduct) {
  require_fp8();
  if (HasFatalFailure() || IsSkipped()) return;
  blas::lt_gemm lt;
  ASSERT_EQ(lt.create(), blas::ok);
  constexpr std::int64_t in = 1024, max_tokens = 70;
  std::mt19937 rng(1024);
  const std::vector<host_weight> ws_host = {host_weight(ggml_type::Q4_K, 256, in, rng),
                                            host_weight(ggml_type::Q6_K, 96, in, rng),
                                            host_weight(ggml_type::Q8_0, 64, in, rng)};
  const std::vector<float> x = random_vector(std::size_t(max_tokens * in), rng, -2.f, 2.f);
  const std::vector<float> bias = random_vector(256, rng, -1.f, 1.f);
  guarded_buffer dx(x.size()), db(bias.size());
  dx.upload(x);
  db.upload(bias);
  std::vector<std::unique_ptr<device_bytes>> copies;
  std::vector<fp8_matrix> mats;
  std::vector<std::unique_ptr<guarded_buffer>> ys;
  for (const host_weight& w : ws_host) {
    device_bytes dw(w.bytes.size()), scratch(w.values.size() * 2);
    dw.upload(w.bytes.data(), w.bytes.size());
    copies.push_back(std::make_unique<device_bytes>(fp8_matrix_bytes(in, w.rows)));
    ANVIL_GPU_CHECK(launch_make_fp8_matrix(w.type, dw.data(), in, w.rows, scratch.data(), scratch.size(),
                                           copies.back()->data(), nullptr));
    mats.push_back(fp8_matrix_at(copies.back()->data(), in, w.rows));
    ys.push_back(std::make_unique<guarded_buffer>(std::size_t(max_tokens * w.rows)));
  }
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  device_bytes ws(gemm_fp8_workspace_bytes(in, max_tokens)), blas_ws(blas::recommended_workspace_bytes);
  const gemm_fp8_context ctx{.blas = &lt,
                             .workspace = ws.data(),
                             .workspace_bytes = ws.size(),
                             .blas_workspace = blas_ws.data(),
                             .blas_workspace_bytes = blas_ws.size()};
  for (const std::int64_t nt : {1, 33, 70, 17}) {
    SCOPED_TRACE("n_tokens=" + std::to_string(nt));
    std::vector<gemm_fp8_projection> ps;
    for (std::size_t i = 0; i < mats.size(); ++i) {
      ys[i]->poison();
      ps.push_back({.w = &mats[i], .bias = i == 0 ? db.data() : nullptr, .y = ys[i]->data()});
    }
    ANVIL_GPU_CHECK(launch_gemm_fp8_group(ps, dx.data(), nt, ctx, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    std::vector<std::uint8_t> xc(std::size_t(nt * in));
    const float sx = fp8_quantize_tensor_ref(x.data(), nt * in, xc.data());
    for (std::size_t i = 0; i < mats.size(); ++i) {
      const host_weight& w = ws_host[i];
      const quantized wq = download(*copies[i], std::size_t(w.rows * in), mats[i].scale);
      const float* bp = i == 0 ? bias.data() : nullptr;
      std::vector<float> got = ys[i]->download();
      got.resize(std::size_t(nt * w.rows));
      const std::vector<float> exact = decoded_product(wq.codes, wq.scale, xc, sx, bp, w.rows, in, nt);
      std::vector<float> ref(got.size());
      matmul_ref({.w = w.bytes.data(), .w_type = w.type, .in = in, .out = w.rows, .bias = bp, .x = x.data(),
                  .y = ref.data(), .n_tokens = nt});
      const double err_exact = max_scaled_error(got, exact, w, x, bp, nt), err_ref = nmse(got, ref);
      std::printf("  fp8 %s %lldx%lld n_tokens=%lld: max scaled error vs decoded product %.3g, nmse vs f32 reference %.3g\n",
                  type_name(w.type).c_str(), static_cast<long long>(w.rows), static_cast<long long>(in),
                  static_cast<long long>(nt), err_exact, err_ref);
      // The tensor cores sum FP8 products with fewer bits than f32 between cuBLASLt's promotions
      // to f32 (measured 1.2e-5 to 2.8e-5 on the H200); a wrong scale or layout is off by O(1).
      EXPECT_LT(err_exact, 1e-4);
      EXPECT_LT(err_ref, 1e-2);  // E4M3 on both sides: ~1e-3 expected
      EXPECT_TRUE(ys[i]->guards_intact());
    }
  }
  // A NaN and an infinity in token 5 of 40: token 5's outputs are not finite-and-right, every
  // other token's equal the decoded product of a scale the NaN did not move.
  std::vector<float> xbad(x.begin(), x.begin() + 40 * in);
  xbad[std::size_t(5 * in + 7)] = std::numeric_limits<float>::quiet_NaN();
  xbad[std::size_t(5 * in + 9)] = std::numeric_limits<float>::infinity();
  guarded_buffer dxb(xbad.size());
  dxb.upload(xbad);
  const gemm_fp8_projection p{.w = &mats[0], .bias = nullptr, .y = ys[0]->data()};
  ANVIL_GPU_CHECK(launch_gemm_fp8_group(std::span(&p, 1), dxb.data(), 40, ctx, nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  std::vector<std::uint8_t> xc(xbad.size());
  const float sx = fp8_quantize_tensor_ref(xbad.data(), 40 * in, xc.data());
  const quantized wq = download(*copies[0], std::size_t(256 * in), mats[0].scale);
  const std::vector<float> exact = decoded_product(wq.codes, wq.scale, xc, sx, nullptr, 256, in, 40);
  const std::vector<float> got = ys[0]->download();
  std::vector<float> got_rest, exact_rest, x_rest;  // the 39 other tokens
  const auto append_row = [](std::vector<float>& dst, const std::vector<float>& src, std::int64_t t, std::int64_t width) {
    dst.insert(dst.end(), src.begin() + t * width, src.begin() + (t + 1) * width);
  };
  for (std::int64_t t = 0; t < 40; ++t) {
    if (t == 5) {
      for (std::int64_t o = 0; o < 256; ++o) EXPECT_TRUE(std::isnan(got[std::size_t(t * 256 + o)])) << o;
      continue;
    }
    append_row(got_rest, got, t, 256);
    append_row(exact_rest, exact, t, 256);
    append_row(x_rest, xbad, t, in);
  }
  EXPECT_LT(max_scaled_error(got_rest, exact_rest, ws_host[0], x_rest, nullptr, 39), 1e-4);
  // Refused, nothing launched: in not a multiple of 16, a mismatched group, a small workspace.
  const fp8_matrix odd{.codes = mats[0].codes, .scale = mats[0].scale, .in = 1000, .out = 256};
  const gemm_fp8_projection bad_in{.w = &odd, .bias = nullptr, .y = ys[0]->data()};
  EXPECT_EQ(launch_gemm_fp8_group(std::span(&bad_in, 1), dx.data(), 8, ctx, nullptr), hipErrorInvalidValue);
  gemm_fp8_context small = ctx;
  small.workspace_bytes = 1024;
  EXPECT_EQ(launch_gemm_fp8_group(std::span(&p, 1), dx.data(), 8, small, nullptr), hipErrorInvalidValue);
}

}  // namespace
}  // namespace anvil::kernels::testing

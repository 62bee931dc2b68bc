// GEMM (launch_gemm, every algorithm this build has) and the dequantize kernels against the CPU
// references, for every weight type, at 3 to 512 tokens, with and without bias. Tolerances,
// relative to each output's |W|.|x| scale: 1e-5 where the inputs stay f32 (tiled_f32), 2e-3 where
// W and x are rounded to f16/bf16 first (tiled_f16, vendor_blas, quantized: 2^-11 per factor at worst,
// 4e-3 for BF16 weights under vendor_blas, whose x is rounded to bf16, 2^-9). The vendor paths run
// through cuBLAS and through cuBLASLt's plans (blas::lt_gemm: one object for every token count, so
// that plans made for a bucket run other counts of it). Outputs poisoned and guarded. Label: gpu.
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gemm.h"
#include "kernels/gemm_quant.h"
#include "tests/kernels/matmul_gpu_cases.h"

namespace {

using namespace anvil::kernels;
using namespace anvil::kernels::testing;
namespace blas = anvil::blas;

struct gemm_case {
  ggml_type type;
  std::int64_t out, in;
  std::string str() const {
    std::ostringstream s;
    s << "gemm(" << type_name(type) << ", out=" << out << ", in=" << in << ")";
    return s.str();
  }
};

std::vector<gemm_case> gemm_cases() {
  std::vector<gemm_case> cases;
  for (ggml_type t : gpu_weight_types()) {
    const std::int64_t b = anvil::model::info(t).block_elems == 256 ? 256 : 32;
    cases.push_back({t, 37, 2 * b});
    cases.push_back({t, 131, 1024});
    if (b == 32) cases.push_back({t, 70, 96});
    // launch_gemm picks the quantized GEMM at 3 and 9 tokens.
    if (t == ggml_type::Q4_K || t == ggml_type::Q5_K || t == ggml_type::Q6_K) cases.push_back({t, 1024, 4096});
  }
  return cases;
}

const char* algo_name(gemm_algo a) {
  return a == gemm_algo::quantized     ? "quantized"
         : a == gemm_algo::vendor_blas ? "vendor_blas"
         : a == gemm_algo::tiled_f16   ? "tiled_f16"
                                       : "tiled_f32";
}

std::vector<gemm_algo> algos() {
  std::vector<gemm_algo> a = {gemm_algo::tiled_f32, gemm_algo::tiled_f16};
  if (ANVIL_GPU_HAVE_BLAS) {
    a.push_back(gemm_algo::vendor_blas);
    a.push_back(gemm_algo::quantized);
  }
  return a;
}

class GemmGpu : public ::testing::TestWithParam<gemm_case> {};

TEST_P(GemmGpu, MatchesCpuReference) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  const gemm_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(static_cast<unsigned>(c.out * 31 + c.in + int(c.type) * 104729));
  const host_weight w(c.type, c.out, c.in, rng);
  constexpr std::int64_t max_tokens = 512;
  const std::vector<float> x = random_vector(std::size_t(max_tokens * c.in), rng, -2.f, 2.f);
  const std::vector<float> bias = random_vector(std::size_t(c.out), rng, -1.f, 1.f);

  device_bytes dw(w.bytes.size());
  dw.upload(w.bytes.data(), w.bytes.size());
  guarded_buffer dx(x.size()), db(bias.size());
  dx.upload(x);
  db.upload(bias);

  blas::handle_t handle = nullptr;
  const bool have_blas = ANVIL_GPU_HAVE_BLAS && blas::create(&handle) == blas::ok;
  device_bytes blas_ws(std::size_t(4) << 20);
  blas::lt_gemm lt;

  std::vector<std::pair<gemm_algo, bool>> paths;  // (algorithm, through lt_gemm)
  for (gemm_algo algo : algos()) {
    paths.emplace_back(algo, false);
    if (gemm_uses_blas(algo)) paths.emplace_back(algo, true);
  }
  for (const auto& [algo, via_lt] : paths) {
    if (gemm_uses_blas(algo)) {
      ASSERT_TRUE(have_blas) << "blas::create failed";
      if (via_lt) {
        ASSERT_EQ(lt.create(), blas::ok);
      }
    }
    device_bytes ws(gemm_workspace_bytes(algo, c.type, c.in, c.out, max_tokens));
    const gemm_context ctx{.algo = algo,
                           .workspace = ws.data(),
                           .workspace_bytes = ws.size(),
                           .blas = handle,
                           .blas_workspace = blas_ws.data(),
                           .blas_workspace_bytes = blas_ws.size(),
                           .lt = via_lt ? &lt : nullptr};
    const std::string path = std::string(algo_name(algo)) + (via_lt ? "+lt" : "");
    const double tol = algo == gemm_algo::tiled_f32                              ? 1e-5
                       : gemm_uses_blas(algo) && c.type == ggml_type::BF16 ? 4e-3  // x in bf16
                                                                           : 2e-3;
    // Token counts of one 8-token tile, of the quantized GEMM's 16/64-token tiles, several of
    // them with a ragged last one, and past gemm_quant_max_tokens; 300 and 512 share a plan
    // bucket (blas::plan_bucket), 300 first.
    for (std::int64_t nt : {3, 9, 61, 64, 200, 300, 512}) {
      const bool with_bias = nt != 64;
      SCOPED_TRACE(path + " n_tokens=" + std::to_string(nt));
      std::vector<float> ref(std::size_t(nt * c.out));
      const float* bp = with_bias ? bias.data() : nullptr;
      matmul_ref({.w = w.bytes.data(),
                  .w_type = c.type,
                  .in = c.in,
                  .out = c.out,
                  .bias = bp,
                  .x = x.data(),
                  .y = ref.data(),
                  .n_tokens = nt});
      guarded_buffer dy(ref.size());
      dy.poison();
      ANVIL_GPU_CHECK(launch_gemm({.w = dw.data(),
                                   .w_type = c.type,
                                   .in = c.in,
                                   .out = c.out,
                                   .bias = with_bias ? db.data() : nullptr,
                                   .x = dx.data(),
                                   .y = dy.data(),
                                   .n_tokens = nt},
                                  ctx, nullptr));
      ANVIL_GPU_CHECK(hipDeviceSynchronize());
      const double err = max_scaled_error(dy.download(), ref, w, x, bp, nt);
      std::printf("  %-36s %-14s n_tokens=%-4lld%s max scaled error %.3g\n", c.str().c_str(), path.c_str(),
                  static_cast<long long>(nt), with_bias ? " +bias" : "      ", err);
      EXPECT_LT(err, tol);
      EXPECT_TRUE(dy.guards_intact());
    }
  }
  if (handle) blas::destroy(handle);
}

// An f16 copy made by launch_dequantize (the GPU worker's --f16-weight-copies) gives the bits of
// the path that dequantizes the weight on each call, on a workspace sized without the weight's room.
// The types that get a copy: every one but F16 and BF16, which the vendor path multiplies as stored.
std::vector<gemm_case> copied_cases() {
  std::vector<gemm_case> cases;
  for (const gemm_case& c : gemm_cases()) {
    if (c.type != ggml_type::F16 && c.type != ggml_type::BF16) cases.push_back(c);
  }
  return cases;
}

class GemmGpuF16Copy : public ::testing::TestWithParam<gemm_case> {};

TEST_P(GemmGpuF16Copy, GivesTheBitsOfDequantizingOnEachCall) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  const gemm_case c = GetParam();
  if (!ANVIL_GPU_HAVE_BLAS) GTEST_SKIP() << "the copies serve the vendor BLAS path, not in this build";
  SCOPED_TRACE(c.str());
  std::mt19937 rng(static_cast<unsigned>(c.out * 17 + c.in + int(c.type) * 7919));
  const host_weight w(c.type, c.out, c.in, rng);
  constexpr std::int64_t max_tokens = 512;
  const std::vector<float> x = random_vector(std::size_t(max_tokens * c.in), rng, -2.f, 2.f);
  const std::vector<float> bias = random_vector(std::size_t(c.out), rng, -1.f, 1.f);
  device_bytes dw(w.bytes.size());
  dw.upload(w.bytes.data(), w.bytes.size());
  device_bytes w16(std::size_t(c.out * c.in) * 2);
  ANVIL_GPU_CHECK(launch_dequantize(c.type, dw.data(), static_cast<std::uint16_t*>(w16.data()), c.out, c.in, nullptr));
  guarded_buffer dx(x.size()), db(bias.size());
  dx.upload(x);
  db.upload(bias);
  device_bytes blas_ws(std::size_t(4) << 20);
  blas::lt_gemm lt;
  ASSERT_EQ(lt.create(), blas::ok);
  for (const gemm_algo algo : {gemm_algo::vendor_blas, gemm_algo::quantized}) {
    const std::size_t plain_bytes = gemm_workspace_bytes(algo, c.type, c.in, c.out, max_tokens);
    const std::size_t copy_bytes = gemm_workspace_bytes(algo, c.type, c.in, c.out, max_tokens, true);
    EXPECT_LE(copy_bytes, plain_bytes);
    device_bytes ws_plain(plain_bytes), ws_copy(copy_bytes);
    const auto ctx = [&](device_bytes& ws) {
      return gemm_context{.algo = algo,
                          .workspace = ws.data(),
                          .workspace_bytes = ws.size(),
                          .blas_workspace = blas_ws.data(),
                          .blas_workspace_bytes = blas_ws.size(),
                          .lt = &lt};
    };
    for (std::int64_t nt : {9, 61, 200, 512}) {
      SCOPED_TRACE(std::string(algo_name(algo)) + " n_tokens=" + std::to_string(nt));
      matmul_params p{.w = dw.data(),
                      .w_type = c.type,
                      .in = c.in,
                      .out = c.out,
                      .bias = db.data(),
                      .x = dx.data(),
                      .n_tokens = nt};
      guarded_buffer plain(std::size_t(nt * c.out)), copied(std::size_t(nt * c.out));
      plain.poison();
      copied.poison();
      p.y = plain.data();
      ANVIL_GPU_CHECK(launch_gemm(p, ctx(ws_plain), nullptr));
      p.y = copied.data();
      p.w16 = w16.data();
      ANVIL_GPU_CHECK(launch_gemm(p, ctx(ws_copy), nullptr));
      ANVIL_GPU_CHECK(hipDeviceSynchronize());
      const std::vector<float> a = plain.download(), b = copied.download();
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
      EXPECT_TRUE(plain.guards_intact());
      EXPECT_TRUE(copied.guards_intact());
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<gemm_case>& i) {
  return type_name(i.param.type) + "_" + std::to_string(i.param.out) + "x" + std::to_string(i.param.in);
}

INSTANTIATE_TEST_SUITE_P(TypesAndShapes, GemmGpu, ::testing::ValuesIn(gemm_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(TypesAndShapes, GemmGpuF16Copy, ::testing::ValuesIn(copied_cases()), case_name);

// Dequantization into f32 is dequantize_row's values (up to a contracted multiply-add in the
// K-quants); into f16 those values rounded to nearest.
class DequantizeGpu : public ::testing::TestWithParam<ggml_type> {};

TEST_P(DequantizeGpu, MatchesDequantizeRow) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  const ggml_type t = GetParam();
  std::mt19937 rng(static_cast<unsigned>(t) + 17);
  // Short rows several to a thread block (rows past the end), and rows longer than a block's
  // chunks (several blocks along the row, the last one part-filled for the K-quants).
  for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{13, 768}, {5, 5120}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const host_weight w(t, rows, cols, rng);
    device_bytes dw(w.bytes.size());
    dw.upload(w.bytes.data(), w.bytes.size());

    guarded_buffer d32(w.values.size());
    d32.poison();
    ANVIL_GPU_CHECK(launch_dequantize_f32(t, dw.data(), d32.data(), rows, cols, nullptr));
    // f16 output in a float-sized guarded buffer (two halves per float).
    guarded_buffer d16(w.values.size() / 2);
    d16.poison();
    ANVIL_GPU_CHECK(launch_dequantize(t, dw.data(), reinterpret_cast<std::uint16_t*>(d16.data()), rows, cols, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());

    const std::vector<float> f32 = d32.download();
    const std::vector<float> packed = d16.download();
    std::vector<std::uint16_t> f16(w.values.size());
    std::memcpy(f16.data(), packed.data(), f16.size() * sizeof(std::uint16_t));
    double worst32 = 0, worst16 = 0;
    std::size_t not_rounded = 0;  // f16 outputs other than the f32 output rounded to nearest even
    for (std::size_t i = 0; i < w.values.size(); ++i) {
      const double ref = w.values[i];
      not_rounded += f16[i] != anvil::model::f32_to_f16(f32[i]);
      worst32 = std::max(worst32, std::fabs(double(f32[i]) - ref) / (std::fabs(ref) + 1e-3));
      worst16 = std::max(worst16, std::fabs(double(anvil::model::f16_to_f32(f16[i])) - ref) / (std::fabs(ref) + 1e-3));
      if (std::isnan(f32[i])) worst32 = f32[i];
    }
    std::printf("  dequantize(%s, %lldx%lld): f32 max rel %.3g, f16 max rel %.3g\n", type_name(t).c_str(),
                static_cast<long long>(rows), static_cast<long long>(cols), worst32, worst16);
    EXPECT_LT(worst32, 1e-6);
    EXPECT_LT(worst16, 1.0 / 2048);
    EXPECT_EQ(not_rounded, 0u);
    EXPECT_TRUE(d32.guards_intact());
    EXPECT_TRUE(d16.guards_intact());
  }
}

INSTANTIATE_TEST_SUITE_P(Types, DequantizeGpu, ::testing::ValuesIn(gpu_weight_types()),
                         [](const ::testing::TestParamInfo<ggml_type>& i) { return type_name(i.param); });

TEST(GemmGpuLaunch, RejectsTooSmallWorkspaceAndBadShapes) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  guarded_buffer buf(8192);
  float* p = buf.data();
  const gemm_context none{gemm_algo::tiled_f16, nullptr, 0, nullptr, nullptr, 0};
  // Q8_0 needs an f16 scratch for tiled_f16: none given.
  EXPECT_EQ(launch_gemm({.w = p,
                         .w_type = ggml_type::Q8_0,
                         .in = 64,
                         .out = 4,
                         .bias = nullptr,
                         .x = p + 2048,
                         .y = p + 4096,
                         .n_tokens = 16},
                        none, nullptr),
            hipErrorInvalidValue);
  EXPECT_EQ(launch_gemm({.w = p,
                         .w_type = ggml_type::F32,
                         .in = 60,
                         .out = 4,
                         .bias = nullptr,
                         .x = p + 2048,
                         .y = p + 4096,
                         .n_tokens = 16},
                        none, nullptr),
            hipErrorInvalidValue);
  EXPECT_EQ(launch_gemm({.w = p,
                         .w_type = ggml_type::IQ2_XXS,
                         .in = 256,
                         .out = 4,
                         .bias = nullptr,
                         .x = p + 2048,
                         .y = p + 4096,
                         .n_tokens = 16},
                        none, nullptr),
            hipErrorInvalidValue);
  EXPECT_EQ(launch_gemm({.w = p,
                         .w_type = ggml_type::F16,
                         .in = 64,
                         .out = 4,
                         .bias = nullptr,
                         .x = p + 2048,
                         .y = p + 4096,
                         .n_tokens = 0},
                        none, nullptr),
            hipSuccess);
  EXPECT_EQ(hipGetLastError(), hipSuccess);
  EXPECT_TRUE(buf.guards_intact());
}

// The quantized GEMM itself (launch_gemm_quant, whatever launch_gemm would pick) against the CPU
// reference: every token tile (8, 16, 32, 64 tokens) with ragged last tiles, several tiles of
// tokens, rows past a block's last full tile, and splits of the reduction (in = 4096: 16
// super-blocks). Tolerance as vendor_blas (W's values and x rounded to f16).
class GemmQuantGpu : public ::testing::TestWithParam<ggml_type> {};

TEST_P(GemmQuantGpu, MatchesCpuReference) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  const ggml_type type = GetParam();
  if (!gemm_quant_supported(type, 1)) GTEST_SKIP() << "no tensor-core quantized GEMM on this device";
  for (const auto& [out, in] : {std::pair<std::int64_t, std::int64_t>{200, 4096}, {64, 512}, {131, 1024}, {8, 256}}) {
    SCOPED_TRACE(std::to_string(out) + "x" + std::to_string(in));
    std::mt19937 rng(static_cast<unsigned>(out * 7 + in + int(type)));
    const host_weight w(type, out, in, rng);
    constexpr std::int64_t max_tokens = gemm_quant_max_tokens;
    const std::vector<float> x = random_vector(std::size_t(max_tokens * in), rng, -2.f, 2.f);
    const std::vector<float> bias = random_vector(std::size_t(out), rng, -1.f, 1.f);
    device_bytes dw(w.bytes.size());
    dw.upload(w.bytes.data(), w.bytes.size());
    guarded_buffer dx(x.size()), db(bias.size());
    dx.upload(x);
    db.upload(bias);
    device_bytes ws(gemm_quant_workspace_bytes(type, in, out, max_tokens));
    for (std::int64_t nt : {1, 3, 8, 9, 16, 17, 31, 33, 64, 65, 100, 128}) {
      const bool with_bias = nt % 2 == 1;
      SCOPED_TRACE("n_tokens=" + std::to_string(nt));
      std::vector<float> ref(std::size_t(nt * out));
      const float* bp = with_bias ? bias.data() : nullptr;
      matmul_ref({.w = w.bytes.data(), .w_type = type, .in = in, .out = out, .bias = bp, .x = x.data(),
                  .y = ref.data(), .n_tokens = nt});
      guarded_buffer dy(ref.size());
      dy.poison();
      ANVIL_GPU_CHECK(launch_gemm_quant({.w = dw.data(),
                                         .w_type = type,
                                         .in = in,
                                         .out = out,
                                         .bias = with_bias ? db.data() : nullptr,
                                         .x = dx.data(),
                                         .y = dy.data(),
                                         .n_tokens = nt},
                                        ws.data(), ws.size(), nullptr));
      ANVIL_GPU_CHECK(hipDeviceSynchronize());
      const double err = max_scaled_error(dy.download(), ref, w, x, bp, nt);
      std::printf("  gemm_quant(%s, out=%lld, in=%lld) n_tokens=%-4lld%s max scaled error %.3g\n",
                  type_name(type).c_str(), static_cast<long long>(out), static_cast<long long>(in), static_cast<long long>(nt),
                  with_bias ? " +bias" : "      ", err);
      EXPECT_LT(err, 2e-3);
      EXPECT_TRUE(dy.guards_intact());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GemmQuantGpu, ::testing::Values(ggml_type::Q4_K, ggml_type::Q5_K, ggml_type::Q6_K),
                         [](const ::testing::TestParamInfo<ggml_type>& i) { return type_name(i.param); });

// Three GEMMs on one x through one conversion (the worker's q, k, v): each split over the device
// (in = 4096, few rows), so each leaves the tile counters at zero for the next; every output
// against the CPU reference, twice in a row.
TEST(GemmQuantGpuGroup, SharesOneConversion) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  if (!gemm_quant_supported(ggml_type::Q4_K, 1)) GTEST_SKIP() << "no tensor-core quantized GEMM on this device";
  constexpr std::int64_t in = 4096, max_tokens = 40;
  std::mt19937 rng(4096);
  const std::vector<host_weight> ws_host = {host_weight(ggml_type::Q4_K, 200, in, rng),
                                            host_weight(ggml_type::Q6_K, 96, in, rng),
                                            host_weight(ggml_type::Q5_K, 64, in, rng)};
  const std::vector<float> x = random_vector(std::size_t(max_tokens * in), rng, -2.f, 2.f);
  guarded_buffer dx(x.size());
  dx.upload(x);
  std::vector<std::unique_ptr<device_bytes>> dws;
  std::vector<std::unique_ptr<guarded_buffer>> dys;
  std::size_t ws_bytes = 0;
  for (const host_weight& w : ws_host) {
    dws.push_back(std::make_unique<device_bytes>(w.bytes.size()));
    dws.back()->upload(w.bytes.data(), w.bytes.size());
    dys.push_back(std::make_unique<guarded_buffer>(std::size_t(max_tokens * w.rows)));
    ws_bytes = std::max(ws_bytes, gemm_quant_workspace_bytes(w.type, in, w.rows, max_tokens));
  }
  device_bytes ws(ws_bytes);
  for (std::int64_t nt : {9, 40, 9}) {
    SCOPED_TRACE("n_tokens=" + std::to_string(nt));
    std::vector<matmul_params> ps;
    for (std::size_t i = 0; i < ws_host.size(); ++i) {
      dys[i]->poison();
      ps.push_back({.w = dws[i]->data(),
                    .w_type = ws_host[i].type,
                    .in = in,
                    .out = ws_host[i].rows,
                    .bias = nullptr,
                    .x = dx.data(),
                    .y = dys[i]->data(),
                    .n_tokens = nt});
    }
    ANVIL_GPU_CHECK(launch_gemm_quant_group(ps, ws.data(), ws.size(), nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    for (std::size_t i = 0; i < ws_host.size(); ++i) {
      const host_weight& w = ws_host[i];
      std::vector<float> ref(std::size_t(nt * w.rows));
      matmul_ref({.w = w.bytes.data(), .w_type = w.type, .in = in, .out = w.rows, .bias = nullptr, .x = x.data(),
                  .y = ref.data(), .n_tokens = nt});
      std::vector<float> got = dys[i]->download();
      got.resize(ref.size());
      const double err = max_scaled_error(got, ref, w, x, nullptr, nt);
      std::printf("  group %s %lldx%lld n_tokens=%lld max scaled error %.3g\n", type_name(w.type).c_str(),
                  static_cast<long long>(w.rows), static_cast<long long>(in), static_cast<long long>(nt), err);
      EXPECT_LT(err, 2e-3);
      EXPECT_TRUE(dys[i]->guards_intact());
    }
  }
  // Different activations in one group: refused, nothing launched.
  std::vector<matmul_params> bad = {{.w = dws[0]->data(), .w_type = ggml_type::Q4_K, .in = in, .out = 200, .bias = nullptr,
                                     .x = dx.data(), .y = dys[0]->data(), .n_tokens = 9},
                                    {.w = dws[1]->data(), .w_type = ggml_type::Q6_K, .in = in, .out = 96, .bias = nullptr,
                                     .x = dx.data() + in, .y = dys[1]->data(), .n_tokens = 9}};
  EXPECT_EQ(launch_gemm_quant_group(bad, ws.data(), ws.size(), nullptr), hipErrorInvalidValue);
}

TEST(GemmQuantGpuLaunch, RefusesWhatItDoesNotTake) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  EXPECT_FALSE(gemm_quant_supported(ggml_type::Q8_0, 16));
  EXPECT_FALSE(gemm_quant_supported(ggml_type::Q4_K, 0));
  EXPECT_FALSE(gemm_quant_supported(ggml_type::Q4_K, gemm_quant_max_tokens + 1));
  EXPECT_FALSE(gemm_quant_preferred(ggml_type::Q4_K, 64, 4096, 1024));  // a small weight for 64 tokens
  if (!gemm_quant_supported(ggml_type::Q4_K, 1)) GTEST_SKIP() << "no tensor-core quantized GEMM on this device";
  EXPECT_TRUE(gemm_quant_preferred(ggml_type::Q4_K, 16, 4096, 4096));
  guarded_buffer buf(1 << 16);
  float* p = buf.data();
  const matmul_params ok{.w = p, .w_type = ggml_type::Q4_K, .in = 256, .out = 16, .bias = nullptr, .x = p + 8192,
                         .y = p + 16384, .n_tokens = 16};
  const std::size_t need = gemm_quant_workspace_bytes(ggml_type::Q4_K, 256, 16, 16);
  ASSERT_GT(need, 0u);
  ASSERT_LE(need, 4 * std::size_t(1 << 14));
  void* ws = p + 3 * (1 << 14);
  EXPECT_EQ(launch_gemm_quant(ok, ws, need - 1, nullptr), hipErrorInvalidValue);  // workspace too small
  matmul_params bad = ok;
  bad.in = 300;  // not whole super-blocks
  EXPECT_EQ(launch_gemm_quant(bad, ws, need, nullptr), hipErrorInvalidValue);
  bad = ok;
  bad.w_type = ggml_type::Q8_0;
  EXPECT_EQ(launch_gemm_quant(bad, ws, need, nullptr), hipErrorInvalidValue);
  bad = ok;
  bad.n_tokens = gemm_quant_max_tokens + 1;
  EXPECT_EQ(launch_gemm_quant(bad, ws, need, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(hipGetLastError(), hipSuccess);
  EXPECT_TRUE(buf.guards_intact());
}

}  // namespace

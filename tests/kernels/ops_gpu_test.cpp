// The elementwise and reduction GPU kernels against their CPU references: the fused residual add
// + RMSNorm, Q/K norm (RMSNorm over head_dim rows), SwiGLU on fused and split buffers, and the
// logits → candidates reduction (bias, penalties, temperature, top-K with ties, normaliser, tail
// mass and draw). Sentinels guard every output. Label: gpu.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <tuple>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/all_reduce_p2p.h"
#include "kernels/candidates.h"
#include "kernels/candidates_merge.h"
#include "kernels/feed_tokens.h"
#include "kernels/moe.h"
#include "kernels/output_gate.h"
#include "kernels/per_layer_inputs.h"
#include "kernels/rms_norm.h"
#include "kernels/rms_norm_residual.h"
#include "kernels/softcap.h"
#include "kernels/swiglu.h"
#include "sampler/sampler_core.h"
#include "tests/kernels/gpu_array.h"
#include "tests/kernels/op_check.h"
#include "tests/sampler/edge_params.h"

namespace {

using namespace anvil::kernels;
using namespace anvil::kernels::testing;
using anvil::gpu_worker::logit_params;
using anvil::gpu_worker::seq_output;

// ---------------------------------------------------------------------------------------------
// rms_norm_residual

struct norm_case {
  std::int64_t rows, cols;
  bool delta;
  std::int64_t skew;        // element offset inside the buffers (breaks 16-byte alignment)
  bool delta_norm = false;  // gemma3: delta normed first (delta_weight)
  float h_scale = 1.f;      // gemma4: the sum scaled (layer_output_scale)
  std::string str() const {
    std::ostringstream s;
    s << "rms_norm_residual(rows=" << rows << ", cols=" << cols << ", delta=" << delta << ", skew=" << skew
      << ", delta_norm=" << delta_norm << ", h_scale=" << h_scale << ")";
    return s.str();
  }
};

class RmsNormResidualGpu : public ::testing::TestWithParam<norm_case> {};

TEST_P(RmsNormResidualGpu, MatchesCpuReference) {
  require_device();
  const norm_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(unsigned(c.rows * 7919 + c.cols + c.delta));
  const std::size_t n = std::size_t(c.rows * c.cols) + std::size_t(c.skew);
  const std::vector<float> h = random_vector(n, rng, -3.f, 3.f), d = random_vector(n, rng, -1.f, 1.f);
  const std::vector<float> w = random_vector(std::size_t(c.cols), rng, 0.5f, 1.5f);
  const std::vector<float> dw_host = random_vector(std::size_t(c.cols), rng, 0.5f, 1.5f);
  std::vector<float> h_ref = h, y_ref(n, 0.f);
  rms_norm_residual_ref({.h = h_ref.data() + c.skew,
                         .delta = c.delta ? d.data() + c.skew : nullptr,
                         .weight = w.data(),
                         .y = y_ref.data() + c.skew,
                         .rows = c.rows,
                         .cols = c.cols,
                         .eps = 1e-6f,
                         .delta_weight = c.delta_norm ? dw_host.data() : nullptr,
                         .h_scale = c.h_scale});

  guarded_array<float> dh(h), dd(d), dw(w), dy(n), ddw(dw_host);
  dy.poison();
  ANVIL_GPU_CHECK(launch_rms_norm_residual({.h = dh.data() + c.skew,
                                            .delta = c.delta ? dd.data() + c.skew : nullptr,
                                            .weight = dw.data(),
                                            .y = dy.data() + c.skew,
                                            .rows = c.rows,
                                            .cols = c.cols,
                                            .eps = 1e-6f,
                                            .delta_weight = c.delta_norm ? ddw.data() : nullptr,
                                            .h_scale = c.h_scale},
                                           nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  std::vector<float> h_out = dh.download(), y_out = dy.download();
  if (c.delta_norm) {  // delta's own norm: a float reduction against the reference's double one
    EXPECT_LT(nmse(h_out, h_ref), 1e-12) << "h";
  } else {
    EXPECT_TRUE(std::equal(h_out.begin(), h_out.end(), h_ref.begin())) << "h differs (the add is one float add)";
  }
  h_out.erase(h_out.begin(), h_out.begin() + c.skew);
  y_out.erase(y_out.begin(), y_out.begin() + c.skew);
  y_ref.erase(y_ref.begin(), y_ref.begin() + c.skew);
  const double err = nmse(y_out, y_ref);
  std::printf("  %-70s nmse=%.3g\n", c.str().c_str(), err);
  EXPECT_LT(err, 1e-10);
  for (auto* g : {&dh, &dd, &dw, &dy, &ddw}) EXPECT_TRUE(g->guards_intact());
}

// With yq: y as before, and y's 8-bit form bit for bit what the GEMV's own quantizer makes of it.
// Shapes the 8-bit output takes: aligned, whole 32-element blocks, up to 16384 columns.
class RmsNormResidualX8Gpu : public ::testing::TestWithParam<norm_case> {};

TEST_P(RmsNormResidualX8Gpu, AlsoWritesYInEightBitsForTheGemv) {
  require_device();
  const norm_case c = GetParam();
  SCOPED_TRACE(c.str());
  ASSERT_TRUE(c.skew == 0 && c.cols % 32 == 0 && c.cols <= rms_norm_residual_max_x8_cols)
      << "not a shape the 8-bit output takes";
  std::mt19937 rng(unsigned(c.rows * 31 + c.cols + c.delta));
  const std::size_t n = std::size_t(c.rows * c.cols);
  const std::vector<float> h = random_vector(n, rng, -3.f, 3.f), d = random_vector(n, rng, -1.f, 1.f);
  const std::vector<float> w = random_vector(std::size_t(c.cols), rng, 0.5f, 1.5f);
  const std::vector<float> dw_host = random_vector(std::size_t(c.cols), rng, 0.5f, 1.5f);
  std::vector<float> h_ref = h, y_ref(n, 0.f);
  rms_norm_residual_ref({.h = h_ref.data(),
                         .delta = c.delta ? d.data() : nullptr,
                         .weight = w.data(),
                         .y = y_ref.data(),
                         .rows = c.rows,
                         .cols = c.cols,
                         .eps = 1e-6f,
                         .delta_weight = c.delta_norm ? dw_host.data() : nullptr,
                         .h_scale = c.h_scale});

  guarded_array<float> dh(h), dd(d), dw(w), dy(n), dds(n / 8), ddw(dw_host);
  guarded_array<std::int8_t> dq(n);
  dy.poison();
  dq.poison();
  dds.poison();
  rms_norm_residual_params p{.h = dh.data(),
                             .delta = c.delta ? dd.data() : nullptr,
                             .weight = dw.data(),
                             .y = dy.data(),
                             .rows = c.rows,
                             .cols = c.cols,
                             .eps = 1e-6f,
                             .delta_weight = c.delta_norm ? ddw.data() : nullptr,
                             .h_scale = c.h_scale};
  p.yq = dq.data();
  p.yq_scales = dds.data();
  ANVIL_GPU_CHECK(launch_rms_norm_residual(p, nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  const std::vector<float> h_out = dh.download(), y_out = dy.download();
  if (c.delta_norm) {
    EXPECT_LT(nmse(h_out, h_ref), 1e-12) << "h";
  } else {
    EXPECT_TRUE(std::equal(h_out.begin(), h_out.end(), h_ref.begin()));
  }
  EXPECT_LT(nmse(y_out, y_ref), 1e-10);
  const x8_host want = quantize_x8_host(y_out);
  EXPECT_TRUE(dq.download() == want.q) << "int8 values differ from the GEMV quantizer's";
  EXPECT_TRUE(dds.download() == want.ds) << "scales differ from the GEMV quantizer's";
  for (auto* g : {&dh, &dd, &dw, &dy, &dds}) EXPECT_TRUE(g->guards_intact());
  EXPECT_TRUE(dq.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormResidualGpu,
                         ::testing::Values(norm_case{1, 1, true, 0}, norm_case{3, 64, true, 0},
                                           norm_case{5, 896, true, 0}, norm_case{17, 4096, true, 0},
                                           norm_case{9, 4097, true, 0}, norm_case{4, 4096, true, 1},
                                           norm_case{7, 2048, false, 0}, norm_case{300, 5120, true, 0},
                                           norm_case{2, 14336, true, 0}, norm_case{1, 16384, false, 0},
                                           norm_case{2, 16416, true, 0},
                                           // gemma3's norm on delta: the register path (1 to 4
                                           // float4s a thread), the strided vector and scalar paths
                                           norm_case{1, 5376, true, 0, true}, norm_case{3, 3840, true, 0, true},
                                           norm_case{2, 896, true, 0, true}, norm_case{2, 16416, true, 0, true},
                                           norm_case{5, 1001, true, 0, true}, norm_case{4, 4096, true, 1, true},
                                           // gemma4's scaled sum, on the same paths
                                           norm_case{1, 5376, true, 0, true, 0.25f},
                                           norm_case{2, 16416, true, 0, true, 0.5f},
                                           norm_case{5, 1001, true, 0, true, 0.125f},
                                           norm_case{3, 64, true, 0, false, 2.f}));

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormResidualX8Gpu,
                         ::testing::Values(norm_case{3, 64, true, 0}, norm_case{5, 896, true, 0},
                                           norm_case{17, 4096, true, 0}, norm_case{7, 2048, false, 0},
                                           norm_case{300, 5120, true, 0}, norm_case{2, 14336, true, 0},
                                           norm_case{1, 16384, false, 0}, norm_case{1, 5376, true, 0, true},
                                           norm_case{7, 2560, true, 0, true},
                                           norm_case{1, 5376, true, 0, true, 0.25f}));

TEST(RmsNormResidualGpuLaunch, RefusesAnEightBitOutputItCannotWrite) {
  require_device();
  // h at 0, the weight at 20000, y at 40000, the scales at 60000: room for 16416 columns each.
  guarded_array<float> buf(80000);
  guarded_array<std::int8_t> q(20000);
  float* b = buf.data();
  float* scales = b + 60000;
  auto with = [&](std::int64_t cols, std::int64_t h_off, std::int8_t* yq, float* yq_scales) {
    rms_norm_residual_params p{
        .h = b + h_off, .delta = nullptr, .weight = b + 20000, .y = b + 40000, .rows = 1, .cols = cols, .eps = 1e-6f};
    p.yq = yq;
    p.yq_scales = yq_scales;
    return launch_rms_norm_residual(p, nullptr);
  };
  EXPECT_EQ(with(4097, 0, q.data(), scales), hipErrorInvalidValue);      // not whole 32-element blocks
  EXPECT_EQ(with(4096, 1, q.data(), scales), hipErrorInvalidValue);      // the unaligned path
  EXPECT_EQ(with(4096, 0, q.data(), nullptr), hipErrorInvalidValue);     // no scales
  EXPECT_EQ(with(4096, 0, q.data() + 1, scales), hipErrorInvalidValue);  // misaligned int8 rows
  EXPECT_EQ(with(16416, 0, q.data(), scales), hipErrorInvalidValue);     // past the register path
  // delta_weight norms a delta: none to norm, or experts' pairs, is refused.
  rms_norm_residual_params no_delta{.h = b, .weight = b + 20000, .y = b + 40000, .rows = 1, .cols = 64};
  no_delta.delta_weight = b + 20000;
  EXPECT_EQ(launch_rms_norm_residual(no_delta, nullptr), hipErrorInvalidValue);
  rms_norm_residual_params pairs = no_delta;
  pairs.delta = b + 60000;
  pairs.pair_weights = b + 70000;
  pairs.k = 1;
  EXPECT_EQ(launch_rms_norm_residual(pairs, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(hipGetLastError(), hipSuccess);
  EXPECT_TRUE(buf.guards_intact() && q.guards_intact());
}

// After a mixture of experts without a shared expert: delta is k experts' rows per row, summed
// with their weights by the norm itself. h and y (and y's 8-bit form) are bit for bit what
// launch_moe_combine into a row per token, then the plain residual norm, give; both are within
// float rounding of the CPU reference (which sums without fused multiply-adds).
struct pairs_case {
  std::int64_t rows, cols, k;
  bool x8;
};

class RmsNormResidualPairsGpu : public ::testing::TestWithParam<pairs_case> {};

TEST_P(RmsNormResidualPairsGpu, SumsTheExpertsRowsAsCombineThenTheNormDo) {
  require_device();
  const pairs_case c = GetParam();
  SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " cols=" << c.cols << " k=" << c.k << " x8=" << c.x8);
  std::mt19937 rng(unsigned(c.rows * 131 + c.cols + c.k));
  const std::size_t n = std::size_t(c.rows * c.cols);
  const std::vector<float> h = random_vector(n, rng, -3.f, 3.f);
  const std::vector<float> y = random_vector(n * std::size_t(c.k), rng, -1.f, 1.f);
  const std::vector<float> pw = random_vector(std::size_t(c.rows * c.k), rng, 0.f, 1.f);
  const std::vector<float> w = random_vector(std::size_t(c.cols), rng, 0.5f, 1.5f);
  std::vector<float> h_ref = h, y_ref(n, 0.f);
  rms_norm_residual_ref({.h = h_ref.data(),
                         .delta = y.data(),
                         .weight = w.data(),
                         .y = y_ref.data(),
                         .rows = c.rows,
                         .cols = c.cols,
                         .eps = 1e-6f,
                         .pair_weights = pw.data(),
                         .k = c.k});

  guarded_array<float> dy(y), dpw(pw), dw(w), dsum(n);
  struct out {
    std::vector<float> h, y, ds;
    std::vector<std::int8_t> q;
  };
  // fused: the norm sums the pairs; else combine into dsum, then the norm adds that row.
  const auto run = [&](bool fused, out& o) {
    guarded_array<float> dh(h), dout(n), dds(n / 8);
    guarded_array<std::int8_t> dq(n);
    dout.poison();
    dq.poison();
    dds.poison();
    if (!fused) {
      ANVIL_GPU_CHECK(launch_moe_combine(
          {.y = dy.data(), .weights = dpw.data(), .n_tokens = c.rows, .k = c.k, .cols = c.cols, .out = dsum.data()}, nullptr));
    }
    rms_norm_residual_params p{.h = dh.data(),
                               .delta = fused ? dy.data() : dsum.data(),
                               .weight = dw.data(),
                               .y = dout.data(),
                               .rows = c.rows,
                               .cols = c.cols,
                               .eps = 1e-6f};
    if (fused) {
      p.pair_weights = dpw.data();
      p.k = c.k;
    }
    if (c.x8) {
      p.yq = dq.data();
      p.yq_scales = dds.data();
    }
    ANVIL_GPU_CHECK(launch_rms_norm_residual(p, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_TRUE(dh.guards_intact() && dout.guards_intact() && dds.guards_intact() && dq.guards_intact());
    o = out{dh.download(), dout.download(), dds.download(), dq.download()};
  };
  out two, one;
  run(false, two);
  run(true, one);
  EXPECT_TRUE(one.h == two.h) << "h differs from combine + norm";
  EXPECT_TRUE(one.y == two.y) << "y differs from combine + norm";
  if (c.x8) {
    EXPECT_TRUE(one.q == two.q && one.ds == two.ds) << "8-bit y differs from combine + norm";
  }
  const double h_err = nmse(one.h, h_ref), y_err = nmse(one.y, y_ref);
  std::printf("  pairs(rows=%lld, cols=%lld, k=%lld) h nmse=%.3g, y nmse=%.3g\n", static_cast<long long>(c.rows),
              static_cast<long long>(c.cols), static_cast<long long>(c.k), h_err, y_err);
  EXPECT_LT(h_err, 1e-12);
  EXPECT_LT(y_err, 1e-10);
  for (auto* g : {&dy, &dpw, &dw, &dsum}) EXPECT_TRUE(g->guards_intact());
}

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormResidualPairsGpu,
                         ::testing::Values(pairs_case{1, 2048, 8, true},    // qwen3-30b-a3b decode
                                           pairs_case{7, 2880, 4, true},    // gpt-oss-20b
                                           pairs_case{3, 4096, 2, false},   // mixtral
                                           pairs_case{5, 101, 3, false},    // the scalar path
                                           pairs_case{2, 20000, 1, false},  // past the register path
                                           pairs_case{64, 2048, 8, false}));

TEST(RmsNormResidualGpuLaunch, RefusesPairWeightsWithoutRowsOrWithKOutOfRange) {
  require_device();
  guarded_array<float> buf(4096);
  float* b = buf.data();
  const auto with = [&](const float* delta, std::int64_t k) {
    return launch_rms_norm_residual(
        {.h = b, .delta = delta, .weight = b + 1024, .y = b + 2048, .rows = 1, .cols = 64, .pair_weights = b + 3072, .k = k},
        nullptr);
  };
  EXPECT_EQ(with(nullptr, 2), hipErrorInvalidValue);
  EXPECT_EQ(with(b + 512, 0), hipErrorInvalidValue);
  EXPECT_EQ(with(b + 512, 65), hipErrorInvalidValue);
  EXPECT_EQ(hipGetLastError(), hipSuccess);
  EXPECT_TRUE(buf.guards_intact());
}

// Q/K norm: launch_rms_norm over rows = tokens * heads of head_dim, in place (the short-row path).
class QkNormGpu : public ::testing::TestWithParam<std::pair<std::int64_t, std::int64_t>> {};

TEST_P(QkNormGpu, MatchesCpuReferenceInPlace) {
  require_device();
  const auto [rows, cols] = GetParam();
  std::mt19937 rng(unsigned(rows * 3 + cols));
  const std::vector<float> x = random_vector(std::size_t(rows * cols), rng, -3.f, 3.f);
  const std::vector<float> w = random_vector(std::size_t(cols), rng, 0.5f, 1.5f);
  std::vector<float> ref = x;
  rms_norm_ref({.x = ref.data(), .weight = w.data(), .y = ref.data(), .rows = rows, .cols = cols, .eps = 1e-6f});
  guarded_array<float> dx(x), dw(w);
  ANVIL_GPU_CHECK(launch_rms_norm(
      {.x = dx.data(), .weight = dw.data(), .y = dx.data(), .rows = rows, .cols = cols, .eps = 1e-6f}, nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  const double err = nmse(dx.download(), ref);
  std::printf("  qk_norm(rows=%lld, head_dim=%lld) nmse=%.3g\n", static_cast<long long>(rows),
              static_cast<long long>(cols), err);
  EXPECT_LT(err, 1e-10);
  EXPECT_TRUE(dx.guards_intact() && dw.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(Shapes, QkNormGpu,
                         ::testing::Values(std::pair<std::int64_t, std::int64_t>{37 * 32, 128},
                                           std::pair<std::int64_t, std::int64_t>{5 * 8, 128},
                                           std::pair<std::int64_t, std::int64_t>{9 * 14, 64},
                                           std::pair<std::int64_t, std::int64_t>{3, 100},
                                           std::pair<std::int64_t, std::int64_t>{2, 512}));

// ---------------------------------------------------------------------------------------------
// output gate (Qwen3.5's attention): each head times the sigmoid of its gate, read from the q
// projection's rows (each head's query, then its gate)

TEST(OutputGateGpu, MatchesCpuReference) {
  require_device();
  for (const auto& [rows, heads, hd] : {std::tuple{1, 16, 256}, std::tuple{37, 4, 64}, std::tuple{3, 3, 40}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows, " + std::to_string(heads) + " heads of " + std::to_string(hd));
    std::mt19937 rng(unsigned(rows * 31 + hd));
    const std::vector<float> x = random_vector(std::size_t(rows * heads * hd), rng, -4.f, 4.f);
    const std::vector<float> qg = random_vector(std::size_t(rows * heads * 2 * hd), rng, -6.f, 6.f);
    std::vector<float> ref = x;
    const output_gate_params host{.x = ref.data(), .gate = qg.data() + hd, .rows = rows, .heads = heads, .head_dim = hd,
                                  .gate_row_stride = 2 * heads * hd, .gate_head_stride = 2 * hd};
    output_gate_ref(host);
    guarded_array<float> dx(x), dqg(qg);
    output_gate_params p = host;
    p.x = dx.data();
    p.gate = dqg.data() + hd;
    ANVIL_GPU_CHECK(launch_output_gate(p, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_LT(nmse(dx.download(), ref), 1e-12);
    EXPECT_EQ(dqg.download(), qg);
    EXPECT_TRUE(dx.guards_intact() && dqg.guards_intact());
    p.gate_head_stride = hd - 1;
    EXPECT_EQ(launch_output_gate(p, nullptr), hipErrorInvalidValue);
  }
}

// ---------------------------------------------------------------------------------------------
// softcap (Gemma 4's logits): cap * tanh(x / cap) in place, past the grid's stride too

TEST(SoftcapGpu, MatchesCpuReference) {
  require_device();
  for (const std::int64_t n :
       {std::int64_t(1), std::int64_t(1000), std::int64_t(3) * 262144 + 5, std::int64_t(20000000)}) {
    SCOPED_TRACE(std::to_string(n) + " logits");
    std::mt19937 rng(static_cast<unsigned>(n));
    const std::vector<float> x = random_vector(std::size_t(n), rng, -100.f, 100.f);
    std::vector<float> ref = x;
    softcap_ref({.x = ref.data(), .n = n, .cap = 30.f});
    guarded_array<float> dx(x);
    ANVIL_GPU_CHECK(launch_softcap({.x = dx.data(), .n = n, .cap = 30.f}, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    const std::vector<float> got = dx.download();
    EXPECT_LT(nmse(got, ref), 1e-12);
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float v) { return std::abs(v) <= 30.f; }));
    EXPECT_TRUE(dx.guards_intact());
  }
  EXPECT_EQ(launch_softcap({.x = nullptr, .n = 4, .cap = 0.f}, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(launch_softcap({.x = nullptr, .n = -1, .cap = 30.f}, nullptr), hipErrorInvalidValue);
}

// ---------------------------------------------------------------------------------------------
// per-layer inputs (Gemma 4 E2B / E4B)

TEST(PerLayerInputsGpu, MatchesCpuReference) {
  require_device();
  struct shape {
    std::int64_t tokens, layers, dim;
  };
  // E2B / E4B's (35 or 42 layers of 256), dims short of a group of 32 and past it, one token to a
  // prompt chunk.
  for (const shape c : {shape{1, 35, 256}, shape{513, 42, 256}, shape{7, 3, 48}, shape{3, 2, 16}, shape{2, 5, 1024}}) {
    SCOPED_TRACE(std::to_string(c.tokens) + " tokens, " + std::to_string(c.layers) + " layers of " + std::to_string(c.dim));
    std::mt19937 rng(static_cast<unsigned>(c.tokens * 131 + c.layers * 7 + c.dim));
    const std::size_t n = std::size_t(c.tokens * c.layers * c.dim);
    const std::vector<float> y = random_vector(n, rng, -40.f, 40.f), tok = random_vector(n, rng, -2.f, 2.f);
    const std::vector<float> norm = random_vector(std::size_t(c.dim), rng, 0.5f, 1.5f);
    std::vector<float> ref = y;
    const per_layer_inputs_params p{.y = ref.data(),
                                    .tok = tok.data(),
                                    .norm = norm.data(),
                                    .n_tokens = c.tokens,
                                    .n_layers = c.layers,
                                    .dim = c.dim,
                                    .proj_scale = 1.f / 48.f,
                                    .sum_scale = 0.70710678f,
                                    .eps = 1e-6f};
    per_layer_inputs_ref(p);
    guarded_array<float> dy(y), dtok(tok), dnorm(norm);
    per_layer_inputs_params d = p;
    d.y = dy.data(), d.tok = dtok.data(), d.norm = dnorm.data();
    ANVIL_GPU_CHECK(launch_per_layer_inputs(d, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_LT(nmse(dy.download(), ref), 1e-11);
    EXPECT_TRUE(dy.guards_intact() && dtok.guards_intact() && dnorm.guards_intact());
  }
  EXPECT_EQ(launch_per_layer_inputs({.n_tokens = 1, .n_layers = 1, .dim = 1025}, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(launch_per_layer_inputs({.n_tokens = -1, .n_layers = 1, .dim = 16}, nullptr), hipErrorInvalidValue);
}

// ---------------------------------------------------------------------------------------------
// swiglu

struct swiglu_case {
  std::int64_t rows, cols;
  bool fused;     // gate and up are the halves of one [rows, 2 * cols] buffer
  bool in_place;  // out aliases gate
  std::int64_t skew;
  float limit = 0.f;  // > 0: gpt-oss's clamped variant (alpha 1.702); the inputs span [-8, 8]
  glu_activation act = glu_activation::silu;
  std::string str() const {
    std::ostringstream s;
    s << "swiglu(rows=" << rows << ", cols=" << cols << ", fused=" << fused << ", in_place=" << in_place
      << ", skew=" << skew << ", limit=" << limit << ", gelu=" << (act == glu_activation::gelu_tanh) << ")";
    return s.str();
  }
};

class SwigluGpu : public ::testing::TestWithParam<swiglu_case> {};

TEST_P(SwigluGpu, MatchesCpuReference) {
  require_device();
  const swiglu_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(unsigned(c.rows * 17 + c.cols));
  const std::int64_t in_stride = c.fused ? 2 * c.cols : c.cols;
  const std::size_t n_in = std::size_t(c.rows * in_stride) + std::size_t(c.skew) + (c.fused ? 0 : std::size_t(c.rows * c.cols));
  const std::vector<float> in = random_vector(n_in, rng, -8.f, 8.f);
  const std::size_t up_off = std::size_t(c.skew) + (c.fused ? std::size_t(c.cols) : std::size_t(c.rows * c.cols));
  const std::size_t n_out = std::size_t(c.rows * c.cols);

  std::vector<float> ref(n_out);
  swiglu_rows_ref({.gate = in.data() + c.skew,
                   .up = in.data() + up_off,
                   .out = ref.data(),
                   .rows = c.rows,
                   .cols = c.cols,
                   .gate_stride = in_stride,
                   .up_stride = in_stride,
                   .out_stride = c.cols,
                   .limit = c.limit,
                   .alpha = 1.702f,
                   .act = c.act});

  guarded_array<float> din(in), dout(n_out);
  dout.poison();
  swiglu_rows_params p{.gate = din.data() + c.skew,
                       .up = din.data() + up_off,
                       .out = dout.data(),
                       .rows = c.rows,
                       .cols = c.cols,
                       .gate_stride = in_stride,
                       .up_stride = in_stride,
                       .out_stride = c.cols,
                       .limit = c.limit,
                       .alpha = 1.702f,
                       .act = c.act};
  if (c.in_place) {
    p.out = din.data() + c.skew;
    p.out_stride = in_stride;
  }
  ANVIL_GPU_CHECK(launch_swiglu(p, nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  std::vector<float> out;
  if (c.in_place) {
    const std::vector<float> all = din.download();
    for (std::int64_t r = 0; r < c.rows; ++r) {
      const auto row = all.begin() + c.skew + r * in_stride;
      out.insert(out.end(), row, row + c.cols);
    }
  } else {
    out = dout.download();
  }
  const double err = nmse(out, ref);
  std::printf("  %-70s nmse=%.3g\n", c.str().c_str(), err);
  EXPECT_LT(err, 1e-12);
  EXPECT_TRUE(din.guards_intact() && dout.guards_intact());
}

// With yq: out as before, and its 8-bit form bit for bit what the GEMV's own quantizer makes of it.
// Shapes the 8-bit output takes: whole 32-element blocks, aligned (its buffers are its own).
class SwigluX8Gpu : public ::testing::TestWithParam<swiglu_case> {};

TEST_P(SwigluX8Gpu, AlsoWritesOutInEightBitsForTheGemv) {
  require_device();
  const swiglu_case c = GetParam();
  SCOPED_TRACE(c.str());
  ASSERT_TRUE(c.skew == 0 && c.cols % 32 == 0) << "not a shape the 8-bit output takes";
  std::mt19937 rng(unsigned(c.rows * 17 + c.cols));
  const std::size_t n = std::size_t(c.rows * c.cols);
  const std::vector<float> gate = random_vector(n, rng, -6.f, 6.f), up = random_vector(n, rng, -2.f, 2.f);
  std::vector<float> ref(n);
  swiglu_rows_ref({.gate = gate.data(),
                   .up = up.data(),
                   .out = ref.data(),
                   .rows = c.rows,
                   .cols = c.cols,
                   .gate_stride = c.cols,
                   .up_stride = c.cols,
                   .out_stride = c.cols,
                   .act = c.act});
  guarded_array<float> dg(gate), du(up), dout(n), dds(n / 8);
  guarded_array<std::int8_t> dq(n);
  dout.poison();
  dq.poison();
  dds.poison();
  swiglu_rows_params p{.gate = dg.data(),
                       .up = du.data(),
                       .out = dout.data(),
                       .rows = c.rows,
                       .cols = c.cols,
                       .gate_stride = c.cols,
                       .up_stride = c.cols,
                       .out_stride = c.cols,
                       .act = c.act};
  p.yq = dq.data();
  p.yq_scales = dds.data();
  ANVIL_GPU_CHECK(launch_swiglu(p, nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  const std::vector<float> out = dout.download();
  EXPECT_LT(nmse(out, ref), 1e-12);
  const x8_host want = quantize_x8_host(out);
  EXPECT_TRUE(dq.download() == want.q) << "int8 values differ from the GEMV quantizer's";
  EXPECT_TRUE(dds.download() == want.ds) << "scales differ from the GEMV quantizer's";
  for (auto* g : {&dg, &du, &dout, &dds}) EXPECT_TRUE(g->guards_intact());
  EXPECT_TRUE(dq.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(Shapes, SwigluGpu,
                         ::testing::Values(swiglu_case{1, 1, false, false, 0}, swiglu_case{7, 4864, true, false, 0},
                                           swiglu_case{7, 4864, false, false, 0}, swiglu_case{3, 14336, true, true, 0},
                                           swiglu_case{5, 1001, true, false, 0}, swiglu_case{4, 896, false, false, 3},
                                           swiglu_case{70000, 8, false, true, 0},
                                           swiglu_case{7, 2880, false, false, 0, 7.f},
                                           swiglu_case{5, 1001, true, false, 0, 7.f},
                                           // GeGLU (gemma3): vector and scalar paths, in place
                                           swiglu_case{7, 15360, false, false, 0, 0.f, glu_activation::gelu_tanh},
                                           swiglu_case{5, 1001, true, true, 0, 0.f, glu_activation::gelu_tanh}));

INSTANTIATE_TEST_SUITE_P(Shapes, SwigluX8Gpu,
                         ::testing::Values(swiglu_case{7, 4864, true, false, 0}, swiglu_case{7, 4864, false, false, 0},
                                           swiglu_case{3, 14336, true, true, 0},
                                           swiglu_case{7, 15360, false, false, 0, 0.f, glu_activation::gelu_tanh}));

// ---------------------------------------------------------------------------------------------
// candidates

struct cand_seq_case {
  std::int32_t top_k;
  float temperature;
  bool penalties;
  bool bias;
  int logit_kind;  // 0: continuous, 1: quantised (many ties), 2: mostly -inf, 3: all equal
  int mask = 0;    // constrained decoding (logit_params::allowed): 0 none, 1 two tokens in five, 2 one token
};

struct cand_case {
  std::int64_t vocab;
  std::vector<cand_seq_case> seqs;
  std::string str() const {
    std::ostringstream s;
    s << "candidates(vocab=" << vocab << ", k=[";
    for (std::size_t i = 0; i < seqs.size(); ++i) s << (i ? " " : "") << seqs[i].top_k << "/" << seqs[i].logit_kind;
    s << "])";
    return s.str();
  }
};

// One launch of the candidates op over `params.size()` sequences, with sentinels around every
// buffer; the records, copied back.
std::vector<unsigned char> run_candidates_gpu(const std::vector<float>& logits, const std::vector<logit_params>& params,
                                              const std::vector<std::int64_t>& positions, std::int64_t vocab) {
  const candidates_batch b = pack_candidates(params, positions, vocab);
  const std::size_t rec = candidates_record_bytes(candidates_max_k);
  guarded_array<float> dlogits(logits);
  guarded_array<candidates_seq> dseqs(b.seqs);
  guarded_array<std::int32_t> dbias_ids(b.bias_ids.empty() ? std::vector<std::int32_t>{0} : b.bias_ids);
  guarded_array<float> dbias_values(b.bias_values.empty() ? std::vector<float>{0.f} : b.bias_values);
  guarded_array<std::int32_t> dcount_ids(b.count_ids.empty() ? std::vector<std::int32_t>{0} : b.count_ids);
  guarded_array<std::int32_t> dcount_values(b.count_values.empty() ? std::vector<std::int32_t>{0} : b.count_values);
  guarded_array<std::uint32_t> dmask(b.mask_words.empty() ? std::vector<std::uint32_t>{0} : b.mask_words);
  guarded_array<unsigned char> dout(params.size() * rec);
  dout.poison();
  const std::size_t ws_bytes = candidates_workspace(std::int64_t(params.size()), vocab, candidates_max_k).bytes;
  guarded_array<unsigned char> dws(ws_bytes);
  dws.poison();
  const candidates_params p{.logits = dlogits.data(),
                            .vocab = vocab,
                            .n_seqs = std::int64_t(params.size()),
                            .seqs = dseqs.data(),
                            .bias_ids = dbias_ids.data(),
                            .bias_values = dbias_values.data(),
                            .count_ids = dcount_ids.data(),
                            .count_values = dcount_values.data(),
                            .mask_words = dmask.data(),
                            .max_k = candidates_max_k,
                            .out = dout.data(),
                            .workspace = dws.data(),
                            .workspace_bytes = ws_bytes,
                            .draw = std::any_of(params.begin(), params.end(), [](const logit_params& l) { return l.draw.on; })};
  // EXPECT, not ANVIL_GPU_CHECK: a function that returns a value cannot ASSERT.
  const hipError_t launched = launch_candidates(p, nullptr);
  EXPECT_EQ(launched, hipSuccess) << hipGetErrorString(launched);
  const hipError_t finished = hipDeviceSynchronize();
  EXPECT_EQ(finished, hipSuccess) << hipGetErrorString(finished);
  const std::vector<unsigned char> records = dout.download();
  EXPECT_TRUE(dout.guards_intact() && dlogits.guards_intact() && dseqs.guards_intact() && dws.guards_intact());
  EXPECT_TRUE(dbias_ids.guards_intact() && dbias_values.guards_intact());
  EXPECT_TRUE(dcount_ids.guards_intact() && dcount_values.guards_intact() && dmask.guards_intact());
  return records;
}

class CandidatesGpu : public ::testing::TestWithParam<cand_case> {};

TEST_P(CandidatesGpu, MatchesCandidatesRef) {
  require_device();
  const cand_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(unsigned(c.vocab + c.seqs.size() * 101));
  const std::size_t vocab = std::size_t(c.vocab), n_seqs = c.seqs.size();
  std::vector<float> logits(n_seqs * vocab);
  std::vector<logit_params> params(n_seqs);
  std::vector<std::int64_t> positions(n_seqs);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_int_distribution<std::int32_t> token(0, std::int32_t(c.vocab - 1));
  for (std::size_t s = 0; s < n_seqs; ++s) {
    const cand_seq_case& q = c.seqs[s];
    float* l = logits.data() + s * vocab;
    for (std::size_t t = 0; t < vocab; ++t) {
      float x = normal(rng);
      if (q.logit_kind == 1) x = std::round(x * 2.f) / 2.f;  // ties everywhere, -0 and +0 too
      if (q.logit_kind == 2) x = t % 97 == 5 ? std::round(x) : -INFINITY;
      if (q.logit_kind == 3) x = t % 2 == 0 ? 0.f : -0.f;  // one value everywhere: every slice's top is all ties
      if (q.logit_kind == 0 && t % 1013 == 7) x = -INFINITY;
      l[t] = x;
    }
    logit_params& p = params[s];
    p.top_k = q.top_k;
    p.temperature = q.temperature;
    p.seed = 1234567 + s;
    positions[s] = std::int64_t(17 + 1000 * s);
    // The draw, with cuts of every kind across the sequences (greedy ones take the first).
    p.draw = {.on = s % 5 != 4,
              .top_k = s % 2 == 1 ? 0 : std::max(1, q.top_k / 2),
              .top_p = s % 3 == 0 ? 0.9f : 1.f,
              .min_p = s % 4 == 1 ? 0.05f : 0.f};
    if (q.bias) {
      for (int i = 0; i < 20; ++i) p.logit_bias.push_back({token(rng), normal(rng)});
      p.logit_bias.push_back(p.logit_bias.front());  // a repeated id adds up
      p.logit_bias.push_back({std::int32_t(vocab - 1), 5.f});
    }
    if (q.mask != 0) {
      p.allowed.assign((vocab + 31) / 32, 0u);
      for (std::size_t t = 0; t < vocab; ++t) {
        const bool on = q.mask == 1 ? (t * 7919) % 5 < 2 || t + 1 == vocab : t == vocab / 3;
        if (on) p.allowed[t / 32] |= 1u << (t % 32);
      }
    }
    if (q.penalties) {
      p.repetition_penalty = 1.3f;
      p.presence_penalty = 0.4f;
      p.frequency_penalty = 0.15f;
      std::vector<std::int32_t> ids;
      for (int i = 0; i < 40; ++i) ids.push_back(token(rng));
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      std::shuffle(ids.begin(), ids.end(), rng);
      for (std::size_t i = 0; i < ids.size(); ++i) p.token_counts.push_back({ids[i], std::int32_t(i % 5)});
    }
  }

  const std::size_t rec = candidates_record_bytes(candidates_max_k);
  const std::vector<unsigned char> records = run_candidates_gpu(logits, params, positions, c.vocab);

  for (std::size_t s = 0; s < n_seqs; ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    const seq_output ref = candidates_ref(std::span<const float>(logits.data() + s * vocab, vocab), params[s], positions[s]);
    seq_output got = unpack_candidates(records.data() + s * rec);
    candidates_record_header h;
    std::memcpy(&h, records.data() + s * rec, sizeof h);
    EXPECT_EQ(h.flags, 0);
    // The device's draw is the host's from the same record (kernels/draw.h: up to the last bit of
    // exp, which a boundary this close would need).
    got.position = positions[s];
    EXPECT_EQ(got.drawn, draw_token(got, params[s]));
    if (!params[s].draw.on) {
      EXPECT_EQ(got.drawn, -1);
    }
    ASSERT_EQ(got.top.size(), ref.top.size());
    std::size_t top_mismatch = 0;
    for (std::size_t i = 0; i < ref.top.size(); ++i) {
      top_mismatch += got.top[i].token != ref.top[i].token || !(got.top[i].logit == ref.top[i].logit ||
                                                               (std::isinf(ref.top[i].logit) && got.top[i].logit == ref.top[i].logit));
    }
    EXPECT_EQ(top_mismatch, 0u) << "first: got " << got.top[0].token << " ref " << ref.top[0].token;
    EXPECT_NEAR(got.log_normalizer, ref.log_normalizer, 2e-6 * std::max(1.f, std::fabs(ref.log_normalizer)));
    EXPECT_NEAR(got.tail_mass, ref.tail_mass, 1e-6 * std::max(1e-3f, ref.tail_mass));
    EXPECT_EQ(got.tail.token, ref.tail.token);
    EXPECT_EQ(got.tail.logit, ref.tail.logit);
    std::printf("  %-50s seq %zu: k=%zu lse=%.7g tail_mass=%.4g tail=%d\n", c.str().c_str(), s, ref.top.size(),
                double(got.log_normalizer), double(got.tail_mass), got.tail.token);
  }
}

std::vector<cand_case> candidate_cases() {
  std::vector<cand_case> cases;
  for (std::int64_t vocab : {1000, 151936}) {
    cases.push_back({vocab, {{1, 0.f, false, false, 0}}});
    cases.push_back({vocab, {{64, 0.7f, true, true, 0}}});
    cases.push_back({vocab, {{256, 1.f, false, false, 1}}});  // ties at the cut
    cases.push_back({vocab, {{64, 0.f, true, false, 1}, {256, 1.3f, false, true, 2}, {1, 0.5f, true, true, 0},
                             {17, 0.9f, false, false, 1}}});  // a batch
  }
  cases.push_back({200, {{256, 1.f, false, false, 0}}});  // top_k beyond the vocabulary: no tail
  cases.push_back({3000, {{256, 1.f, false, false, 2}}});  // fewer finite logits than K
  // Slices of 4096 tokens: a last slice of one token, one shorter than K, and ties across slices.
  cases.push_back({4097, {{256, 1.f, false, false, 1}, {5, 0.8f, true, true, 0}}});
  cases.push_back({8192 + 100, {{256, 1.f, false, false, 3}, {3, 0.f, false, false, 3}, {256, 0.6f, false, false, 1}}});
  cases.push_back({candidates_max_vocab, {{40, 1.f, false, false, 0}, {256, 1.f, false, false, 3}}});
  // Constrained decoding: masks beside unmasked sequences, with bias and penalties; a mask of one token.
  for (std::int64_t vocab : {1000, 151936}) {
    cases.push_back({vocab, {{64, 1.f, true, true, 0, 1}, {256, 0.f, false, false, 1}, {16, 0.8f, false, true, 0, 2},
                             {256, 1.f, false, false, 1, 1}}});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CandidatesGpu, ::testing::ValuesIn(candidate_cases()));

// The sampling-edge property test of tests/sampler/edge_params_test.cpp, on the GPU op: thousands
// of accepted parameter sets (edges, subnormals) over logits of any finite scale, 64 sequences a
// launch. No record may be flagged (a non-finite processed logit), and each must match the
// reference as MatchesCandidatesRef requires.
TEST(CandidatesGpuEdges, AcceptedParameterSetsGiveFiniteRecordsEqualToTheReference) {
  require_device();
  std::mt19937_64 rng(20261124);
  const std::int64_t vocab = 5000;  // two slices, the second short
  std::size_t mismatched = 0, flagged = 0, sets = 0, drawn_differ = 0;
  for (int launch = 0; launch < 48; ++launch) {
    const std::size_t n_seqs = 64;
    std::vector<float> logits;
    std::vector<logit_params> params;
    std::vector<anvil::sampler::sampling_params> sampling;
    std::vector<std::int64_t> positions;
    for (std::size_t s = 0; s < n_seqs; ++s) {
      const anvil::sampler::sampling_params sp = anvil::testing::edge_sampling_params(rng, std::int32_t(vocab));
      ASSERT_FALSE(anvil::sampler::validate(sp, vocab));
      const std::vector<float> l = anvil::testing::edge_logits(rng, std::int32_t(vocab));
      logits.insert(logits.end(), l.begin(), l.end());
      const std::int32_t k = anvil::testing::candidates_k(sp, candidates_max_k);
      params.push_back(anvil::testing::logit_params_of(sp, anvil::testing::edge_token_counts(rng, std::int32_t(vocab)), k));
      sampling.push_back(sp);
      positions.push_back(std::int64_t(launch * 1000 + int(s)));
    }
    const std::vector<unsigned char> records = run_candidates_gpu(logits, params, positions, vocab);
    const std::size_t rec = candidates_record_bytes(candidates_max_k);
    for (std::size_t s = 0; s < n_seqs; ++s, ++sets) {
      candidates_record_header h;
      std::memcpy(&h, records.data() + s * rec, sizeof h);
      if (h.flags != 0) {
        ++flagged;
        ADD_FAILURE() << "set " << sets << " flagged " << h.flags << ": temperature " << sampling[s].temperature
                      << " repetition " << sampling[s].repetition_penalty;
        continue;
      }
      seq_output got = unpack_candidates(records.data() + s * rec);
      got.position = positions[s];
      drawn_differ += got.drawn != draw_token(got, params[s]);
      const seq_output ref =
          candidates_ref(std::span<const float>(logits.data() + s * std::size_t(vocab), std::size_t(vocab)), params[s], positions[s]);
      EXPECT_TRUE(std::isfinite(got.log_normalizer));
      EXPECT_FALSE(anvil::sampler::check_candidates(got)) << "set " << sets;
      bool same = got.top.size() == ref.top.size() && got.tail.token == ref.tail.token &&
                  std::fabs(got.log_normalizer - ref.log_normalizer) <= 2e-6f * std::max(1.f, std::fabs(ref.log_normalizer));
      for (std::size_t i = 0; same && i < ref.top.size(); ++i) {
        same = got.top[i].token == ref.top[i].token && got.top[i].logit == ref.top[i].logit;
      }
      mismatched += !same;
    }
  }
  std::printf("  candidates edges: %zu parameter sets, %zu flagged, %zu differ from the reference, %zu draws differ\n",
              sets, flagged, mismatched, drawn_differ);
  EXPECT_EQ(drawn_differ, 0u);
  EXPECT_EQ(flagged, 0u);
  EXPECT_EQ(mismatched, 0u);
}

TEST(CandidatesGpuLaunch, RejectsBadShapesWithoutLaunching) {
  require_device();
  candidates_params p{.vocab = 0, .n_seqs = 1};
  EXPECT_EQ(launch_candidates(p, nullptr), hipErrorInvalidValue);
  p.vocab = 10;
  p.max_k = candidates_max_k + 1;
  EXPECT_EQ(launch_candidates(p, nullptr), hipErrorInvalidValue);
  p.max_k = candidates_max_k;  // no workspace
  EXPECT_EQ(launch_candidates(p, nullptr), hipErrorInvalidValue);
  p.vocab = candidates_max_vocab + 1;
  EXPECT_EQ(launch_candidates(p, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(hipGetLastError(), hipSuccess);
}

// The candidates merge over vocabulary slices (tensor parallelism): each rank's records from the
// GPU candidates op on its slice, gathered; the GPU merge equals the host's on the same records
// (kernels/candidates_merge.h), and its top is the whole vocabulary's reference top.
TEST(CandidatesMergeGpu, MatchesTheHostMergeAndTheWholeVocabularysTop) {
  require_device();
  std::mt19937 rng(20261129);
  std::normal_distribution<float> normal(0.f, 3.f);
  const std::size_t rec = candidates_record_bytes(candidates_max_k);
  for (const int ranks : {2, 3, 4}) {
    const std::int64_t vocab = 9001;
    const std::int64_t stride = (vocab + ranks - 1) / ranks;
    const std::size_t n_seqs = 7;
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    std::vector<float> logits(n_seqs * std::size_t(vocab));
    for (float& x : logits) x = normal(rng);
    std::vector<logit_params> params(n_seqs);
    std::vector<std::int64_t> positions(n_seqs);
    for (std::size_t s = 0; s < n_seqs; ++s) {
      logit_params& p = params[s];
      p.top_k = std::array<std::int32_t, 7>{1, 2, 40, 64, 255, candidates_max_k, 17}[s];
      p.temperature = s % 2 == 0 ? 0.f : 0.8f;
      p.seed = 99 + s;
      p.draw = {.on = s != 6, .top_k = s == 3 ? 10 : 0, .top_p = s == 5 ? 0.9f : 1.f, .min_p = s == 1 ? 0.05f : 0.f};
      p.logit_bias = {{std::int32_t(stride - 1), 9.f}, {std::int32_t(stride), 8.f}};  // beside a slice boundary
      if (s == 4) {
        p.allowed.assign(std::size_t((vocab + 31) / 32), 0u);  // the last rank's slice all masked out
        for (std::int64_t t = 0; t < stride * (ranks - 1); t += 3) p.allowed[std::size_t(t / 32)] |= 1u << (t % 32);
      }
      positions[s] = std::int64_t(5 + 31 * s);
    }
    std::vector<unsigned char> gathered;
    candidates_merge_params mp{.n_ranks = ranks, .n_seqs = std::int64_t(n_seqs), .record_bytes = rec, .vocab = vocab, .draw = true};
    for (int q = 0; q < ranks; ++q) {
      const std::int64_t b = std::min(vocab, stride * q), e = std::min(vocab, stride * (q + 1));
      mp.vocab_begin[q] = std::int32_t(b);
      std::vector<float> slice;
      std::vector<logit_params> sp;
      for (std::size_t s = 0; s < n_seqs; ++s) {
        slice.insert(slice.end(), logits.begin() + std::ptrdiff_t(s * std::size_t(vocab) + std::size_t(b)),
                     logits.begin() + std::ptrdiff_t(s * std::size_t(vocab) + std::size_t(e)));
        sp.push_back(slice_logit_params(params[s], b, e, q));
      }
      const std::vector<unsigned char> part = run_candidates_gpu(slice, sp, positions, e - b);
      gathered.insert(gathered.end(), part.begin(), part.end());
    }
    const candidates_batch whole = pack_candidates(params, positions, vocab);
    std::vector<unsigned char> want(n_seqs * rec);
    mp.parts = gathered.data();
    mp.seqs = whole.seqs.data();
    mp.out = want.data();
    merge_candidates_host(mp);
    guarded_array<unsigned char> dparts(gathered), dout(n_seqs * rec);
    guarded_array<candidates_seq> dseqs(whole.seqs);
    dout.poison();
    mp.parts = dparts.data();
    mp.seqs = dseqs.data();
    mp.out = dout.data();
    ANVIL_GPU_CHECK(launch_candidates_merge(mp, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    const std::vector<unsigned char> got = dout.download();
    EXPECT_TRUE(dparts.guards_intact() && dout.guards_intact() && dseqs.guards_intact());
    for (std::size_t s = 0; s < n_seqs; ++s) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      const seq_output g = unpack_candidates(got.data() + s * rec), w = unpack_candidates(want.data() + s * rec);
      const seq_output ref = candidates_ref(std::span<const float>(logits.data() + s * std::size_t(vocab), std::size_t(vocab)),
                                            params[s], positions[s]);
      ASSERT_EQ(g.top.size(), ref.top.size());
      for (std::size_t i = 0; i < g.top.size(); ++i) {
        EXPECT_EQ(g.top[i].token, ref.top[i].token) << i;
        EXPECT_EQ(g.top[i].logit, ref.top[i].logit) << i;
      }
      EXPECT_NEAR(g.log_normalizer, w.log_normalizer, 1e-6 * std::max(1.f, std::abs(w.log_normalizer)));
      EXPECT_NEAR(g.log_normalizer, ref.log_normalizer, 1e-5 * std::max(1.f, std::abs(ref.log_normalizer)));
      EXPECT_NEAR(g.tail_mass, w.tail_mass, 1e-6);
      EXPECT_EQ(g.tail.token, w.tail.token);
      EXPECT_EQ(g.drawn, w.drawn);
      if (params[s].draw.on && params[s].temperature == 0.f) {
        EXPECT_EQ(g.drawn, ref.top[0].token);
      }
    }
  }
  EXPECT_EQ(launch_candidates_merge({.n_ranks = 0, .record_bytes = rec, .vocab = 1}, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(launch_candidates_merge({.n_ranks = 1, .n_seqs = 1, .record_bytes = rec, .vocab = 1}, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(launch_candidates_merge({.n_ranks = 1, .n_seqs = 0, .record_bytes = rec, .vocab = 1}, nullptr), hipSuccess);
}

// The one-shot all-reduce, its ranks played by streams of one device (the kernel takes any device
// pointers; on several GPUs they are peers'): every rank's x becomes the sum in rank order, bit for
// bit, over calls of different sizes in a row (the epochs and the two staging halves), each rank's
// calls enqueued whole before the next rank's; and an abort ends a rank's wait for a rank that
// never comes.
struct p2p_group {
  static constexpr std::int64_t capacity = 4 * all_reduce_p2p_chunk;
  int n;
  std::vector<std::unique_ptr<guarded_array<float>>> staging;
  std::vector<std::unique_ptr<guarded_array<unsigned>>> flags;  // flags, then epochs
  int* abort_host = nullptr;
  explicit p2p_group(int ranks) : n(ranks) {
    for (int q = 0; q < n; ++q) {
      staging.push_back(std::make_unique<guarded_array<float>>(all_reduce_p2p_staging_bytes(capacity, n) / 4));
      flags.push_back(std::make_unique<guarded_array<unsigned>>(
          std::vector<unsigned>(all_reduce_p2p_flag_bytes(capacity, n) / 4, 0u)));
    }
    if (hipHostMalloc(reinterpret_cast<void**>(&abort_host), sizeof(int), hipHostMallocMapped) != hipSuccess) {
      throw std::runtime_error("hipHostMalloc");
    }
    *abort_host = 0;
  }
  ~p2p_group() { (void)hipHostFree(abort_host); }
  all_reduce_p2p_rank rank(int r, float* x, std::int64_t elems) const {
    all_reduce_p2p_rank p{.x = x, .n = elems, .rank = r, .n_ranks = n, .capacity = capacity};
    for (int q = 0; q < n; ++q) {
      p.staging[q] = staging[std::size_t(q)]->data();
      p.flags[q] = flags[std::size_t(q)]->data();
    }
    p.epochs = flags[std::size_t(r)]->data() + std::int64_t(n) * all_reduce_p2p_blocks(capacity);
    void* dev = nullptr;
    if (hipHostGetDevicePointer(&dev, abort_host, 0) != hipSuccess) throw std::runtime_error("hipHostGetDevicePointer");
    p.abort = static_cast<const volatile int*>(dev);
    return p;
  }
};

TEST(AllReduceP2pGpu, EveryRankGetsTheSumInRankOrderCallAfterCall) {
  require_device();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  const std::vector<std::int64_t> sizes = {1, 5, all_reduce_p2p_chunk, all_reduce_p2p_chunk + 7, 3000, p2p_group::capacity, 64};
  for (const int ranks : {1, 2, 3, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    p2p_group g(ranks);
    std::vector<hipStream_t> streams(static_cast<std::size_t>(ranks));
    for (auto& s : streams) ANVIL_GPU_CHECK(hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
    // Each (call, rank) its own x, uploaded before any launch: a copy on a stream whose rank waits
    // for ranks not yet enqueued would block this thread.
    std::vector<std::vector<std::vector<float>>> in(sizes.size());
    std::vector<std::vector<std::unique_ptr<guarded_array<float>>>> xs(sizes.size());
    for (std::size_t c = 0; c < sizes.size(); ++c) {
      for (int r = 0; r < ranks; ++r) {
        std::vector<float> x(std::size_t(sizes[c]));
        for (float& v : x) v = normal(rng);
        in[c].push_back(x);
        xs[c].push_back(std::make_unique<guarded_array<float>>(x));
      }
    }
    for (int r = 0; r < ranks; ++r) {  // rank r's calls, all enqueued before rank r + 1's
      for (std::size_t c = 0; c < sizes.size(); ++c) {
        ANVIL_GPU_CHECK(launch_all_reduce_p2p(g.rank(r, xs[c][std::size_t(r)]->data(), sizes[c]), streams[std::size_t(r)]));
      }
    }
    for (auto& s : streams) ANVIL_GPU_CHECK(hipStreamSynchronize(s));
    for (std::size_t c = 0; c < sizes.size(); ++c) {
      std::vector<std::vector<float>> want = in[c];
      all_reduce_p2p_ref(want);
      for (int r = 0; r < ranks; ++r) {
        EXPECT_EQ(xs[c][std::size_t(r)]->download(), want[std::size_t(r)]) << "call " << c << ", rank " << r;
        EXPECT_TRUE(xs[c][std::size_t(r)]->guards_intact());
      }
    }
    for (int r = 0; r < ranks; ++r) {
      EXPECT_TRUE(g.staging[std::size_t(r)]->guards_intact() && g.flags[std::size_t(r)]->guards_intact());
    }
    for (auto& s : streams) ANVIL_GPU_CHECK(hipStreamDestroy(s));
  }
}

TEST(AllReduceP2pGpu, AnAbortEndsTheWaitForARankThatNeverComes) {
  require_device();
  p2p_group g(2);
  guarded_array<float> x(std::vector<float>(100, 1.f));
  hipStream_t s{};
  ANVIL_GPU_CHECK(hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
  ANVIL_GPU_CHECK(launch_all_reduce_p2p(g.rank(0, x.data(), 100), s));  // rank 1 never launches
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(hipStreamQuery(s), hipErrorNotReady) << "rank 0 waits for rank 1";
  *g.abort_host = 1;
  ANVIL_GPU_CHECK(hipStreamSynchronize(s));
  ANVIL_GPU_CHECK(hipStreamDestroy(s));
  float y = 0;
  all_reduce_p2p_rank p = g.rank(0, &y, p2p_group::capacity + 1);
  EXPECT_EQ(launch_all_reduce_p2p(p, nullptr), hipErrorInvalidValue);
  p = g.rank(2 - 1, &y, 1);
  p.n_ranks = all_reduce_p2p_max_ranks + 1;
  EXPECT_EQ(launch_all_reduce_p2p(p, nullptr), hipErrorInvalidValue);
  p = g.rank(0, nullptr, 1);
  EXPECT_EQ(launch_all_reduce_p2p(p, nullptr), hipErrorInvalidValue);
}

// feed_tokens: the draws of one step's records written into the next step's ids, on rows in any
// order; a record that drew nothing (-1) feeds token 0; rows not fed keep their ids; nothing
// outside the ids is written.
TEST(FeedTokensGpu, WritesEachFedRowTheDrawOfItsRecordAsTheReference) {
  require_device();
  std::mt19937 rng(20261126);
  for (const std::int32_t max_k : {1, 7, candidates_max_k}) {
    for (const std::int64_t n_records : {1, 5, 256}) {
      SCOPED_TRACE("max_k " + std::to_string(max_k) + ", records " + std::to_string(n_records));
      const std::size_t rec = candidates_record_bytes(max_k);
      std::vector<unsigned char> records(std::size_t(n_records) * rec, 0xab);
      for (std::int64_t r = 0; r < n_records; ++r) {
        candidates_record_header h;
        h.drawn = r % 7 == 3 ? -1 : std::int32_t(rng() % 150000);
        std::memcpy(records.data() + std::size_t(r) * rec, &h, sizeof h);
      }
      const std::int64_t tokens = 3 * n_records + 11;
      std::vector<std::int32_t> ids(static_cast<std::size_t>(tokens));
      for (auto& t : ids) t = std::int32_t(rng() % 1000);
      // Every record feeds one row, the rows shuffled over the step.
      std::vector<std::int32_t> rows(static_cast<std::size_t>(tokens)), from(static_cast<std::size_t>(n_records));
      for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = std::int32_t(i);
      std::shuffle(rows.begin(), rows.end(), rng);
      rows.resize(std::size_t(n_records));
      for (std::size_t i = 0; i < from.size(); ++i) from[i] = std::int32_t(i);
      std::shuffle(from.begin(), from.end(), rng);

      std::vector<std::int32_t> want = ids;
      feed_tokens_ref({.ids = want.data(), .rows = rows.data(), .from = from.data(), .records = records.data(),
                       .record_bytes = rec, .n = n_records});
      guarded_array<std::int32_t> dids(ids), drows(rows), dfrom(from);
      guarded_array<unsigned char> drecords(records);
      ANVIL_GPU_CHECK(launch_feed_tokens({.ids = dids.data(), .rows = drows.data(), .from = dfrom.data(),
                                          .records = drecords.data(), .record_bytes = rec, .n = n_records},
                                         nullptr));
      ANVIL_GPU_CHECK(hipDeviceSynchronize());
      EXPECT_EQ(dids.download(), want);
      EXPECT_TRUE(dids.guards_intact() && drows.guards_intact() && dfrom.guards_intact() && drecords.guards_intact());
      std::size_t zero_fed = 0;
      for (std::size_t i = 0; i < rows.size(); ++i) zero_fed += want[std::size_t(rows[i])] == 0;
      if (n_records >= 4) {
        EXPECT_GT(zero_fed, 0u) << "record 3 drew nothing: its row is fed 0";
      }
    }
  }
  EXPECT_EQ(launch_feed_tokens({.n = 0}, nullptr), hipSuccess);
  EXPECT_EQ(launch_feed_tokens({.n = -1}, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(launch_feed_tokens({.n = 1}, nullptr), hipErrorInvalidValue);
}

}  // namespace

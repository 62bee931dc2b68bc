// GEMV kernel (launch_gemv) against matmul_ref for every weight type, several shapes (odd row
// counts, rows shorter and longer than a warp's stride) and every decode batch size 1..8, with
// and without bias. Outputs are poisoned and guarded. Label: gpu.
//
// Tolerances, per output, relative to its |W|.|x| scale:
//   F32, F16, BF16: 1e-5 of matmul_ref (the formats dequantize exactly; only the summation order
//     differs).
//   Quantized types: the kernel rounds x to 8 bits per 32-element block (q = rint(x / d),
//     d = max|x| / 127) and multiplies in integers. Two checks: (1) against matmul_ref applied to
//     that rounded x (mirrored here bit for bit), 1e-5 as above: the integer path is exact; (2)
//     against matmul_ref on x itself, within the rounding's own bound sum_i |W[o,i]| |x_i - x8_i|
//     (at most half a step, max|x| / 254 per element) plus 1e-5: nothing beyond the activation
//     rounding. The largest error against the float reference is printed (~1e-3 of the scale,
//     what llama.cpp's Q8_1 activations give; its tests accept 1e-2).
//   Quantized types with gemv_activations::f32: 1e-5 of matmul_ref on x itself (exact decode).
// Group launches and prepared 8-bit activations (gemv_x8_source::workspace) must equal single
// launches bit for bit. The fused gate / up / gated product (launch_gemv_glu) must equal the group
// launch followed by launch_swiglu bit for bit (floats and 8-bit rows), and the CPU reference
// (matmul_ref on the rounded x, then swiglu_rows_ref) within 1e-5 of the product's scale.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gemv.h"
#include "kernels/swiglu.h"
#include "tests/kernels/matmul_gpu_cases.h"

namespace {

using namespace anvil::kernels;
using namespace anvil::kernels::testing;

struct gemv_case {
  ggml_type type;
  std::int64_t out, in;
  std::string str() const {
    std::ostringstream s;
    s << "gemv(" << type_name(type) << ", out=" << out << ", in=" << in << ")";
    return s.str();
  }
};

std::vector<gemv_case> gemv_cases() {
  std::vector<gemv_case> cases;
  for (ggml_type t : gpu_weight_types()) {
    const std::int64_t b = anvil::model::info(t).block_elems == 256 ? 256 : 32;
    for (auto [out, in] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, b}, {7, 3 * b}, {37, 4096}, {131, 2 * b}, {257, 5 * b}, {64, 896}, {5, 14336}}) {
      if (in % b != 0) continue;
      cases.push_back({t, out, in});
    }
  }
  return cases;
}

// x rounded as the kernel's activation quantizer rounds it (kernels/gemv.hip quantize_x_kernel).
std::vector<float> round_to_q8(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (std::size_t b = 0; b < x.size(); b += 32) {
    float amax = 0.f;
    for (std::size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    for (std::size_t i = b; i < b + 32; ++i) r[i] = std::rint(x[i] * id) * d;
  }
  return r;
}

// Largest amount by which |out - ref| exceeds bound = sum_i |W[o,i]| |x_i - x8_i| + 1e-5 * scale,
// relative to the scale (<= 0 when every output is within its bound; NaN for a NaN output).
double excess_over_rounding_bound(const std::vector<float>& out, const std::vector<float>& ref, const host_weight& w,
                                  const std::vector<float>& x, const std::vector<float>& x8, std::int64_t n_tokens) {
  double worst = -1;
  for (std::int64_t t = 0; t < n_tokens; ++t) {
    for (std::int64_t o = 0; o < w.rows; ++o) {
      double scale = 0, bound = 0;
      for (std::int64_t i = 0; i < w.cols; ++i) {
        const double wi = std::fabs(double(w.values[std::size_t(o * w.cols + i)]));
        scale += wi * std::fabs(double(x[std::size_t(t * w.cols + i)]));
        bound += wi * std::fabs(double(x[std::size_t(t * w.cols + i)]) - double(x8[std::size_t(t * w.cols + i)]));
      }
      const std::size_t k = std::size_t(t * w.rows + o);
      const double err = std::fabs(double(out[k]) - double(ref[k]));
      if (std::isnan(err)) return err;
      worst = std::max(worst, (err - bound - 1e-5 * scale) / (scale > 0 ? scale : 1.0));
    }
  }
  return worst;
}

class GemvGpu : public ::testing::TestWithParam<gemv_case> {};

TEST_P(GemvGpu, MatchesCpuReferenceForEveryBatchSize) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  const gemv_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(static_cast<unsigned>(c.out * 131 + c.in + int(c.type) * 7919));
  const host_weight w(c.type, c.out, c.in, rng);
  const std::vector<float> x = random_vector(std::size_t(gemv_max_tokens * c.in), rng, -2.f, 2.f);
  const std::vector<float> bias = random_vector(std::size_t(c.out), rng, -1.f, 1.f);
  const std::size_t ws_bytes = gemv_workspace_bytes(c.type, c.in, gemv_max_tokens);
  const bool q8 = ws_bytes > 0;
  const std::vector<float> x8 = q8 ? round_to_q8(x) : x;
  device_bytes ws(ws_bytes);

  device_bytes dw(w.bytes.size());
  dw.upload(w.bytes.data(), w.bytes.size());
  guarded_buffer dx(x.size()), db(bias.size());
  dx.upload(x);
  db.upload(bias);

  for (std::int64_t nt = 1; nt <= gemv_max_tokens; ++nt) {
    const bool with_bias = nt % 2 == 1;
    SCOPED_TRACE("n_tokens=" + std::to_string(nt) + (with_bias ? " bias" : ""));
    std::vector<float> ref(std::size_t(nt * c.out)), ref8(ref.size());
    matmul_ref({.w = w.bytes.data(),
                .w_type = c.type,
                .in = c.in,
                .out = c.out,
                .bias = with_bias ? bias.data() : nullptr,
                .x = x.data(),
                .y = ref.data(),
                .n_tokens = nt});
    matmul_ref({.w = w.bytes.data(),
                .w_type = c.type,
                .in = c.in,
                .out = c.out,
                .bias = with_bias ? bias.data() : nullptr,
                .x = x8.data(),
                .y = ref8.data(),
                .n_tokens = nt});

    guarded_buffer dy(ref.size());
    dy.poison();
    ANVIL_GPU_CHECK(launch_gemv({.w = dw.data(),
                                 .w_type = c.type,
                                 .in = c.in,
                                 .out = c.out,
                                 .bias = with_bias ? db.data() : nullptr,
                                 .x = dx.data(),
                                 .y = dy.data(),
                                 .n_tokens = nt},
                                ws.data(), ws.size(), nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    const std::vector<float> out = dy.download();
    const double err = max_scaled_error(out, ref, w, x, with_bias ? bias.data() : nullptr, nt);
    const double err8 = max_scaled_error(out, ref8, w, x8, with_bias ? bias.data() : nullptr, nt);
    std::printf("  %-40s n_tokens=%lld%s  max scaled error %.3g (vs rounded x %.3g)\n", c.str().c_str(),
                static_cast<long long>(nt), with_bias ? " +bias" : "      ", err, err8);
    EXPECT_LT(err8, 1e-5);
    if (q8) {
      EXPECT_LE(excess_over_rounding_bound(out, ref, w, x, x8, nt), 0.0);
      EXPECT_LT(err, 1e-2);
    } else {
      EXPECT_LT(err, 1e-5);
    }
    EXPECT_TRUE(dy.guards_intact());
    if (q8) {
      // The float path for the quantized types: matmul_ref but for summation order, no workspace.
      guarded_buffer dyf(ref.size());
      dyf.poison();
      ANVIL_GPU_CHECK(launch_gemv({.w = dw.data(),
                                   .w_type = c.type,
                                   .in = c.in,
                                   .out = c.out,
                                   .bias = with_bias ? db.data() : nullptr,
                                   .x = dx.data(),
                                   .y = dyf.data(),
                                   .n_tokens = nt},
                                  nullptr, 0, nullptr, gemv_activations::f32));
      ANVIL_GPU_CHECK(hipDeviceSynchronize());
      const double errf = max_scaled_error(dyf.download(), ref, w, x, with_bias ? bias.data() : nullptr, nt);
      std::printf("  %-40s n_tokens=%lld  f32 activations: max scaled error %.3g\n", c.str().c_str(),
                  static_cast<long long>(nt), errf);
      EXPECT_LT(errf, 1e-5);
      EXPECT_TRUE(dyf.guards_intact());
    }
  }
  EXPECT_TRUE(dx.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(TypesAndShapes, GemvGpu, ::testing::ValuesIn(gemv_cases()),
                         [](const ::testing::TestParamInfo<gemv_case>& i) {
                           return type_name(i.param.type) + "_" + std::to_string(i.param.out) + "x" +
                                  std::to_string(i.param.in);
                         });

// A group launch (q, k and v; gate and up) gives each matrix exactly what its own launch gives,
// and so does a GEMV reading 8-bit activations already in the workspace — written by the host in
// the documented layout (gemv_x8_view) or left there by the previous GEMV on the same x.
class GemvGroupGpu : public ::testing::TestWithParam<ggml_type> {};

TEST_P(GemvGroupGpu, EqualsOneLaunchPerMatrixAndReadsPreparedActivations) {
  require_device();
  if (HasFatalFailure()) return;
  const ggml_type type = GetParam();
  const std::int64_t in = 512;
  const std::int64_t outs[3] = {37, 8, 131};
  std::mt19937 rng(static_cast<unsigned>(int(type) * 104729 + 1));
  std::vector<host_weight> ws;
  std::vector<std::unique_ptr<device_bytes>> dws;
  for (const std::int64_t o : outs) {
    ws.emplace_back(type, o, in, rng);
    dws.push_back(std::make_unique<device_bytes>(ws.back().bytes.size()));
    dws.back()->upload(ws.back().bytes.data(), ws.back().bytes.size());
  }
  const std::vector<float> x = random_vector(std::size_t(gemv_max_tokens * in), rng, -2.f, 2.f);
  const std::vector<float> bias = random_vector(std::size_t(outs[0]), rng, -1.f, 1.f);
  guarded_buffer dx(x.size()), db(bias.size());
  dx.upload(x);
  db.upload(bias);
  const std::size_t ws_bytes = std::max<std::size_t>(gemv_workspace_bytes(type, in, gemv_max_tokens), 16);
  device_bytes work(ws_bytes);

  for (std::int64_t nt = 1; nt <= gemv_max_tokens; ++nt) {
    SCOPED_TRACE(type_name(type) + " n_tokens=" + std::to_string(nt));
    std::vector<std::vector<float>> alone;
    for (int g = 0; g < 3; ++g) {
      guarded_buffer dy(std::size_t(nt * outs[g]));
      ANVIL_GPU_CHECK(launch_gemv({.w = dws[g]->data(),
                                   .w_type = type,
                                   .in = in,
                                   .out = outs[g],
                                   .bias = g == 0 ? db.data() : nullptr,
                                   .x = dx.data(),
                                   .y = dy.data(),
                                   .n_tokens = nt},
                                  work.data(), work.size(), nullptr));
      ANVIL_GPU_CHECK(hipDeviceSynchronize());
      alone.push_back(dy.download());
    }
    std::vector<std::unique_ptr<guarded_buffer>> dys;
    std::vector<matmul_params> ps;
    for (int g = 0; g < 3; ++g) {
      dys.push_back(std::make_unique<guarded_buffer>(std::size_t(nt * outs[g])));
      dys.back()->poison();
      ps.push_back({.w = dws[g]->data(),
                    .w_type = type,
                    .in = in,
                    .out = outs[g],
                    .bias = g == 0 ? db.data() : nullptr,
                    .x = dx.data(),
                    .y = dys.back()->data(),
                    .n_tokens = nt});
    }
    ANVIL_GPU_CHECK(launch_gemv_group(ps, work.data(), work.size(), nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    for (int g = 0; g < 3; ++g) {
      EXPECT_TRUE(dys[g]->download() == alone[g]) << "matrix " << g << " of the group";
      EXPECT_TRUE(dys[g]->guards_intact());
    }
    if (gemv_workspace_bytes(type, in, nt) == 0) continue;  // the float path has no 8-bit form

    // Left by the previous GEMV on the same x: the group above quantized x into `work`.
    guarded_buffer dy(std::size_t(nt * outs[2]));
    dy.poison();
    ps[2].y = dy.data();
    ANVIL_GPU_CHECK(launch_gemv(ps[2], work.data(), work.size(), nullptr, gemv_activations::int8,
                                gemv_x8_source::workspace));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_TRUE(dy.download() == alone[2]) << "reading the previous GEMV's 8-bit x";

    // Written by the host in the documented layout, with x itself replaced by garbage: the GEMV
    // must read the workspace, not x.
    const x8_host x8 = quantize_x8_host(std::vector<float>(x.begin(), x.begin() + nt * in));
    const gemv_x8_rows view = gemv_x8_view(work.data(), in, nt);
    ANVIL_GPU_CHECK(hipMemset(work.data(), 0x5A, work.size()));
    ANVIL_GPU_CHECK(hipMemcpy(view.q, x8.q.data(), x8.q.size(), hipMemcpyHostToDevice));
    ANVIL_GPU_CHECK(hipMemcpy(view.ds, x8.ds.data(), x8.ds.size() * sizeof(float), hipMemcpyHostToDevice));
    guarded_buffer junk(x.size());
    junk.poison();
    ps[0].x = junk.data();
    guarded_buffer dy0(std::size_t(nt * outs[0]));
    ps[0].y = dy0.data();
    ANVIL_GPU_CHECK(launch_gemv(ps[0], work.data(), work.size(), nullptr, gemv_activations::int8,
                                gemv_x8_source::workspace));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_TRUE(dy0.download() == alone[0]) << "reading 8-bit x written in the gemv_x8_view layout";
    EXPECT_TRUE(dy0.guards_intact() && dy.guards_intact());
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GemvGroupGpu, ::testing::ValuesIn(gpu_weight_types()),
                         [](const ::testing::TestParamInfo<ggml_type>& i) { return type_name(i.param); });

// The fused gate / up / product against the two launches it replaces and the CPU reference, for
// the batch it takes (one token), each of swiglu_ref's forms, a width with a partial last block of
// rows (no 8-bit output there: it needs whole 32-element groups), x rounded here or read from the
// workspace. Rows of 768: a lane's share of a row's slices is not whole.
struct glu_case {
  ggml_type type;
  glu_activation act;
  float limit;
};

std::vector<glu_case> glu_cases() {
  std::vector<glu_case> cases;
  for (ggml_type t : gpu_weight_types()) {
    if (!gemv_glu_supports(t)) continue;
    cases.push_back({t, glu_activation::silu, 0.f});
  }
  cases.push_back({ggml_type::Q4_K, glu_activation::silu, 7.f});  // gpt-oss's clamped form
  cases.push_back({ggml_type::Q8_0, glu_activation::gelu_tanh, 0.f});
  return cases;
}

class GemvGluGpu : public ::testing::TestWithParam<glu_case> {};

TEST_P(GemvGluGpu, EqualsTheGroupAndSwigluAndTheCpuReference) {
  require_device();
  if (HasFatalFailure()) return;
  const glu_case c = GetParam();
  const std::int64_t in = 768;
  std::mt19937 rng(static_cast<unsigned>(int(c.type) * 7919 + int(c.act) * 31 + int(c.limit)));
  for (const std::int64_t out : {std::int64_t(96), std::int64_t(70)}) {
    const bool quantized_out = out % 32 == 0;
    const host_weight gate(c.type, out, in, rng), up(c.type, out, in, rng);
    device_bytes dgate(gate.bytes.size()), dup(up.bytes.size());
    dgate.upload(gate.bytes.data(), gate.bytes.size());
    dup.upload(up.bytes.data(), up.bytes.size());
    const std::vector<float> x = random_vector(std::size_t(gemv_max_tokens * in), rng, -2.f, 2.f);
    guarded_buffer dx(x.size());
    dx.upload(x);
    const std::size_t ws_bytes = gemv_workspace_bytes(c.type, in, gemv_max_tokens);
    const std::size_t out8_bytes = gemv_x8_bytes(out, gemv_max_tokens);
    device_bytes work(ws_bytes), fused8(out8_bytes), pair8(out8_bytes);
    for (std::int64_t nt = 1; nt <= gemv_glu_max_tokens; ++nt) {
      SCOPED_TRACE(type_name(c.type) + " out=" + std::to_string(out) + " n_tokens=" + std::to_string(nt));
      const std::size_t n = std::size_t(nt * out);
      // The two launches the fused one replaces.
      guarded_buffer dg(n), du(n), dpair(n);
      const matmul_params ps[2] = {
          {.w = dgate.data(), .w_type = c.type, .in = in, .out = out, .x = dx.data(), .y = dg.data(), .n_tokens = nt},
          {.w = dup.data(), .w_type = c.type, .in = in, .out = out, .x = dx.data(), .y = du.data(), .n_tokens = nt}};
      ANVIL_GPU_CHECK(launch_gemv_group(ps, work.data(), work.size(), nullptr));
      ANVIL_GPU_CHECK(hipMemset(pair8.data(), 0x5A, pair8.size()));
      const gemv_x8_rows pv = gemv_x8_view(pair8.data(), out, nt);
      // The product's rows, for the GPU's SwiGLU here and the CPU reference below.
      const swiglu_rows_params rows{.rows = nt,
                                    .cols = out,
                                    .gate_stride = out,
                                    .up_stride = out,
                                    .out_stride = out,
                                    .limit = c.limit,
                                    .alpha = 1.702f,
                                    .act = c.act};
      swiglu_rows_params on_device = rows;
      on_device.gate = dg.data(), on_device.up = du.data(), on_device.out = dpair.data();
      if (quantized_out) on_device.yq = pv.q, on_device.yq_scales = pv.ds;
      ANVIL_GPU_CHECK(launch_swiglu(on_device, nullptr));
      ANVIL_GPU_CHECK(hipDeviceSynchronize());
      const std::vector<float> pair = dpair.download();

      // The fused launch: x rounded by it, then read from the workspace with x itself garbage.
      for (const gemv_x8_source source : {gemv_x8_source::quantize, gemv_x8_source::workspace}) {
        SCOPED_TRACE(source == gemv_x8_source::quantize ? "x rounded by the launch" : "x8 from the workspace");
        guarded_buffer junk(x.size()), dy(n);
        junk.poison();
        dy.poison();
        ANVIL_GPU_CHECK(hipMemset(fused8.data(), 0x5A, fused8.size()));
        const gemv_x8_rows fv = gemv_x8_view(fused8.data(), out, nt);
        ANVIL_GPU_CHECK(launch_gemv_glu({.gate = dgate.data(),
                                         .up = dup.data(),
                                         .w_type = c.type,
                                         .in = in,
                                         .out = out,
                                         .x = source == gemv_x8_source::quantize ? dx.data() : junk.data(),
                                         .y = dy.data(),
                                         .n_tokens = nt,
                                         .limit = c.limit,
                                         .alpha = 1.702f,
                                         .act = c.act,
                                         .yq = quantized_out ? fv : gemv_x8_rows{}},
                                        work.data(), work.size(), nullptr, source));
        ANVIL_GPU_CHECK(hipDeviceSynchronize());
        EXPECT_TRUE(dy.download() == pair) << "the product differs from the group + SwiGLU's";
        EXPECT_TRUE(dy.guards_intact() && junk.guards_intact());
        if (quantized_out) {
          std::vector<std::uint8_t> a(out8_bytes), b(out8_bytes);
          ANVIL_GPU_CHECK(hipMemcpy(a.data(), fused8.data(), a.size(), hipMemcpyDeviceToHost));
          ANVIL_GPU_CHECK(hipMemcpy(b.data(), pair8.data(), b.size(), hipMemcpyDeviceToHost));
          EXPECT_TRUE(a == b) << "the 8-bit rows (and the bytes around them) differ from SwiGLU's";
        }
      }

      // The CPU reference: both projections on x as the kernels round it (the integer path is
      // exact for it: 1e-5 of the |W|.|x| scale, as above), then the product of the GPU's own
      // gate and up rows (the activations' float functions may differ by an ulp).
      const std::vector<float> x8 = round_to_q8(std::vector<float>(x.begin(), x.begin() + nt * in));
      const std::vector<float> g = dg.download(), u = du.download();
      std::vector<float> rg(n), ru(n), ref(n);
      for (const auto& [w, y] : {std::pair{&gate, &rg}, std::pair{&up, &ru}}) {
        matmul_ref(
            {.w = w->bytes.data(), .w_type = c.type, .in = in, .out = out, .x = x8.data(), .y = y->data(), .n_tokens = nt});
      }
      EXPECT_LE(max_scaled_error(g, rg, gate, x8, nullptr, nt), 1e-5) << "gate";
      EXPECT_LE(max_scaled_error(u, ru, up, x8, nullptr, nt), 1e-5) << "up";
      swiglu_rows_params on_host = rows;
      on_host.gate = g.data(), on_host.up = u.data(), on_host.out = ref.data();
      swiglu_rows_ref(on_host);
      double scale = 0;
      for (const float v : ref) scale = std::max(scale, std::fabs(double(v)));
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_LE(std::fabs(double(pair[i]) - double(ref[i])), 1e-5 * std::fabs(double(ref[i])) + 1e-7 * scale)
            << "product " << i << " against swiglu_ref";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GemvGluGpu, ::testing::ValuesIn(glu_cases()),
                         [](const ::testing::TestParamInfo<glu_case>& i) {
                           return type_name(i.param.type) + (i.param.act == glu_activation::gelu_tanh ? "_gelu" : "") +
                                  (i.param.limit > 0 ? "_clamped" : "");
                         });

TEST(GemvGpuLaunch, RefusesAGluItCannotDo) {
  require_device();
  if (HasFatalFailure()) return;
  const std::size_t need = gemv_workspace_bytes(ggml_type::Q8_0, 64, 1);
  device_bytes w(8192), ws(need), out8(gemv_x8_bytes(64, 1));
  guarded_buffer buf(1024);
  const gemv_glu_params ok{.gate = w.data(),
                           .up = w.data(),
                           .w_type = ggml_type::Q8_0,
                           .in = 64,
                           .out = 64,
                           .x = buf.data(),
                           .y = buf.data() + 256,
                           .n_tokens = 1,
                           .yq = gemv_x8_view(out8.data(), 64, 1)};
  auto with = [&](auto edit) {
    gemv_glu_params q = ok;
    edit(q);
    return launch_gemv_glu(q, ws.data(), need, nullptr);
  };
  EXPECT_EQ(with([](gemv_glu_params&) {}), hipSuccess);
  EXPECT_EQ(with([](gemv_glu_params& q) { q.n_tokens = 0; }), hipSuccess);
  EXPECT_EQ(with([](gemv_glu_params& q) { q.n_tokens = gemv_glu_max_tokens + 1; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](gemv_glu_params& q) { q.w_type = ggml_type::F16; }), hipErrorInvalidValue);   // no integer path
  EXPECT_EQ(with([](gemv_glu_params& q) { q.w_type = ggml_type::Q4_K; }), hipErrorInvalidValue);  // 64 % 256
  EXPECT_EQ(with([](gemv_glu_params& q) { q.out = 48; }), hipErrorInvalidValue);  // 8-bit rows need out % 32
  EXPECT_EQ(with([&](gemv_glu_params& q) { q.yq.ds = nullptr; }), hipErrorInvalidValue);
  EXPECT_EQ(with([&](gemv_glu_params& q) { q.yq = {}; }), hipSuccess);  // floats only
  EXPECT_EQ(with([&](gemv_glu_params& q) { q.yq = gemv_x8_view(ws.data(), 64, 1); }), hipErrorInvalidValue);  // over x8
  EXPECT_EQ(with([](gemv_glu_params& q) { q.act = glu_activation::gelu_tanh, q.limit = 7.f; }), hipErrorInvalidValue);
  EXPECT_EQ(with([&](gemv_glu_params& q) { q.up = w.as<char>() + 8; }), hipErrorInvalidValue);  // misaligned
  EXPECT_EQ(with([](gemv_glu_params& q) { q.y = nullptr; }), hipErrorInvalidValue);
  EXPECT_EQ(launch_gemv_glu(ok, ws.data(), need - 1, nullptr), hipErrorInvalidValue);  // workspace too small
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  EXPECT_EQ(hipGetLastError(), hipSuccess);
  EXPECT_TRUE(buf.guards_intact());
}

TEST(GemvGpuLaunch, RefusesAGroupThatDoesNotShareItsInput) {
  require_device();
  if (HasFatalFailure()) return;
  guarded_buffer buf(8192);
  float* p = buf.data();
  const matmul_params a{.w = p,
                        .w_type = ggml_type::F32,
                        .in = 64,
                        .out = 8,
                        .bias = nullptr,
                        .x = p + 1024,
                        .y = p + 2048,
                        .n_tokens = 1};
  matmul_params b = a;
  b.y = p + 3072;
  auto group = [&](matmul_params second) {
    const matmul_params ps[2] = {a, second};
    return launch_gemv_group(ps, nullptr, 0, nullptr);
  };
  EXPECT_EQ(group(b), hipSuccess);
  EXPECT_EQ(launch_gemv_group({}, nullptr, 0, nullptr), hipErrorInvalidValue);
  matmul_params c = b;
  c.x = p + 4096;
  EXPECT_EQ(group(c), hipErrorInvalidValue);  // another x
  c = b;
  c.in = 32;
  EXPECT_EQ(group(c), hipErrorInvalidValue);  // another row length
  c = b;
  c.w_type = ggml_type::F16;
  EXPECT_EQ(group(c), hipErrorInvalidValue);  // another type
  c = b;
  c.n_tokens = 2;
  EXPECT_EQ(group(c), hipErrorInvalidValue);  // another batch
  const matmul_params four[4] = {a, b, b, b};
  EXPECT_EQ(launch_gemv_group(four, nullptr, 0, nullptr), hipErrorInvalidValue);  // more than gemv_max_group
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  EXPECT_EQ(hipGetLastError(), hipSuccess);
  EXPECT_TRUE(buf.guards_intact());
}

TEST(GemvGpuLaunch, RejectsWhatItCannotDoWithoutLaunching) {
  require_device();
  if (HasFatalFailure()) return;  // no GPU: require_device has said so
  guarded_buffer buf(4096);
  float* p = buf.data();
  const matmul_params ok{.w = p,
                         .w_type = ggml_type::F32,
                         .in = 64,
                         .out = 8,
                         .bias = nullptr,
                         .x = p + 1024,
                         .y = p + 2048,
                         .n_tokens = 1};
  auto with = [&](auto edit) {
    matmul_params q = ok;
    edit(q);
    return launch_gemv(q, nullptr, 0, nullptr);
  };
  EXPECT_EQ(with([](matmul_params& q) { q.n_tokens = 9; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](matmul_params& q) { q.n_tokens = -1; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](matmul_params& q) { q.in = 12; }), hipErrorInvalidValue);           // not a multiple of 8
  EXPECT_EQ(with([](matmul_params& q) { q.w_type = ggml_type::Q4_K; }), hipErrorInvalidValue);  // 64 % 256
  EXPECT_EQ(with([](matmul_params& q) { q.w_type = ggml_type::IQ2_XXS; q.in = 256; }), hipErrorInvalidValue);  // no GPU decoder
  EXPECT_EQ(with([&](matmul_params& q) { q.x = p + 1025; }), hipErrorInvalidValue);      // x misaligned
  EXPECT_EQ(with([&](matmul_params& q) { q.w = p + 1; }), hipErrorInvalidValue);         // w misaligned
  EXPECT_EQ(with([](matmul_params& q) { q.n_tokens = 0; }), hipSuccess);
  EXPECT_EQ(with([](matmul_params& q) { q.w_type = ggml_type::Q8_0; }), hipErrorInvalidValue);  // no workspace
  {
    const std::size_t need = gemv_workspace_bytes(ggml_type::Q4_K, 256, 2);
    ASSERT_GT(need, 0u);
    EXPECT_EQ(gemv_workspace_bytes(ggml_type::F16, 256, 2), 0u);
    device_bytes ws(need);
    matmul_params q = ok;
    q.w_type = ggml_type::Q4_K, q.in = 256, q.out = 1, q.n_tokens = 2;
    EXPECT_EQ(launch_gemv(q, ws.data(), need - 1, nullptr), hipErrorInvalidValue);                  // too small
    EXPECT_EQ(launch_gemv(q, ws.as<char>() + 8, need, nullptr), hipErrorInvalidValue);              // misaligned
    q.n_tokens = 3;
    EXPECT_EQ(launch_gemv(q, ws.data(), need, nullptr), hipErrorInvalidValue);                      // sized for 2
  }
  EXPECT_EQ(hipGetLastError(), hipSuccess);
  EXPECT_TRUE(buf.guards_intact());
}

}  // namespace

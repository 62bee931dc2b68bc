// The GEMVs that norm their own input (kernels/gemv.h gemv_norm_input): launch_gemv_group_norm
// and launch_gemv_glu with norm, against the two launches they replace — launch_rms_norm_residual
// writing the 8-bit x into a workspace, then the GEMV reading it there — bit for bit: every output,
// the 8-bit product rows of the gate/up launch, and h + delta stored at h_out against the norm's
// updated h (and against h + delta added here). For every type with the integer path, rows of a
// partial and of a whole 256-thread norm block, with and without delta, a group of three matrices
// (one with a bias, rows that leave warps without a row). Outputs and h_out are poisoned and
// guarded; h and delta must come out untouched. launch_gemv_qkv_rope likewise against the normed
// group followed by launch_rope_kv_write: the rotated q, the f16 cache's bytes; and
// launch_gemv_rope_run (no norm: rows of any width, runs of one type) against the GEMVs followed by
// launch_rope_kv_write. Label: gpu.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gemv.h"
#include "kernels/rms_norm_residual.h"
#include "kernels/rope_kv_write.h"
#include "tests/kernels/gpu_array.h"
#include "tests/kernels/matmul_gpu_cases.h"

namespace {

using namespace anvil::kernels;
using namespace anvil::kernels::testing;

struct norm_case {
  ggml_type type;
  std::int64_t in;
  bool delta;
};

std::vector<norm_case> norm_cases() {
  std::vector<norm_case> cases;
  for (ggml_type t : gpu_weight_types()) {
    if (!gemv_glu_supports(t)) continue;
    const std::int64_t b = anvil::model::info(t).block_elems;
    for (const std::int64_t in : {std::int64_t(896), std::int64_t(768), gemv_norm_max_cols}) {
      if (in % b != 0) continue;
      for (const bool delta : {true, false}) cases.push_back({t, in, delta});
    }
  }
  return cases;
}

// The norm's inputs on the device, and what the norm kernel makes of them.
struct norm_inputs {
  std::vector<float> h, delta, weight;
  guarded_buffer dh, dd, dw;
  norm_inputs(std::int64_t in, std::mt19937& rng)
      : h(random_vector(std::size_t(in), rng, -3.f, 3.f)),
        delta(random_vector(std::size_t(in), rng, -1.f, 1.f)),
        weight(random_vector(std::size_t(in), rng, 0.5f, 1.5f)),
        dh(h.size()),
        dd(delta.size()),
        dw(weight.size()) {
    dh.upload(h);
    dd.upload(delta);
    dw.upload(weight);
  }
  // launch_rms_norm_residual on a copy of h: its updated h into `updated`, and x in 8 bits in `work`.
  void norm_into(device_bytes& work, std::int64_t in, bool with_delta, std::vector<float>& updated) const {
    guarded_buffer hc(h.size()), y(h.size());
    hc.upload(h);
    const gemv_x8_rows x8 = gemv_x8_view(work.data(), in, 1);
    ANVIL_GPU_CHECK(launch_rms_norm_residual({.h = hc.data(),
                                              .delta = with_delta ? dd.data() : nullptr,
                                              .weight = dw.data(),
                                              .y = y.data(),
                                              .rows = 1,
                                              .cols = in,
                                              .eps = 1e-5f,
                                              .yq = x8.q,
                                              .yq_scales = x8.ds},
                                             nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    updated = hc.download();
  }
  gemv_norm_input input(bool with_delta, float* h_out) const {
    return {.h = dh.data(), .delta = with_delta ? dd.data() : nullptr, .weight = dw.data(), .h_out = h_out, .eps = 1e-5f};
  }
  void expect_untouched() const {
    EXPECT_TRUE(dh.download() == h && dd.download() == delta && dw.download() == weight) << "the norm's inputs changed";
    EXPECT_TRUE(dh.guards_intact() && dd.guards_intact() && dw.guards_intact());
  }
};

// h + delta as the kernels add it (one float add an element).
std::vector<float> host_sum(const norm_inputs& n, bool with_delta) {
  std::vector<float> s = n.h;
  if (with_delta) {
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += n.delta[i];
  }
  return s;
}

// Three matrices on one x (a q/k/v-like group) on the device, with two sets of outputs: the
// reference launches' and the checked launch's (poisoned). ps's outputs are the reference's until
// checked() points them at the others.
struct group_case {
  std::vector<host_weight> ws;
  std::vector<std::unique_ptr<device_bytes>> dws;
  std::vector<std::unique_ptr<guarded_buffer>> ref_y, y;
  std::vector<matmul_params> ps;
  group_case(ggml_type type, std::int64_t in, const std::int64_t (&outs)[3], std::mt19937& rng)
      : group_case({type, type, type}, in, outs, rng) {}
  group_case(const ggml_type (&types)[3], std::int64_t in, const std::int64_t (&outs)[3], std::mt19937& rng) {
    for (std::size_t g = 0; g < 3; ++g) {
      const std::int64_t o = outs[g];
      ws.emplace_back(types[g], o, in, rng);
      dws.push_back(std::make_unique<device_bytes>(ws.back().bytes.size()));
      dws.back()->upload(ws.back().bytes.data(), ws.back().bytes.size());
      ref_y.push_back(std::make_unique<guarded_buffer>(std::size_t(o)));
      y.push_back(std::make_unique<guarded_buffer>(std::size_t(o)));
      ps.push_back({.w = dws.back()->data(), .w_type = types[g], .in = in, .out = o, .n_tokens = 1});
    }
    reference();
  }
  // Outputs to the reference buffers; the checked ones poisoned.
  void reference() {
    for (std::size_t g = 0; g < ps.size(); ++g) {
      ps[g].y = ref_y[g]->data();
      y[g]->poison();
    }
  }
  void checked() {
    for (std::size_t g = 0; g < ps.size(); ++g) ps[g].y = y[g]->data();
  }
};

class GemvNormGpu : public ::testing::TestWithParam<norm_case> {};

TEST_P(GemvNormGpu, GroupEqualsTheNormKernelThenTheGroup) {
  require_device();
  if (HasFatalFailure()) return;
  const norm_case c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(int(c.type) * 131 + c.in + (c.delta ? 7 : 0)));
  const std::int64_t outs[3] = {131, 8, 37};
  group_case q(c.type, c.in, outs, rng);
  const std::vector<float> bias = random_vector(std::size_t(outs[0]), rng, -1.f, 1.f);
  guarded_buffer db(bias.size());
  db.upload(bias);
  q.ps[0].bias = db.data();
  const norm_inputs n(c.in, rng);
  device_bytes work(gemv_workspace_bytes(c.type, c.in, 1));

  // The two launches: the norm kernel's 8-bit x, read by the group from the workspace.
  std::vector<float> normed_h;
  n.norm_into(work, c.in, c.delta, normed_h);
  if (HasFatalFailure()) return;
  ANVIL_GPU_CHECK(launch_gemv_group(q.ps, work.data(), work.size(), nullptr, gemv_activations::int8,
                                    gemv_x8_source::workspace));

  // The normed launch, h + delta stored at h_out.
  guarded_buffer h_out(std::size_t(c.in));
  h_out.poison();
  q.checked();
  ANVIL_GPU_CHECK(launch_gemv_group_norm(q.ps, n.input(c.delta, h_out.data()), nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  for (std::size_t g = 0; g < 3; ++g) {
    EXPECT_TRUE(q.y[g]->download() == q.ref_y[g]->download()) << "matrix " << g << " of the group";
    EXPECT_TRUE(q.y[g]->guards_intact());
  }
  const std::vector<float> stored = h_out.download();
  EXPECT_TRUE(stored == normed_h) << "h_out differs from the norm kernel's updated h";
  EXPECT_TRUE(stored == host_sum(n, c.delta)) << "h_out differs from h + delta";
  EXPECT_TRUE(h_out.guards_intact());
  n.expect_untouched();
}

TEST_P(GemvNormGpu, GateUpEqualsTheNormKernelThenTheFusedLaunch) {
  require_device();
  if (HasFatalFailure()) return;
  const norm_case c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(int(c.type) * 257 + c.in + (c.delta ? 3 : 0)));
  const std::int64_t out = 96;
  const host_weight gate(c.type, out, c.in, rng), up(c.type, out, c.in, rng);
  device_bytes dgate(gate.bytes.size()), dup(up.bytes.size());
  dgate.upload(gate.bytes.data(), gate.bytes.size());
  dup.upload(up.bytes.data(), up.bytes.size());
  const norm_inputs n(c.in, rng);
  device_bytes work(gemv_workspace_bytes(c.type, c.in, 1));
  const std::size_t out8_bytes = gemv_x8_bytes(out, 1);
  device_bytes ref8(out8_bytes), fused8(out8_bytes);
  ANVIL_GPU_CHECK(hipMemset(ref8.data(), 0x5A, out8_bytes));
  ANVIL_GPU_CHECK(hipMemset(fused8.data(), 0x5A, out8_bytes));

  std::vector<float> normed_h;
  n.norm_into(work, c.in, c.delta, normed_h);
  if (HasFatalFailure()) return;
  guarded_buffer ref_y{std::size_t(out)}, y{std::size_t(out)}, h_out{std::size_t(c.in)};
  y.poison();
  h_out.poison();
  gemv_glu_params p{.gate = dgate.data(),
                    .up = dup.data(),
                    .w_type = c.type,
                    .in = c.in,
                    .out = out,
                    .y = ref_y.data(),
                    .n_tokens = 1,
                    .yq = gemv_x8_view(ref8.data(), out, 1)};
  ANVIL_GPU_CHECK(launch_gemv_glu(p, work.data(), work.size(), nullptr, gemv_x8_source::workspace));
  p.y = y.data();
  p.yq = gemv_x8_view(fused8.data(), out, 1);
  p.norm = n.input(c.delta, h_out.data());
  ANVIL_GPU_CHECK(launch_gemv_glu(p, nullptr, 0, nullptr));  // no workspace: x is normed in the launch
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  EXPECT_TRUE(y.download() == ref_y.download()) << "the product differs";
  std::vector<std::uint8_t> a(out8_bytes), b(out8_bytes);
  ANVIL_GPU_CHECK(hipMemcpy(a.data(), fused8.data(), a.size(), hipMemcpyDeviceToHost));
  ANVIL_GPU_CHECK(hipMemcpy(b.data(), ref8.data(), b.size(), hipMemcpyDeviceToHost));
  EXPECT_TRUE(a == b) << "the 8-bit product rows (and the bytes around them) differ";
  EXPECT_TRUE(h_out.download() == normed_h) << "h_out differs from the norm kernel's updated h";
  EXPECT_TRUE(y.guards_intact() && h_out.guards_intact());
  n.expect_untouched();
}

INSTANTIATE_TEST_SUITE_P(Types, GemvNormGpu, ::testing::ValuesIn(norm_cases()),
                         [](const ::testing::TestParamInfo<norm_case>& i) {
                           return type_name(i.param.type) + "_" + std::to_string(i.param.in) +
                                  (i.param.delta ? "_delta" : "");
                         });

// The rotations both rope launches are checked over: both pairings, whole and half rotation, a
// token with a cache slot and a padding token without one (nothing cached). For each, `check`
// gets a rope_setup: the angles and the slot on the device, and two f16 caches each (the reference
// launches' and the checked launch's), poisoned.
constexpr std::int64_t rope_hd = 64, rope_heads = 6, rope_kv_heads = 2, rope_block_size = 4, rope_blocks = 3;
constexpr std::size_t rope_cache_elems = std::size_t(rope_blocks * rope_block_size * rope_kv_heads * rope_hd);
constexpr std::int64_t rope_outs[3] = {rope_heads * rope_hd, rope_kv_heads * rope_hd, rope_kv_heads * rope_hd};

struct rope_setup {
  rope_style style;
  std::int64_t rot, slot;
  device_bytes dangles, dslot;
  guarded_array<anvil::gpu::half_bits> kref{rope_cache_elems}, vref{rope_cache_elems}, kc{rope_cache_elems},
      vc{rope_cache_elems};
  rope_setup(rope_style st, std::int64_t r, std::int64_t sl, std::mt19937& rng)
      : style(st), rot(r), slot(sl), dangles(std::size_t(r) * sizeof(double)), dslot(sizeof sl) {
    std::vector<double> angles(static_cast<std::size_t>(rot));
    std::uniform_real_distribution<double> theta(-40.0, 40.0);
    for (std::size_t i = 0; i < angles.size(); i += 2) {
      const double t = theta(rng);
      angles[i] = std::sin(t), angles[i + 1] = std::cos(t);
    }
    dangles.upload(angles.data(), angles.size() * sizeof(double));
    dslot.upload(&slot, sizeof slot);
    for (auto* a : {&kref, &vref, &kc, &vc}) a->poison();
  }
  static paged_kv_device cache(const guarded_array<anvil::gpu::half_bits>& k, const guarded_array<anvil::gpu::half_bits>& v) {
    return paged_kv_device{.k = k.data(), .v = v.data(), .n_blocks = rope_blocks, .block_size = rope_block_size,
                           .n_kv_heads = rope_kv_heads, .head_dim = rope_hd, .dtype = kv_dtype::f16};
  }
  // launch_rope_kv_write on the reference outputs of q, k and v, into the reference cache.
  void reference(const group_case& q) {
    ANVIL_GPU_CHECK(launch_rope_kv_write({.q = q.ref_y[0]->data(),
                                          .k = q.ref_y[1]->data(),
                                          .v = q.ref_y[2]->data(),
                                          .cache = cache(kref, vref),
                                          .n_tokens = 1,
                                          .n_heads = rope_heads,
                                          .rot_dim = rot,
                                          .angles = dangles.as<double>(),
                                          .slots = dslot.as<std::int64_t>(),
                                          .style = style},
                                         nullptr));
  }
  // The checked launch's rope, into the other cache.
  gemv_rope_kv checked() const {
    return {.angles = dangles.as<double>(),
            .head_dim = rope_hd,
            .rot_dim = rot,
            .style = style,
            .cache = cache(kc, vc),
            .slot = dslot.as<std::int64_t>()};
  }
  // After both (synchronized): q rotated in place of its output, the caches' bytes, k's and v's
  // outputs never written.
  void expect_equal(const group_case& q) const {
    EXPECT_TRUE(q.y[0]->download() == q.ref_y[0]->download()) << "the rotated q differs";
    EXPECT_TRUE(kc.download() == kref.download()) << "the cache's k differs";
    EXPECT_TRUE(vc.download() == vref.download()) << "the cache's v differs";
    if (slot < 0) {
      const std::vector<anvil::gpu::half_bits> untouched(rope_cache_elems, 0xa5a5);
      EXPECT_TRUE(kc.download() == untouched && vc.download() == untouched) << "a padding token was cached";
    }
    for (std::size_t g = 1; g < 3; ++g) {  // k and v go to the cache only
      const std::vector<float> out = q.y[g]->download();
      EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); })) << "matrix " << g;
    }
    for (std::size_t g = 0; g < 3; ++g) EXPECT_TRUE(q.y[g]->guards_intact());
    EXPECT_TRUE(kc.guards_intact() && vc.guards_intact());
  }
};

template <class Check>
void for_each_rope(std::mt19937& rng, Check check) {
  for (const rope_style style : {rope_style::normal, rope_style::neox}) {
    for (const std::int64_t rot : {rope_hd, rope_hd / 2}) {
      for (const std::int64_t slot : {std::int64_t(5), std::int64_t(-1)}) {
        SCOPED_TRACE(::testing::Message() << (style == rope_style::neox ? "neox" : "normal") << " rot_dim " << rot
                                          << " slot " << slot);
        rope_setup r(style, rot, slot, rng);
        check(r);
      }
    }
  }
}

// Random biases on every matrix of a q/k/v group.
struct group_biases {
  std::vector<std::unique_ptr<guarded_buffer>> b;
  group_biases(group_case& q, std::mt19937& rng) {
    for (std::size_t g = 0; g < 3; ++g) {
      b.push_back(std::make_unique<guarded_buffer>(std::size_t(q.ps[g].out)));
      b.back()->upload(random_vector(std::size_t(q.ps[g].out), rng, -1.f, 1.f));
      q.ps[g].bias = b.back()->data();
    }
  }
};

// launch_gemv_qkv_rope: per type, every rotation of for_each_rope.
class GemvQkvRopeGpu : public ::testing::TestWithParam<norm_case> {};

TEST_P(GemvQkvRopeGpu, EqualsTheNormedGroupThenTheRopeKvWrite) {
  require_device();
  if (HasFatalFailure()) return;
  const norm_case c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(int(c.type) * 521 + c.in));
  group_case q(c.type, c.in, rope_outs, rng);
  const group_biases biases(q, rng);
  const norm_inputs n(c.in, rng);
  for_each_rope(rng, [&](rope_setup& r) {
    q.reference();
    // The two launches.
    guarded_buffer ref_h(std::size_t(c.in)), h_out(std::size_t(c.in));
    h_out.poison();
    ANVIL_GPU_CHECK(launch_gemv_group_norm(q.ps, n.input(true, ref_h.data()), nullptr));
    r.reference(q);
    // The one launch.
    q.checked();
    ANVIL_GPU_CHECK(launch_gemv_qkv_rope(q.ps, n.input(true, h_out.data()), r.checked(), nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    r.expect_equal(q);
    EXPECT_TRUE(h_out.download() == ref_h.download()) << "h_out differs";
    EXPECT_TRUE(h_out.guards_intact());
  });
  n.expect_untouched();
}

// One case a type: rows of 896 where the type's blocks divide them, else 768, with delta.
std::vector<norm_case> rope_cases() {
  std::vector<norm_case> cases;
  for (const norm_case& c : norm_cases()) {
    if (c.delta && (cases.empty() || cases.back().type != c.type)) cases.push_back(c);
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Types, GemvQkvRopeGpu, ::testing::ValuesIn(rope_cases()),
                         [](const ::testing::TestParamInfo<norm_case>& i) {
                           return type_name(i.param.type) + "_" + std::to_string(i.param.in);
                         });

// launch_gemv_rope_run: q, k and v of the given types on rows of `in`, each run of one type one
// launch (the first rounding x, the others reading its 8-bit x), against each matrix's
// launch_gemv_group then launch_rope_kv_write, for every rotation of for_each_rope.
struct rope_run_case {
  ggml_type types[3];
  std::int64_t in;
};

std::vector<rope_run_case> rope_run_cases() {
  std::vector<rope_run_case> cases;
  for (ggml_type t : gpu_weight_types()) {
    if (gemv_glu_supports(t)) cases.push_back({{t, t, t}, 2048});
  }
  using enum ggml_type;
  cases.push_back({{Q8_0, Q8_0, Q8_0}, 896});  // rows of one 32-element block a lane: four rows a warp
  cases.push_back({{Q4_K, Q4_K, Q6_K}, 4096});  // a Q4_K_M file's layers with a Q6_K v
  cases.push_back({{Q6_K, Q4_K, Q4_K}, 2048});  // a run from k
  cases.push_back({{Q4_0, Q8_0, Q5_K}, 1536});  // three runs
  return cases;
}

class GemvRopeRunGpu : public ::testing::TestWithParam<rope_run_case> {};

TEST_P(GemvRopeRunGpu, EqualsTheGemvsThenTheRopeKvWrite) {
  require_device();
  if (HasFatalFailure()) return;
  const rope_run_case c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(int(c.types[0]) * 97 + int(c.types[2]) * 13 + c.in));
  group_case q(c.types, c.in, rope_outs, rng);
  const group_biases biases(q, rng);
  guarded_buffer x(std::size_t(c.in));
  x.upload(random_vector(std::size_t(c.in), rng, -2.f, 2.f));
  for (matmul_params& p : q.ps) p.x = x.data();
  device_bytes work(gemv_x8_bytes(c.in, 1));
  for_each_rope(rng, [&](rope_setup& r) {
    q.reference();
    for (const matmul_params& p : q.ps) ANVIL_GPU_CHECK(launch_gemv(p, work.data(), work.size(), nullptr));
    r.reference(q);
    ANVIL_GPU_CHECK(hipMemset(work.data(), 0x5A, work.size()));  // the first run must round x itself
    q.checked();
    for (int first = 0; first < 3;) {
      int n = 1;
      while (first + n < 3 && c.types[first + n] == c.types[first]) ++n;
      ANVIL_GPU_CHECK(launch_gemv_rope_run(std::span(q.ps).subspan(std::size_t(first), std::size_t(n)), first,
                                           r.checked(), work.data(), work.size(), nullptr,
                                           first == 0 ? gemv_x8_source::quantize : gemv_x8_source::workspace));
      first += n;
    }
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    r.expect_equal(q);
  });
  EXPECT_TRUE(x.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(Types, GemvRopeRunGpu, ::testing::ValuesIn(rope_run_cases()),
                         [](const ::testing::TestParamInfo<rope_run_case>& i) {
                           const auto& ts = i.param.types;
                           return type_name(ts[0]) + "_" + type_name(ts[1]) + "_" + type_name(ts[2]) + "_" +
                                  std::to_string(i.param.in);
                         });

TEST(GemvNormLaunch, RefusesWhatItCannotNorm) {
  require_device();
  if (HasFatalFailure()) return;
  constexpr std::int64_t in = 256;
  guarded_buffer buf(8 * 1024);
  float* p = buf.data();
  device_bytes w(std::size_t(64) * *anvil::model::row_bytes(ggml_type::Q8_0, 2048));
  const matmul_params ok{.w = w.data(), .w_type = ggml_type::Q8_0, .in = in, .out = 8, .y = p, .n_tokens = 1};
  const gemv_norm_input norm{.h = p + 1024, .delta = p + 2048, .weight = p + 3072, .h_out = p + 4096};
  auto with = [&](auto edit) {
    matmul_params q = ok;
    gemv_norm_input n = norm;
    edit(q, n);
    return launch_gemv_group_norm(std::span(&q, 1), n, nullptr);
  };
  EXPECT_EQ(with([](matmul_params&, gemv_norm_input&) {}), hipSuccess);
  EXPECT_EQ(with([](matmul_params&, gemv_norm_input& n) { n.delta = nullptr, n.h_out = nullptr; }), hipSuccess);
  EXPECT_EQ(with([](matmul_params& q, gemv_norm_input&) { q.n_tokens = 0; }), hipSuccess);
  EXPECT_EQ(with([](matmul_params& q, gemv_norm_input&) { q.n_tokens = 2; }), hipErrorInvalidValue);  // one token
  EXPECT_EQ(with([](matmul_params& q, gemv_norm_input&) { q.w_type = ggml_type::F16; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](matmul_params& q, gemv_norm_input&) { q.in = gemv_norm_max_cols + 32; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](matmul_params&, gemv_norm_input& n) { n.h = nullptr; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](matmul_params&, gemv_norm_input& n) { n.weight = nullptr; }), hipErrorInvalidValue);
  EXPECT_EQ(with([&](matmul_params&, gemv_norm_input& n) { n.h = p + 1025; }), hipErrorInvalidValue);  // misaligned
  EXPECT_EQ(with([&](matmul_params&, gemv_norm_input& n) { n.h_out = p + 1024 + in / 2; }), hipErrorInvalidValue);  // over h
  EXPECT_EQ(with([&](matmul_params&, gemv_norm_input& n) { n.h_out = p + 2048 - in / 2; }), hipErrorInvalidValue);  // over delta
  {
    // The gate/up launch takes the same norm checks, and no workspace with one.
    gemv_glu_params g{.gate = w.data(), .up = w.data(), .w_type = ggml_type::Q8_0, .in = in, .out = 64, .y = p, .n_tokens = 1};
    g.norm = norm;
    EXPECT_EQ(launch_gemv_glu(g, nullptr, 0, nullptr), hipSuccess);
    g.in = gemv_norm_max_cols * 2;
    EXPECT_EQ(launch_gemv_glu(g, nullptr, 0, nullptr), hipErrorInvalidValue);
    g.in = in;
    g.norm.h_out = p + 1024;  // h itself
    EXPECT_EQ(launch_gemv_glu(g, nullptr, 0, nullptr), hipErrorInvalidValue);
  }
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
  EXPECT_EQ(hipGetLastError(), hipSuccess);
  EXPECT_TRUE(buf.guards_intact());
}

// The launches' refusal tests: a Q8_0 q of two heads of 64 and k and v of one, on rows of 256 (x
// at buf + 1024), and a rope whose token is a padding one (slot -1: nothing reaches the cache).
struct rope_refusal_setup {
  static constexpr std::int64_t in = 256, hd = 64;
  guarded_buffer buf{8 * 1024};
  device_bytes w{std::size_t(256) * *anvil::model::row_bytes(ggml_type::Q8_0, in)}, cache{8 * 1024}, misc{1024};
  matmul_params q, kv;
  gemv_rope_kv rope;
  explicit rope_refusal_setup(rope_style style) {
    float* p = buf.data();
    q = {.w = w.data(), .w_type = ggml_type::Q8_0, .in = in, .out = 2 * hd, .x = p + 1024, .y = p, .n_tokens = 1};
    kv = q;
    kv.out = hd;
    const std::int64_t slot = -1;
    misc.upload(&slot, sizeof slot);
    rope = {.angles = reinterpret_cast<const double*>(misc.as<char>() + 64),
            .head_dim = hd,
            .rot_dim = hd,
            .style = style,
            .cache = {.k = cache.data(), .v = cache.as<char>() + 4096, .n_blocks = 1, .block_size = 16, .n_kv_heads = 1,
                      .head_dim = hd, .dtype = kv_dtype::f16},
            .slot = misc.as<std::int64_t>()};
  }
  // Nothing launched went wrong, and nothing was written past the buffer.
  void expect_clean() const {
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_EQ(hipGetLastError(), hipSuccess);
    EXPECT_TRUE(buf.guards_intact());
  }
};

TEST(GemvQkvRopeLaunch, RefusesWhatItCannotRotate) {
  require_device();
  if (HasFatalFailure()) return;
  const rope_refusal_setup t(rope_style::neox);
  constexpr std::int64_t hd = rope_refusal_setup::hd;
  float* p = t.buf.data();
  const gemv_norm_input norm{.h = p + 1024, .delta = p + 2048, .weight = p + 3072, .h_out = p + 4096};
  const matmul_params &q = t.q, &kv = t.kv;
  const gemv_rope_kv& rope = t.rope;
  auto with = [&](auto edit) {
    matmul_params ps[3] = {q, kv, kv};
    gemv_rope_kv r = rope;
    edit(ps, r);
    return launch_gemv_qkv_rope(ps, norm, r, nullptr);
  };
  using mp = matmul_params[3];
  EXPECT_EQ(with([](mp&, gemv_rope_kv&) {}), hipSuccess);
  EXPECT_EQ(with([](mp&, gemv_rope_kv& r) { r.rot_dim = hd / 2; }), hipSuccess);
  EXPECT_EQ(with([](mp&, gemv_rope_kv& r) { r.rot_dim = hd + 2; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](mp&, gemv_rope_kv& r) { r.rot_dim = 3; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](mp&, gemv_rope_kv& r) { r.angles = nullptr; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](mp&, gemv_rope_kv& r) { r.slot = nullptr; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](mp&, gemv_rope_kv& r) { r.cache.dtype = kv_dtype::fp8; }), hipErrorInvalidValue);  // a head's scale
  EXPECT_EQ(with([](mp&, gemv_rope_kv& r) { r.cache.head_dim = hd / 2; }), hipErrorInvalidValue);
  EXPECT_EQ(with([](mp& ps, gemv_rope_kv&) { ps[0].out = hd + 2; }), hipErrorInvalidValue);  // not whole heads
  EXPECT_EQ(with([](mp& ps, gemv_rope_kv&) { ps[2].out = 2 * hd; }), hipErrorInvalidValue);  // not the cache's row
  EXPECT_EQ(with([](mp& ps, gemv_rope_kv&) { ps[0].n_tokens = ps[1].n_tokens = ps[2].n_tokens = 2; }),
            hipErrorInvalidValue);
  EXPECT_EQ(launch_gemv_qkv_rope(std::span(&q, 1), norm, rope, nullptr), hipErrorInvalidValue);  // q, k and v
  t.expect_clean();
}

TEST(GemvRopeRunLaunch, RefusesWhatItCannotRotate) {
  require_device();
  if (HasFatalFailure()) return;
  const rope_refusal_setup t(rope_style::normal);
  constexpr std::int64_t hd = rope_refusal_setup::hd;
  device_bytes work(gemv_x8_bytes(rope_refusal_setup::in, 1));
  const matmul_params &q = t.q, &kv = t.kv;
  const gemv_rope_kv& rope = t.rope;
  const matmul_params qkv[3] = {q, kv, kv};
  const auto run = [&](std::size_t from, std::size_t n, int first, const gemv_rope_kv& r) {
    return launch_gemv_rope_run(std::span(qkv).subspan(from, n), first, r, work.data(), work.size(), nullptr);
  };
  EXPECT_EQ(run(0, 3, 0, rope), hipSuccess);
  EXPECT_EQ(run(0, 2, 0, rope), hipSuccess);  // q and k; v its own launch
  EXPECT_EQ(run(1, 2, 1, rope), hipSuccess);  // k and v
  EXPECT_EQ(run(2, 1, 2, rope), hipSuccess);  // v
  EXPECT_EQ(run(0, 1, 1, rope), hipErrorInvalidValue);  // q's rows as k's: not the cache's row
  EXPECT_EQ(run(1, 2, 2, rope), hipErrorInvalidValue);  // past v
  EXPECT_EQ(run(1, 1, -1, rope), hipErrorInvalidValue);
  EXPECT_EQ(run(0, 3, 1, rope), hipErrorInvalidValue);
  gemv_rope_kv r = rope;
  r.cache.dtype = kv_dtype::int8;
  EXPECT_EQ(run(0, 3, 0, r), hipErrorInvalidValue);  // a head's scale
  r = rope;
  r.rot_dim = hd + 2;
  EXPECT_EQ(run(0, 3, 0, r), hipErrorInvalidValue);
  EXPECT_EQ(launch_gemv_rope_run(qkv, 0, rope, nullptr, 0, nullptr), hipErrorInvalidValue);  // no workspace
  EXPECT_EQ(launch_gemv_rope_run(qkv, 0, rope, work.data(), work.size() - 16, nullptr), hipErrorInvalidValue);
  matmul_params two[3] = {q, kv, kv};
  for (matmul_params& m : two) m.n_tokens = 2;
  EXPECT_EQ(launch_gemv_rope_run(two, 0, rope, work.data(), work.size(), nullptr), hipErrorInvalidValue);
  matmul_params f16[3] = {q, kv, kv};
  for (matmul_params& m : f16) m.w_type = ggml_type::F16;
  EXPECT_EQ(launch_gemv_rope_run(f16, 0, rope, work.data(), work.size(), nullptr), hipErrorInvalidValue);
  t.expect_clean();
}

}  // namespace

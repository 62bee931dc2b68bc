// The mixture-of-experts kernels (kernels/moe.h) against their CPU references. Label: gpu.
//   router: matmul_ref of the F32 router within 1e-5 of the |W|.|x| scale, decode and prefill sizes.
//   route: ids equal to moe_route_ref's (ties included: the lower id first), weights within 1e-6;
//     the grouping is a permutation of the pairs with each expert's pairs in its range, and the
//     active list names exactly the experts with pairs, in ascending order.
//   matmul: every GEMV weight type, gate/up (one row per token, two matrices in one launch) and
//     down (one row per pair): each pair's output equals matmul_ref of its expert's matrix on its
//     row within 1e-5 of the |W|.|x| scale (float activations, exact decode); on 8-bit rows (the
//     integer types), matmul_ref of the rounded rows within 1e-5. Poisoned and guarded. One token's
//     pairs each on its own (by the route's ids): the grouped launches' floats bit for bit; the
//     route without its grouping gives the same ids and weights.
//   combine: within 1e-5, with and without the shared expert and its gate.
//   the quantized GEMM's experts form (kernels/gemm_quant.h; Q4_K, Q5_K, Q6_K, MXFP4, tensor cores): the
//     same gate/up and down launches against matmul_ref within 2e-3 of the |W|.|x| scale (f16
//     operands), at every tile size (8 to 64 pairs), experts with several tiles, a stack whose
//     Q6_K and MXFP4 experts start off 16-byte boundaries, MXFP4 rows of 2,880 (a stage part-filled);
//     refusals of what it does not take.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/gemm_quant.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "tests/kernels/gpu_array.h"
#include "tests/kernels/matmul_gpu_cases.h"

namespace {

using namespace anvil::kernels;
using namespace anvil::kernels::testing;

struct route_case {
  std::int64_t tokens, n_expert, k;
  bool normalize;
  bool scaled = false;  // gemma4: each chosen weight times its expert's scale
};

// The same bytes (floats compared as bits: NaN weights included).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Routes `logits` on the device; returns ids, weights, offsets and sorted.
struct routed {
  std::vector<std::int32_t> ids, offsets, sorted, active;
  std::vector<float> weights;
};

// grouped false: ids and weights only (offsets, sorted and active null; returned empty).
routed route_on_device(const std::vector<float>& logits, std::int64_t tokens, std::int64_t n_expert, std::int64_t k,
                       bool normalize, const std::vector<float>& expert_scale = {}, bool grouped = true) {
  guarded_array<float> dl(logits), dscale(expert_scale.empty() ? std::vector<float>{0.f} : expert_scale);
  guarded_array<std::int32_t> ids(std::size_t(tokens * k)), offsets(std::size_t(n_expert + 1)),
      sorted(std::size_t(tokens * k)), active(std::size_t(n_expert + 1));
  guarded_array<float> w(std::size_t(tokens * k));
  for (auto* a : {&ids, &offsets, &sorted, &active}) a->poison();
  w.poison();
  EXPECT_EQ(launch_moe_route({.logits = dl.data(),
                              .n_tokens = tokens,
                              .n_expert = n_expert,
                              .k = k,
                              .normalize = normalize,
                              .expert_scale = expert_scale.empty() ? nullptr : dscale.data(),
                              .ids = ids.data(),
                              .weights = w.data(),
                              .offsets = grouped ? offsets.data() : nullptr,
                              .sorted = grouped ? sorted.data() : nullptr,
                              .active = grouped ? active.data() : nullptr},
                             nullptr),
            hipSuccess);
  EXPECT_EQ(hipDeviceSynchronize(), hipSuccess);
  for (auto* a : {&ids, &offsets, &sorted, &active}) EXPECT_TRUE(a->guards_intact());
  EXPECT_TRUE(w.guards_intact());
  if (!grouped) return {ids.download(), {}, {}, {}, w.download()};
  return {ids.download(), offsets.download(), sorted.download(), active.download(), w.download()};
}

// offsets/sorted group the pairs of `ids` by expert.
void expect_grouping(const routed& r, std::int64_t n_expert) {
  const std::int64_t pairs = std::int64_t(r.ids.size());
  ASSERT_EQ(r.offsets.front(), 0);
  ASSERT_EQ(r.offsets.back(), pairs);
  std::vector<int> seen(std::size_t(pairs), 0);
  for (std::int64_t e = 0; e < n_expert; ++e) {
    ASSERT_LE(r.offsets[std::size_t(e)], r.offsets[std::size_t(e + 1)]);
    for (std::int32_t i = r.offsets[std::size_t(e)]; i < r.offsets[std::size_t(e + 1)]; ++i) {
      const std::int32_t p = r.sorted[std::size_t(i)];
      ASSERT_TRUE(p >= 0 && p < pairs) << p;
      EXPECT_EQ(r.ids[std::size_t(p)], e) << "pair " << p;
      ++seen[std::size_t(p)];
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; })) << "not a permutation";
  std::vector<std::int32_t> with_pairs;
  for (std::int64_t e = 0; e < n_expert; ++e) {
    if (r.offsets[std::size_t(e + 1)] > r.offsets[std::size_t(e)]) with_pairs.push_back(std::int32_t(e));
  }
  ASSERT_EQ(r.active[0], std::int32_t(with_pairs.size()));
  EXPECT_EQ(std::vector<std::int32_t>(r.active.begin() + 1, r.active.begin() + 1 + r.active[0]), with_pairs);
}

class MoeRouteGpu : public ::testing::TestWithParam<route_case> {};

TEST_P(MoeRouteGpu, MatchesTheReferenceAndGroupsThePairs) {
  require_device();
  const route_case c = GetParam();
  std::mt19937 rng(unsigned(c.tokens * 31 + c.n_expert * 7 + c.k));
  std::vector<float> logits = random_vector(std::size_t(c.tokens * c.n_expert), rng, -4.f, 4.f);
  // Ties: in some tokens, several experts share the largest logits.
  for (std::int64_t t = 0; t < c.tokens; t += 3) {
    float* l = logits.data() + t * c.n_expert;
    for (std::int64_t e = 1; e < c.n_expert; e += 2) l[e] = 5.f;
  }
  std::vector<std::int32_t> ids(std::size_t(c.tokens * c.k));
  std::vector<float> w(ids.size());
  const std::vector<float> scale =
      c.scaled ? random_vector(std::size_t(c.n_expert), rng, 0.5f, 2.f) : std::vector<float>{};
  moe_route_ref({.logits = logits.data(),
                 .n_tokens = c.tokens,
                 .n_expert = c.n_expert,
                 .k = c.k,
                 .normalize = c.normalize,
                 .expert_scale = c.scaled ? scale.data() : nullptr,
                 .ids = ids.data(),
                 .weights = w.data()});
  const routed r = route_on_device(logits, c.tokens, c.n_expert, c.k, c.normalize, scale);
  EXPECT_EQ(r.ids, ids);
  for (std::size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(r.weights[i], w[i], 1e-6f) << i;
  expect_grouping(r, c.n_expert);
  // Without the grouping (a one-token step's matmuls by pair): the same ids and weights.
  const routed alone = route_on_device(logits, c.tokens, c.n_expert, c.k, c.normalize, scale, false);
  EXPECT_EQ(alone.ids, r.ids);
  EXPECT_TRUE(same_bits(alone.weights, r.weights));
}

INSTANTIATE_TEST_SUITE_P(Shapes, MoeRouteGpu,
                         ::testing::Values(route_case{1, 8, 2, true}, route_case{37, 8, 2, false},
                                           route_case{300, 128, 8, true}, route_case{5, 60, 4, false},
                                           route_case{9, 1024, 64, true}, route_case{0, 16, 2, true},
                                           route_case{64, 3, 3, true},
                                           // one block routing and grouping: each token by the whole
                                           // block (up to 8 tokens; 128 to 1,024 threads), or a warp
                                           // per token (512 and 1,024 threads)
                                           route_case{1, 128, 8, true}, route_case{8, 60, 4, true},
                                           route_case{3, 1000, 16, false}, route_case{12, 128, 8, false},
                                           route_case{32, 256, 8, true},
                                           // gemma4's per-expert scales, by both ways of routing
                                           route_case{37, 128, 8, true, true}, route_case{4, 128, 8, true, true}));

// A NaN logit makes every probability of its token NaN (the softmax's sum): the k experts chosen
// are then the lowest ids, in order, never an id out of range, by either way of routing.
TEST(MoeRouteGpu, ANanLogitStillChoosesKValidExperts) {
  require_device();
  for (const std::int64_t tokens : {std::int64_t(1), std::int64_t(12)}) {
    SCOPED_TRACE(tokens);
    constexpr std::int64_t n_expert = 128, k = 8;
    std::mt19937 rng{unsigned(tokens)};
    std::vector<float> logits = random_vector(std::size_t(tokens * n_expert), rng, -4.f, 4.f);
    logits[std::size_t(5)] = std::nanf("");  // token 0
    const routed r = route_on_device(logits, tokens, n_expert, k, true);
    for (std::int64_t j = 0; j < k; ++j) EXPECT_EQ(r.ids[std::size_t(j)], j);
    std::vector<std::int32_t> ids(std::size_t(tokens * k));
    std::vector<float> w(ids.size());
    moe_route_ref({.logits = logits.data(), .n_tokens = tokens, .n_expert = n_expert, .k = k, .normalize = true,
                   .ids = ids.data(), .weights = w.data()});
    EXPECT_TRUE(std::equal(r.ids.begin() + k, r.ids.end(), ids.begin() + k)) << "the other tokens as the reference";
    expect_grouping(r, n_expert);
  }
}

TEST(MoeRouteGpu, RefusesOutOfRangeShapes) {
  require_device();
  guarded_array<float> l(16);
  guarded_array<std::int32_t> i(16), o(32), s(16), act(32);
  guarded_array<float> w(16);
  const moe_route_params ok{.logits = l.data(),
                            .n_tokens = 2,
                            .n_expert = 8,
                            .k = 2,
                            .ids = i.data(),
                            .weights = w.data(),
                            .offsets = o.data(),
                            .sorted = s.data(),
                            .active = act.data()};
  const auto refused = [&](auto change) {
    moe_route_params q = ok;
    change(q);
    return launch_moe_route(q, nullptr) == hipErrorInvalidValue;
  };
  EXPECT_TRUE(refused([](moe_route_params& q) { q.k = 9; })) << "k above n_expert";
  EXPECT_TRUE(refused([](moe_route_params& q) { q.k = moe_max_used + 1; })) << "k above the kernel's limit";
  EXPECT_TRUE(refused([](moe_route_params& q) { q.n_expert = 0; })) << "no experts";
  EXPECT_TRUE(refused([](moe_route_params& q) { q.n_expert = moe_max_experts + 1; })) << "too many experts";
  EXPECT_TRUE(refused([](moe_route_params& q) { q.sorted = nullptr; })) << "no grouping";
  EXPECT_TRUE(refused([](moe_route_params& q) { q.active = nullptr; })) << "no active list";
  EXPECT_TRUE(refused([](moe_route_params& q) { q.offsets = nullptr; })) << "a grouping without offsets";
  EXPECT_FALSE(refused([](moe_route_params& q) {
    q.offsets = nullptr, q.sorted = nullptr, q.active = nullptr;
  })) << "no grouping asked";
  EXPECT_FALSE(refused([](moe_route_params&) {})) << "the valid shape";
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
}

TEST(MoeRouterGpu, IsTheF32MatmulOfTheRouter) {
  require_device();
  // Steps of up to 8 tokens take the split kernel, longer ones the other; odd token counts add a
  // bias per expert (gpt-oss), even ones none.
  for (const auto& [tokens, n_expert, in] : {std::tuple{1, 128, 2048}, std::tuple{5, 8, 64}, std::tuple{37, 60, 512},
                                             std::tuple{300, 128, 256}}) {
    SCOPED_TRACE("tokens " + std::to_string(tokens) + ", experts " + std::to_string(n_expert) + ", in " + std::to_string(in));
    std::mt19937 rng(unsigned(tokens + n_expert + in));
    const host_weight w(ggml_type::F32, n_expert, in, rng);
    const std::vector<float> x = random_vector(std::size_t(tokens * in), rng);
    const bool biased = tokens % 2 == 1;
    const std::vector<float> bias = random_vector(std::size_t(n_expert), rng, -2.f, 2.f);
    std::vector<float> ref(std::size_t(tokens * n_expert));
    matmul_ref({.w = w.bytes.data(),
                .w_type = ggml_type::F32,
                .in = in,
                .out = n_expert,
                .bias = biased ? bias.data() : nullptr,
                .x = x.data(),
                .y = ref.data(),
                .n_tokens = tokens});
    guarded_array<float> dw(w.values), dx(x), db(bias), out(ref.size());
    out.poison();
    ANVIL_GPU_CHECK(launch_moe_router({.w = dw.data(),
                                       .x = dx.data(),
                                       .logits = out.data(),
                                       .in = in,
                                       .n_expert = n_expert,
                                       .n_tokens = tokens,
                                       .bias = biased ? db.data() : nullptr},
                                      nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_TRUE(out.guards_intact());
    EXPECT_LE(max_scaled_error(out.download(), ref, w, x, biased ? bias.data() : nullptr, tokens), 1e-5);
  }
}

struct matmul_case {
  ggml_type type;
  std::int64_t tokens, n_expert, k, in, out;
  std::string str() const {
    std::ostringstream s;
    s << type_name(type) << " tokens=" << tokens << " experts=" << n_expert << " k=" << k << " in=" << in
      << " out=" << out;
    return s.str();
  }
};

// Rows of x rounded to 8 bits as the GEMV's activation quantizer rounds them (kernels/gemv.h):
// q = rint(x / d), d = max|x| / 127 per 32 elements, {d, d * sum(q)} per 16; `rounded` is q * d.
struct host_x8 {
  std::vector<std::int8_t> q;
  std::vector<float> ds, rounded;
  explicit host_x8(const std::vector<float>& x) : q(x.size()), ds(x.size() / 8), rounded(x.size()) {
    for (std::size_t b = 0; b < x.size(); b += 32) {
      float amax = 0.f;
      for (std::size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
      for (std::size_t h = b; h < b + 32; h += 16) {
        int sum = 0;
        for (std::size_t i = h; i < h + 16; ++i) {
          q[i] = std::int8_t(std::rint(x[i] * id));
          sum += q[i];
          rounded[i] = float(q[i]) * d;
        }
        ds[h / 8] = d;
        ds[h / 8 + 1] = d * float(sum);
      }
    }
  }
};

// Two stacks (gate, up) of n_expert random matrices [out][in] of the case's type, as a GGUF's
// expert tensors hold them, on the host and on the device.
struct host_stacks {
  std::vector<host_weight> gate, up;
  std::vector<std::uint8_t> gate_bytes, up_bytes;
};
host_stacks random_stacks(const matmul_case& c, std::mt19937& rng) {
  host_stacks h;
  for (std::int64_t e = 0; e < c.n_expert; ++e) {
    h.gate.emplace_back(c.type, c.out, c.in, rng);
    h.up.emplace_back(c.type, c.out, c.in, rng);
    h.gate_bytes.insert(h.gate_bytes.end(), h.gate.back().bytes.begin(), h.gate.back().bytes.end());
    h.up_bytes.insert(h.up_bytes.end(), h.up.back().bytes.begin(), h.up.back().bytes.end());
  }
  return h;
}
struct expert_stacks {
  host_stacks h;
  const std::vector<host_weight>& gate = h.gate;
  const std::vector<host_weight>& up = h.up;
  std::size_t stride = h.gate.front().bytes.size();  // bytes from one expert's matrix to the next
  device_bytes dg{h.gate_bytes.size()}, du{h.up_bytes.size()};
  expert_stacks(const matmul_case& c, std::mt19937& rng) : h(random_stacks(c, rng)) {
    dg.upload(h.gate_bytes.data(), h.gate_bytes.size());
    du.upload(h.up_bytes.data(), h.up_bytes.size());
  }
};

// Gate and up in one launch: both stacks, a row of x per token (x_div k), the route's grouping.
moe_matmul_params gate_up_params(const matmul_case& c, const expert_stacks& s, const float* x, float* yg, float* yu,
                                 const guarded_array<std::int32_t>& offsets, const guarded_array<std::int32_t>& sorted,
                                 const guarded_array<std::int32_t>& active) {
  return {.w = {s.dg.data(), s.du.data()},
          .y = {yg, yu},
          .n_mats = 2,
          .w_type = c.type,
          .in = c.in,
          .out = c.out,
          .stride = s.stride,
          .x = x,
          .x_div = c.k,
          .n_pairs = c.tokens * c.k,
          .n_expert = c.n_expert,
          .offsets = offsets.data(),
          .sorted = sorted.data(),
          .active = active.data()};
}

// The down projection's form of the same launch: the gate stack alone, a row of x per pair
// (x_div 1), a bias per expert (gpt-oss; [n_expert, out]).
moe_matmul_params down_params(moe_matmul_params p, const float* x, float* y, const float* bias) {
  p.w[1] = nullptr;
  p.y[0] = y;
  p.y[1] = nullptr;
  p.bias[0] = bias;
  p.n_mats = 1;
  p.x = x;
  p.x_div = 1;
  return p;
}

// Each pair's gate and up outputs (token t's row of x) and down output (the pair's row of xp,
// its expert's bias) against matmul_ref of its expert's matrix: every scaled error below
// `limit`; returns the largest (1 for a NaN).
double expect_pairs_match(const matmul_case& c, const routed& r, const expert_stacks& s, const std::vector<float>& x,
                          const std::vector<float>& xp, const std::vector<float>& bias, const std::vector<float>& got_g,
                          const std::vector<float>& got_u, const std::vector<float>& got_d, double limit,
                          const char* what) {
  double worst = 0;
  for (std::int64_t pr = 0; pr < c.tokens * c.k; ++pr) {
    const std::size_t e = std::size_t(r.ids[std::size_t(pr)]);
    const std::int64_t t = pr / c.k;
    const std::vector<float> xt(x.begin() + t * c.in, x.begin() + (t + 1) * c.in);
    const std::vector<float> xr(xp.begin() + pr * c.in, xp.begin() + (pr + 1) * c.in);
    const float* down_bias = bias.data() + std::int64_t(e) * c.out;
    for (const auto& [hw, xv, got, b] : {std::tuple{&s.gate[e], &xt, &got_g, (const float*)nullptr},
                                         std::tuple{&s.up[e], &xt, &got_u, (const float*)nullptr},
                                         std::tuple{&s.gate[e], &xr, &got_d, down_bias}}) {
      std::vector<float> ref(std::size_t(c.out));
      matmul_ref({.w = hw->bytes.data(),
                  .w_type = c.type,
                  .in = c.in,
                  .out = c.out,
                  .bias = b,
                  .x = xv->data(),
                  .y = ref.data(),
                  .n_tokens = 1});
      const std::vector<float> mine(got->begin() + pr * c.out, got->begin() + (pr + 1) * c.out);
      const double err = max_scaled_error(mine, ref, *hw, *xv, b, 1);
      worst = std::max(worst, std::isnan(err) ? 1.0 : err);
      EXPECT_LT(err, limit) << what << ", pair " << pr;
    }
  }
  return worst;
}

class MoeMatmulGpu : public ::testing::TestWithParam<ggml_type> {};

TEST_P(MoeMatmulGpu, EachPairIsItsExpertsMatmulOfItsRow) {
  require_device();
  const ggml_type type = GetParam();
  // Decode-sized, prefill-sized (chunks of 8, 2 and 1 pairs per expert) and one expert taking all.
  // Rows of 768 (a 30B-A3B expert's down projection), 2048 and 4096 take 4, 8 and 32 lanes a row
  // on the integer path for some types.
  std::vector<matmul_case> cases = {matmul_case{type, 1, 8, 2, 256, 72},   matmul_case{type, 23, 6, 2, 512, 40},
                                    matmul_case{type, 40, 4, 3, 256, 130},  matmul_case{type, 9, 1, 1, 256, 8},
                                    matmul_case{type, 2, 16, 8, 768, 33},   matmul_case{type, 3, 4, 2, 2048, 20},
                                    matmul_case{type, 1, 4, 2, 4096, 9},   matmul_case{type, 1, 128, 8, 2048, 24}};
  // gpt-oss's rows of 2,880 for the types of 32-element blocks.
  if (type == ggml_type::MXFP4 || type == ggml_type::Q8_0) cases.push_back(matmul_case{type, 1, 4, 2, 2880, 24});
  for (const matmul_case& c : cases) {
    SCOPED_TRACE(c.str());
    std::mt19937 rng(unsigned(c.tokens * 131 + c.n_expert + int(type)));
    const std::int64_t pairs = c.tokens * c.k;
    const std::vector<float> logits = random_vector(std::size_t(c.tokens * c.n_expert), rng, -2.f, 2.f);
    const routed r = route_on_device(logits, c.tokens, c.n_expert, c.k, true);
    // Two stacks (gate, up) of n_expert matrices, and one row per token.
    const expert_stacks stacks(c, rng);
    const std::vector<float> x = random_vector(std::size_t(c.tokens * c.in), rng);
    guarded_array<float> dx(x), yg(std::size_t(pairs * c.out)), yu(std::size_t(pairs * c.out));
    guarded_array<std::int32_t> off(r.offsets), sorted(r.sorted), active(r.active);
    yg.poison();
    yu.poison();
    const moe_matmul_params p = gate_up_params(c, stacks, dx.data(), yg.data(), yu.data(), off, sorted, active);
    ANVIL_GPU_CHECK(launch_moe_matmul(p, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_TRUE(yg.guards_intact());
    EXPECT_TRUE(yu.guards_intact());
    const std::vector<float> got_g = yg.download(), got_u = yu.download();
    // The down projection's form: one row per pair, one matrix, a bias per expert.
    const std::vector<float> xp = random_vector(std::size_t(pairs * c.in), rng);
    const std::vector<float> bias = random_vector(std::size_t(c.n_expert * c.out), rng, -1.f, 1.f);
    guarded_array<float> dxp(xp), yd(std::size_t(pairs * c.out)), dbias(bias);
    yd.poison();
    const moe_matmul_params d = down_params(p, dxp.data(), yd.data(), dbias.data());
    ANVIL_GPU_CHECK(launch_moe_matmul(d, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_TRUE(yd.guards_intact());
    expect_pairs_match(c, r, stacks, x, xp, bias, got_g, got_u, yd.download(), 1e-5, "float path");
    if (!moe_matmul_int8(type)) continue;
    // The integer path: the same launches on 8-bit rows, against matmul_ref of the rounded rows
    // (exact but for float rounding of the per-block terms, as the GEMV's). max_expert_pairs 1
    // takes the one-pair kernel (a token's step) even where experts have more: it only chooses.
    const host_x8 x8(x), xp8(xp);
    guarded_array<std::int8_t> q_tok(x8.q), q_pair(xp8.q);
    guarded_array<float> s_tok(x8.ds), s_pair(xp8.ds);
    moe_matmul_params gi = p, di = d;
    gi.xq = q_tok.data(), gi.x_scales = s_tok.data(), gi.x = nullptr;
    di.xq = q_pair.data(), di.x_scales = s_pair.data(), di.x = nullptr;
    std::vector<float> grouped[3];  // gate, up, down of the last round
    for (const std::int64_t max_pairs : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "max_expert_pairs " << max_pairs);
      gi.max_expert_pairs = di.max_expert_pairs = max_pairs;
      yg.poison();
      yu.poison();
      yd.poison();
      ANVIL_GPU_CHECK(launch_moe_matmul(gi, nullptr));
      ANVIL_GPU_CHECK(launch_moe_matmul(di, nullptr));
      ANVIL_GPU_CHECK(hipDeviceSynchronize());
      for (const auto* a : {&yg, &yu, &yd}) EXPECT_TRUE(a->guards_intact());
      grouped[0] = yg.download(), grouped[1] = yu.download(), grouped[2] = yd.download();
      expect_pairs_match(c, r, stacks, x8.rounded, xp8.rounded, bias, grouped[0], grouped[1], grouped[2], 1e-5,
                         "integer path");
    }
    if (c.tokens != 1) continue;
    // One token's pairs each on its own, by the route's ids (no grouping read): the grouped
    // launches' floats bit for bit.
    guarded_array<std::int32_t> dids(r.ids);
    moe_matmul_params ga = gi, da = di;
    ga.offsets = ga.sorted = ga.active = da.offsets = da.sorted = da.active = nullptr;
    ga.pair_experts = da.pair_experts = dids.data();
    for (auto* a : {&yg, &yu, &yd}) a->poison();
    ANVIL_GPU_CHECK(launch_moe_matmul(ga, nullptr));
    ANVIL_GPU_CHECK(launch_moe_matmul(da, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    for (const auto* a : {&yg, &yu, &yd}) EXPECT_TRUE(a->guards_intact());
    EXPECT_TRUE(same_bits(yg.download(), grouped[0])) << "gate, by pair";
    EXPECT_TRUE(same_bits(yu.download(), grouped[1])) << "up, by pair";
    EXPECT_TRUE(same_bits(yd.download(), grouped[2])) << "down, by pair";
  }
}

TEST(MoePairsGpu, RefusesWhatItCannotDoAlone) {
  require_device();
  const matmul_case c{ggml_type::Q8_0, 1, 8, 2, 256, 16};
  std::mt19937 rng(3);
  const expert_stacks stacks(c, rng);
  guarded_array<std::int8_t> q(std::size_t(c.in));
  guarded_array<float> qs(std::size_t(c.in / 8)), x(std::size_t(c.in)), y(std::size_t(c.k * c.out));
  guarded_array<std::int32_t> ids(std::vector<std::int32_t>{3, 5});
  const moe_matmul_params ok{.w = {stacks.dg.data()},
                             .y = {y.data()},
                             .w_type = c.type,
                             .in = c.in,
                             .out = c.out,
                             .stride = stacks.stride,
                             .x = x.data(),
                             .x_div = c.k,
                             .xq = q.data(),
                             .x_scales = qs.data(),
                             .n_pairs = c.k,
                             .n_expert = c.n_expert,
                             .pair_experts = ids.data()};
  const auto refused = [&](auto change) {
    moe_matmul_params p = ok;
    change(p);
    return launch_moe_matmul(p, nullptr) == hipErrorInvalidValue;
  };
  EXPECT_TRUE(refused([](moe_matmul_params& p) { p.xq = nullptr; })) << "float activations";
  EXPECT_TRUE(refused([](moe_matmul_params& p) { p.n_pairs = 65536; })) << "more pairs than a grid's rows";
  EXPECT_FALSE(refused([](moe_matmul_params&) {})) << "the valid launch, with no grouping";
  EXPECT_TRUE(refused([](moe_matmul_params& p) { p.pair_experts = nullptr; })) << "neither ids nor a grouping";
  ANVIL_GPU_CHECK(hipDeviceSynchronize());
}

INSTANTIATE_TEST_SUITE_P(Types, MoeMatmulGpu, ::testing::ValuesIn(gpu_weight_types()),
                         [](const auto& param_info) { return type_name(param_info.param); });

class MoeGemmQuantGpu : public ::testing::TestWithParam<ggml_type> {};

TEST_P(MoeGemmQuantGpu, EachPairIsItsExpertsMatmulOfItsRow) {
  require_device();
  const ggml_type type = GetParam();
  if (!gemm_quant_supported(ggml_type::Q4_K, 1)) GTEST_SKIP() << "no tensor-core quantized GEMM on this device";
  // Mean pairs per expert 1 and 7 (tiles of 8; one expert with several), 10 (16), 30 (32), 65
  // (64, three tiles for some experts), one expert taking all, many experts with few pairs; out 33
  // puts Q6_K and MXFP4 experts off 16-byte boundaries (630 x 33 and 408 x 33 bytes apart); MXFP4
  // rows of 2,880 (gpt-oss) and 800 end inside a stage.
  std::vector<matmul_case> cases = {matmul_case{type, 1, 8, 2, 256, 72},   matmul_case{type, 23, 6, 2, 512, 40},
                                    matmul_case{type, 20, 16, 8, 2048, 64}, matmul_case{type, 40, 4, 3, 256, 130},
                                    matmul_case{type, 130, 4, 2, 768, 33},  matmul_case{type, 9, 1, 1, 256, 8},
                                    matmul_case{type, 3, 64, 4, 256, 64}};
  if (type == ggml_type::MXFP4) {
    cases.push_back(matmul_case{type, 5, 4, 2, 2880, 40});
    cases.push_back(matmul_case{type, 70, 2, 1, 800, 17});
  }
  for (const matmul_case& c : cases) {
    SCOPED_TRACE(c.str());
    std::mt19937 rng(unsigned(c.tokens * 71 + c.n_expert + int(type)));
    const std::int64_t pairs = c.tokens * c.k;
    const routed r = route_on_device(random_vector(std::size_t(c.tokens * c.n_expert), rng, -2.f, 2.f), c.tokens,
                                     c.n_expert, c.k, true);
    const expert_stacks stacks(c, rng);
    ASSERT_TRUE(gemm_quant_experts_supported(type, c.in, c.out, stacks.stride));
    const std::vector<float> x = random_vector(std::size_t(c.tokens * c.in), rng);
    const std::vector<float> xp = random_vector(std::size_t(pairs * c.in), rng);
    const std::vector<float> bias = random_vector(std::size_t(c.n_expert * c.out), rng, -1.f, 1.f);
    guarded_array<float> dx(x), dxp(xp), dbias(bias), yg(std::size_t(pairs * c.out)), yu(std::size_t(pairs * c.out)),
        yd(std::size_t(pairs * c.out));
    guarded_array<std::int32_t> off(r.offsets), sorted(r.sorted), active(r.active);
    device_bytes ws(gemm_quant_experts_workspace_bytes(c.in, pairs));
    for (auto* y : {&yg, &yu, &yd}) y->poison();
    const moe_matmul_params p = gate_up_params(c, stacks, dx.data(), yg.data(), yu.data(), off, sorted, active);
    const moe_matmul_params d = down_params(p, dxp.data(), yd.data(), dbias.data());
    ANVIL_GPU_CHECK(launch_gemm_quant_experts(p, ws.data(), ws.size(), nullptr));
    ANVIL_GPU_CHECK(launch_gemm_quant_experts(d, ws.data(), ws.size(), nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    for (const auto* y : {&yg, &yu, &yd}) EXPECT_TRUE(y->guards_intact());
    const double worst =
        expect_pairs_match(c, r, stacks, x, xp, bias, yg.download(), yu.download(), yd.download(), 2e-3, "tensor cores");
    std::printf("  experts gemm_quant(%s) tokens=%lld experts=%lld k=%lld in=%lld out=%lld: max scaled error %.3g\n",
                type_name(type).c_str(), static_cast<long long>(c.tokens), static_cast<long long>(c.n_expert),
                static_cast<long long>(c.k), static_cast<long long>(c.in), static_cast<long long>(c.out), worst);
    // Refused, nothing launched: a workspace too small, an odd-aligned K-quant stack, a ragged x_div.
    moe_matmul_params bad = p;
    EXPECT_EQ(launch_gemm_quant_experts(bad, ws.data(), gemm_quant_experts_workspace_bytes(c.in, c.tokens) - 1, nullptr),
              hipErrorInvalidValue);
    if (type != ggml_type::MXFP4) {  // MXFP4 blocks take any byte alignment
      bad.w[0] = static_cast<const char*>(p.w[0]) + 1;
      EXPECT_EQ(launch_gemm_quant_experts(bad, ws.data(), ws.size(), nullptr), hipErrorInvalidValue);
    }
    bad = d;
    bad.x_div = pairs + 1;
    EXPECT_EQ(launch_gemm_quant_experts(bad, ws.data(), ws.size(), nullptr), hipErrorInvalidValue);
  }
  EXPECT_FALSE(gemm_quant_experts_supported(type, type == ggml_type::MXFP4 ? 300 : 800, 64, 1 << 20))
      << "rows not whole blocks (MXFP4) or super-blocks";
  EXPECT_FALSE(gemm_quant_experts_supported(ggml_type::Q8_0, 256, 64, 1 << 20));
}

INSTANTIATE_TEST_SUITE_P(Types, MoeGemmQuantGpu,
                         ::testing::Values(ggml_type::Q4_K, ggml_type::Q5_K, ggml_type::Q6_K, ggml_type::MXFP4),
                         [](const auto& param_info) { return type_name(param_info.param); });

TEST(MoeCombineGpu, MatchesTheReferenceWithAndWithoutTheSharedExpert) {
  require_device();
  std::mt19937 rng(7);
  const std::int64_t tokens = 13, k = 4, d = 1000;
  const std::vector<float> y = random_vector(std::size_t(tokens * k * d), rng), w = random_vector(std::size_t(tokens * k), rng, 0.f, 1.f);
  const std::vector<float> shared = random_vector(std::size_t(tokens * d), rng), gate = random_vector(std::size_t(d), rng, -0.1f, 0.1f);
  const std::vector<float> x = random_vector(std::size_t(tokens * d), rng);
  guarded_array<float> dy(y), dw(w), ds(shared), dg(gate), dx(x), out(std::size_t(tokens * d));
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant == 0 ? "routed only" : variant == 1 ? "shared, ungated" : "shared, gated");
    moe_combine_params p{.y = y.data(), .weights = w.data(), .n_tokens = tokens, .k = k, .cols = d, .x = x.data()};
    if (variant >= 1) p.shared = shared.data();
    if (variant == 2) p.shared_gate = gate.data();
    std::vector<float> ref(std::size_t(tokens * d));
    p.out = ref.data();
    moe_combine_ref(p);
    moe_combine_params q{.y = dy.data(), .weights = dw.data(), .n_tokens = tokens, .k = k, .cols = d, .x = dx.data()};
    if (variant >= 1) q.shared = ds.data();
    if (variant == 2) q.shared_gate = dg.data();
    out.poison();
    q.out = out.data();
    ANVIL_GPU_CHECK(launch_moe_combine(q, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_TRUE(out.guards_intact());
    const std::vector<float> got = out.download();
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-5f) << i;
  }
}

}  // namespace

// The gated DeltaNet kernels (kernels/delta_net.hip) against their CPU references: sequences in
// their own slots, starting afresh or continuing the state a step before left (a prompt in pieces,
// then decode steps), the outputs, the convolution's and the delta rule's states all compared,
// nothing written outside its arrays or into a slot no sequence of the step holds. The convolution
// runs a thread per channel, and in the chunked cases its token-parallel kernel on the sequences
// the chunked delta rule takes (4 taps through the kernels specialised for them, 2 and 3 through
// the general ones). The delta rule runs in its recurrent form, and in its chunked form
// (prompts of several chunks of 32 and partial ones, 1-token sequences, column groups of 32 and
// partial groups) beside the recurrent one in the same launch: on tensor cores where the device
// has them, and on CUDA cores.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <sstream>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/delta_net.h"
#include "tests/kernels/gpu_array.h"
#include "tests/kernels/op_check.h"

namespace {

using namespace anvil::kernels;
using namespace anvil::kernels::testing;

struct delta_case {
  std::int64_t k_heads, v_heads, head_k, head_v, kernel;
  std::vector<std::int64_t> lengths;  // each sequence's tokens in the first step; then three decode steps
  std::string str() const {
    std::ostringstream s;
    s << "delta(hk=" << k_heads << ", hv=" << v_heads << ", dk=" << head_k << ", dv=" << head_v << ", taps=" << kernel
      << ", seqs=" << lengths.size() << ")";
    return s.str();
  }
};

enum class form { recurrent, chunked, chunked_cuda_cores };

class DeltaNetGpu : public ::testing::TestWithParam<std::tuple<delta_case, form>> {};

TEST_P(DeltaNetGpu, MatchesTheCpuReferenceStepAfterStep) {
  require_device();
  const delta_case c = std::get<0>(GetParam());
  const form f = std::get<1>(GetParam());
  const bool chunked = f != form::recurrent;
  SCOPED_TRACE(c.str() + (f == form::chunked ? " chunked" : f == form::chunked_cuda_cores ? " chunked on CUDA cores" : " recurrent"));
  std::mt19937 rng(unsigned(c.head_k * 7 + c.head_v + c.lengths.size()));
  const std::int64_t channels = 2 * c.k_heads * c.head_k + c.v_heads * c.head_v, value = c.v_heads * c.head_v;
  const auto n_seqs = std::int64_t(c.lengths.size());
  const std::int64_t n_slots = n_seqs + 2;  // the spare slots must stay untouched
  const std::vector<float> taps = random_vector(std::size_t(channels * c.kernel), rng, -0.7f, 0.7f);
  std::vector<float> a = random_vector(std::size_t(c.v_heads), rng, -0.5f, 0.5f);
  for (float& x : a) x = -std::exp(x);
  const std::vector<float> dt_bias = random_vector(std::size_t(c.v_heads), rng), norm = random_vector(std::size_t(c.head_v), rng, 0.5f, 1.5f);
  std::vector<float> conv_ref = random_vector(std::size_t(n_slots * (c.kernel - 1) * channels), rng);  // stale states
  std::vector<float> state_ref = random_vector(std::size_t(n_slots * c.v_heads * c.head_k * c.head_v), rng);
  guarded_array<float> dtaps(taps), da(a), ddt(dt_bias), dnorm(norm), dconv(conv_ref), dstate(state_ref);

  for (int step = 0; step < 4; ++step) {
    // Step 0: each sequence's prompt from position 0 (fresh), in slots n_seqs - 1 .. 0; then one token each.
    std::vector<recurrent_seq> seqs;
    std::int64_t rows = 0;
    // The chunked form: every prompt but the first (which stays recurrent in the same launch), then
    // on odd decode steps the second half of the sequences (chunks of one token).
    std::size_t chunked_from = SIZE_MAX;
    if (chunked) chunked_from = step == 0 ? std::min<std::size_t>(1, c.lengths.size() - 1) : step % 2 == 1 ? c.lengths.size() / 2 : SIZE_MAX;
    for (std::int64_t i = 0; i < n_seqs; ++i) {
      const std::int64_t n = step == 0 ? c.lengths[std::size_t(i)] : 1;
      seqs.push_back({.first = rows, .n_tokens = n, .slot = std::int32_t(n_seqs - 1 - i), .fresh = step == 0});
      rows += n;
    }
    const std::vector<float> qkv = random_vector(std::size_t(rows * channels), rng, -2.f, 2.f);
    const std::vector<float> b = random_vector(std::size_t(rows * c.v_heads), rng, -3.f, 3.f);
    const std::vector<float> alpha = random_vector(std::size_t(rows * c.v_heads), rng, -3.f, 3.f);
    const std::vector<float> z = random_vector(std::size_t(rows * value), rng, -2.f, 2.f);

    std::vector<float> x_ref = qkv, y_ref(std::size_t(rows * value));
    conv1d_silu_ref({.x = x_ref.data(), .channels = channels, .kernel = c.kernel, .taps = taps.data(),
                     .state = conv_ref.data(), .n_slots = n_slots, .seqs = seqs});
    delta_rule_ref({.qkv = x_ref.data(), .b = b.data(), .alpha = alpha.data(), .a = a.data(), .dt_bias = dt_bias.data(),
                    .z = z.data(), .norm = norm.data(), .eps = 1e-6f, .y = y_ref.data(), .state = state_ref.data(),
                    .n_slots = n_slots, .k_heads = c.k_heads, .v_heads = c.v_heads, .head_k = c.head_k,
                    .head_v = c.head_v, .seqs = seqs});

    guarded_array<float> dx(qkv), db(b), dalpha(alpha), dz(z), dy(y_ref.size());
    guarded_array<recurrent_seq> dseqs(seqs);
    dy.poison();
    const std::span<const recurrent_seq> dev_seqs(dseqs.data(), seqs.size());
    ANVIL_GPU_CHECK(launch_conv1d_silu({.x = dx.data(), .channels = channels, .kernel = c.kernel, .taps = dtaps.data(),
                                        .state = dconv.data(), .n_slots = n_slots, .seqs = dev_seqs,
                                        .chunked_from = chunked_from},
                                       nullptr));
    ANVIL_GPU_CHECK(launch_delta_rule({.qkv = dx.data(), .b = db.data(), .alpha = dalpha.data(), .a = da.data(),
                                       .dt_bias = ddt.data(), .z = dz.data(), .norm = dnorm.data(), .eps = 1e-6f,
                                       .y = dy.data(), .state = dstate.data(), .n_slots = n_slots,
                                       .k_heads = c.k_heads, .v_heads = c.v_heads, .head_k = c.head_k,
                                       .head_v = c.head_v, .seqs = dev_seqs, .chunked_from = chunked_from,
                                       .cuda_cores_only = f == form::chunked_cuda_cores},
                                      nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    const double ex = nmse(dx.download(), x_ref), ey = nmse(dy.download(), y_ref);
    const double ec = nmse(dconv.download(), conv_ref), es = nmse(dstate.download(), state_ref);
    std::printf("  %-56s step %d: nmse conv %.3g, y %.3g, conv state %.3g, state %.3g\n", c.str().c_str(), step, ex, ey,
                ec, es);
    EXPECT_LT(ex, 1e-10) << "step " << step;
    EXPECT_LT(ey, 1e-8) << "step " << step;
    EXPECT_LT(ec, 1e-10) << "step " << step;
    EXPECT_LT(es, 1e-8) << "step " << step;
    // The spare slots hold their stale state exactly (the reference left them alone too).
    const std::vector<float> conv_now = dconv.download(), state_now = dstate.download();
    const std::size_t conv_slot = std::size_t((c.kernel - 1) * channels), state_slot = std::size_t(value * c.head_k);
    for (std::size_t i = std::size_t(n_seqs) * conv_slot; i < conv_now.size(); ++i) ASSERT_EQ(conv_now[i], conv_ref[i]);
    for (std::size_t i = std::size_t(n_seqs) * state_slot; i < state_now.size(); ++i) ASSERT_EQ(state_now[i], state_ref[i]);
    EXPECT_TRUE(dx.guards_intact() && dy.guards_intact() && dconv.guards_intact() && dstate.guards_intact());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DeltaNetGpu,
    ::testing::Combine(
        ::testing::Values(
            delta_case{.k_heads = 2, .v_heads = 4, .head_k = 16, .head_v = 16, .kernel = 4, .lengths = {5, 1, 9}},
            delta_case{.k_heads = 1, .v_heads = 3, .head_k = 32, .head_v = 24, .kernel = 3, .lengths = {7, 2}},
            delta_case{.k_heads = 4, .v_heads = 4, .head_k = 64, .head_v = 64, .kernel = 2, .lengths = {3}},
            delta_case{.k_heads = 2, .v_heads = 4, .head_k = 64, .head_v = 72, .kernel = 4, .lengths = {1, 64, 95}},
            // Qwen3.5's heads: 16 key heads of 128, 32 value heads of 128, 4 taps.
            delta_case{.k_heads = 16, .v_heads = 32, .head_k = 128, .head_v = 128, .kernel = 4,
                       .lengths = {33, 1, 70, 4}},
            delta_case{.k_heads = 16, .v_heads = 32, .head_k = 128, .head_v = 128, .kernel = 4, .lengths = {2, 517}}),
        ::testing::Values(form::recurrent, form::chunked, form::chunked_cuda_cores)),
    [](const ::testing::TestParamInfo<std::tuple<delta_case, form>>& i) {
      const form f = std::get<1>(i.param);
      return "case" + std::to_string(i.index / 3) +
             (f == form::chunked ? "_chunked" : f == form::chunked_cuda_cores ? "_chunked_cuda_cores" : "_recurrent");
    });

TEST(DeltaNetGpuLaunch, RefusesShapesItHasNoKernelFor) {
  require_device();
  guarded_array<recurrent_seq> dseqs(std::vector<recurrent_seq>{{.first = 0, .n_tokens = 1, .slot = 0, .fresh = true}});
  const std::span<const recurrent_seq> seqs(dseqs.data(), 1);
  EXPECT_EQ(launch_delta_rule({.n_slots = 1, .k_heads = 1, .v_heads = 1, .head_k = 48, .head_v = 16, .seqs = seqs}, nullptr),
            hipErrorInvalidValue);
  EXPECT_EQ(launch_delta_rule({.n_slots = 1, .k_heads = 1, .v_heads = 1, .head_k = 16, .head_v = 129, .seqs = seqs}, nullptr),
            hipErrorInvalidValue);
  EXPECT_EQ(launch_delta_rule({.n_slots = 1, .k_heads = 2, .v_heads = 3, .head_k = 16, .head_v = 16, .seqs = seqs}, nullptr),
            hipErrorInvalidValue);
  EXPECT_EQ(launch_delta_rule({.n_slots = 1, .k_heads = 1, .v_heads = 1, .head_k = 16, .head_v = 16, .seqs = seqs,
                               .chunked_from = 2},
                              nullptr),
            hipErrorInvalidValue);
  EXPECT_EQ(launch_conv1d_silu({.channels = 8, .kernel = 17, .n_slots = 1, .seqs = seqs}, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(launch_conv1d_silu({.channels = 8, .kernel = 1, .n_slots = 1, .seqs = seqs}, nullptr), hipErrorInvalidValue);
}

}  // namespace

// The gated DeltaNet references (kernels/delta_net.h) against a naive double-precision restatement
// of the recurrence, and the state's continuation: a sequence fed in one step, in pieces, or one
// token at a time, alone or beside another, gives the same outputs and leaves the same state.
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/delta_net.h"
#include "tests/random_data.h"

namespace {

using namespace anvil::kernels;
using anvil::test_support::randn;

double silu(double x) { return x / (1 + std::exp(-x)); }

// Shapes of a small layer: 2 key heads, 4 value heads (each key head serves value heads h and h + 2).
constexpr std::int64_t hk = 2, hv = 4, dk = 8, dv = 6, kw = 4;
constexpr std::int64_t channels = 2 * hk * dk + hv * dv;

struct layer_inputs {
  std::vector<float> qkv, b, alpha, z, a, dt_bias, norm, taps;
  explicit layer_inputs(std::int64_t n, unsigned seed)
      : qkv(randn(n * channels, seed)), b(randn(n * hv, seed + 1)), alpha(randn(n * hv, seed + 2)),
        z(randn(n * hv * dv, seed + 3)), a(randn(hv, seed + 4)), dt_bias(randn(hv, seed + 5)),
        norm(randn(dv, seed + 6)), taps(randn(channels * kw, seed + 7)) {
    for (float& x : a) x = -std::exp(0.3f * x);  // -exp(A_log)
  }
};

// Runs conv1d_silu then delta_rule over `seqs` (slots in `conv_state`, `state`), in place on a copy
// of the inputs; returns y.
std::vector<float> run(const layer_inputs& in, std::int64_t n, std::span<const recurrent_seq> seqs,
                       std::vector<float>& conv_state, std::vector<float>& state, std::int64_t n_slots) {
  std::vector<float> x = in.qkv, y(std::size_t(n * hv * dv), 0.f);
  conv1d_silu_ref({.x = x.data(), .channels = channels, .kernel = kw, .taps = in.taps.data(), .state = conv_state.data(),
                   .n_slots = n_slots, .seqs = seqs});
  delta_rule_ref({.qkv = x.data(), .b = in.b.data(), .alpha = in.alpha.data(), .a = in.a.data(),
                  .dt_bias = in.dt_bias.data(), .z = in.z.data(), .norm = in.norm.data(), .eps = 1e-6f, .y = y.data(),
                  .state = state.data(), .n_slots = n_slots, .k_heads = hk, .v_heads = hv, .head_k = dk, .head_v = dv,
                  .seqs = seqs});
  return y;
}

// The definition restated for one sequence of rows [0, n), from a zero state, in double.
std::vector<double> naive(const layer_inputs& in, std::int64_t n) {
  std::vector<double> u(std::size_t(n * channels));
  for (std::int64_t t = 0; t < n; ++t) {
    for (std::int64_t c = 0; c < channels; ++c) {
      double acc = 0;
      for (std::int64_t j = 0; j < kw; ++j) {
        const std::int64_t src = t - (kw - 1) + j;
        if (src >= 0) acc += double(in.taps[c * kw + j]) * in.qkv[src * channels + c];
      }
      u[t * channels + c] = silu(acc);
    }
  }
  std::vector<double> y(std::size_t(n * hv * dv));
  for (std::int64_t h = 0; h < hv; ++h) {
    const std::int64_t g = h % hk;  // the tiled order
    std::vector<double> S(std::size_t(dk * dv), 0.0);
    for (std::int64_t t = 0; t < n; ++t) {
      std::vector<double> q(dk), k(dk);
      double qq = 0, kk = 0;
      for (std::int64_t i = 0; i < dk; ++i) {
        q[i] = u[t * channels + g * dk + i];
        k[i] = u[t * channels + hk * dk + g * dk + i];
        qq += q[i] * q[i];
        kk += k[i] * k[i];
      }
      for (std::int64_t i = 0; i < dk; ++i) {
        q[i] /= std::sqrt(qq + 1e-6) * std::sqrt(double(dk));
        k[i] /= std::sqrt(kk + 1e-6);
      }
      const double beta = 1 / (1 + std::exp(-double(in.b[t * hv + h])));
      const double decay = std::exp(in.a[h] * std::log1p(std::exp(double(in.alpha[t * hv + h]) + in.dt_bias[h])));
      // S_t = d S + beta k (v - d S^T k)^T
      std::vector<double> kv(dv, 0.0);
      for (std::int64_t i = 0; i < dk; ++i) {
        for (std::int64_t c = 0; c < dv; ++c) kv[c] += decay * S[i * dv + c] * k[i];
      }
      for (std::int64_t i = 0; i < dk; ++i) {
        for (std::int64_t c = 0; c < dv; ++c) {
          const double v = u[t * channels + 2 * hk * dk + h * dv + c];
          S[i * dv + c] = decay * S[i * dv + c] + beta * k[i] * (v - kv[c]);
        }
      }
      std::vector<double> o(dv, 0.0);
      double ms = 0;
      for (std::int64_t c = 0; c < dv; ++c) {
        for (std::int64_t i = 0; i < dk; ++i) o[c] += S[i * dv + c] * q[i];
        ms += o[c] * o[c];
      }
      const double inv = 1 / std::sqrt(ms / dv + 1e-6);
      for (std::int64_t c = 0; c < dv; ++c) {
        y[(t * hv + h) * dv + c] = o[c] * inv * in.norm[c] * silu(in.z[(t * hv + h) * dv + c]);
      }
    }
  }
  return y;
}

TEST(DeltaNetRef, MatchesTheRecurrenceRestatedInDouble) {
  const std::int64_t n = 13;
  const layer_inputs in(n, 11);
  std::vector<float> conv(std::size_t((kw - 1) * channels), 7.f), state(std::size_t(hv * dk * dv), 7.f);  // garbage: fresh clears it
  const recurrent_seq seq{.first = 0, .n_tokens = n, .slot = 0, .fresh = true};
  const std::vector<float> y = run(in, n, std::span(&seq, 1), conv, state, 1);
  const std::vector<double> want = naive(in, n);
  double err = 0, ref = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    err += (y[i] - want[i]) * (y[i] - want[i]);
    ref += want[i] * want[i];
  }
  EXPECT_LT(std::sqrt(err / ref), 1e-6);
  EXPECT_GT(ref, 0.0);
}

TEST(DeltaNetRef, ASequenceInPiecesContinuesFromItsSlotExactly) {
  const std::int64_t n = 11;
  const layer_inputs in(n, 21);
  const std::int64_t n_slots = 3;
  std::vector<float> conv1(std::size_t(n_slots * (kw - 1) * channels), 0.f), state1(std::size_t(n_slots * hv * dk * dv), 0.f);
  const recurrent_seq whole{.first = 0, .n_tokens = n, .slot = 2, .fresh = true};
  const std::vector<float> y1 = run(in, n, std::span(&whole, 1), conv1, state1, n_slots);

  // The same rows as pieces of 1, 4, 2 and 4 tokens in four steps, slot 2 again.
  std::vector<float> conv2(conv1.size(), 3.f), state2(state1.size(), 3.f);
  std::vector<float> y2(y1.size());
  std::int64_t first = 0;
  for (const std::int64_t len : {1, 4, 2, 4}) {
    const recurrent_seq piece{.first = first, .n_tokens = len, .slot = 2, .fresh = first == 0};
    const std::vector<float> y = run(in, n, std::span(&piece, 1), conv2, state2, n_slots);
    std::memcpy(y2.data() + first * hv * dv, y.data() + first * hv * dv, std::size_t(len * hv * dv) * sizeof(float));
    first += len;
  }
  EXPECT_EQ(y1, y2);
  const std::size_t slot_conv = std::size_t(2 * (kw - 1) * channels), slot_state = std::size_t(2 * hv * dk * dv);
  EXPECT_TRUE(std::equal(conv1.begin() + slot_conv, conv1.end(), conv2.begin() + slot_conv));
  EXPECT_TRUE(std::equal(state1.begin() + slot_state, state1.end(), state2.begin() + slot_state));
  EXPECT_EQ(conv2[0], 3.f) << "other slots untouched";
}

TEST(DeltaNetRef, TwoSequencesInOneStepKeepToTheirOwnSlots) {
  const std::int64_t n = 9;  // rows 0-4 sequence A (slot 1), rows 5-8 sequence B (slot 0)
  const layer_inputs in(n, 31);
  std::vector<float> conv(std::size_t(2 * (kw - 1) * channels), 0.f), state(std::size_t(2 * hv * dk * dv), 0.f);
  const recurrent_seq both[] = {{.first = 0, .n_tokens = 5, .slot = 1, .fresh = true},
                                {.first = 5, .n_tokens = 4, .slot = 0, .fresh = true}};
  const std::vector<float> y = run(in, n, both, conv, state, 2);
  for (const recurrent_seq& s : both) {
    std::vector<float> c1(conv.size(), 0.f), s1(state.size(), 0.f);
    const std::vector<float> alone = run(in, n, std::span(&s, 1), c1, s1, 2);
    for (std::int64_t i = s.first * hv * dv; i < (s.first + s.n_tokens) * hv * dv; ++i) {
      ASSERT_EQ(y[std::size_t(i)], alone[std::size_t(i)]) << "row " << i / (hv * dv);
    }
  }
}

}  // namespace

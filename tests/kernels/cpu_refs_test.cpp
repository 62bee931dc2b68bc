// The CPU references other than RMSNorm: each checked against hand-computed values or a naive
// double-precision restatement of its definition.
#include <cmath>
#include <random>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"
#include "kernels/rms_norm_residual.h"
#include "kernels/softcap.h"
#include "kernels/swiglu.h"
#include "tests/random_data.h"

namespace {

using namespace anvil::kernels;
using anvil::model::ggml_type;

using anvil::test_support::randn;

TEST(MatmulRef, MatchesANaiveProductWithBias) {
  const std::int64_t in = 96, out = 7, tokens = 3;
  const auto w = randn(in * out, 1), x = randn(in * tokens, 2), b = randn(out, 3);
  std::vector<float> y(out * tokens);
  matmul_ref({.w = w.data(),
              .w_type = ggml_type::F32,
              .in = in,
              .out = out,
              .bias = b.data(),
              .x = x.data(),
              .y = y.data(),
              .n_tokens = tokens});
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t o = 0; o < out; ++o) {
      double ref = b[o];
      for (std::int64_t i = 0; i < in; ++i) ref += double(w[o * in + i]) * x[t * in + i];
      EXPECT_NEAR(y[t * out + o], ref, 1e-4) << "t=" << t << " o=" << o;
    }
  }
}

TEST(MatmulRef, ReadsQuantizedWeightsThroughDequantization) {
  const std::int64_t in = 256, out = 5;
  const auto wf = randn(in * out, 4), x = randn(in, 5);
  for (ggml_type t : {ggml_type::F16, ggml_type::BF16, ggml_type::Q8_0, ggml_type::Q4_0, ggml_type::Q4_K,
                      ggml_type::Q5_K, ggml_type::Q6_K}) {
    const std::size_t row = *anvil::model::row_bytes(t, in);
    std::vector<std::byte> wq(row * out);
    for (std::int64_t o = 0; o < out; ++o) anvil::model::quantize_row(t, wf.data() + o * in, wq.data() + o * row, in);
    std::vector<float> y(out), deq(in);
    matmul_ref({.w = wq.data(),
                .w_type = t,
                .in = in,
                .out = out,
                .bias = nullptr,
                .x = x.data(),
                .y = y.data(),
                .n_tokens = 1});
    for (std::int64_t o = 0; o < out; ++o) {
      anvil::model::dequantize_row(t, wq.data() + o * row, deq.data(), in);
      double ref = 0;
      for (std::int64_t i = 0; i < in; ++i) ref += double(deq[i]) * x[i];
      EXPECT_NEAR(y[o], ref, 1e-3) << anvil::model::info(t).name << " row " << o;
    }
  }
}

TEST(RopeRef, PositionZeroIsTheIdentityAndNormsArePreserved) {
  const std::int64_t heads = 2, dim = 8;
  const auto x = randn(2 * heads * dim, 6);
  for (rope_style style : {rope_style::normal, rope_style::neox}) {
    std::vector<float> y = x;
    const std::int32_t pos[] = {0, 37};
    rope_ref({.x = y.data(),
              .n_tokens = 2,
              .n_heads = heads,
              .head_dim = dim,
              .rot_dim = dim,
              .positions = pos,
              .freq_base = 10000.f,
              .freq_scale = 1.f,
              .freq_factors = nullptr,
              .style = style});
    for (std::int64_t i = 0; i < heads * dim; ++i) EXPECT_FLOAT_EQ(y[i], x[i]);
    for (std::int64_t h = 0; h < heads; ++h) {
      double n0 = 0, n1 = 0;
      for (std::int64_t i = 0; i < dim; ++i) {
        n0 += double(x[(heads + h) * dim + i]) * x[(heads + h) * dim + i];
        n1 += double(y[(heads + h) * dim + i]) * y[(heads + h) * dim + i];
      }
      EXPECT_NEAR(n0, n1, 1e-4);
    }
  }
}

TEST(RopeRef, RotatesThePairsEachStyleNames) {
  // dim 4: pair 0 turns by pos * 1, pair 1 by pos * base^(-1/2).
  const float base = 100.f, p = 3.f;
  const float a0 = p, a1 = p / 10.f;
  std::vector<float> normal = {1, 2, 3, 4}, neox = {1, 2, 3, 4};
  const std::int32_t pos[] = {3};
  rope_ref({.x = normal.data(),
            .n_tokens = 1,
            .n_heads = 1,
            .head_dim = 4,
            .rot_dim = 4,
            .positions = pos,
            .freq_base = base,
            .freq_scale = 1.f,
            .freq_factors = nullptr,
            .style = rope_style::normal});
  EXPECT_NEAR(normal[0], 1 * std::cos(a0) - 2 * std::sin(a0), 1e-6);
  EXPECT_NEAR(normal[1], 1 * std::sin(a0) + 2 * std::cos(a0), 1e-6);
  EXPECT_NEAR(normal[2], 3 * std::cos(a1) - 4 * std::sin(a1), 1e-6);
  rope_ref({.x = neox.data(),
            .n_tokens = 1,
            .n_heads = 1,
            .head_dim = 4,
            .rot_dim = 4,
            .positions = pos,
            .freq_base = base,
            .freq_scale = 1.f,
            .freq_factors = nullptr,
            .style = rope_style::neox});
  EXPECT_NEAR(neox[0], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-6);
  EXPECT_NEAR(neox[2], 1 * std::sin(a0) + 3 * std::cos(a0), 1e-6);
  EXPECT_NEAR(neox[1], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-6);
  // Linear scaling and frequency factors slow the rotation.
  std::vector<float> scaled = {1, 2, 3, 4};
  const float factors[] = {2.f, 1.f};
  rope_ref({.x = scaled.data(),
            .n_tokens = 1,
            .n_heads = 1,
            .head_dim = 4,
            .rot_dim = 4,
            .positions = pos,
            .freq_base = base,
            .freq_scale = 0.5f,
            .freq_factors = factors,
            .style = rope_style::normal});
  EXPECT_NEAR(scaled[0], 1 * std::cos(a0 / 4) - 2 * std::sin(a0 / 4), 1e-6);
  EXPECT_NEAR(scaled[2], 3 * std::cos(a1 / 2) - 4 * std::sin(a1 / 2), 1e-6);
}

// The paged attention of attention_ref, written out plainly: query t at position t over positions
// (t - window, t] (all up to t for window 0), with an optional sink logit per head.
void check_attention(std::int64_t window, const float* sinks) {
  // 2 kv heads, 4 query heads (GQA 2:1), blocks of 2 slots, a sequence of 5 positions stored in
  // blocks 3, 0, 2 (out of order on purpose).
  const std::int64_t kvh = 2, heads = 4, dim = 4, bs = 2, nblocks = 4, n = 5;
  std::vector<float> kc(nblocks * bs * kvh * dim, NAN), vc(kc.size(), NAN);
  paged_kv_view cache{
      .k = kc.data(), .v = vc.data(), .n_blocks = nblocks, .block_size = bs, .n_kv_heads = kvh, .head_dim = dim};
  const std::int32_t table[] = {3, 0, 2};
  const auto k = randn(n * kvh * dim, 7), v = randn(n * kvh * dim, 8), q = randn(n * heads * dim, 9);
  std::vector<std::int64_t> slots;
  for (std::int64_t p = 0; p < n; ++p) slots.push_back(table[p / bs] * bs + p % bs);
  kv_write_ref({.cache = cache, .k = k.data(), .v = v.data(), .slots = slots.data(), .n_tokens = n});

  std::vector<float> out(q.size());
  const attention_seq seq{0, n, 0, table};
  attention_ref({.q = q.data(),
                 .out = out.data(),
                 .n_heads = heads,
                 .cache = cache,
                 .scale = 0.5f,
                 .seqs = std::span(&seq, 1),
                 .window = window,
                 .sinks = sinks});
  for (std::int64_t t = 0; t < n; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t g = h / 2, first = window ? std::max<std::int64_t>(0, t + 1 - window) : 0;
      std::vector<double> w(t + 1, 0.0);
      double sum = sinks ? std::exp(double(sinks[h])) : 0.0;
      for (std::int64_t p = first; p <= t; ++p) {
        double d = 0;
        for (std::int64_t i = 0; i < dim; ++i) d += double(q[(t * heads + h) * dim + i]) * k[(p * kvh + g) * dim + i];
        sum += w[p] = std::exp(0.5 * d);
      }
      for (std::int64_t i = 0; i < dim; ++i) {
        double ref = 0;
        for (std::int64_t p = first; p <= t; ++p) ref += w[p] / sum * v[(p * kvh + g) * dim + i];
        EXPECT_NEAR(out[(t * heads + h) * dim + i], ref, 1e-5) << "t=" << t << " h=" << h << " window=" << window;
      }
    }
  }
}

TEST(AttentionRef, ReadsThePagedCacheThroughTheBlockTable) {
  check_attention(0, nullptr);
}

TEST(AttentionRef, SlidingWindowReadsOnlyTheLastPositions) {
  check_attention(2, nullptr);
  check_attention(1, nullptr);  // each query sees itself only
}

TEST(AttentionRef, SinksTakeTheirShareOfTheSoftmax) {
  const float sinks[] = {0.5f, -1.f, 3.f, 0.f};
  check_attention(0, sinks);
  check_attention(3, sinks);
}

TEST(SwigluRef, IsSiluOfTheGateTimesUp) {
  const std::vector<float> g = {0.f, 1.f, -2.f}, u = {5.f, 2.f, 3.f};
  std::vector<float> y(3);
  swiglu_ref({.gate = g.data(), .up = u.data(), .out = y.data(), .n = 3});
  EXPECT_FLOAT_EQ(y[0], 0.f);
  EXPECT_NEAR(y[1], 1.f / (1.f + std::exp(-1.f)) * 2.f, 1e-6);
  EXPECT_NEAR(y[2], -2.f / (1.f + std::exp(2.f)) * 3.f, 1e-6);
}

TEST(SwigluRef, ClampedVariantClampsGateAndUp) {
  // gpt-oss: g = min(gate, 7), u = clamp(up, -7, 7), out = g * sigmoid(1.702 g) * (u + 1).
  const std::vector<float> g = {0.5f, 9.f, -3.f}, u = {2.f, -10.f, 8.f};
  std::vector<float> y(3);
  swiglu_ref({.gate = g.data(), .up = u.data(), .out = y.data(), .n = 3, .limit = 7.f, .alpha = 1.702f});
  const auto sig = [](float x) { return 1.f / (1.f + std::exp(-x)); };
  EXPECT_NEAR(y[0], 0.5f * sig(1.702f * 0.5f) * 3.f, 1e-6);
  EXPECT_NEAR(y[1], 7.f * sig(1.702f * 7.f) * -6.f, 1e-5);
  EXPECT_NEAR(y[2], -3.f * sig(1.702f * -3.f) * 8.f, 1e-6);
}

TEST(RmsNormResidualRef, DeltaWeightNormsTheDeltaBeforeTheAdd) {
  // Gemma 3: h += rms_norm(delta) * delta_weight, then y = rms_norm(h) * weight.
  std::vector<float> h = {1.f, -2.f, 0.5f, 3.f}, y(4);
  const std::vector<float> delta = {2.f, 0.f, -4.f, 2.f}, dw = {1.f, 2.f, 0.5f, 1.f}, w = {1.f, 1.f, 1.f, 2.f};
  rms_norm_residual_ref({.h = h.data(),
                         .delta = delta.data(),
                         .weight = w.data(),
                         .y = y.data(),
                         .rows = 1,
                         .cols = 4,
                         .eps = 0.f,
                         .delta_weight = dw.data()});
  // delta's RMS is sqrt((4 + 0 + 16 + 4) / 4) = sqrt(6).
  const float r = std::sqrt(6.f);
  const std::vector<float> want_h = {1.f + 2.f / r, -2.f, 0.5f - 2.f / r, 3.f + 2.f / r};
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(h[i], want_h[i], 1e-6) << i;
  double sq = 0;
  for (float v : want_h) sq += double(v) * v;
  const double rms = std::sqrt(sq / 4);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(y[i], want_h[i] / rms * w[i], 1e-5) << i;
}

TEST(RmsNormResidualRef, HScaleMultipliesTheSumBeforeTheNorm) {
  // Gemma 4: h = (h + delta) * h_scale, then y = rms_norm(h) * weight.
  std::vector<float> h = {1.f, -2.f, 0.5f, 3.f}, y(4);
  const std::vector<float> delta = {2.f, 0.f, -4.f, 2.f}, w = {1.f, 1.f, 1.f, 2.f};
  rms_norm_residual_ref({.h = h.data(),
                         .delta = delta.data(),
                         .weight = w.data(),
                         .y = y.data(),
                         .rows = 1,
                         .cols = 4,
                         .eps = 0.f,
                         .h_scale = 0.5f});
  const std::vector<float> want_h = {1.5f, -1.f, -1.75f, 2.5f};
  EXPECT_EQ(h, want_h);
  double sq = 0;
  for (float v : want_h) sq += double(v) * v;
  const double rms = std::sqrt(sq / 4);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(y[i], want_h[i] / rms * w[i], 1e-6) << i;
}

TEST(SoftcapRef, SquashesIntoPlusMinusTheCap) {
  std::vector<float> x = {0.f, 1.f, -30.f, 1e6f, -1e6f};
  softcap_ref({.x = x.data(), .n = 5, .cap = 30.f});
  EXPECT_EQ(x[0], 0.f);
  EXPECT_NEAR(x[1], 30.0 * std::tanh(1.0 / 30.0), 1e-6);
  EXPECT_NEAR(x[2], 30.0 * std::tanh(-1.0), 1e-5);
  EXPECT_EQ(x[3], 30.f);
  EXPECT_EQ(x[4], -30.f);
}

TEST(SwigluRef, GegluIsTanhGeluOfTheGateTimesUp) {
  // Gemma: gelu(g) = g / 2 * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 g^3))), PyTorch's approximate='tanh'.
  const std::vector<float> g = {0.f, 1.f, -2.f, 3.5f}, u = {5.f, 2.f, 3.f, -1.f};
  std::vector<float> y(4);
  swiglu_ref({.gate = g.data(), .up = u.data(), .out = y.data(), .n = 4, .act = glu_activation::gelu_tanh});
  const auto gelu = [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); };
  for (std::size_t i = 0; i < 4; ++i) EXPECT_NEAR(y[i], gelu(g[i]) * u[i], 1e-5) << i;
  EXPECT_NEAR(gelu(1.0), 0.8411920, 1e-6);  // torch.nn.functional.gelu(1.0, approximate='tanh')
}

TEST(EmbeddingRef, GathersRowsAndRejectsIdsOutsideTheVocabulary) {
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};
  std::vector<float> out(4);
  const auto gather = [&](std::span<const std::int32_t> ids, float scale) {
    embedding_ref({.table = table.data(),
                   .type = ggml_type::F32,
                   .n_embd = 2,
                   .n_vocab = 3,
                   .ids = ids.data(),
                   .n_tokens = std::int64_t(ids.size()),
                   .out = out.data(),
                   .scale = scale});
  };
  const std::int32_t ids[] = {2, 0};
  gather(ids, 1.f);
  EXPECT_EQ(out, (std::vector<float>{20, 21, 0, 1}));
  gather(ids, 0.5f);  // Gemma's sqrt(n_embd)
  EXPECT_EQ(out, (std::vector<float>{10, 10.5f, 0, 0.5f}));
  const std::int32_t bad[] = {3};
  EXPECT_THROW(gather(bad, 1.f), std::out_of_range);
}

}  // namespace

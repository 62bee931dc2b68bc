// The candidates merge over vocabulary slices (kernels/candidates_merge.h) against the whole
// vocabulary's reference: each rank's record comes from candidates_ref on its slice with
// slice_logit_params, the merge of the records must give the whole vocabulary's top (exactly), its
// log-normaliser and tail mass (to rounding), and tail draws from the same distribution.
#include "kernels/candidates_merge.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "tests/chi_square.h"
#include "tests/random_data.h"

namespace {

namespace k = anvil::kernels;
using anvil::gpu_worker::logit_params;
using anvil::gpu_worker::seq_output;

constexpr std::int32_t max_k = 64;

// Rank q's tokens of n: slices of ceil(V / n), as the model's split makes them.
struct slice {
  std::int64_t begin, end;
};
slice slice_of(std::int64_t V, int q, int n) {
  const std::int64_t stride = (V + n - 1) / n;
  return {std::min(V, stride * q), std::min(V, stride * (q + 1))};
}
const std::size_t record_bytes = k::candidates_record_bytes(max_k);

// A rank's record of one sequence, as the GPU op writes it: from candidates_ref on the slice, or,
// for a slice with no finite processed logit (all masked), the op's answer there: the slice's
// first ids at -inf, flagged.
void write_part(unsigned char* rec, std::span<const float> slice, const logit_params& p, std::int64_t position) {
  k::candidates_record_header h;
  std::vector<k::candidates_record_entry> top;
  bool masked_out = !p.allowed.empty();
  for (std::size_t t = 0; t < slice.size() && masked_out; ++t) masked_out = (p.allowed[t / 32] >> (t % 32) & 1u) == 0;
  if (masked_out) {
    h.log_normalizer = -INFINITY;
    h.n_top = std::int32_t(std::min<std::size_t>(std::size_t(p.top_k), slice.size()));
    h.flags = k::candidates_flag_no_finite;
    for (std::int32_t i = 0; i < h.n_top; ++i) top.push_back({.token = i, .logit = -INFINITY});
  } else {
    const seq_output o = k::candidates_ref(slice, p, position);
    h.log_normalizer = o.log_normalizer;
    h.tail_mass = o.tail_mass;
    h.tail_token = o.tail.token;
    h.tail_logit = o.tail.logit;
    h.n_top = std::int32_t(o.top.size());
    for (const auto& c : o.top) top.push_back({.token = c.token, .logit = c.logit});
  }
  std::memcpy(rec, &h, sizeof h);
  std::memcpy(rec + sizeof h, top.data(), top.size() * sizeof(top[0]));
}

// The logits split over n ranks as the GPU ranks split them, each reduced, then merged.
seq_output merged(const std::vector<float>& logits, const logit_params& p, std::int64_t position, int n) {
  const auto V = std::int64_t(logits.size());
  std::vector<unsigned char> parts(std::size_t(n) * record_bytes), out(record_bytes);
  k::candidates_merge_params mp{.parts = parts.data(), .n_ranks = n, .n_seqs = 1, .record_bytes = record_bytes, .vocab = V};
  for (int q = 0; q < n; ++q) {
    const slice v = slice_of(V, q, n);
    mp.vocab_begin[q] = std::int32_t(v.begin);
    const std::span<const float> slice(logits.data() + v.begin, std::size_t(v.end - v.begin));
    write_part(parts.data() + std::size_t(q) * record_bytes, slice, k::slice_logit_params(p, v.begin, v.end, q), position);
  }
  const k::candidates_batch batch = k::pack_candidates(std::span(&p, 1), std::span(&position, 1), V, max_k);
  mp.seqs = batch.seqs.data();
  mp.out = out.data();
  mp.draw = true;
  k::merge_candidates_host(mp);
  seq_output o = k::unpack_candidates(out.data());
  o.position = position;
  k::candidates_record_header h;
  std::memcpy(&h, out.data(), sizeof h);
  EXPECT_EQ(h.flags, 0);
  return o;
}

// Every processed logit of the whole vocabulary, by token.
std::vector<float> processed(const std::vector<float>& logits, logit_params p) {
  p.top_k = std::int32_t(logits.size());
  p.draw = {};
  const seq_output all = k::candidates_ref(logits, p, 0);
  std::vector<float> by_token(logits.size());
  for (const auto& c : all.top) by_token[std::size_t(c.token)] = c.logit;
  return by_token;
}

void expect_same_summary(const std::vector<float>& logits, const logit_params& p, int n, const char* what) {
  SCOPED_TRACE(std::string(what) + ", " + std::to_string(n) + " ranks");
  const std::int64_t position = 17;
  const seq_output whole = k::candidates_ref(logits, p, position);
  const seq_output m = merged(logits, p, position, n);
  ASSERT_EQ(m.top.size(), whole.top.size());
  for (std::size_t i = 0; i < m.top.size(); ++i) {
    EXPECT_EQ(m.top[i].token, whole.top[i].token) << i;
    EXPECT_EQ(m.top[i].logit, whole.top[i].logit) << i;
  }
  EXPECT_NEAR(m.log_normalizer, whole.log_normalizer, 2e-6 * std::max(1.f, std::abs(whole.log_normalizer)));
  EXPECT_NEAR(m.tail_mass, whole.tail_mass, 1e-6 + 1e-5 * whole.tail_mass);
  EXPECT_EQ(m.tail.token < 0, whole.tail.token < 0);
  if (m.tail.token >= 0) {
    for (const auto& c : m.top) {
      EXPECT_NE(c.token, m.tail.token);
    }
    EXPECT_EQ(m.tail.logit, processed(logits, p)[std::size_t(m.tail.token)]);
    EXPECT_TRUE(std::isfinite(m.tail.logit));
  }
  EXPECT_EQ(m.drawn, k::draw_token(m, p));
  if (p.draw.on && anvil::gpu_worker::is_greedy(p.temperature)) {
    EXPECT_EQ(m.drawn, whole.top[0].token);
  }
}

logit_params params(std::int32_t top_k, float temperature) {
  logit_params p;
  p.top_k = top_k;
  p.temperature = temperature;
  p.seed = 1234;
  p.draw.on = true;
  return p;
}

TEST(CandidatesMerge, GivesTheWholeVocabularysTopNormaliserAndTailMass) {
  for (const std::int64_t V : {7, 100, 1000, 4099}) {
    const std::vector<float> logits = anvil::test_support::randn(std::size_t(V), unsigned(V), 3.f);
    for (const int n : {1, 2, 3, 4}) {
      if (slice_of(V, n - 1, n).begin >= V) continue;  // the model refuses such a split
      expect_same_summary(logits, params(1, 0.f), n, "greedy");
      expect_same_summary(logits, params(40, 0.7f), n, "top 40 at 0.7");
      expect_same_summary(logits, params(max_k, 1.3f), n, "top 64 at 1.3");
    }
  }
}

TEST(CandidatesMerge, AppliesBiasPenaltiesAndTheMaskToTheRightSlice) {
  const std::int64_t V = 1000;
  const std::vector<float> logits = anvil::test_support::randn(std::size_t(V), 5u, 2.f);
  logit_params p = params(16, 0.9f);
  p.logit_bias = {{3, 4.f}, {499, 6.f}, {500, 5.f}, {999, 7.f}, {3, 0.5f}};
  p.token_counts = {{0, 2}, {250, 1}, {750, 3}, {998, 5}};
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.2f;
  p.frequency_penalty = 0.1f;
  for (const int n : {2, 3, 4}) expect_same_summary(logits, p, n, "bias and penalties");
  // A mask over every other token, and one that leaves the last quarter (a whole rank of 4) out.
  p.allowed.assign(std::size_t((V + 31) / 32), 0u);
  for (std::int64_t t = 0; t < V; t += 2) p.allowed[std::size_t(t / 32)] |= 1u << (t % 32);
  for (const int n : {2, 3, 4}) expect_same_summary(logits, p, n, "every other token allowed");
  p.allowed.assign(std::size_t((V + 31) / 32), 0u);
  for (std::int64_t t = 0; t < 700; ++t) p.allowed[std::size_t(t / 32)] |= 1u << (t % 32);
  for (const int n : {2, 4}) expect_same_summary(logits, p, n, "the last ranks masked out");
}

TEST(CandidatesMerge, TailDrawsFollowTheRestrictedDistribution) {
  const std::int64_t V = 48;
  const std::vector<float> logits = anvil::test_support::randn(std::size_t(V), 11u, 1.f);
  logit_params p = params(4, 1.f);
  p.draw = {};
  const seq_output whole = k::candidates_ref(logits, p, 0);
  const std::vector<float> l = processed(logits, p);
  std::vector<double> q(std::size_t(V), 0.0);
  double tail = 0;
  for (std::int64_t t = 0; t < V; ++t) {
    const bool in_top = std::any_of(whole.top.begin(), whole.top.end(), [&](const auto& c) { return c.token == t; });
    if (!in_top) tail += q[std::size_t(t)] = std::exp(double(l[std::size_t(t)]) - double(whole.log_normalizer));
  }
  for (double& x : q) x /= tail;
  std::vector<std::int64_t> counts(std::size_t(V), 0);
  for (std::uint64_t seed = 0; seed < 20000; ++seed) {
    p.seed = seed;
    const seq_output m = merged(logits, p, std::int64_t(seed % 7), 3);
    ASSERT_GE(m.tail.token, 0);
    ++counts[std::size_t(m.tail.token)];
  }
  const auto r = anvil::testing::chi_square(counts, q);
  EXPECT_LT(r.statistic, r.bound) << "dof " << r.dof;
}

TEST(CandidatesMerge, SliceParamsKeepTheSlicesTokensAndNoDraw) {
  logit_params p = params(8, 1.f);
  p.logit_bias = {{5, 1.f}, {40, 2.f}};
  p.token_counts = {{39, 1}, {41, 2}};
  p.allowed = {0xffffffffu, 0x00000300u};  // tokens 0-31, 40 and 41 of 64
  const logit_params s = k::slice_logit_params(p, 33, 64, 1);
  EXPECT_EQ(s.logit_bias, (std::vector<std::pair<std::int32_t, float>>{{7, 2.f}}));
  EXPECT_EQ(s.token_counts, (std::vector<std::pair<std::int32_t, std::int32_t>>{{6, 1}, {8, 2}}));
  EXPECT_EQ(s.allowed, (std::vector<std::uint32_t>{(1u << 7) | (1u << 8)}));
  EXPECT_FALSE(s.draw.on);
  EXPECT_NE(s.seed, p.seed);
  EXPECT_NE(s.seed, k::slice_logit_params(p, 0, 33, 0).seed);
  EXPECT_THROW(k::slice_logit_params(p, 10, 5, 0), std::invalid_argument);
}

TEST(CandidatesMerge, RefusesParametersOutOfRange) {
  std::vector<unsigned char> buf(4 * record_bytes);
  k::candidates_seq seq;
  const k::candidates_merge_params ok{.parts = buf.data(), .n_ranks = 2, .n_seqs = 1, .record_bytes = record_bytes,
                                      .vocab = 10, .seqs = &seq, .out = buf.data() + 2 * record_bytes};
  const std::vector<std::function<void(k::candidates_merge_params&)>> breaks = {
      [](auto& p) { p.n_ranks = 0; }, [](auto& p) { p.n_ranks = k::candidates_merge_max_ranks + 1; },
      [](auto& p) { p.record_bytes = 12; }, [](auto& p) { p.vocab = 0; }, [](auto& p) { p.seqs = nullptr; }};
  for (const auto& broken : breaks) {
    k::candidates_merge_params p = ok;
    broken(p);
    EXPECT_THROW(k::merge_candidates_host(p), std::invalid_argument);
  }
}

}  // namespace

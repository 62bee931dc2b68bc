// The attention-side GPU kernels against their CPU references: rope_kv_write (RoPE + the paged KV
// write), paged decode attention (split-K) and paged prefill attention, over each cache element
// type (f16, int8, fp8: kernels/kv_quant.h), with and without a sliding window and sink logits
// (gpt-oss). The references run on the cache's own values (K/V rounded through f16, or codes
// times scales): what remains is summation order and f32 softmax. Sentinels guard every output;
// untouched cache slots must keep their bits. Label: gpu.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"
#include "kernels/attention_decode.h"
#include "messages/step.h"
#include "kernels/attention_prefill.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/rope_kv_write.h"
#include "tests/kernels/gpu_array.h"
#include "tests/kernels/op_check.h"

namespace {

using namespace anvil::kernels;
using namespace anvil::kernels::testing;
using anvil::gpu::host_float_to_half;
using anvil::gpu::host_half_to_float;

// A random f16 cache (every slot holds some value, so untouched slots can be checked).
std::vector<std::uint16_t> random_cache(std::size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<std::uint16_t> c(n);
  for (auto& x : c) x = host_float_to_half(d(rng));
  return c;
}

std::vector<float> to_float(const std::vector<std::uint16_t>& h) {
  std::vector<float> f(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) f[i] = host_half_to_float(h[i]);
  return f;
}

// A shuffled pool of block ids, dealt out to sequences: non-contiguous, out-of-order tables.
struct block_deal {
  std::vector<std::int32_t> pool;
  std::size_t next = 0;
  block_deal(std::int64_t n_blocks, std::mt19937& rng) : pool(std::size_t(n_blocks)) {
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
  }
  std::vector<std::int32_t> take(std::int64_t n) {
    std::vector<std::int32_t> t(pool.begin() + std::ptrdiff_t(next), pool.begin() + std::ptrdiff_t(next + n));
    next += std::size_t(n);
    return t;
  }
};

std::int64_t blocks_for(std::int64_t positions, std::int64_t bs) { return (positions + bs - 1) / bs; }

// ---------------------------------------------------------------------------------------------
// rope_kv_write

struct rope_case {
  std::int64_t n_tokens, n_heads, n_kv_heads, head_dim, rot_dim;
  rope_style style;
  bool factors;
  float temp = 0.f;  // > 0: the queries' temperature (mistral3) at this scale, over a floor of 4096 positions
  std::string str() const {
    std::ostringstream s;
    s << "rope_kv_write(tokens=" << n_tokens << ", heads=" << n_heads << "/" << n_kv_heads << ", head_dim=" << head_dim
      << ", rot_dim=" << rot_dim << ", " << (style == rope_style::neox ? "neox" : "normal")
      << (factors ? ", freq_factors" : "") << (temp > 0 ? ", q temperature" : "") << ")";
    return s.str();
  }
};
constexpr std::int64_t rope_temp_floor = 4096;

class RopeKvWriteGpu : public ::testing::TestWithParam<rope_case> {};

// One case's inputs: random q, k, v; positions up to 131071 (the first 0); distinct slots spread
// over a shuffled cache, the last token padding (slot -1) when there are several; frequency
// factors when the case has them.
struct rope_inputs {
  std::int64_t bs = 16, n_blocks = 0, kv_row = 0;
  std::vector<float> q, k, v, factors;
  std::vector<std::int32_t> positions;
  std::vector<std::int64_t> slots;

  rope_inputs(const rope_case& c, std::mt19937& rng, float v_range)
      : n_blocks(blocks_for(c.n_tokens, 16) * 2 + 3), kv_row(c.n_kv_heads * c.head_dim) {
    q = random_vector(std::size_t(c.n_tokens * c.n_heads * c.head_dim), rng, -2.f, 2.f);
    k = random_vector(std::size_t(c.n_tokens * kv_row), rng, -2.f, 2.f);
    v = random_vector(std::size_t(c.n_tokens * kv_row), rng, -v_range, v_range);
    positions.resize(std::size_t(c.n_tokens));
    std::uniform_int_distribution<std::int32_t> pos_d(0, 131071);
    for (auto& p : positions) p = pos_d(rng);
    positions[0] = 0;
    std::vector<std::int64_t> all_slots(std::size_t(n_blocks * bs));
    std::iota(all_slots.begin(), all_slots.end(), 0);
    std::shuffle(all_slots.begin(), all_slots.end(), rng);
    slots.assign(all_slots.begin(), all_slots.begin() + c.n_tokens);
    if (c.n_tokens > 1) slots.back() = -1;
    factors = c.factors ? random_vector(std::size_t(c.rot_dim / 2), rng, 1.f, 8.f) : std::vector<float>{0.f};
  }

  // rope_ref over x, n_heads heads per token, as the kernel rotates q and k.
  std::vector<float> rotated(std::vector<float> x, std::int64_t n_heads, const rope_case& c) const {
    rope_ref({.x = x.data(),
              .n_tokens = c.n_tokens,
              .n_heads = n_heads,
              .head_dim = c.head_dim,
              .rot_dim = c.rot_dim,
              .positions = positions.data(),
              .freq_base = 500000.f,
              .freq_scale = 0.5f,
              .freq_factors = c.factors ? factors.data() : nullptr,
              .style = c.style});
    return x;
  }
  // A q as the kernel leaves it: rotated, then times each token's temperature where the case has one.
  std::vector<float> rotated_q(const std::vector<float>& q_in, const rope_case& c) const {
    std::vector<float> x = rotated(q_in, c.n_heads, c);
    if (c.temp <= 0) return x;
    const std::int64_t row = c.n_heads * c.head_dim;
    for (std::int64_t t = 0; t < c.n_tokens; ++t) {
      const float temp = attn_temperature(positions[std::size_t(t)], c.temp, rope_temp_floor);
      for (std::int64_t e = 0; e < row; ++e) x[std::size_t(t * row + e)] *= temp;
    }
    return x;
  }
};

// The inputs on the device, and the launch's parameters over a given cache.
// The angles table is computed on the device first, as the worker does once per step.
struct rope_device {
  guarded_array<float> q, k, v, factors;
  guarded_array<std::int32_t> positions;
  guarded_array<std::int64_t> slots;
  guarded_array<double> angles;
  guarded_array<float> q_temps;
  rope_device(const rope_inputs& in, const rope_case& c)
      : q(in.q),
        k(in.k),
        v(in.v),
        factors(in.factors),
        positions(in.positions),
        slots(in.slots),
        angles(std::max<std::size_t>(1, rope_angles_bytes(c.n_tokens, c.rot_dim) / sizeof(double))),
        q_temps(std::size_t(c.n_tokens)) {
    EXPECT_EQ(launch_rope_angles({.positions = positions.data(),
                                  .n_tokens = c.n_tokens,
                                  .rot_dim = c.rot_dim,
                                  .freq_base = 500000.f,
                                  .freq_scale = 0.5f,
                                  .freq_factors = c.factors ? factors.data() : nullptr,
                                  .out = angles.data(),
                                  .q_scales = c.temp > 0 ? q_temps.data() : nullptr,
                                  .attn_temp_scale = c.temp,
                                  .attn_temp_floor = rope_temp_floor},
                                 nullptr),
              hipSuccess);
  }
  rope_kv_write_params params(const rope_case& c, const paged_kv_device& cache) const {
    return {.q = q.data(),
            .k = k.data(),
            .v = v.data(),
            .cache = cache,
            .n_tokens = c.n_tokens,
            .n_heads = c.n_heads,
            .rot_dim = c.rot_dim,
            .angles = angles.data(),
            .slots = slots.data(),
            .style = c.style,
            .q_scales = c.temp > 0 ? q_temps.data() : nullptr};
  }
  bool intact() const {
    return q.guards_intact() && k.guards_intact() && v.guards_intact() && factors.guards_intact() &&
           positions.guards_intact() && slots.guards_intact() && angles.guards_intact() && q_temps.guards_intact();
  }
};

TEST_P(RopeKvWriteGpu, MatchesRopeThenKvWrite) {
  require_device();
  const rope_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(unsigned(c.n_tokens * 131 + c.head_dim + c.n_heads));
  const rope_inputs in(c, rng, 2.f);
  const std::vector<std::uint16_t> cache0 = random_cache(std::size_t(in.n_blocks * in.bs * in.kv_row), rng);

  // Reference: rope on q and k (float), then the write rounded to f16.
  const std::vector<float> q_ref = in.rotated_q(in.q, c), k_ref = in.rotated(in.k, c.n_kv_heads, c);
  std::vector<std::uint16_t> k_cache_ref = cache0, v_cache_ref = cache0;
  for (std::int64_t t = 0; t < c.n_tokens; ++t) {
    const std::int64_t slot = in.slots[std::size_t(t)];
    if (slot < 0) continue;
    for (std::int64_t e = 0; e < in.kv_row; ++e) {
      k_cache_ref[std::size_t(slot * in.kv_row + e)] = host_float_to_half(k_ref[std::size_t(t * in.kv_row + e)]);
      v_cache_ref[std::size_t(slot * in.kv_row + e)] = host_float_to_half(in.v[std::size_t(t * in.kv_row + e)]);
    }
  }

  const rope_device d(in, c);
  guarded_array<std::uint16_t> dkc(cache0), dvc(cache0);
  ANVIL_GPU_CHECK(launch_rope_kv_write(d.params(c, {.k = dkc.data(),
                                                    .v = dvc.data(),
                                                    .n_blocks = in.n_blocks,
                                                    .block_size = in.bs,
                                                    .n_kv_heads = c.n_kv_heads,
                                                    .head_dim = c.head_dim}),
                                       nullptr));
  ANVIL_GPU_CHECK(hipDeviceSynchronize());

  const double q_err = nmse(d.q.download(), q_ref);
  EXPECT_LT(q_err, 1e-12) << "q nmse " << q_err;
  EXPECT_EQ(d.k.download(), in.k) << "k is read only";
  // K may differ by one f16 ulp where the device's double sin/cos land across a rounding
  // boundary; V and every slot not written must match bit for bit.
  const std::vector<std::uint16_t> kc = dkc.download(), vc = dvc.download();
  std::size_t k_off_by_one = 0, k_bad = 0;
  for (std::size_t i = 0; i < kc.size(); ++i) {
    const int diff = std::abs(int(kc[i]) - int(k_cache_ref[i]));
    k_off_by_one += diff == 1;
    k_bad += diff > 1;
  }
  EXPECT_EQ(k_bad, 0u);
  EXPECT_LE(k_off_by_one, kc.size() / 1000 + 1);
  EXPECT_TRUE(vc == v_cache_ref) << "V cache (or an untouched slot) differs";
  std::printf("  %-75s q nmse=%.3g, k off-by-one ulp=%zu\n", c.str().c_str(), q_err, k_off_by_one);
  EXPECT_TRUE(d.intact());
  EXPECT_TRUE(dkc.guards_intact());
  EXPECT_TRUE(dvc.guards_intact());
}

// Gemma 4 E2B / E4B's shared-KV layers (q_only): q rotated as the full op rotates it, with k, v and
// the slots null; the cache's bytes (f16 codes, or 8-bit codes and scales) untouched.
TEST_P(RopeKvWriteGpu, RotatesOnlyQForALayerThatSharesAnotherLayersKv) {
  require_device();
  const rope_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(unsigned(c.n_tokens * 37 + c.head_dim + c.n_heads));
  const rope_inputs in(c, rng, 2.f);
  const std::int64_t n_rows = in.n_blocks * in.bs * c.n_kv_heads;
  const std::vector<std::uint8_t> bytes0 = [&] {
    std::vector<std::uint8_t> b(std::size_t(n_rows * c.head_dim * 2));
    for (auto& x : b) x = std::uint8_t(rng() & 0x7E);
    return b;
  }();
  const std::vector<float> scales0 = random_vector(std::size_t(n_rows), rng, 0.01f, 0.02f);
  for (const kv_dtype t : {kv_dtype::f16, kv_dtype::fp8}) {
    SCOPED_TRACE(std::string(kv_dtype_name(t)));
    const rope_device d(in, c);
    guarded_array<std::uint8_t> dkc(bytes0), dvc(bytes0);
    guarded_array<float> dks(scales0), dvs(scales0);
    const bool q8 = kv_is_8bit(t);
    rope_kv_write_params p = d.params(c, {.k = dkc.data(),
                                          .v = dvc.data(),
                                          .n_blocks = in.n_blocks,
                                          .block_size = in.bs,
                                          .n_kv_heads = c.n_kv_heads,
                                          .head_dim = c.head_dim,
                                          .dtype = t,
                                          .k_scales = q8 ? dks.data() : nullptr,
                                          .v_scales = q8 ? dvs.data() : nullptr});
    p.k = p.v = nullptr;
    p.slots = nullptr;
    p.q_only = true;
    ANVIL_GPU_CHECK(launch_rope_kv_write(p, nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    const double q_err = nmse(d.q.download(), in.rotated_q(in.q, c));
    EXPECT_LT(q_err, 1e-12);
    EXPECT_TRUE(dkc.download() == bytes0 && dvc.download() == bytes0) << "the cache was written";
    EXPECT_TRUE(dks.download() == scales0 && dvs.download() == scales0) << "the scales were written";
    EXPECT_TRUE(d.intact() && dkc.guards_intact() && dvc.guards_intact() && dks.guards_intact() && dvs.guards_intact());
  }
}

// The 8-bit cache: each written row holds kv_quantize_row's codes and scale for the rotated k
// (a code may move by one where the device's double sin/cos round k across a code boundary) and
// for v (exactly); rows not written keep their bytes.
TEST_P(RopeKvWriteGpu, Stores8BitRowsAsKvQuantizeRowDoes) {
  require_device();
  const rope_case c = GetParam();
  SCOPED_TRACE(c.str());
  for (const kv_dtype t : {kv_dtype::int8, kv_dtype::fp8}) {
    SCOPED_TRACE(std::string(kv_dtype_name(t)));
    std::mt19937 rng(unsigned(c.n_tokens * 17 + c.head_dim + c.n_heads));
    const rope_inputs in(c, rng, 3.f);
    const std::int64_t n_rows = in.n_blocks * in.bs * c.n_kv_heads;
    std::vector<std::uint8_t> codes0(std::size_t(n_rows * c.head_dim));
    for (auto& b : codes0) b = std::uint8_t(rng() & 0x7E);  // no NaN codes
    const std::vector<float> scales0 = random_vector(std::size_t(n_rows), rng, 0.01f, 0.02f);

    const std::vector<float> k_rot = in.rotated(in.k, c.n_kv_heads, c);
    std::vector<std::uint8_t> kc_ref = codes0, vc_ref = codes0;
    std::vector<float> ks_ref = scales0, vs_ref = scales0;
    for (std::int64_t tok = 0; tok < c.n_tokens; ++tok) {
      const std::int64_t slot = in.slots[std::size_t(tok)];
      if (slot < 0) continue;
      for (std::int64_t h = 0; h < c.n_kv_heads; ++h) {
        const std::int64_t row = slot * c.n_kv_heads + h, src = (tok * c.n_kv_heads + h) * c.head_dim;
        ks_ref[std::size_t(row)] = kv_quantize_row(k_rot.data() + src, c.head_dim, t, kc_ref.data() + row * c.head_dim);
        vs_ref[std::size_t(row)] = kv_quantize_row(in.v.data() + src, c.head_dim, t, vc_ref.data() + row * c.head_dim);
      }
    }

    const rope_device d(in, c);
    guarded_array<float> dks(scales0), dvs(scales0);
    guarded_array<std::uint8_t> dkc(codes0), dvc(codes0);
    ANVIL_GPU_CHECK(launch_rope_kv_write(d.params(c, {.k = dkc.data(),
                                                      .v = dvc.data(),
                                                      .n_blocks = in.n_blocks,
                                                      .block_size = in.bs,
                                                      .n_kv_heads = c.n_kv_heads,
                                                      .head_dim = c.head_dim,
                                                      .dtype = t,
                                                      .k_scales = dks.data(),
                                                      .v_scales = dvs.data()}),
                                         nullptr));
    ANVIL_GPU_CHECK(hipDeviceSynchronize());
    EXPECT_EQ(d.k.download(), in.k) << "k is read only";
    const std::vector<std::uint8_t> kc = dkc.download();
    const std::vector<float> ks = dks.download();
    // A code's rank in value order (both zeros rank 0): codes one apart in value rank one apart.
    const auto rank = [t](std::uint8_t b) { return t == kv_dtype::int8 ? int(std::int8_t(b)) : (b & 0x80 ? -(b & 0x7F) : b); };
    std::size_t k_moved = 0, k_bad = 0;
    for (std::size_t i = 0; i < kc.size(); ++i) {
      const int diff = std::abs(rank(kc[i]) - rank(kc_ref[i]));
      k_moved += diff != 0;
      k_bad += diff > 1;
    }
    EXPECT_EQ(k_bad, 0u);
    EXPECT_LE(k_moved, kc.size() / 500 + 1);
    for (std::size_t r = 0; r < ks.size(); ++r) EXPECT_NEAR(ks[r], ks_ref[r], 1e-6 * std::abs(ks_ref[r])) << "row " << r;
    EXPECT_TRUE(dvc.download() == vc_ref) << "V codes (or an untouched row) differ";
    EXPECT_TRUE(dvs.download() == vs_ref) << "V scales (or an untouched row) differ";
    const double q_err = nmse(d.q.download(), in.rotated_q(in.q, c));
    EXPECT_LT(q_err, 1e-12);
    std::printf("  %-75s %s: k codes moved by one=%zu\n", c.str().c_str(), std::string(kv_dtype_name(t)).c_str(), k_moved);
    EXPECT_TRUE(d.intact());
    for (auto* g : {&dks, &dvs}) EXPECT_TRUE(g->guards_intact());
    EXPECT_TRUE(dkc.guards_intact() && dvc.guards_intact());
  }
}

// q, k and v of each token inside one row of `stride` floats (the FP8 path's stacked q/k/v
// projection), the padding between rows random.
std::vector<float> fused_qkv_rows(const rope_inputs& in, const rope_case& c, std::int64_t stride, std::mt19937& rng) {
  const std::int64_t q_w = c.n_heads * c.head_dim;
  std::vector<float> fused = random_vector(std::size_t(c.n_tokens * stride), rng, -1.f, 1.f);
  for (std::int64_t t = 0; t < c.n_tokens; ++t) {
    std::copy_n(in.q.begin() + t * q_w, q_w, fused.begin() + t * stride);
    std::copy_n(in.k.begin() + t * in.kv_row, in.kv_row, fused.begin() + t * stride + q_w);
    std::copy_n(in.v.begin() + t * in.kv_row, in.kv_row, fused.begin() + t * stride + q_w + in.kv_row);
  }
  return fused;
}

// One launch's device side for the tests of fused rows: the inputs packed (d) and inside the fused
// rows, q's packed output for the fused form, and a zeroed cache of type t (k, then v) with its
// scales (8-bit types). params() reads the packed inputs or the fused rows.
struct rope_fused_launch {
  const rope_case& c;
  const rope_inputs& in;
  const std::vector<float>& fused;
  std::int64_t stride, q_w = c.n_heads * c.head_dim, n_rows = in.n_blocks * in.bs * c.n_kv_heads;
  kv_dtype t;
  std::size_t cache_bytes = std::size_t(n_rows * c.head_dim) * (t == kv_dtype::f16 ? 2 : 1);
  rope_device d{in, c};
  guarded_array<float> dfused{fused}, dq{std::size_t(c.n_tokens * q_w)}, ds{std::size_t(2 * n_rows)};
  guarded_array<std::uint8_t> dc{2 * cache_bytes};

  rope_fused_launch(const rope_case& c_, const rope_inputs& in_, const std::vector<float>& fused_, std::int64_t stride_,
                    kv_dtype t_)
      : c(c_), in(in_), fused(fused_), stride(stride_), t(t_) {
    EXPECT_EQ(hipMemset(dc.data(), 0, 2 * cache_bytes), hipSuccess);
    EXPECT_EQ(hipMemset(ds.data(), 0, std::size_t(2 * n_rows) * sizeof(float)), hipSuccess);
  }
  rope_kv_write_params params(bool from_fused) const {
    rope_kv_write_params p = d.params(c, {.k = dc.data(),
                                          .v = dc.data() + cache_bytes,
                                          .n_blocks = in.n_blocks,
                                          .block_size = in.bs,
                                          .n_kv_heads = c.n_kv_heads,
                                          .head_dim = c.head_dim,
                                          .dtype = t,
                                          .k_scales = t == kv_dtype::f16 ? nullptr : ds.data(),
                                          .v_scales = t == kv_dtype::f16 ? nullptr : ds.data() + n_rows});
    if (from_fused) {
      p.q = dq.data();
      p.q_in = dfused.data();
      p.k = dfused.data() + q_w;
      p.v = dfused.data() + q_w + in.kv_row;
      p.q_in_stride = p.k_stride = p.v_stride = stride;
    }
    return p;
  }
  // After the launch: the rotated q, the cache bytes and the scales; the guards and the fused rows
  // (read only) checked.
  void results(bool from_fused, std::vector<float>& q_out, std::vector<std::uint8_t>& cache, std::vector<float>& scales) const {
    q_out = from_fused ? dq.download() : d.q.download();
    cache = dc.download();
    scales = ds.download();
    EXPECT_EQ(dfused.download(), fused) << "the fused rows are read only";
    EXPECT_TRUE(dfused.guards_intact() && dq.guards_intact() && dc.guards_intact() && ds.guards_intact() && d.intact());
  }
};

// q, k and v inside one fused row per token (the FP8 path's stacked q/k/v projection): the same
// rotated q (written packed to q), the same cache bytes and scales as from packed inputs, for the
// f16 and the 8-bit caches; the fused rows are left as they were.
TEST_P(RopeKvWriteGpu, ReadsQkvFromOneFusedRowAsFromPackedRows) {
  require_device();
  const rope_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(unsigned(c.n_tokens * 29 + c.head_dim + c.n_heads));
  const rope_inputs in(c, rng, 3.f);
  const std::int64_t stride = c.n_heads * c.head_dim + 2 * in.kv_row + 4;  // padded rows
  const std::vector<float> fused = fused_qkv_rows(in, c, stride, rng);
  for (const kv_dtype t : {kv_dtype::f16, kv_dtype::fp8}) {
    SCOPED_TRACE(std::string(kv_dtype_name(t)));
    const auto run = [&](bool from_fused, std::vector<float>& q_out, std::vector<std::uint8_t>& cache,
                         std::vector<float>& scales) {
      const rope_fused_launch l(c, in, fused, stride, t);
      ANVIL_GPU_CHECK(launch_rope_kv_write(l.params(from_fused), nullptr));
      ANVIL_GPU_CHECK(hipDeviceSynchronize());
      l.results(from_fused, q_out, cache, scales);
    };
    std::vector<float> q_packed, q_fused, s_packed, s_fused;
    std::vector<std::uint8_t> c_packed, c_fused;
    run(false, q_packed, c_packed, s_packed);
    run(true, q_fused, c_fused, s_fused);
    EXPECT_EQ(q_fused, q_packed);
    EXPECT_TRUE(c_fused == c_packed) << "cache bytes differ";
    EXPECT_EQ(s_fused, s_packed);
  }
  const rope_device d(in, c);
  rope_kv_write_params short_stride = d.params(c, {.n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim});
  short_stride.k_stride = in.kv_row - 1;
  EXPECT_EQ(launch_rope_kv_write(short_stride, nullptr), hipErrorInvalidValue);
}

// Q/K norms in the op (qwen3), and V's norm without a weight (gemma4): the rotated q, the cache
// bytes and the scales are bit for bit what launch_rms_norm in place over the q, k and v heads (v
// with a weight of ones), then the op without norms, give (the worker's launches before), for
// packed rows and for one fused q/k/v row per token, f16 and fp8 caches; q against rms_norm_ref
// then rope_ref on the CPU.
TEST_P(RopeKvWriteGpu, NormsEachHeadFirstAsRmsNormInPlaceThenRopeDo) {
  require_device();
  const rope_case c = GetParam();
  SCOPED_TRACE(c.str());
  std::mt19937 rng(unsigned(c.n_tokens * 37 + c.head_dim + c.n_heads));
  const rope_inputs in(c, rng, 3.f);
  const std::vector<float> qw = random_vector(std::size_t(c.head_dim), rng, 0.5f, 1.5f);
  const std::vector<float> kw = random_vector(std::size_t(c.head_dim), rng, 0.5f, 1.5f);
  const std::int64_t q_w = c.n_heads * c.head_dim, stride = q_w + 2 * in.kv_row + 4;  // padded rows
  const std::vector<float> fused = fused_qkv_rows(in, c, stride, rng);
  guarded_array<float> dqw(qw), dkw(kw), dones(std::vector<float>(std::size_t(c.head_dim), 1.f));
  for (const bool from_fused : {false, true}) {
    for (const kv_dtype t : {kv_dtype::f16, kv_dtype::fp8}) {
      SCOPED_TRACE(std::string(kv_dtype_name(t)) + (from_fused ? ", fused rows" : ", packed rows"));
      // in_op: the norms in this op; else launch_rms_norm in place first.
      const auto run = [&](bool in_op, std::vector<float>& q_out, std::vector<std::uint8_t>& cache, std::vector<float>& scales) {
        const rope_fused_launch l(c, in, fused, stride, t);
        rope_kv_write_params p = l.params(from_fused);
        if (in_op) {
          p.q_norm = dqw.data();
          p.k_norm = dkw.data();
          p.v_norm = true;
          p.norm_eps = 1e-6f;
        } else {
          const auto norm = [&](float* x, const float* w, std::int64_t heads) {  // the op's input, in place
            ANVIL_GPU_CHECK(launch_rms_norm({.x = x,
                                             .weight = w,
                                             .y = x,
                                             .rows = c.n_tokens * heads,
                                             .cols = c.head_dim,
                                             .eps = 1e-6f,
                                             .group_rows = from_fused ? heads : 0,
                                             .group_stride = from_fused ? stride : 0},
                                            nullptr));
          };
          norm(from_fused ? l.dfused.data() : l.d.q.data(), dqw.data(), c.n_heads);
          norm(from_fused ? l.dfused.data() + q_w : l.d.k.data(), dkw.data(), c.n_kv_heads);
          norm(from_fused ? l.dfused.data() + q_w + in.kv_row : l.d.v.data(), dones.data(), c.n_kv_heads);
        }
        ANVIL_GPU_CHECK(launch_rope_kv_write(p, nullptr));
        ANVIL_GPU_CHECK(hipDeviceSynchronize());
        if (in_op) {
          EXPECT_EQ(l.d.k.download(), in.k) << "k is read only";
          EXPECT_EQ(l.d.v.download(), in.v) << "v is read only";
          l.results(from_fused, q_out, cache, scales);
        } else {  // the inputs were normalised in place: the outputs and the guards only
          q_out = from_fused ? l.dq.download() : l.d.q.download();
          cache = l.dc.download();
          scales = l.ds.download();
          EXPECT_TRUE(l.dfused.guards_intact() && l.dq.guards_intact() && l.dc.guards_intact() && l.d.intact());
        }
      };
      std::vector<float> q_two, q_one, s_two, s_one;
      std::vector<std::uint8_t> c_two, c_one;
      run(false, q_two, c_two, s_two);
      run(true, q_one, c_one, s_one);
      EXPECT_EQ(q_one, q_two);
      EXPECT_TRUE(c_one == c_two) << "cache bytes differ";
      EXPECT_EQ(s_one, s_two);
      std::vector<float> q_ref = in.q;
      rms_norm_ref({.x = q_ref.data(), .weight = qw.data(), .y = q_ref.data(), .rows = c.n_tokens * c.n_heads,
                    .cols = c.head_dim, .eps = 1e-6f});
      const double q_err = nmse(q_one, in.rotated_q(q_ref, c));
      EXPECT_LT(q_err, 1e-12);
      std::printf("  %-75s norms in the op, %s, %s rows: q nmse=%.3g\n", c.str().c_str(),
                  std::string(kv_dtype_name(t)).c_str(), from_fused ? "fused" : "packed", q_err);
    }
  }
  EXPECT_TRUE(dqw.guards_intact() && dkw.guards_intact() && dones.guards_intact());
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeKvWriteGpu,
                         ::testing::Values(rope_case{1, 8, 8, 64, 64, rope_style::normal, false},
                                           rope_case{17, 32, 8, 128, 128, rope_style::normal, true},   // llama 3
                                           rope_case{33, 14, 2, 64, 64, rope_style::neox, false},     // qwen2.5 0.5B
                                           rope_case{300, 16, 8, 128, 128, rope_style::neox, false},  // qwen3
                                           rope_case{5, 8, 1, 128, 64, rope_style::neox, true},       // partial rotation
                                           rope_case{9, 4, 4, 64, 32, rope_style::normal, false},
                                           rope_case{19, 4, 1, 256, 256, rope_style::neox, false},    // gemma3 1B
                                           rope_case{23, 32, 8, 128, 128, rope_style::normal, false, 0.1f},  // mistral3
                                           rope_case{11, 32, 16, 256, 256, rope_style::neox, false},  // gemma4, sliding
                                           rope_case{7, 32, 4, 512, 512, rope_style::neox, true}));  // gemma4, global

// ---------------------------------------------------------------------------------------------
// Attention: shared set-up. Sequences with shuffled block tables over one random f16 cache.

struct attn_seq_shape {
  std::int64_t start_pos, n_tokens;  // decode: n_tokens 1, context start_pos + 1
};

struct attn_case {
  std::int64_t head_dim, n_kv_heads, group;
  std::vector<attn_seq_shape> seqs;
  std::int64_t window = 0;  // sliding window in positions; 0: the whole context
  bool sinks = false;       // a sink logit per query head (attn_setup::sinks)
  std::string str(const char* op) const {
    std::ostringstream s;
    s << op << "(head_dim=" << head_dim << ", kv_heads=" << n_kv_heads << ", group=" << group << ", seqs=[";
    for (std::size_t i = 0; i < seqs.size(); ++i) s << (i ? " " : "") << seqs[i].start_pos << "+" << seqs[i].n_tokens;
    s << "]";
    if (window > 0) s << ", window=" << window;
    if (sinks) s << ", sinks";
    s << ")";
    return s.str();
  }
};

struct attn_setup {
  std::int64_t bs = 16, n_blocks = 0, n_heads = 0, total_tokens = 0, stride = 0, max_context = 0, max_tokens = 0;
  kv_dtype dtype = kv_dtype::f16;
  std::vector<std::vector<std::int32_t>> tables;
  std::vector<std::int32_t> flat_tables;
  std::vector<std::uint16_t> k16, v16;   // f16
  std::vector<std::uint8_t> k8, v8;      // 8 bits: random codes (no NaN) ...
  std::vector<float> ks, vs;             // ... and row scales
  std::vector<float> q;
  std::vector<float> sinks;  // c.sinks: [n_heads] around the scores' range, the last head's large
  std::vector<float> ref;

  attn_setup(const attn_case& c, std::mt19937& rng, kv_dtype t = kv_dtype::f16) : dtype(t) {
    n_heads = c.n_kv_heads * c.group;
    for (const auto& s : c.seqs) {
      const std::int64_t end = s.start_pos + s.n_tokens;
      n_blocks += blocks_for(end, bs);
      stride = std::max(stride, blocks_for(end, bs));
      max_context = std::max(max_context, end);
      max_tokens = std::max(max_tokens, s.n_tokens);
      total_tokens += s.n_tokens;
    }
    n_blocks += 7;  // spare blocks no sequence owns
    block_deal deal(n_blocks, rng);
    flat_tables.assign(std::size_t(std::int64_t(c.seqs.size()) * stride), -1);
    for (std::size_t i = 0; i < c.seqs.size(); ++i) {
      tables.push_back(deal.take(blocks_for(c.seqs[i].start_pos + c.seqs[i].n_tokens, bs)));
      std::copy(tables.back().begin(), tables.back().end(), flat_tables.begin() + std::ptrdiff_t(i * std::size_t(stride)));
    }
    const std::size_t cache_n = std::size_t(n_blocks * bs * c.n_kv_heads * c.head_dim);
    std::vector<float> kf, vf;
    if (kv_is_8bit(t)) {
      // Codes times scales spanning about [-2, 2] for K and [-1, 1] for V.
      for (auto* codes : {&k8, &v8}) {
        codes->resize(cache_n);
        for (auto& b : *codes) {
          b = std::uint8_t(rng());
          if ((b & 0x7F) == 0x7F) b ^= 1;  // not fp8's NaN
        }
      }
      const std::size_t rows = cache_n / std::size_t(c.head_dim);
      ks = random_vector(rows, rng, 1.f / kv_code_max(t), 2.f / kv_code_max(t));
      vs = random_vector(rows, rng, 0.5f / kv_code_max(t), 1.f / kv_code_max(t));
    } else {
      k16 = random_cache(cache_n, rng, -2.f, 2.f);
      v16 = random_cache(cache_n, rng, -1.f, 1.f);
      kf = to_float(k16);
      vf = to_float(v16);
    }
    q = random_vector(std::size_t(total_tokens * n_heads * c.head_dim), rng, -2.f, 2.f);
    if (c.sinks) {
      // The scores are about N(0, 1.3^2): sinks among them, and one (exp(12) = 1.6e5 against at most
      // about 1e4 for the rows here) that takes most of its head's mass.
      sinks = random_vector(std::size_t(n_heads), rng, -2.f, 4.f);
      sinks.back() = large_sink;
    }

    // The reference on the cache's own values (f16, or codes times scales).
    std::vector<attention_seq> ref_seqs;
    std::int64_t first = 0;
    for (std::size_t i = 0; i < c.seqs.size(); ++i) {
      ref_seqs.push_back({first, c.seqs[i].n_tokens, c.seqs[i].start_pos, tables[i].data()});
      first += c.seqs[i].n_tokens;
    }
    ref.assign(q.size(), 0.f);
    attention_ref({.q = q.data(),
                   .out = ref.data(),
                   .n_heads = n_heads,
                   .cache = {.k = kf.empty() ? nullptr : kf.data(),
                             .v = vf.empty() ? nullptr : vf.data(),
                             .n_blocks = n_blocks,
                             .block_size = bs,
                             .n_kv_heads = c.n_kv_heads,
                             .head_dim = c.head_dim,
                             .dtype = t,
                             .k8 = k8.empty() ? nullptr : k8.data(),
                             .v8 = v8.empty() ? nullptr : v8.data(),
                             .k_scales = ks.empty() ? nullptr : ks.data(),
                             .v_scales = vs.empty() ? nullptr : vs.data()},
                   .scale = 1.f / std::sqrt(float(c.head_dim)),
                   .seqs = ref_seqs,
                   .window = c.window,
                   .sinks = sinks.empty() ? nullptr : sinks.data()});
  }
  static constexpr float large_sink = 12.f;
};

// nmse of one query head's outputs alone (rows of n_heads x head_dim): the head whose sink takes
// most of the mass has small outputs, which the nmse over every head would hardly see.
double head_nmse(const std::vector<float>& out, const std::vector<float>& ref, std::int64_t n_heads, std::int64_t head_dim,
                 std::int64_t head) {
  std::vector<float> o, r;
  for (std::size_t row = 0; row < ref.size() / std::size_t(n_heads * head_dim); ++row) {
    const std::size_t at = (row * std::size_t(n_heads) + std::size_t(head)) * std::size_t(head_dim);
    o.insert(o.end(), out.begin() + std::ptrdiff_t(at), out.begin() + std::ptrdiff_t(at + std::size_t(head_dim)));
    r.insert(r.end(), ref.begin() + std::ptrdiff_t(at), ref.begin() + std::ptrdiff_t(at + std::size_t(head_dim)));
  }
  return nmse(o, r);
}

// A short fingerprint of an output's bits (FNV-1a), printed beside its error: two builds whose
// kernels should agree bit for bit print the same.
unsigned bits_hash(const std::vector<float>& x) {
  std::uint32_t h = 2166136261u;
  for (const float f : x) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    for (int i = 0; i < 4; ++i) h = (h ^ ((u >> (8 * i)) & 0xffu)) * 16777619u;
  }
  return h;
}

// The sinks on the device (one unused element when there are none), and the launch's pointer.
struct device_sinks {
  guarded_array<float> d;
  const float* ptr;
  explicit device_sinks(const attn_setup& s)
      : d(s.sinks.empty() ? std::vector<float>{0.f} : s.sinks), ptr(s.sinks.empty() ? nullptr : d.data()) {}
  // The no-op options: sinks of -inf (exp gives exactly 0) beside a window past every context.
  static std::vector<float> none(std::int64_t n_heads) { return std::vector<float>(std::size_t(n_heads), -INFINITY); }
};

// The setup's cache on the device, in its element type; the kernels only read it.
struct device_cache {
  guarded_array<std::uint16_t> k16, v16;
  guarded_array<std::uint8_t> k8, v8;
  guarded_array<float> ks, vs;
  paged_kv_device view;

  device_cache(const attn_setup& s, const attn_case& c)
      : k16(s.k16), v16(s.v16), k8(s.k8), v8(s.v8), ks(s.ks), vs(s.vs) {
    const bool q8 = kv_is_8bit(s.dtype);
    view = {.k = q8 ? static_cast<void*>(k8.data()) : k16.data(),
            .v = q8 ? static_cast<void*>(v8.data()) : v16.data(),
            .n_blocks = s.n_blocks,
            .block_size = s.bs,
            .n_kv_heads = c.n_kv_heads,
            .head_dim = c.head_dim,
            .dtype = s.dtype,
            .k_scales = q8 ? ks.data() : nullptr,
            .v_scales = q8 ? vs.data() : nullptr};
  }
  // Unchanged, guards included.
  bool intact(const attn_setup& s) const {
    return k16.download() == s.k16 && v16.download() == s.v16 && k8.download() == s.k8 && v8.download() == s.v8 &&
           ks.download() == s.ks && vs.download() == s.vs && k16.guards_intact() && v16.guards_intact() &&
           k8.guards_intact() && v8.guards_intact() && ks.guards_intact() && vs.guards_intact();
  }
};

constexpr kv_dtype all_kv_dtypes[] = {kv_dtype::f16, kv_dtype::int8, kv_dtype::fp8};

// The block tables as a window pool leaves them (kv_config::window): -1 for the blocks wholly
// before the window of each sequence's first query, which the kernels must never read.
std::vector<std::int32_t> windowed_tables(const attn_setup& s, const attn_case& c) {
  std::vector<std::int32_t> t = s.flat_tables;
  for (std::size_t i = 0; i < c.seqs.size(); ++i) {
    const std::int64_t first = anvil::gpu_worker::first_window_block(c.seqs[i].start_pos, c.window, s.bs);
    for (std::int64_t b = 0; b < first; ++b) t[i * std::size_t(s.stride) + std::size_t(b)] = -1;
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Decode

class AttentionDecodeGpu : public ::testing::TestWithParam<attn_case> {};

TEST_P(AttentionDecodeGpu, MatchesReferenceOnItsCache) {
  require_device();
  const attn_case c = GetParam();
  SCOPED_TRACE(c.str("decode"));
  for (const kv_dtype t : all_kv_dtypes) {
    SCOPED_TRACE(std::string(kv_dtype_name(t)));
    std::mt19937 rng(unsigned(c.head_dim * 31 + c.group * 7 + c.seqs.size()));
    const attn_setup s(c, rng, t);
    std::vector<std::int32_t> lens;
    for (const auto& sq : c.seqs) lens.push_back(std::int32_t(sq.start_pos + 1));
    // Both kernels where the tensor-core one runs: the CUDA-core one is what other devices run.
    for (const bool cuda_cores : {false, true}) {
      if (cuda_cores && !attention_decode_tensor_cores(c.head_dim)) continue;
      const bool tensor_cores = !cuda_cores && attention_decode_tensor_cores(c.head_dim);
      SCOPED_TRACE(tensor_cores ? "tensor cores" : "CUDA cores");
      std::vector<std::int64_t> splits{attention_decode_split, attention_decode_short_split, attention_decode_long_split};
      if (tensor_cores) splits.push_back(attention_decode_longest_split);  // the tensor-core kernel's own
      for (const std::int64_t split : splits) {
        SCOPED_TRACE("split " + std::to_string(split));

        guarded_array<float> dq(s.q), dout(s.q.size());
        const device_cache dc(s, c);
        const device_sinks ds(s);
        guarded_array<std::int32_t> dtables(s.flat_tables), dlens(lens);
        const std::size_t ws_bytes =
            attention_decode_workspace_bytes(std::int64_t(c.seqs.size()), s.n_heads, c.head_dim, s.max_context, split);
        guarded_array<unsigned char> dws(std::max<std::size_t>(ws_bytes, 1));
        dout.poison();
        // The 8-bit form for the o projection's GEMV, beside out.
        guarded_array<std::int8_t> dyq(s.q.size());
        guarded_array<float> dyds(s.q.size() / 8);
        dyq.poison();
        dyds.poison();

        attention_decode_params p{.q = dq.data(),
                                  .out = dout.data(),
                                  .cache = dc.view,
                                  .n_heads = s.n_heads,
                                  .block_tables = dtables.data(),
                                  .block_table_stride = s.stride,
                                  .context_lens = dlens.data(),
                                  .n_seqs = std::int64_t(c.seqs.size()),
                                  .max_context = s.max_context,
                                  .scale = 1.f / std::sqrt(float(c.head_dim)),
                                  .window = c.window,
                                  .sinks = ds.ptr,
                                  .split = split,
                                  .yq = dyq.data(),
                                  .yq_scales = dyds.data(),
                                  .workspace = dws.data(),
                                  .workspace_bytes = ws_bytes,
                                  .cuda_cores_only = cuda_cores};
        ANVIL_GPU_CHECK(launch_attention_decode(p, nullptr));
        ANVIL_GPU_CHECK(hipDeviceSynchronize());
        const std::vector<float> out = dout.download();
        const double err = nmse(out, s.ref);
        const x8_host want = quantize_x8_host(out);
        EXPECT_TRUE(dyq.download() == want.q) << "int8 values differ from the GEMV quantizer's";
        EXPECT_TRUE(dyds.download() == want.ds) << "scales differ from the GEMV quantizer's";
        EXPECT_TRUE(dyq.guards_intact() && dyds.guards_intact());
        // Determinism: a second run gives the same bits.
        ANVIL_GPU_CHECK(launch_attention_decode(p, nullptr));
        ANVIL_GPU_CHECK(hipDeviceSynchronize());
        EXPECT_TRUE(dout.download() == out) << "two runs differ";
        if (c.window > 0) {
          // The blocks before the window given back (-1): the same bits.
          guarded_array<std::int32_t> dwt(windowed_tables(s, c));
          attention_decode_params trimmed = p;
          trimmed.block_tables = dwt.data();
          dout.poison();
          ANVIL_GPU_CHECK(launch_attention_decode(trimmed, nullptr));
          ANVIL_GPU_CHECK(hipDeviceSynchronize());
          EXPECT_TRUE(dout.download() == out) << "the window's given-back blocks change the output";
        }
        if (c.window == 0 && !c.sinks) {
          // Options that change nothing (a window past every context, sinks of -inf) give the
          // defaults' bits.
          guarded_array<float> dnone(device_sinks::none(s.n_heads));
          attention_decode_params noop = p;
          noop.window = s.max_context;
          noop.sinks = dnone.data();
          dout.poison();
          ANVIL_GPU_CHECK(launch_attention_decode(noop, nullptr));
          ANVIL_GPU_CHECK(hipDeviceSynchronize());
          EXPECT_TRUE(dout.download() == out) << "the no-op window and sinks change the output";
          EXPECT_TRUE(dnone.guards_intact());
        }

        const double sink_err = c.sinks ? head_nmse(out, s.ref, s.n_heads, c.head_dim, s.n_heads - 1) : 0.0;
        std::printf("  %-75s %s %s nmse=%.3g splits=%lld bits=%08x", c.str("decode").c_str(),
                    std::string(kv_dtype_name(t)).c_str(), tensor_cores ? "tc" : "cc", err,
                    static_cast<long long>(attention_decode_splits(s.max_context, split)), bits_hash(out));
        if (c.sinks) std::printf(" large-sink head nmse=%.3g", sink_err);
        std::printf("\n");
        EXPECT_LT(err, 1e-9) << "nmse " << err;
        EXPECT_LT(sink_err, 1e-9) << "the large-sink head's nmse " << sink_err;
        EXPECT_TRUE(dc.intact(s)) << "the cache is read only";
        for (auto* g : {&dq, &dout}) EXPECT_TRUE(g->guards_intact());
        EXPECT_TRUE(dtables.guards_intact() && dlens.guards_intact());
        EXPECT_TRUE(dws.guards_intact());
        EXPECT_TRUE(ds.d.guards_intact() && ds.d.download() == (s.sinks.empty() ? std::vector<float>{0.f} : s.sinks));
      }
    }
  }
}

std::vector<attn_case> decode_cases() {
  std::vector<attn_case> cases;
  const std::vector<std::vector<attn_seq_shape>> contexts = {
      {{0, 1}},                                                         // context 1
      {{16, 1}},                                                        // 17
      {{299, 1}},                                                       // 300
      {{4096, 1}},                                                      // 4097: split-K
      {{4096, 1}, {0, 1}, {299, 1}, {16, 1}, {255, 1}, {256, 1}, {1000, 1}},  // mixed batch
  };
  for (std::int64_t hd : {64, 128, 256}) {  // 256: gemma3 1B/4B/12B
    for (std::int64_t group : {1, 4, 8}) {
      for (const auto& ctx : contexts) cases.push_back({hd, group == 1 ? 4 : 2, group, ctx});
    }
  }
  cases.push_back({128, 2, 7, {{300, 1}, {5000, 1}}});  // qwen2.5-7B's ratio
  cases.push_back({64, 1, 14, {{700, 1}}});             // a group over 8 (two head chunks)
  // Heads of 512 (Gemma 4's global layers: 8 query heads per kv head), on the CUDA cores in
  // chunks of 4 heads; a group of 2 in one chunk.
  for (const auto& ctx : contexts) cases.push_back({512, 2, 8, ctx});
  cases.push_back({512, 1, 2, {{4096, 1}, {0, 1}, {299, 1}}});
  return cases;
}

// gpt-oss's options: windows of 1, 7 and 128 (gpt-oss: 128 on every other layer) over contexts
// shorter than the window, just around it and many splits longer (4097: the splits before the
// window's first have no block, at every split length), with and without sinks; sinks alone.
// head_dim 64 and group 8 are gpt-oss's.
std::vector<attn_case> decode_window_cases() {
  std::vector<attn_case> cases;
  const std::vector<attn_seq_shape> batch = {{4096, 1}, {0, 1},    {5, 1},    {126, 1},  {127, 1},
                                             {128, 1},  {299, 1},  {2047, 1}, {2048, 1}, {1000, 1}};
  for (std::int64_t hd : {64, 128}) {
    for (std::int64_t group : {1, 8}) {
      for (std::int64_t window : {0, 1, 7, 128}) {
        for (bool sinks : {false, true}) {
          if (window > 0 || sinks) cases.push_back({hd, group == 1 ? 4 : 2, group, batch, window, sinks});
        }
      }
    }
  }
  cases.push_back({128, 2, 7, {{300, 1}, {5000, 1}}, 128, true});  // a group that is not a power of two
  cases.push_back({64, 1, 14, {{700, 1}, {3, 1}}, 7, true});       // two head chunks
  for (std::int64_t window : {7, 128}) cases.push_back({256, 2, 2, batch, window, false});  // gemma3 12B's heads
  cases.push_back({256, 1, 4, batch, 128, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(WindowAndSinks, AttentionDecodeGpu, ::testing::ValuesIn(decode_window_cases()));

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionDecodeGpu, ::testing::ValuesIn(decode_cases()));

// ---------------------------------------------------------------------------------------------
// Prefill

class AttentionPrefillGpu : public ::testing::TestWithParam<attn_case> {};

TEST_P(AttentionPrefillGpu, MatchesReferenceOnItsCache) {
  require_device();
  const attn_case c = GetParam();
  SCOPED_TRACE(c.str("prefill"));
  for (const kv_dtype t : all_kv_dtypes) {
    SCOPED_TRACE(std::string(kv_dtype_name(t)));
    std::mt19937 rng(unsigned(c.head_dim * 37 + c.group * 11 + c.seqs.size()));
    const attn_setup s(c, rng, t);
    std::vector<attention_prefill_seq> seqs;
    std::int32_t first = 0;
    for (const auto& sq : c.seqs) {
      seqs.push_back({first, std::int32_t(sq.n_tokens), std::int32_t(sq.start_pos), 0});
      first += std::int32_t(sq.n_tokens);
    }

    // Both kernels where the tensor-core one runs: the CUDA-core one is what other devices run.
    for (const bool cuda_cores : {false, true}) {
      if (cuda_cores && !attention_prefill_tensor_cores(c.head_dim)) continue;
      const bool tensor_cores = !cuda_cores && attention_prefill_tensor_cores(c.head_dim);
      SCOPED_TRACE(tensor_cores ? "tensor cores" : "CUDA cores");
      guarded_array<float> dq(s.q), dout(s.q.size());
      const device_cache dc(s, c);
      const device_sinks ds(s);
      guarded_array<std::int32_t> dtables(s.flat_tables);
      guarded_array<attention_prefill_seq> dseqs(seqs);
      dout.poison();

      attention_prefill_params p{.q = dq.data(),
                                 .out = dout.data(),
                                 .cache = dc.view,
                                 .n_heads = s.n_heads,
                                 .seqs = dseqs.data(),
                                 .n_seqs = std::int64_t(seqs.size()),
                                 .max_seq_tokens = s.max_tokens,
                                 .block_tables = dtables.data(),
                                 .block_table_stride = s.stride,
                                 .scale = 1.f / std::sqrt(float(c.head_dim)),
                                 .window = c.window,
                                 .sinks = ds.ptr,
                                 .cuda_cores_only = cuda_cores};
      ANVIL_GPU_CHECK(launch_attention_prefill(p, nullptr));
      ANVIL_GPU_CHECK(hipDeviceSynchronize());
      const std::vector<float> out = dout.download();
      const double err = nmse(out, s.ref);
      if (c.window > 0) {
        // The blocks before the window given back (-1): the same bits.
        guarded_array<std::int32_t> dwt(windowed_tables(s, c));
        attention_prefill_params trimmed = p;
        trimmed.block_tables = dwt.data();
        dout.poison();
        ANVIL_GPU_CHECK(launch_attention_prefill(trimmed, nullptr));
        ANVIL_GPU_CHECK(hipDeviceSynchronize());
        EXPECT_TRUE(dout.download() == out) << "the window's given-back blocks change the output";
      }
      if (c.window == 0 && !c.sinks) {
        // Options that change nothing (a window past every position, sinks of -inf) give the
        // defaults' bits.
        guarded_array<float> dnone(device_sinks::none(s.n_heads));
        attention_prefill_params noop = p;
        noop.window = s.max_context;
        noop.sinks = dnone.data();
        dout.poison();
        ANVIL_GPU_CHECK(launch_attention_prefill(noop, nullptr));
        ANVIL_GPU_CHECK(hipDeviceSynchronize());
        EXPECT_TRUE(dout.download() == out) << "the no-op window and sinks change the output";
        EXPECT_TRUE(dnone.guards_intact());
      }
      const double sink_err = c.sinks ? head_nmse(out, s.ref, s.n_heads, c.head_dim, s.n_heads - 1) : 0.0;
      std::printf("  %-75s %s %s nmse=%.3g bits=%08x", c.str("prefill").c_str(), std::string(kv_dtype_name(t)).c_str(),
                  tensor_cores ? "tc" : "cc", err, bits_hash(out));
      if (c.sinks) std::printf(" large-sink head nmse=%.3g", sink_err);
      std::printf("\n");
      // 8-bit rows are staged as halves of code x scale: one more f16 rounding than the f16 cache;
      // on tensor cores q and the softmax weights are f16 too (nmse ~1e-7).
      const double tolerance = kv_is_8bit(t) || tensor_cores ? 1e-6 : 1e-9;
      EXPECT_LT(err, tolerance) << "nmse " << err;
      EXPECT_LT(sink_err, tolerance) << "the large-sink head's nmse " << sink_err;
      EXPECT_TRUE(dc.intact(s)) << "the cache is read only";
      for (auto* g : {&dq, &dout}) EXPECT_TRUE(g->guards_intact());
      EXPECT_TRUE(dtables.guards_intact() && dseqs.guards_intact());
      EXPECT_TRUE(ds.d.guards_intact());
    }
  }
}

std::vector<attn_case> prefill_cases() {
  std::vector<attn_case> cases;
  const std::vector<std::vector<attn_seq_shape>> batches = {
      {{0, 1}},                                   // one token from 0
      {{0, 17}},                                  // a prompt from 0
      {{0, 300}},
      {{300, 17}},                                // a chunk mid-sequence
      {{3999, 98}},                               // a chunk reaching 4097
      {{0, 17}, {256, 44}, {5, 1}, {0, 300}, {1000, 33}},  // mixed batch
  };
  for (std::int64_t hd : {64, 128, 256}) {  // 256: gemma3 1B/4B/12B
    for (std::int64_t group : {1, 4, 8}) {
      for (const auto& b : batches) cases.push_back({hd, group == 1 ? 4 : 2, group, b});
    }
  }
  cases.push_back({128, 2, 7, {{0, 45}, {123, 20}}});  // a group that does not divide the tile
  for (const auto& b : batches) cases.push_back({512, 2, 8, b});  // Gemma 4's global heads
  cases.push_back({512, 1, 3, {{0, 45}, {123, 20}}});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionPrefillGpu, ::testing::ValuesIn(prefill_cases()));

// gpt-oss's options: windows of 1, 7 and 128 over a prompt of 1001 tokens (its later row blocks
// start their key loop far past 0), a chunk 3999 positions in, a prompt shorter than the window,
// single tokens and odd chunks, with and without sinks; sinks alone.
std::vector<attn_case> prefill_window_cases() {
  std::vector<attn_case> cases;
  const std::vector<attn_seq_shape> batch = {{0, 1001}, {3999, 98}, {0, 5}, {5, 1}, {256, 44}, {1000, 33}};
  const std::vector<attn_seq_shape> whole = {{0, 300}, {3999, 98}, {5, 1}, {256, 44}};  // sinks alone: cheaper reference
  for (std::int64_t hd : {64, 128}) {
    for (std::int64_t group : {1, 8}) {
      for (std::int64_t window : {0, 1, 7, 128}) {
        for (bool sinks : {false, true}) {
          if (window > 0 || sinks) cases.push_back({hd, group == 1 ? 4 : 2, group, window ? batch : whole, window, sinks});
        }
      }
    }
  }
  cases.push_back({128, 2, 7, {{0, 45}, {123, 200}}, 128, true});  // a group that does not divide the tile
  for (std::int64_t window : {7, 128}) cases.push_back({256, 2, 2, batch, window, false});  // gemma3 12B's heads
  cases.push_back({256, 1, 4, batch, 128, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(WindowAndSinks, AttentionPrefillGpu, ::testing::ValuesIn(prefill_window_cases()));

TEST(AttentionGpuLaunch, RejectsBadShapesWithoutLaunching) {
  require_device();
  attention_decode_params d{.cache = {.n_blocks = 1, .block_size = 16, .n_kv_heads = 2, .head_dim = 96},  // unsupported
                            .n_heads = 8,
                            .block_table_stride = 1,
                            .n_seqs = 1,
                            .max_context = 1};
  EXPECT_EQ(launch_attention_decode(d, nullptr), hipErrorInvalidValue);
  d.cache.head_dim = 128;
  d.max_context = 1000;  // needs a workspace
  d.block_table_stride = 100;
  EXPECT_EQ(launch_attention_decode(d, nullptr), hipErrorInvalidValue);
  d.max_context = 1;
  d.split = 128;  // the kernels take splits of 64, 256, 1024 or (tensor cores) 2048 only
  EXPECT_EQ(launch_attention_decode(d, nullptr), hipErrorInvalidValue);
  d.split = attention_decode_longest_split;
  d.cuda_cores_only = true;  // the CUDA-core kernel's scores for 2048 positions would not fit its shared memory
  EXPECT_EQ(launch_attention_decode(d, nullptr), hipErrorInvalidValue);
  d.cuda_cores_only = false;
  d.split = attention_decode_split;
  std::int8_t yq[8];
  d.yq = yq;  // an 8-bit output without its scales
  EXPECT_EQ(launch_attention_decode(d, nullptr), hipErrorInvalidValue);
  d.yq = nullptr;
  d.window = -1;
  EXPECT_EQ(launch_attention_decode(d, nullptr), hipErrorInvalidValue);
  const attention_prefill_params pf{.cache = {.n_blocks = 1, .block_size = 16, .n_kv_heads = 4, .head_dim = 64},
                                    .n_heads = 6,  // 6 heads over 4 kv heads
                                    .n_seqs = 1,
                                    .max_seq_tokens = 1};
  EXPECT_EQ(launch_attention_prefill(pf, nullptr), hipErrorInvalidValue);
  attention_prefill_params negative_window = pf;
  negative_window.n_heads = 8;
  negative_window.window = -1;
  EXPECT_EQ(launch_attention_prefill(negative_window, nullptr), hipErrorInvalidValue);
  const rope_kv_write_params r{.cache = {.n_kv_heads = 1, .head_dim = 64}, .n_tokens = 1, .n_heads = 1, .rot_dim = 65};
  EXPECT_EQ(launch_rope_kv_write(r, nullptr), hipErrorInvalidValue);
  const rope_kv_write_params no_angles{.cache = {.n_kv_heads = 1, .head_dim = 64}, .n_tokens = 1, .n_heads = 1, .rot_dim = 64};
  EXPECT_EQ(launch_rope_kv_write(no_angles, nullptr), hipErrorInvalidValue);
  std::int32_t pos[1] = {0};
  double table[2];
  EXPECT_EQ(launch_rope_angles({.positions = pos, .n_tokens = 1, .rot_dim = 3, .out = table}, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(launch_rope_angles({.positions = pos, .n_tokens = 1, .rot_dim = 514, .out = table}, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(launch_rope_angles({.positions = pos, .n_tokens = 1, .rot_dim = 2}, nullptr), hipErrorInvalidValue);
  EXPECT_EQ(hipGetLastError(), hipSuccess);
}

}  // namespace

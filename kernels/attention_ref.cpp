#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/attention.h"

namespace anvil::kernels {
namespace {

std::int64_t slot_of(const paged_kv_view& c, const std::int32_t* table, std::int64_t pos) {
  return std::int64_t(table[pos / c.block_size]) * c.block_size + pos % c.block_size;
}

}  // namespace

void kv_write_ref(const kv_write_params& p) {
  const paged_kv_view& c = p.cache;
  const std::int64_t d = c.head_dim, row = c.n_kv_heads * d;
  for (std::int64_t t = 0; t < p.n_tokens; ++t) {
    const std::int64_t slot = p.slots[t];
    if (!kv_is_8bit(c.dtype)) {
      std::memcpy(c.k + slot * row, p.k + t * row, row * sizeof(float));
      std::memcpy(c.v + slot * row, p.v + t * row, row * sizeof(float));
      continue;
    }
    for (std::int64_t h = 0; h < c.n_kv_heads; ++h) {
      c.k_scales[slot * c.n_kv_heads + h] = kv_quantize_row(p.k + t * row + h * d, d, c.dtype, c.k8 + slot * row + h * d);
      c.v_scales[slot * c.n_kv_heads + h] = kv_quantize_row(p.v + t * row + h * d, d, c.dtype, c.v8 + slot * row + h * d);
    }
  }
}

void kv_read_row(const paged_kv_view& c, bool v, std::int64_t slot, std::int64_t kvh, float* out) {
  const std::int64_t d = c.head_dim, off = (slot * c.n_kv_heads + kvh) * d;
  if (!kv_is_8bit(c.dtype)) {
    std::memcpy(out, (v ? c.v : c.k) + off, std::size_t(d) * sizeof(float));
    return;
  }
  const std::uint8_t* codes = (v ? c.v8 : c.k8) + off;
  const float scale = (v ? c.v_scales : c.k_scales)[slot * c.n_kv_heads + kvh];
  for (std::int64_t i = 0; i < d; ++i) out[i] = kv_decode(codes[i], c.dtype) * scale;
}

void attention_ref(const attention_params& p) {
  const paged_kv_view& c = p.cache;
  const std::int64_t d = c.head_dim, group = p.n_heads / c.n_kv_heads;
  for (const attention_seq& s : p.seqs) {
    const std::int64_t ctx_max = s.start_pos + s.n_tokens;
#pragma omp parallel
    {
      std::vector<double> score(static_cast<std::size_t>(ctx_max)), acc(static_cast<std::size_t>(d));
      std::vector<float> row(static_cast<std::size_t>(d));
      const float* k = row.data();
      const float* v = row.data();
#pragma omp for collapse(2) schedule(static)
      for (std::int64_t j = 0; j < s.n_tokens; ++j) {
        for (std::int64_t h = 0; h < p.n_heads; ++h) {
          const std::int64_t tok = s.first_token + j, ctx = s.start_pos + j + 1, kvh = h / group;
          const std::int64_t first = p.window > 0 ? std::max<std::int64_t>(0, ctx - p.window) : 0;
          const float* q = p.q + (tok * p.n_heads + h) * d;
          double max_score = p.sinks ? double(p.sinks[h]) : -INFINITY;
          for (std::int64_t pos = first; pos < ctx; ++pos) {
            kv_read_row(c, false, slot_of(c, s.block_table, pos), kvh, row.data());
            double dot = 0;
            for (std::int64_t i = 0; i < d; ++i) dot += double(q[i]) * double(k[i]);
            score[pos] = dot * p.scale;
            max_score = std::max(max_score, score[pos]);
          }
          double sum = p.sinks ? std::exp(double(p.sinks[h]) - max_score) : 0.0;
          for (std::int64_t pos = first; pos < ctx; ++pos) sum += score[pos] = std::exp(score[pos] - max_score);
          std::fill(acc.begin(), acc.end(), 0.0);
          for (std::int64_t pos = first; pos < ctx; ++pos) {
            kv_read_row(c, true, slot_of(c, s.block_table, pos), kvh, row.data());
            const double w = score[pos] / sum;
            for (std::int64_t i = 0; i < d; ++i) acc[i] += w * double(v[i]);
          }
          float* out = p.out + (tok * p.n_heads + h) * d;
          for (std::int64_t i = 0; i < d; ++i) out[i] = float(acc[i]);
        }
      }
    }
  }
}

}  // namespace anvil::kernels

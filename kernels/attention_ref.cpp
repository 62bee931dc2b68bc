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
  const std::int64_t row = p.cache.n_kv_heads * p.cache.head_dim;
  for (std::int64_t t = 0; t < p.n_tokens; ++t) {
    std::memcpy(p.cache.k + p.slots[t] * row, p.k + t * row, row * sizeof(float));
    std::memcpy(p.cache.v + p.slots[t] * row, p.v + t * row, row * sizeof(float));
  }
}

void attention_ref(const attention_params& p) {
  const paged_kv_view& c = p.cache;
  const std::int64_t d = c.head_dim, group = p.n_heads / c.n_kv_heads, kv_row = c.n_kv_heads * d;
  for (const attention_seq& s : p.seqs) {
    const std::int64_t ctx_max = s.start_pos + s.n_tokens;
#pragma omp parallel
    {
      std::vector<double> score(static_cast<std::size_t>(ctx_max)), acc(static_cast<std::size_t>(d));
#pragma omp for collapse(2) schedule(static)
      for (std::int64_t j = 0; j < s.n_tokens; ++j) {
        for (std::int64_t h = 0; h < p.n_heads; ++h) {
          const std::int64_t tok = s.first_token + j, ctx = s.start_pos + j + 1, kvh = h / group;
          const float* q = p.q + (tok * p.n_heads + h) * d;
          double max_score = -INFINITY;
          for (std::int64_t pos = 0; pos < ctx; ++pos) {
            const float* k = c.k + slot_of(c, s.block_table, pos) * kv_row + kvh * d;
            double dot = 0;
            for (std::int64_t i = 0; i < d; ++i) dot += double(q[i]) * double(k[i]);
            score[pos] = dot * p.scale;
            max_score = std::max(max_score, score[pos]);
          }
          double sum = 0;
          for (std::int64_t pos = 0; pos < ctx; ++pos) sum += score[pos] = std::exp(score[pos] - max_score);
          std::fill(acc.begin(), acc.end(), 0.0);
          for (std::int64_t pos = 0; pos < ctx; ++pos) {
            const float* v = c.v + slot_of(c, s.block_table, pos) * kv_row + kvh * d;
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

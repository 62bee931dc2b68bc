#include <vector>

#include "kernels/matmul.h"

namespace anvil::kernels {
namespace {

// Eight independent accumulators so the compiler can vectorise without reassociating a single sum.
float dot(const float* a, const float* b, std::int64_t n) {
  float acc[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void matmul_ref(const matmul_params& p) {
  const std::size_t row_bytes = *model::row_bytes(p.w_type, p.in);
  const auto* w = static_cast<const std::byte*>(p.w);
#pragma omp parallel
  {
    std::vector<float> row(static_cast<std::size_t>(p.in));
#pragma omp for schedule(static)
    for (std::int64_t o = 0; o < p.out; ++o) {
      model::dequantize_row(p.w_type, w + o * row_bytes, row.data(), p.in);
      const float b = p.bias ? p.bias[o] : 0.f;
      for (std::int64_t t = 0; t < p.n_tokens; ++t) p.y[t * p.out + o] = dot(row.data(), p.x + t * p.in, p.in) + b;
    }
  }
}

}  // namespace anvil::kernels

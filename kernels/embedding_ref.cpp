#include <stdexcept>
#include <string>

#include "kernels/embedding.h"

namespace anvil::kernels {

void embedding_ref(const embedding_params& p) {
  const std::size_t row = *model::row_bytes(p.type, p.n_embd);
  const auto* table = static_cast<const std::byte*>(p.table);
  for (std::int64_t t = 0; t < p.n_tokens; ++t) {
    const std::int32_t id = p.ids[t] - p.vocab_begin;
    if (id < 0 || id >= p.n_vocab) {
      throw std::out_of_range("embedding: token id " + std::to_string(p.ids[t]) + " outside the vocabulary");
    }
    float* out = p.out + t * p.n_embd;
    model::dequantize_row(p.type, table + std::size_t(id) * row, out, p.n_embd);
    if (p.scale != 1.f) {
      for (std::int64_t i = 0; i < p.n_embd; ++i) out[i] *= p.scale;
    }
  }
}

}  // namespace anvil::kernels

#include "kernels/feed_tokens.h"

#include <cstring>

#include "kernels/candidates.h"

namespace anvil::kernels {

void feed_tokens_ref(const feed_tokens_params& p) {
  for (std::int64_t i = 0; i < p.n; ++i) {
    candidates_record_header h;
    std::memcpy(&h, static_cast<const unsigned char*>(p.records) + std::size_t(p.from[i]) * p.record_bytes, sizeof h);
    p.ids[p.rows[i]] = h.drawn >= 0 ? h.drawn : 0;
  }
}

}  // namespace anvil::kernels

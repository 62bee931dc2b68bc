// feed_tokens: one thread per fed row; each reads the `drawn` field of its record's header.
#include "kernels/feed_tokens.h"

#include "kernels/candidates.h"

namespace anvil::kernels {
namespace {

constexpr int block_size = 128;

__global__ void __launch_bounds__(block_size) feed_tokens_kernel(feed_tokens_params p) {
  const std::int64_t i = std::int64_t(blockIdx.x) * block_size + threadIdx.x;
  if (i >= p.n) return;
  const auto* h = reinterpret_cast<const candidates_record_header*>(static_cast<const unsigned char*>(p.records) +
                                                                    std::size_t(p.from[i]) * p.record_bytes);
  const std::int32_t t = h->drawn;
  p.ids[p.rows[i]] = t >= 0 ? t : 0;
}

}  // namespace

hipError_t launch_feed_tokens(const feed_tokens_params& p, hipStream_t stream) {
  if (p.n < 0 || p.n > 0x7fffffff || p.record_bytes % 4 != 0) return hipErrorInvalidValue;
  if (p.n == 0) return hipSuccess;
  if (!p.ids || !p.rows || !p.from || !p.records) return hipErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>((p.n + block_size - 1) / block_size);
  feed_tokens_kernel<<<dim3(blocks), block_size, 0, stream>>>(p);
  return hipGetLastError();
}

}  // namespace anvil::kernels

// candidates_merge: a thread per sequence, merge_candidates_one over the ranks' records, then the
// draw (kernels/candidates_merge.h). A step has at most a few hundred sequences, each a merge of
// a few hundred entries: one thread each is short next to the gather it follows.
#include "kernels/candidates_merge.h"

namespace anvil::kernels {
namespace {

constexpr int block_size = 64;

__global__ void __launch_bounds__(block_size) merge_kernel(candidates_merge_params p) {
  const std::int64_t s = std::int64_t(blockIdx.x) * block_size + threadIdx.x;
  if (s >= p.n_seqs) return;
  const auto* in = static_cast<const unsigned char*>(p.parts);
  merge_part parts[candidates_merge_max_ranks];
  int taken[candidates_merge_max_ranks];
  for (int q = 0; q < p.n_ranks; ++q) {
    const unsigned char* rec = in + (std::size_t(q) * std::size_t(p.n_seqs) + std::size_t(s)) * p.record_bytes;
    parts[q].hdr = reinterpret_cast<const candidates_record_header*>(rec);
    parts[q].top = reinterpret_cast<const candidates_record_entry*>(rec + sizeof(candidates_record_header));
    parts[q].vocab_begin = p.vocab_begin[q];
  }
  const candidates_seq sp = p.seqs[s];
  unsigned char* rec = static_cast<unsigned char*>(p.out) + std::size_t(s) * p.record_bytes;
  auto* hdr = reinterpret_cast<candidates_record_header*>(rec);
  auto* top = reinterpret_cast<candidates_record_entry*>(rec + sizeof(candidates_record_header));
  const std::int32_t k = std::int32_t(min(std::int64_t(sp.top_k), p.vocab));
  merge_candidates_one(parts, p.n_ranks, k, sp.tail_u, hdr, top, taken);
  if (p.draw && sp.draw != 0) {
    double prob[candidates_max_k];
    const draw_cut cut{.greedy = sp.draw == 1, .top_k = sp.draw_top_k, .top_p = sp.draw_top_p, .min_p = sp.draw_min_p};
    draw_into_record(hdr, top, cut, sp.draw_u, prob);
  }
}

}  // namespace

hipError_t launch_candidates_merge(const candidates_merge_params& p, hipStream_t stream) {
  if (p.n_ranks < 1 || p.n_ranks > candidates_merge_max_ranks || p.n_seqs < 0 || p.n_seqs > 0x7fffffff || p.vocab < 1 ||
      p.record_bytes <= sizeof(candidates_record_header) || p.record_bytes % 8 != 0) {
    return hipErrorInvalidValue;
  }
  if (p.n_seqs == 0) return hipSuccess;
  if (!p.parts || !p.seqs || !p.out) return hipErrorInvalidValue;
  const unsigned blocks = static_cast<unsigned>((p.n_seqs + block_size - 1) / block_size);
  merge_kernel<<<dim3(blocks), block_size, 0, stream>>>(p);
  return hipGetLastError();
}

}  // namespace anvil::kernels

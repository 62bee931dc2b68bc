// Host side of the candidates merge (kernels/candidates_merge.h): a rank's slice of a sequence's
// logit parameters, and the merge over gathered records that the GPU kernel is tested against.
#include "kernels/candidates_merge.h"

#include <stdexcept>
#include <vector>

namespace anvil::kernels {

gpu_worker::logit_params slice_logit_params(const gpu_worker::logit_params& p, std::int64_t begin, std::int64_t end,
                                            int rank) {
  if (begin < 0 || end < begin || rank < 0) throw std::invalid_argument("slice_logit_params: a slice [begin, end) of ranks >= 0");
  gpu_worker::logit_params s = p;
  const auto inside = [&](std::int32_t id) { return id >= begin && id < end; };
  s.logit_bias.clear();
  for (const auto& [id, v] : p.logit_bias) {
    if (inside(id)) s.logit_bias.emplace_back(std::int32_t(id - begin), v);
  }
  s.token_counts.clear();
  for (const auto& [id, n] : p.token_counts) {
    if (inside(id)) s.token_counts.emplace_back(std::int32_t(id - begin), n);
  }
  if (!p.allowed.empty()) {
    s.allowed.assign(std::size_t((end - begin + 31) / 32), 0u);
    for (std::int64_t t = begin; t < end; ++t) {
      const std::size_t w = std::size_t(t / 32);
      if (w < p.allowed.size() && (p.allowed[w] >> (t % 32) & 1u) != 0) {
        s.allowed[std::size_t((t - begin) / 32)] |= 1u << ((t - begin) % 32);
      }
    }
  }
  // A different stream of tail draws per rank: splitmix64's increment times (rank + 1), xored in.
  s.seed = p.seed ^ (0x9E3779B97F4A7C15ull * std::uint64_t(rank + 1));
  s.draw = {};
  return s;
}

void merge_candidates_host(const candidates_merge_params& p) {
  if (p.n_ranks < 1 || p.n_ranks > candidates_merge_max_ranks || p.n_seqs < 0 || p.vocab < 1 ||
      p.record_bytes <= sizeof(candidates_record_header) || p.record_bytes % 8 != 0 ||
      (p.n_seqs > 0 && (p.parts == nullptr || p.seqs == nullptr || p.out == nullptr))) {
    throw std::invalid_argument("merge_candidates_host: parameters out of range");
  }
  const auto* in = static_cast<const unsigned char*>(p.parts);
  auto* out = static_cast<unsigned char*>(p.out);
  merge_part parts[candidates_merge_max_ranks];
  int taken[candidates_merge_max_ranks];
  std::vector<double> prob(candidates_max_k);
  for (std::int64_t s = 0; s < p.n_seqs; ++s) {
    for (int q = 0; q < p.n_ranks; ++q) {
      const unsigned char* rec = in + (std::size_t(q) * std::size_t(p.n_seqs) + std::size_t(s)) * p.record_bytes;
      parts[q] = {.hdr = reinterpret_cast<const candidates_record_header*>(rec),
                  .top = reinterpret_cast<const candidates_record_entry*>(rec + sizeof(candidates_record_header)),
                  .vocab_begin = p.vocab_begin[q]};
    }
    const candidates_seq& sp = p.seqs[s];
    unsigned char* rec = out + std::size_t(s) * p.record_bytes;
    auto* hdr = reinterpret_cast<candidates_record_header*>(rec);
    auto* top = reinterpret_cast<candidates_record_entry*>(rec + sizeof(candidates_record_header));
    const std::int32_t k = std::int32_t(std::min<std::int64_t>(sp.top_k, p.vocab));
    merge_candidates_one(parts, p.n_ranks, k, sp.tail_u, hdr, top, taken);
    if (p.draw && sp.draw != 0) {
      const draw_cut cut{.greedy = sp.draw == 1, .top_k = sp.draw_top_k, .top_p = sp.draw_top_p, .min_p = sp.draw_min_p};
      draw_into_record(hdr, top, cut, sp.draw_u, prob.data());
    }
  }
}

}  // namespace anvil::kernels

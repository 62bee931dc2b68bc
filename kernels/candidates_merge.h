// Candidates over a vocabulary split between tensor-parallel ranks: each rank reduces its slice
// of the logits (kernels/candidates.h, on slice_logit_params), the ranks' records are gathered (a
// record per sequence and rank instead of a vocabulary of logits), and the merge makes the whole
// vocabulary's record from them, on every rank alike.
//
// The merge of one sequence's parts (merge_candidates_one), exact where the single op is:
//   - top: the best min(top_k, vocab) of the parts' tops (logit descending, ties to the lower
//     token id), which holds the whole vocabulary's, since each part holds its slice's best.
//   - log_normalizer: the log of the parts' summed normalisers, around their maximum, in double.
//   - tail_mass: each part's tail mass at its normaliser, plus the tokens of the parts' tops that
//     the merged top left out ("demoted"), in double; in [0, 1].
//   - tail token: drawn from that tail distribution. With u = tail_uniform(seed, position), the
//     first of the components, in rank order (a part's own tail, then its demoted tokens in its
//     order), where the running weight exceeds u * tail; a part's own tail is the token that part
//     drew with its rank's seed (slice_logit_params), independent of u. Same distribution as the
//     single op's draw; not the same token for a seed (the single op scans the vocabulary in id
//     order with u itself).
//   - flags: a part's NaN / +inf (bad logit) is the merged record's; no finite logit only when no
//     part has one. drawn: the draw (kernels/draw.h) on the merged record, as the single op's.
// merge_candidates_host() runs it on the host over gathered records: the GPU kernel's reference.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cfloat>

#include "kernels/candidates.h"
#include "kernels/draw.h"
#include "kernels/host_device.h"

namespace anvil::kernels {

inline constexpr int candidates_merge_max_ranks = 8;

// p for the tokens [begin, end) of the vocabulary, as rank `rank` reduces them: the logit bias and
// counts of those tokens (ids from begin), the mask's bits for them (when p has a mask), the seed
// mixed with the rank (its tail draw independent of the merge's and of the other ranks'), no draw.
// Everything else as p.
gpu_worker::logit_params slice_logit_params(const gpu_worker::logit_params& p, std::int64_t begin, std::int64_t end,
                                            int rank);

// One rank's record of a sequence, as the merge reads it.
struct merge_part {
  const candidates_record_header* hdr = nullptr;
  const candidates_record_entry* top = nullptr;  // hdr->n_top entries, ids within the slice
  std::int32_t vocab_begin = 0;                  // the slice's first token id
};

// The merge of one sequence (see above) into hdr (drawn = -1) and out[0, k); k = min(top_k,
// vocabulary) <= the parts' entries together. taken: n_parts ints of scratch.
ANVIL_HOST_DEVICE inline void merge_candidates_one(const merge_part* parts, int n_parts, std::int32_t k, double tail_u,
                                                   candidates_record_header* hdr, candidates_record_entry* out,
                                                   int* taken) {
  int flags = 0;
  bool any_finite = false;
  double lmax = -INFINITY;
  for (int q = 0; q < n_parts; ++q) {
    const candidates_record_header& h = *parts[q].hdr;
    flags |= h.flags & candidates_flag_bad_logit;
    if ((h.flags & candidates_flag_no_finite) == 0) {
      any_finite = true;
      lmax = ::fmax(lmax, double(h.log_normalizer));
    }
    taken[q] = 0;
  }
  if (!any_finite) flags |= candidates_flag_no_finite;
  std::int32_t n = 0;
  for (; n < k; ++n) {
    int best = -1;
    std::int32_t best_id = 0;
    float best_logit = 0.f;
    for (int q = 0; q < n_parts; ++q) {
      if (taken[q] >= parts[q].hdr->n_top) continue;
      const candidates_record_entry& e = parts[q].top[taken[q]];
      const std::int32_t id = e.token + parts[q].vocab_begin;
      if (best < 0 || e.logit > best_logit || (e.logit == best_logit && id < best_id)) {
        best = q;
        best_id = id;
        best_logit = e.logit;
      }
    }
    if (best < 0) break;
    out[n].token = best_id;
    out[n].logit = best_logit;
    ++taken[best];
  }
  double sum = 0;  // the parts' normalisers at lmax
  for (int q = 0; q < n_parts && any_finite; ++q) {
    if ((parts[q].hdr->flags & candidates_flag_no_finite) == 0) sum += ::exp(double(parts[q].hdr->log_normalizer) - lmax);
  }
  const double lse = any_finite ? lmax + ::log(sum) : -INFINITY;
  // The tail's components, in rank order: a part's own tail, then its demoted tokens.
  const auto own = [&](int q) {
    const candidates_record_header& h = *parts[q].hdr;
    return (h.flags & candidates_flag_no_finite) == 0 && h.tail_token >= 0 ? double(h.tail_mass) * ::exp(double(h.log_normalizer) - lse)
                                                                           : 0.0;
  };
  double tail = 0;
  for (int q = 0; q < n_parts && any_finite; ++q) {
    tail += own(q);
    for (int j = taken[q]; j < parts[q].hdr->n_top; ++j) tail += ::exp(double(parts[q].top[j].logit) - lse);
  }
  const float tail_mass = any_finite ? float(::fmin(::fmax(tail, 0.0), 1.0)) : 0.f;
  hdr->log_normalizer = float(::fmin(lse, double(FLT_MAX)));
  hdr->tail_mass = tail_mass;
  hdr->tail_token = -1;
  hdr->tail_logit = 0.f;
  hdr->n_top = n;
  hdr->flags = flags;
  hdr->drawn = -1;
  hdr->reserved = 0;
  if (tail_mass == 0.f) return;
  const double target = tail_u * tail;
  double running = 0;
  for (int q = 0; q < n_parts; ++q) {
    const candidates_record_header& h = *parts[q].hdr;
    if (const double w = own(q); w > 0) {
      hdr->tail_token = h.tail_token + parts[q].vocab_begin;  // the last with weight, should rounding pass them all
      hdr->tail_logit = h.tail_logit;
      running += w;
      if (running > target) return;
    }
    for (int j = taken[q]; j < h.n_top; ++j) {
      const double w = ::exp(double(parts[q].top[j].logit) - lse);
      if (w <= 0) continue;
      hdr->tail_token = parts[q].top[j].token + parts[q].vocab_begin;
      hdr->tail_logit = parts[q].top[j].logit;
      running += w;
      if (running > target) return;
    }
  }
}

// The draw on a merged record (as the candidates op's draw kernel): hdr->drawn, -1 when the
// record is flagged or empty. prob: n_top doubles of scratch.
ANVIL_HOST_DEVICE inline void draw_into_record(candidates_record_header* hdr, const candidates_record_entry* top,
                                               const draw_cut& cut, double u, double* prob) {
  const std::int32_t k = hdr->n_top;
  if (hdr->flags != 0 || k < 1) return;
  for (std::int32_t i = 0; i < k; ++i) prob[i] = ::exp(double(top[i].logit) - double(hdr->log_normalizer));
  const double tail = hdr->tail_token >= 0 ? double(hdr->tail_mass) : 0.0;
  const std::int32_t i = draw_pick(prob, k, tail, cut, u);
  hdr->drawn = i < k ? top[i].token : hdr->tail_token;
}

struct candidates_merge_params {
  const void* parts = nullptr;     // the gathered records: rank q's n_seqs records at q * n_seqs * record_bytes
  std::int32_t n_ranks = 0;        // in [1, candidates_merge_max_ranks]
  std::int64_t n_seqs = 0;
  std::size_t record_bytes = 0;    // candidates_record_bytes(max_k), in and out
  std::int64_t vocab = 0;          // the whole vocabulary's size
  std::int32_t vocab_begin[candidates_merge_max_ranks] = {};  // rank q's first token id
  const candidates_seq* seqs = nullptr;  // [n_seqs] the whole vocabulary's (top_k, tail_u, the draw)
  void* out = nullptr;             // n_seqs merged records
  bool draw = false;               // run the draw of the sequences that ask for it
};

// The merge on the host: the GPU op's definition.
void merge_candidates_host(const candidates_merge_params& p);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Enqueues the merge (a thread per sequence) on `stream`; hipErrorInvalidValue for ranks outside
// [1, candidates_merge_max_ranks], a record size that is not 8-byte aligned or holds no entry, an
// empty vocabulary, or null pointers.
hipError_t launch_candidates_merge(const candidates_merge_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif

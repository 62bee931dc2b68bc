// The logits → candidates reduction: what the GPU worker returns instead of a vocabulary of
// logits (DESIGN.md, Actors). One sequence's raw logits are processed with the request's
// whole-vocabulary parameters (logit bias, then penalties, then temperature) and summarised
// exactly: the top-K processed logits, the log-normaliser over the whole vocabulary, the mass
// outside the top-K, and one token drawn from that outside ("tail") distribution. With these the
// sampler can draw from the full processed distribution without seeing it (sampler/sampler_core.h).
//
// candidates_ref() is the definition of the op (CPU, double accumulation); the GPU kernel that
// comes later is tested against it. Its precise rules:
//   - logit_bias and token_counts ids must lie in the vocabulary, token_counts ids must be
//     distinct and counts >= 0, top_k >= 1: the scheduler validates requests, so anything else is
//     a caller bug and throws std::invalid_argument. So does a NaN or +inf raw logit, or a
//     vocabulary in which no token has a finite processed logit (-inf masks are fine otherwise).
//   - allowed (a non-empty mask): tokens whose bit is clear are -inf first (they stay -inf
//     through everything after); the mask must have (vocab + 31) / 32 words.
//   - bias: l += b (repeated ids add up). Penalties, for each (token, n > 0): repetition first
//     (l > 0 ? l / r : l * r), then l -= presence + frequency * n — the order sampling.cpp uses.
//     Temperature t >= min_temperature: l /= t; a smaller t leaves the logits alone (greedy). All
//     in float; each bias term, each token's penalties and the temperature go through keep_finite
//     (messages/step.h), so a finite raw logit stays finite whatever the parameters.
//   - top: min(top_k, vocab) tokens, logit descending, ties to the lower token id.
//   - log_normalizer = log sum_t exp(l_t), in double around the maximum (stable for |l| ~ 1e4
//     and -inf), rounded to float. Note: a float log_normalizer near 1e4 carries ~1e-3 absolute
//     error, so p = exp(l - log_normalizer) is good to ~1e-3 relative there; real logits are
//     within a few hundred, where the error is ~1e-5.
//   - tail_mass = 1 - sum of top probabilities, computed as the sum over the tail itself (no
//     cancellation when it is tiny); in [0, 1]; exactly 0 when top covers the vocabulary.
//   - tail: token -1 (logit 0) when float(tail_mass) == 0. Otherwise, with u = tail_uniform(seed,
//     position) and weights w_t = exp(l_t - max) over the tokens outside top, the smallest token
//     id t whose cumulative weight in ascending id order exceeds u * sum(w); its logit is l_t.
//     A scan in id order is what a GPU prefix sum computes, so the kernel can follow it exactly
//     up to rounding at the boundaries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "messages/step.h"

namespace anvil::kernels {

// The counter-based generator of the tail draw: a double in [0, 1) that depends only on the
// request's seed and the position, never on what else is in the batch or on how many draws came
// before (splitmix64 of seed ^ position * golden ratio, top 53 bits). `position` is the position
// the chosen token will occupy (start_pos + tokens.size() of the step), so a recomputed step
// (after preemption) draws the same tail token.
double tail_uniform(std::uint64_t seed, std::int64_t position) noexcept;

// The worker's draw (logit_params::draw) from one sequence's candidates, on the host: what the
// GPU op's draw kernel computes, and what the CPU worker reports as seq_output::drawn. -1 when
// the draw is off or `out` has no candidates.
std::int32_t draw_token(const gpu_worker::seq_output& out, const gpu_worker::logit_params& p);

// Why a sequence's raw logits cannot be reduced (a NaN or +inf, or no finite logit: the model's
// numerics failed for it), or "" when they can. The workers ask before candidates_ref and answer
// such a sequence with no candidates, so that it fails alone instead of its whole step.
std::string unusable_logits(std::span<const float> logits);

// Processes one sequence's raw logits (the whole vocabulary) and reduces them to candidates.
// The result's seq_id is left 0 for the caller to fill.
gpu_worker::seq_output candidates_ref(std::span<const float> logits, const gpu_worker::logit_params& p,
                                      std::int64_t position);

// ---- The GPU op (kernels/candidates.hip): the same reduction for a batch of sequences ----
//
// Inputs are plain arrays the worker uploads each step: one candidates_seq per sequence, and the
// bias and count pairs of all sequences concatenated (each sequence names its range). The tail
// draw's uniform is computed on the host (tail_uniform) and passed in. The output is one
// fixed-size record per sequence (header + max_k entries) in one device buffer that the worker
// copies back whole.

inline constexpr std::int32_t candidates_max_k = 256;

// The GPU op spreads a sequence's vocabulary over slices of this many tokens (one block each), up
// to candidates_max_slices of them: vocabularies up to 524,288 tokens.
inline constexpr std::int64_t candidates_slice_len = 4096;
inline constexpr std::int64_t candidates_max_slices = 128;
inline constexpr std::int64_t candidates_max_vocab = candidates_slice_len * candidates_max_slices;

// The op's device workspace, laid out per sequence: each slice's top k (max_k entries of 8 bytes
// per slice), each slice's sums (32 bytes), then the sequence's selection (16 bytes).
struct candidates_workspace_layout {
  std::size_t slices_at = 0;  // offset of the slice sums
  std::size_t states_at = 0;  // offset of the per-sequence selection
  std::size_t bytes = 0;
};
inline std::int64_t candidates_slices(std::int64_t vocab) {
  return (vocab + candidates_slice_len - 1) / candidates_slice_len;
}
inline candidates_workspace_layout candidates_workspace(std::int64_t n_seqs, std::int64_t vocab, std::int32_t max_k) {
  const auto up16 = [](std::size_t n) { return (n + 15) / 16 * 16; };
  const std::size_t per = std::size_t(n_seqs) * std::size_t(candidates_slices(vocab));
  candidates_workspace_layout w;
  w.slices_at = up16(per * std::size_t(max_k) * 8);
  w.states_at = w.slices_at + per * 32;
  w.bytes = w.states_at + std::size_t(n_seqs) * 16;
  return w;
}

struct candidates_seq {
  float temperature = 0.f;              // as logit_params
  float repetition_penalty = 1.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  std::int32_t top_k = 1;               // in [1, max_k]; clamped to the vocabulary
  std::int32_t bias_begin = 0;          // this sequence's pairs: bias_ids/values[begin, begin + count)
  std::int32_t bias_count = 0;
  std::int32_t counts_begin = 0;        // count_ids/values[begin, begin + count): distinct ids
  std::int32_t counts_count = 0;
  std::int32_t draw = 0;                // logit_params::draw into the record and `drawn`: 0 none, 1 greedy, 2 sampled
  std::int32_t draw_top_k = 0;          // the draw's cuts (kernels/draw.h)
  float draw_top_p = 1.f;
  float draw_min_p = 0.f;
  std::int32_t mask_begin = -1;         // logit_params::allowed: its words at mask_words[mask_begin, +(vocab+31)/32); -1 none
  double tail_u = 0.0;                  // tail_uniform(seed, position)
  double draw_u = 0.0;                  // draw_uniform(seed, position) (kernels/draw.h)
};

// Record layout: this header, then max_k entries (the first n_top used, best first).
struct candidates_record_header {
  float log_normalizer = 0.f;
  float tail_mass = 0.f;
  std::int32_t tail_token = -1;
  float tail_logit = 0.f;
  std::int32_t n_top = 0;
  std::int32_t flags = 0;               // candidates_flag_*: the input broke the op's preconditions
  std::int32_t drawn = -1;              // the draw's token (candidates_seq::draw), -1 for none
  std::int32_t reserved = 0;
};
struct candidates_record_entry {
  std::int32_t token = -1;
  float logit = 0.f;
};
inline constexpr std::int32_t candidates_flag_bad_logit = 1;  // a NaN or +inf processed logit
inline constexpr std::int32_t candidates_flag_no_finite = 2;  // no token has a finite logit

inline std::size_t candidates_record_bytes(std::int32_t max_k) {
  return sizeof(candidates_record_header) + std::size_t(max_k) * sizeof(candidates_record_entry);
}

struct candidates_params {
  float* logits = nullptr;                     // [n_seqs, vocab] raw; processed IN PLACE
  std::int64_t vocab = 0;                      // in [1, candidates_max_vocab]
  std::int64_t n_seqs = 0;
  const candidates_seq* seqs = nullptr;        // [n_seqs]
  const std::int32_t* bias_ids = nullptr;      // concatenated (token, bias) pairs
  const float* bias_values = nullptr;
  const std::int32_t* count_ids = nullptr;     // concatenated (token, occurrences) pairs
  const std::int32_t* count_values = nullptr;
  const std::uint32_t* mask_words = nullptr;   // concatenated masks (candidates_seq::mask_begin); may be null when none has one
  std::int32_t max_k = candidates_max_k;       // record capacity, in [1, candidates_max_k]
  void* out = nullptr;                         // n_seqs records of candidates_record_bytes(max_k)
  void* workspace = nullptr;                   // candidates_workspace(n_seqs, vocab, max_k).bytes, 16-byte aligned
  std::size_t workspace_bytes = 0;
  bool draw = false;                           // run the draw (candidates_seq::draw) into the records
  bool pairs = true;                           // some sequence has bias or count pairs (false: no prep kernel)
};

// The host side of the upload: the flat arrays for a batch, validated as candidates_ref
// validates (ids inside the vocabulary, distinct count ids, counts >= 0, top_k in [1, max_k]);
// a violation throws std::invalid_argument. positions[s] seeds sequence s's tail draw.
struct candidates_batch {
  std::vector<candidates_seq> seqs;
  std::vector<std::int32_t> bias_ids;
  std::vector<float> bias_values;
  std::vector<std::int32_t> count_ids;
  std::vector<std::int32_t> count_values;
  std::vector<std::uint32_t> mask_words;  // the masks of the sequences that have one, concatenated
};
candidates_batch pack_candidates(std::span<const gpu_worker::logit_params> params,
                                 std::span<const std::int64_t> positions, std::int64_t vocab,
                                 std::int32_t max_k = candidates_max_k);

// Reads one record (host copy) back as the reference's result (seq_id left 0).
gpu_worker::seq_output unpack_candidates(const void* record);

}  // namespace anvil::kernels

#if defined(ANVIL_GPU_CUDA) || defined(ANVIL_GPU_HIP)
#include "kernels/gpu_runtime.h"

namespace anvil::kernels {
// Four kernels, and a fifth before them when p.pairs says some sequence has bias or penalty
// pairs: per sequence, and per sequence and slice of the vocabulary (kernels/candidates.hip).
// The logits buffer is processed in place. Rejects (hipErrorInvalidValue) a vocabulary or max_k
// out of range, a misaligned output, or a short or misaligned workspace.
hipError_t launch_candidates(const candidates_params& p, hipStream_t stream);
}  // namespace anvil::kernels
#endif

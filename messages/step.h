// The step contract between the scheduler and the GPU worker (DESIGN.md): a step_plan says which
// sequences run, which tokens they feed, their positions and block tables; the step_result
// carries, per sequence that asked, the top-K candidates of its next-token distribution and the
// log-normaliser — K numbers, never a vocabulary of logits. Plain data only: no pointers, no
// device handles. "We only send what the step needs."
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace anvil::gpu_worker {

// Temperatures below this one choose greedily, on every path (the worker leaves the logits
// unscaled, the samplers take the most likely token): dividing by a smaller one overflows float
// for ordinary logits, and at 1e-5 logits 1e-4 apart already differ by a factor e^10 in probability.
inline constexpr float min_temperature = 1e-5f;
inline bool is_greedy(float temperature) { return !(temperature >= min_temperature); }

// One step of logit processing (bias, a penalty, temperature) on a logit that was `before`: a
// finite logit stays finite — an overflow saturates at the largest float of its sign — so no value
// a request may set can make a logit, a probability or a log-normaliser infinite or NaN; a -inf
// (a token the model masks) stays -inf. The CPU reference, the GPU kernel and sample_token apply it
// after each step, so all three agree.
inline float keep_finite(float before, float after) {
  constexpr float big = std::numeric_limits<float>::max();
  return std::isfinite(before) ? std::clamp(after, -big, big) : after;
}

// The penalties on the logit of a token seen n > 0 times: repetition first (positive logits
// divided, negative multiplied), then presence + frequency * n subtracted, through keep_finite.
inline float penalised(float x, float repetition, float presence, float frequency, std::int32_t n) {
  float y = x > 0 ? x / repetition : x * repetition;
  y -= presence + frequency * float(n);
  return keep_finite(x, y);
}

// The worker's draw of the next token from the candidates it computed (kernels/draw.h), with the
// sampler's cuts and seed, so that a step planned ahead of this one can feed the token without a
// trip through the host (sched/scheduler.h). The sampler reports the worker's token then.
struct draw_params {
  bool on = false;                  // draw (seq_output::drawn); off: only the sampler draws
  std::int32_t top_k = 0;           // the sampler's cuts (sampler::sampling_params): 0 keeps all
  float top_p = 1.f;
  float min_p = 0.f;
};

// Logit processing that needs the whole vocabulary; the worker applies it before the top-K cut,
// in this order: logit bias, penalties, temperature (each step through keep_finite).
struct logit_params {
  float temperature = 0.f;          // is_greedy(): no scaling; else logits are divided by it
  float repetition_penalty = 1.f;   // seen tokens: positive logits divided, negative multiplied
  float presence_penalty = 0.f;     // subtracted once from every seen token
  float frequency_penalty = 0.f;    // subtracted once per occurrence
  std::vector<std::pair<std::int32_t, std::int32_t>> token_counts;  // (token, occurrences) in the history, for the penalties
  std::vector<std::pair<std::int32_t, float>> logit_bias;          // (token, added to its logit)
  // Constrained decoding (sampler/structured/): empty, or a bitset over the vocabulary (bit t of
  // word t / 32) of the tokens allowed next; every other token's logit is -inf before anything
  // else. The scheduler fills it per step from the request's automaton state.
  std::vector<std::uint32_t> allowed{};
  std::int32_t top_k = 64;          // candidates to return, >= 1 (clamped to the vocabulary)
  std::uint64_t seed = 0;           // the request's seed: with the position, it seeds the tail draw and the draw
  draw_params draw;                 // the worker's draw of the next token (temperature and seed above)
};

// One sequence's part of a step.
// The first block a query at position `pos` reads in a layer that attends within `window`
// positions (its own included): the blocks before it hold only positions outside that window,
// which is why a window pool gives them back (kv_config::window) and a window table holds -1 there.
constexpr std::int64_t first_window_block(std::int64_t pos, std::int64_t window, std::int64_t block_size) {
  return std::max<std::int64_t>(0, pos - window + 1) / block_size;
}

struct seq_step {
  std::uint64_t seq_id = 0;                 // the scheduler's sequence (request) id
  std::vector<std::int32_t> tokens;         // fed this step: a prefill chunk or one decode token
  // >= 0: tokens is {-1}, and the token fed is the one the worker drew (draw_params) for its
  // output number feed_from (outputs order) of the step it ran just before, numbered plan.step - 1:
  // that token never leaves the device before this step runs.
  std::int32_t feed_from = -1;
  std::int64_t start_pos = 0;               // position of tokens[0]; earlier positions are in the KV cache
  std::vector<std::int32_t> block_table;    // block ids covering positions [0, start_pos + tokens.size())
  // The model's sliding-window layers' blocks (kv_config::window), covering the same positions;
  // -1 for blocks wholly before the window of every token fed. Empty without a window pool.
  std::vector<std::int32_t> window_table;
  // The model's recurrent layers' state slot (kv_config::n_state_slots), holding the state after
  // start_pos positions (start_pos 0: the step starts it afresh). -1 for a model without them.
  std::int32_t state_slot = -1;
  bool want_candidates = false;             // the next-token distribution after the last fed token is needed
  logit_params logits;                      // how to process it (when want_candidates)
  // Constrained decoding planned ahead: logits.allowed is empty here and comes in a step_masks for
  // this step, once the token fed (feed_from) is known to the automaton. The worker runs the
  // forward pass meanwhile and waits for the mask only to process the logits.
  bool mask_deferred = false;
  // Scoring (perplexity, prompt log-probabilities): empty, or one entry per fed token: the token
  // whose log-probability after tokens[0..j] is wanted, under the model's raw distribution
  // (log-softmax of the logits, no processing), or -1 for none.
  std::vector<std::int32_t> score_targets;
};

// Copy-on-write: the worker copies block `src` into block `dst` (all layers of the block's pool:
// the main one, or with `window` the sliding-window layers' pool) before the step.
struct block_copy {
  std::int32_t src = 0;
  std::int32_t dst = 0;
  bool window = false;
};

// A recurrent state (kv_config::n_state_slots) copied from slot src into slot dst, every
// recurrent layer's: a prefix's snapshot into a sequence resuming after it, or a sequence's state
// into the snapshot of the prefix the step ended.
struct state_copy {
  std::int32_t src = 0;
  std::int32_t dst = 0;
};

struct step_plan {
  std::uint64_t step = 0;                   // step number, for logs (step=)
  std::vector<block_copy> copies;           // done first, in order
  std::vector<state_copy> state_copies;     // done first too: sequences resuming from a snapshot
  std::vector<state_copy> state_snapshots;  // done after the step: snapshots of the prefixes it ended
  std::vector<seq_step> seqs;               // at least one
};

// The masks a step planned ahead waited for (seq_step::mask_deferred): sent by the scheduler once
// the step before it has completed, so each automaton has taken the token drawn there; they come
// before any later plan. There is no reply: a step whose masks are missing or malformed fails.
struct step_masks {
  std::uint64_t step = 0;                   // the step (step_plan::step) they belong to
  // One per seq_step with mask_deferred, in plan order: its logit_params::allowed. Empty for none
  // (a sequence that ended meanwhile: its output is discarded, any mask does).
  std::vector<std::vector<std::uint32_t>> allowed;
};

struct candidate {
  std::int32_t token = -1;
  float logit = 0.f;                        // after processing (bias, penalties, temperature)
};

// One sequence's next-token distribution, summarised exactly: p(t) = exp(logit(t) - log_normalizer).
struct seq_output {
  std::uint64_t seq_id = 0;
  std::vector<candidate> top;               // the top_k most likely, sorted by logit descending, ties by lower token id;
                                            // empty when the model's logits for this sequence were not usable (a NaN
                                            // or +inf, or none finite): the sampler then fails this request alone
  float log_normalizer = 0.f;               // log of the softmax denominator over the whole vocabulary
  float tail_mass = 0.f;                    // probability outside `top` (0 when top covers the vocabulary)
  candidate tail;                           // a token drawn from the distribution restricted to outside `top`,
                                            // seeded by (seed, position); token -1 when tail_mass is 0
  std::int64_t position = 0;                // the position the chosen token will take (it seeds the draws)
  std::int32_t drawn = -1;                  // the worker's draw under logit_params::draw, or -1 for none
};

// The log-probabilities a sequence's score_targets asked for: one per entry, 0 where it was -1.
struct seq_scores {
  std::uint64_t seq_id = 0;
  std::vector<float> logprobs;
};

struct step_result {
  std::uint64_t step = 0;
  std::vector<seq_output> outputs;          // one per seq_step with want_candidates, in plan order
  std::vector<seq_scores> scores;           // one per seq_step with score_targets, in plan order
  double execute_ms = 0;                    // time the worker spent on the step
  // The device's own clock (GPU worker; -1 where not measured, e.g. the CPU worker or the first
  // step): how long the device sat idle between the end of the step before and the first command
  // of this one (the host's turn-around between steps), and how long this one kept it busy.
  double device_idle_us = -1;
  double device_busy_us = -1;
};

}  // namespace anvil::gpu_worker

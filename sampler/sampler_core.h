// sampler_core: the sampler actor's pure core (no Asio). choose() draws a token from the GPU
// worker's summary of a processed distribution (gpu_worker::seq_output: top-K candidates, the
// log-normaliser, the tail mass and one tail draw) as sample_token() (sampling.h) would draw from
// the full logits; sampler_core keeps each request's parameters. When the worker drew the token
// itself (seq_output::drawn, the same kernels::draw_pick with the same uniform) the sampler takes
// that token: the next step may already have fed it (sched/scheduler.h, overlapped steps).
//
// The worker has already applied everything that needs the whole vocabulary (bias, penalties,
// temperature: kernels/candidates.h), so p(t) = exp(logit(t) - log_normalizer) and the sampler
// only cuts and draws: of sampling_params it reads temperature (gpu_worker::is_greedy or not; the
// scheduler sends the same value to the worker), top_k, top_p, min_p and seed, never the
// penalties or the bias. The cuts (top_k, then top_p over the top-k set renormalised, then min_p
// relative to the most likely token, as sample_token applies them) only ever keep a prefix of the
// sorted tokens, so they are exact whenever the kept prefix is known to end inside the K
// candidates: top_k in [1, K], or a top_p / min_p cut that falls inside the candidates. One uniform
// u = kernels::draw_uniform(seed, position) then picks among the kept candidates in proportion to p.
//
// When the cut would extend past the K candidates (top_k = 0 or top_k > K, and neither top_p nor
// min_p cuts inside them), the tail joins as one more entry of weight tail_mass, standing for the
// worker's tail draw: u < (sum of candidate p) / (sum + tail_mass) picks among the candidates, else
// the tail token. With no truncation at all this is exact over the full vocabulary (the worker's
// draw follows the distribution restricted to the tail, independently of u). With truncation it
// over-includes: the whole tail participates although the exact cut would keep only its head.
// Likewise, when K < top_k < vocab, top_p is measured against the whole distribution instead of
// the top-k set's (whose mass past K is unknown), which can only cut later. Both errors are
// bounded by tail_mass; the scheduler stays exact by asking the worker for K >= top_k.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/system/result.hpp>

#include "messages/step.h"
#include "sampler/sampler_error.h"
#include "sampler/sampling.h"

namespace anvil::sampler {

struct token_logprob {
  std::int32_t token = -1;
  float logprob = 0.f;  // log p(token) under the processed distribution; the lowest float where p is 0
};

struct choice {
  std::int32_t token = -1;                  // the chosen token
  float logprob = 0.f;                      // its log p under the processed distribution, before the
                                            // cuts renormalise it (what OpenAI's logprobs report)
  std::vector<token_logprob> top_logprobs;  // the n most likely tokens, most likely first (ties: lower
                                            // id); at most K, the candidates the worker returned
  bool from_tail = false;                   // the token is the worker's tail draw (outside the top K)
};

// nullopt when `out` keeps the step contract the cuts rely on (candidates present with valid ids
// and no NaN or +inf logit, sorted by logit descending with ties by lower id, finite
// log_normalizer, tail_mass in [0, 1], a tail token whenever tail_mass > 0), else what is wrong.
std::optional<std::string> check_candidates(const gpu_worker::seq_output& out);

// Chooses a token from `out` under `p` with the uniform u in [0, 1) (temperature 0: top[0], u
// unused) through kernels::draw_pick, the function the worker draws with, and reports n_logprobs
// alternatives. Preconditions, which throw std::invalid_argument: check_candidates(out) passes
// and n_logprobs is in [0, max_logprobs].
choice choose(const gpu_worker::seq_output& out, const sampling_params& p, double u, std::int32_t n_logprobs);
// The same with u = uniform01(rng): exactly one draw of `rng`, none when greedy.
choice choose(const gpu_worker::seq_output& out, const sampling_params& p, std::mt19937_64& rng,
              std::int32_t n_logprobs);
// The worker's draw (out.drawn) as the choice, with its logprob and the alternatives: it must be
// a candidate or the tail token (else std::invalid_argument, as for choose's preconditions).
choice take_drawn(const gpu_worker::seq_output& out, std::int32_t n_logprobs);

// One entry of a sample batch.
struct sample_request {
  std::uint64_t request_id = 0;        // an id opened with sampler_core::open
  gpu_worker::seq_output candidates;   // the worker's output for the request's sequence this step
  std::int32_t n_logprobs = 0;         // alternatives to report with the token, [0, 20]
};

// An entry's answer: the choice, or why this entry failed (sampler_errc).
using sample_outcome = boost::system::result<choice, error_code>;

// Per-request sampling state. A token's uniform depends on the request's seed and the token's
// position alone (counter-based, kernels/draw.h), so the same seed gives the same tokens whatever
// else is in a batch, however requests interleave, and whichever side (worker or sampler) drew.
class sampler_core {
 public:
  // Starts a request: validates p (invalid_params), refuses an id already open (already_open).
  error_code open(std::uint64_t request_id, const sampling_params& p);

  // One entry; errors: unknown_request, invalid_candidates.
  sample_outcome sample(const sample_request& r);

  // Every entry in order; a failed entry does not affect the others.
  std::vector<sample_outcome> sample(std::span<const sample_request> batch);

  // Forgets a request (unknown_request if it is not open).
  error_code close(std::uint64_t request_id);

  std::size_t open_requests() const noexcept { return requests_.size(); }

 private:
  struct request_state {
    sampling_params params;
  };
  std::unordered_map<std::uint64_t, request_state> requests_;
};

}  // namespace anvil::sampler

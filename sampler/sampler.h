// sampler_actor: the sampler (DESIGN.md, Actors) — a thin strand shell around sampler_core. The
// scheduler opens a request with its sampling parameters, sends each step's candidates for the
// requests that need a token, and closes the request when it ends. Every message runs on the
// actor's strand, so the per-request state (parameters, a generator seeded with the request's
// seed) needs no locks; each request's generator advances only with its own tokens, so a seed
// gives the same tokens whatever the batches look like and however requests interleave.
//
// Completions: async_open / async_close -> (error_code); async_sample -> (error_code,
// std::vector<sample_outcome>), one outcome per entry in order. The first error_code is the
// actor's (busy, stopped); an entry's own failure (unknown request, bad candidates) is its
// outcome's error and leaves the other entries alone.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include <spdlog/logger.h>

#include "actors/strand_actor.h"
#include "sampler/sampler_core.h"

namespace anvil::sampler {

class sampler_actor : public actors::strand_actor {
 public:
  explicit sampler_actor(actors::asio::any_io_executor ex, std::size_t mailbox_capacity = 4096)
      : strand_actor(std::move(ex), {"sampler", mailbox_capacity}) {}

  // open, sample and close are the scheduler's, which bounds them (one per request, one batch per
  // step): exempt from the mailbox bound (actors::admission), so a full mailbox never refuses them.

  // Starts a request's sampling state. Errors: invalid_params (logged with the reason),
  // already_open.
  template <class Token>
  auto async_open(std::uint64_t request_id, sampling_params params, Token&& token) {
    return ask<void, actors::admission::exempt>(std::forward<Token>(token), [this, request_id, p = std::move(params)]() -> actors::outcome<void> {
      if (const error_code ec = core_.open(request_id, p)) {
        const auto why = validate(p);
        log().warn("req={} not opened: {}", request_id, why ? *why : ec.message());
        return ec;
      }
      log().debug("req={} opened (temperature {}, top_k {}, top_p {}, min_p {})", request_id, p.temperature, p.top_k,
                  p.top_p, p.min_p);
      return {};
    });
  }

  // Chooses one token per entry, in order.
  template <class Token>
  auto async_sample(std::vector<sample_request> batch, Token&& token) {
    return ask<std::vector<sample_outcome>, actors::admission::exempt>(std::forward<Token>(token), [this, b = std::move(batch)] {
      std::vector<sample_outcome> out = core_.sample(b);
      for (std::size_t i = 0; i < out.size(); ++i) {
        if (!out[i]) log().warn("req={} not sampled: {}", b[i].request_id, out[i].error().message());
      }
      log().debug("sampled {} entries", out.size());
      return out;
    });
  }

  // Ends a request's sampling state. Errors: unknown_request.
  template <class Token>
  auto async_close(std::uint64_t request_id, Token&& token) {
    return ask<void, actors::admission::exempt>(std::forward<Token>(token), [this, request_id]() -> actors::outcome<void> {
      if (const error_code ec = core_.close(request_id)) return ec;
      log().debug("req={} closed", request_id);
      return {};
    });
  }

 private:
  sampler_core core_;  // strand only
};

}  // namespace anvil::sampler

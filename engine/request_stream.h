// request_stream: a request's CPU-side output state — streaming-safe detokenisation, stop
// strings, usage and timings. Pure: fed token by token by the engine (on its streams strand),
// it answers the text that may be shown now. Text that could be the start of a stop string is
// held back until it is known not to be one; a stop string is never shown.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"

namespace anvil {

struct stream_timings {
  double queue_ms = 0;       // submit to the first step that fed the request
  double ttft_ms = 0;        // submit to the first generated token
  double total_ms = 0;       // submit to the end
  double mean_itl_ms = 0;    // mean time between generated tokens
};

class request_stream {
 public:
  using clock = std::chrono::steady_clock;

  // shown_control: control tokens shown as their text (incremental_decoder's `shown`).
  request_stream(const model::tokenizer& tok, std::vector<std::string> stop, clock::time_point submitted,
                 std::vector<std::int32_t> shown_control = {});

  // A generated token: returns the text that can be shown now, and whether a stop string ended
  // the output (then nothing after it is shown, and the request should be cancelled).
  struct piece {
    std::string text;
    bool stopped = false;
  };
  // hidden: the token counts (usage, timings) but its text is not shown (a stop token id).
  piece push(std::int32_t token, clock::time_point now, bool hidden = false);
  // The end: whatever was held back (an incomplete character, a partial stop-string prefix).
  std::string flush(clock::time_point now);

  std::int64_t completion_tokens() const { return n_tokens_; }
  clock::time_point submitted() const { return submitted_; }
  const std::string& text() const { return text_; }  // everything shown so far
  stream_timings timings() const;
  void mark_first_step(clock::time_point t) {
    if (!first_step_) first_step_ = t;
  }

 private:
  std::size_t held_back_length() const;  // of pending_, the longest suffix that starts a stop string

  model::incremental_decoder decoder_;
  std::vector<std::string> stop_;
  std::string pending_;   // decoded, not yet shown
  std::string text_;      // shown
  bool stopped_ = false;
  std::int64_t n_tokens_ = 0;
  clock::time_point submitted_;
  std::optional<clock::time_point> first_step_, first_token_, last_token_, finished_;
};

}  // namespace anvil

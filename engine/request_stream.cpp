#include "engine/request_stream.h"

#include <algorithm>

namespace anvil {

request_stream::request_stream(const model::tokenizer& tok, std::vector<std::string> stop, clock::time_point submitted,
                               std::vector<std::int32_t> shown_control)
    : decoder_(tok, true, std::move(shown_control)), stop_(std::move(stop)), submitted_(submitted) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
}

std::size_t request_stream::held_back_length() const {
  std::size_t keep = 0;
  for (const std::string& s : stop_) {
    for (std::size_t n = std::min(s.size() - 1, pending_.size()); n > keep; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  return keep;
}

request_stream::piece request_stream::push(std::int32_t token, clock::time_point now, bool hidden) {
  if (!first_token_) first_token_ = now;
  last_token_ = now;
  ++n_tokens_;
  if (stopped_ || hidden) return {};
  pending_ += decoder_.push(token);
  // The earliest stop string anywhere in the pending text ends the output.
  std::size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, pending_.find(s));
  piece out;
  if (cut != std::string::npos) {
    out.text = pending_.substr(0, cut);
    out.stopped = stopped_ = true;
    pending_.clear();
  } else {
    const std::size_t show = pending_.size() - held_back_length();
    out.text = pending_.substr(0, show);
    pending_.erase(0, show);
  }
  text_ += out.text;
  return out;
}

std::string request_stream::flush(clock::time_point now) {
  finished_ = now;
  if (stopped_) return {};
  std::string rest = pending_ + decoder_.flush();
  pending_.clear();
  text_ += rest;
  return rest;
}

stream_timings request_stream::timings() const {
  auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  stream_timings t;
  if (first_step_) t.queue_ms = ms(submitted_, *first_step_);
  if (first_token_) t.ttft_ms = ms(submitted_, *first_token_);
  if (finished_) t.total_ms = ms(submitted_, *finished_);
  if (first_token_ && last_token_ && n_tokens_ > 1) t.mean_itl_ms = ms(*first_token_, *last_token_) / double(n_tokens_ - 1);
  return t;
}

}  // namespace anvil

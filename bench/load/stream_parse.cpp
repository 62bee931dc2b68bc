#include "bench/load/stream_parse.h"

namespace anvil::bench {

std::vector<std::string> line_splitter::feed(std::string_view bytes) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t nl = bytes.find('\n'); nl != std::string_view::npos; nl = bytes.find('\n', start)) {
    partial_.append(bytes.substr(start, nl - start));
    if (!partial_.empty() && partial_.back() == '\r') partial_.pop_back();
    out.push_back(std::move(partial_));
    partial_.clear();
    start = nl + 1;
  }
  partial_.append(bytes.substr(start));
  return out;
}

std::vector<sse_event> sse_parser::feed(std::string_view bytes) {
  std::vector<sse_event> out;
  for (const auto& line : lines_.feed(bytes)) take_line(line, out);
  return out;
}

std::vector<sse_event> sse_parser::finish() {
  std::vector<sse_event> out;
  if (!lines_.pending().empty()) {
    const std::string last = lines_.pending();
    lines_ = line_splitter{};
    take_line(last, out);
  }
  take_line("", out);  // dispatch what is pending
  return out;
}

void sse_parser::take_line(const std::string& line, std::vector<sse_event>& out) {
  if (line.empty()) {
    if (has_data_) out.push_back(std::move(current_));
    current_ = sse_event{};
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // comment (keep-alive pings)
  const auto colon = line.find(':');
  const std::string field = line.substr(0, colon);
  std::string value = colon == std::string::npos ? "" : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.erase(0, 1);
  if (field == "data") {
    if (has_data_) current_.data += '\n';
    current_.data += value;
    has_data_ = true;
  } else if (field == "event") {
    current_.event = value;
  }
  // id and retry do not matter to a benchmark.
}

}  // namespace anvil::bench

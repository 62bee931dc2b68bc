// stream_parse: turning bytes as they arrive from a socket into lines (the TCP line protocol)
// and into server-sent events (HTTP streaming). Reads split lines and events anywhere, so both
// keep the unfinished tail until the rest arrives.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace anvil::bench {

// Newline-delimited input: feed() bytes, get back every line completed by them (without the
// "\n" and an optional "\r" before it).
class line_splitter {
 public:
  std::vector<std::string> feed(std::string_view bytes);
  // The unfinished last line, if any (what a closed stream left behind).
  const std::string& pending() const { return partial_; }

 private:
  std::string partial_;  // bytes after the last newline
};

// One server-sent event: its `event:` name (may be empty) and its `data:` lines joined by "\n".
struct sse_event {
  std::string event;  // the event type; "" for the default "message"
  std::string data;   // the payload, e.g. a JSON chunk or "[DONE]"
};

// The SSE wire format (WHATWG): fields "name: value" per line, an event ends at a blank line,
// lines starting with ':' are comments, several data lines join with "\n".
class sse_parser {
 public:
  std::vector<sse_event> feed(std::string_view bytes);
  // End of stream: an event still missing its blank line is dispatched anyway (lenient).
  std::vector<sse_event> finish();

 private:
  void take_line(const std::string& line, std::vector<sse_event>& out);

  line_splitter lines_;  // bytes -> lines
  sse_event current_;    // fields of the event being read
  bool has_data_ = false;  // current_ saw at least one data line
};

}  // namespace anvil::bench

// Fuzz target: the request codec the line protocol and the HTTP API share (proto/request_json.h).
// The first byte picks the dialect (line, completions, chat); the rest is parsed as JSON and,
// when it is an object, read as a request. Checked: a request read without error satisfies the
// codec's promises (n and stop strings within their caps, max_tokens >= 1, exactly the prompt
// form the dialect takes), and valid_utf8() returns valid UTF-8 (it is its own fixed point, and
// JSON carries it unchanged).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <boost/json.hpp>

#include "proto/request_json.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace anvil::proto;
  namespace json = boost::json;
  if (size == 0) return 0;
  const auto d = static_cast<dialect>(data[0] % 3);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  const std::string clean = valid_utf8(text);
  check(valid_utf8(clean) == clean);
  check(json::parse(json::serialize(json::value(clean))).as_string() == clean);

  json::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) return 0;
  parsed_request out;
  const std::string err = read_request(v.get_object(), d, out);
  if (!err.empty()) return 0;
  check(out.n >= 1 && out.n <= max_choices);
  check(out.req.stop.size() <= max_stop_strings);
  check(out.req.max_tokens >= 1);
  check(out.req.sampling.top_k >= 0);
  if (d == dialect::chat) check(out.req.prompt.empty() && out.req.prompt_tokens.empty());
  if (d == dialect::completions) check(out.req.messages.empty());
  return 0;
}

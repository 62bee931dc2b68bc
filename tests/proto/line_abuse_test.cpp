// The line protocol under a seeded stream of hostile lines — garbage bytes, truncated JSON, deep
// nesting, huge numbers, wrong types, NULs, invalid UTF-8 (raw and as escaped surrogates), bad
// ids, bad logit_bias entries, over-long lines — each answered on its own connection with exactly
// the documented error line, valid requests mixed in still answered in full, while a well-behaved
// client on other connections keeps getting the same correct answers. (The fixed list of one of
// each kind is in line_server_test; this is the random mix.) ANVIL_ABUSE_SEED picks the seed.
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include "tests/proto/abuse_harness.h"

namespace {

using namespace anvil;
using namespace anvil::testing;
namespace json = boost::json;

// One hostile line and the answer it must get: an error line with this `id` and `code`.
struct abuse_line {
  std::string kind;   // for the failure message
  std::string bytes;  // without the '\n'
  json::value id;     // null when the id cannot be known
  std::string code;
};

class line_abuser {
 public:
  line_abuser(std::uint64_t seed, std::size_t max_line, std::int64_t n_vocab) : rng_(seed), max_line_(max_line), n_vocab_(n_vocab) {}

  abuse_line next(int serial) {
    const std::string id = "a" + std::to_string(serial);
    const json::value jid(id);
    switch (pick(11)) {
      case 0: return garbage();
      case 1: return {"truncated", truncated(valid_request(id)), nullptr, "invalid_json"};
      case 2: return deep(id);
      case 3: return huge_number(id);
      case 4: return wrong_type(id);
      case 5: return {"nul", insert(valid_request(id), std::string(1, '\0')), nullptr, "invalid_json"};
      case 6: return bad_utf8(id);
      case 7: return {"too long", std::string(max_line_ + 1 + pick(max_line_), pick(2) ? 'x' : '{'), nullptr, "line_too_long"};
      case 8: return bad_logit_bias(id);
      case 9: return bad_id();
      default: return bad_max_tokens(id);
    }
  }

  std::string valid_request(const std::string& id) {
    json::object o{{"id", id}, {"prompt", pick(2) ? json::value("Hello there") : json::value(json::array{1, 2, 3})},
                   {"max_tokens", 1 + pick(4)}, {"ignore_eos", true}};
    if (pick(2)) o["temperature"] = 0.5;
    if (pick(2)) o["stop"] = json::array{"zz", "yy"};
    if (pick(2)) o["stream"] = false;
    return json::serialize(o);
  }

  std::size_t pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

 private:
  template <class T, std::size_t N>
  const T& one_of(const T (&a)[N]) {
    return a[pick(N)];
  }

  abuse_line garbage() {
    static const std::string first = "!\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz|}~\x01\x7f\x80\xff";
    std::string s(1, first[pick(first.size())]);
    const std::size_t n = pick(300);
    for (std::size_t i = 0; i < n; ++i) {
      char c = char(pick(256));
      s += c == '\n' ? ' ' : c;
    }
    return {"garbage", s, nullptr, "invalid_json"};
  }

  std::string truncated(const std::string& s) { return s.substr(0, 1 + pick(s.size() - 1)); }

  std::string insert(const std::string& s, const std::string& what) {
    const std::size_t at = pick(s.size() + 1);
    return s.substr(0, at) + what + s.substr(at);
  }

  abuse_line deep(const std::string& id) {
    if (pick(2)) {  // shallow enough to parse: a prompt that is not a list of token ids
      const std::size_t d = 2 + pick(18);
      return {"nested prompt", R"({"id":")" + id + R"(","prompt":)" + std::string(d, '[') + "1" + std::string(d, ']') + "}",
              json::value(id), "invalid_request"};
    }
    const bool objects = pick(2);
    const std::size_t d = 40 + pick(std::min<std::size_t>(20000, max_line_ / (objects ? 8 : 4)));
    std::string nest = objects ? "" : std::string(d, '[') + "0" + std::string(d, ']');
    if (objects) {
      for (std::size_t i = 0; i < d; ++i) nest += R"({"a":)";
      nest += "0" + std::string(d, '}');
    }
    return {"deep", R"({"id":")" + id + R"(","prompt":[1],"extra":)" + nest + "}", nullptr, "invalid_json"};
  }

  abuse_line huge_number(const std::string& id) {
    static const char* fields[] = {"temperature", "top_k", "top_p", "min_p", "seed", "logprobs", "priority",
                                   "presence_penalty", "frequency_penalty", "repetition_penalty"};
    static const char* values[] = {"1e308", "-1e308", "1e999", "-1e999", "18446744073709551615",
                                   "123456789012345678901234567890", "-9223372036854775809", "9223372036854775807"};
    std::string field = one_of(fields), value = one_of(values);
    if (field == std::string("seed") && value == std::string("9223372036854775807")) value = "-1";  // the largest seed is valid
    return {"huge " + field, R"({"id":")" + id + R"(","prompt":[1],")" + field + R"(":)" + value + "}", json::value(id),
            "invalid_request"};
  }

  abuse_line wrong_type(const std::string& id) {
    struct field_values {
      const char* field;
      std::vector<const char*> values;
    };
    static const std::vector<field_values> table = {
        {"max_tokens", {R"("16")", "[1]", R"({"a":1})", "true", "1.5"}},
        {"temperature", {R"("0.5")", "[0.5]", "{}", "false"}},
        {"top_k", {R"("5")", "2.5", "[]", "true"}},
        {"top_p", {R"("1")", "[]", "true"}},
        {"seed", {R"("1")", "0.5", "{}", "-3"}},
        {"logprobs", {"true", R"("2")", "-1", "21"}},
        {"priority", {"[0]", R"("0")", "0.25"}},
        {"stream", {"1", R"("true")", "[]", "{}"}},
        {"ignore_eos", {"0", R"("no")", "[]"}},
        {"prompt", {"5", "true", "{}", R"(["a","b"])", "[1.5]", "[-1]", R"("")", "[]", "[4294967296]"}},
        {"stop", {"5", "[1]", "{}", R"(["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])"}},
        {"logit_bias", {"[]", R"("x")", "5", "true"}},
        {"messages", {R"("hi")", "[]", "[1]", R"([{"role":1,"content":"x"}])", R"([{"content":"x"}])",
                      R"([{"role":"user","content":5}])", R"([{"role":"user","content":[{"type":"image","url":"x"}]}])"}},
    };
    const field_values& f = table[pick(table.size())];
    const std::string value = f.values[pick(f.values.size())];
    const bool messages = f.field == std::string("messages") || pick(4) == 0;
    std::string line = R"({"id":")" + id + "\"";
    if (f.field != std::string("prompt") && f.field != std::string("messages")) {
      line += messages ? R"(,"messages":[{"role":"user","content":"hi"}])" : R"(,"prompt":[1])";
    }
    line += ",\"" + std::string(f.field) + "\":" + value + "}";
    return {std::string("wrong type ") + f.field, line, json::value(id), "invalid_request"};
  }

  abuse_line bad_utf8(const std::string& id) {
    static const char* raw[] = {"\x80", "\xff", "\xc0\xaf", "\xed\xa0\x80", "\xe2\x82", "\xf4\x90\x80\x80", "\xfe\xfe"};
    static const char* escaped[] = {"\\ud800", "\\udfff", "\\ud800\\u0041", "\\udc00\\ud800"};
    static const char* where[] = {R"("prompt":"ab%c")", R"("prompt":[1],"stop":["%"])",
                                  R"("messages":[{"role":"user","content":"x%y"}])", R"("prompt":"x","user":"%")"};
    std::string tmpl = one_of(where);
    const std::string bad = pick(3) ? one_of(raw) : one_of(escaped);
    tmpl.replace(tmpl.find('%'), 1, bad);
    return {"bad utf-8", R"({"id":")" + id + "\"," + tmpl + "}", nullptr, "invalid_json"};
  }

  abuse_line bad_logit_bias(const std::string& id) {
    const std::string keys[] = {"-1", std::to_string(n_vocab_), std::to_string(n_vocab_ + 1 + std::int64_t(pick(1000))),
                                "2147483648", "99999999999999999999", "1.5", "1e3", " 1", "+1", "", "abc", "0x10", "1 "};
    static const char* values[] = {"100.5", "-101", "1e308", "-1e308", R"("5")", "true", "[1]", "{}", "1e999"};
    std::string entry;
    if (pick(2)) {
      entry = "\"" + keys[pick(std::size(keys))] + "\":" + std::to_string(int(pick(201)) - 100);
    } else {
      entry = "\"" + std::to_string(pick(std::size_t(n_vocab_))) + "\":" + one_of(values);
    }
    return {"bad logit_bias", R"({"id":")" + id + R"(","prompt":[1],"logit_bias":{)" + entry + "}}", json::value(id),
            "invalid_request"};
  }

  abuse_line bad_id() {
    static const char* ids[] = {"1.5", "[1]", R"({"a":1})", "true", "1e-3", "18446744073709551616"};
    std::string id = pick(4) ? one_of(ids) : "\"" + std::string(257 + pick(100), 'i') + "\"";
    if (pick(5) == 0) return {"no id", R"({"prompt":[1],"max_tokens":1})", nullptr, "invalid_request"};
    return {"bad id", R"({"id":)" + id + R"(,"prompt":[1],"max_tokens":1})", nullptr, "invalid_request"};
  }

  abuse_line bad_max_tokens(const std::string& id) {
    static const char* values[] = {"0", "-1", "-9223372036854775808", "-1e308", R"("16")", "1.5", "true", "[]"};
    return {"bad max_tokens", R"({"id":")" + id + R"(","prompt":[1],"max_tokens":)" + std::string(one_of(values)) + "}",
            json::value(id), "invalid_request"};
  }

  std::mt19937_64 rng_;
  std::size_t max_line_;
  std::int64_t n_vocab_;
};

TEST(LineAbuse, SeededHostileLinesGetTheirErrorsAndAWellBehavedClientIsUnaffected) {
  const std::uint64_t seed = abuse_seed();
  SCOPED_TRACE("ANVIL_ABUSE_SEED=" + std::to_string(seed));
  proto::line_server_options lopt;
  lopt.max_line_bytes = 64 * 1024;
  both_servers s(abuse_engine_config(), lopt);
  const std::int64_t n_vocab = s.eng->tokenizer().n_vocab();
  steady_client good(s.line_port(), s.http_port());

  line_abuser gen(seed, lopt.max_line_bytes, n_vocab);
  std::map<std::string, int> by_kind;
  int valid = 0;
  {
    line_client c(s.line_port());
    for (int i = 0; i < 600; ++i) {
      if (i % 25 == 24) {  // a valid request on the same connection, answered in full
        const std::string id = "v" + std::to_string(i);
        c.send_line(gen.valid_request(id));
        json::object last;
        do {
          last = c.read_json(60s);
          ASSERT_EQ(last.at("id"), json::value(id)) << json::serialize(last);
        } while (!last.contains("done") && !last.contains("error"));
        ASSERT_EQ(last.at("finish_reason"), "length") << json::serialize(last);
        ++valid;
        continue;
      }
      const abuse_line a = gen.next(i);
      ++by_kind[a.kind];
      c.send(a.bytes + "\n");
      const auto line = c.read_line(60s);
      ASSERT_TRUE(line) << a.kind << ": no answer to " << json::serialize(json::string(a.bytes.substr(0, 300)));
      json::error_code ec;
      const json::value v = json::parse(*line, ec);
      ASSERT_FALSE(ec) << *line;
      const json::object& o = v.as_object();
      ASSERT_TRUE(o.contains("error")) << a.kind << ": " << a.bytes.substr(0, 300) << " -> " << *line;
      EXPECT_EQ(o.at("id"), a.id) << a.kind << ": " << a.bytes.substr(0, 300) << " -> " << *line;
      EXPECT_EQ(o.at("error").at("code").as_string(), a.code) << a.kind << ": " << a.bytes.substr(0, 300) << " -> " << *line;
      EXPECT_FALSE(o.at("error").at("message").as_string().empty());
      if (::testing::Test::HasFailure()) break;
    }
  }
  expect_steady(good);
  EXPECT_GT(valid, 20);
  for (const auto& [kind, n] : by_kind) std::printf("  %-24s %d\n", kind.c_str(), n);
  const engine_stats st = s.settled();
  EXPECT_EQ(st.kv.counts.in_use, 0);
  EXPECT_EQ(st.live_requests, 0);
  EXPECT_EQ(st.kv.counts.free + st.kv.counts.cached + st.kv.counts.in_use, st.kv.counts.total);
  EXPECT_TRUE(s.no_connections());
}

}  // namespace

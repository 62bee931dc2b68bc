// UTF-8 helpers and NFC. NFC is checked on known cases and on 600 strings normalised by
// JavaScript's String.prototype.normalize (tests/data/tokenizer/nfc.jsonl).
#include <boost/json.hpp>

#include <fstream>

#include <gtest/gtest.h>

#include "model/tokenizer/unicode.h"
#include "model/tokenizer/unicode_nfc.h"
#include "tests/model/tokenizer_test_util.h"

namespace {

using anvil::model::to_nfc;
using anvil::model::utf8_sequence_length;
using anvil::model::utf8_stable_prefix;

TEST(Utf8, SequenceLengthAcceptsOnlyWellFormedSequences) {
  EXPECT_EQ(utf8_sequence_length("a", 0), 1u);
  EXPECT_EQ(utf8_sequence_length("\xC3\xA9", 0), 2u);
  EXPECT_EQ(utf8_sequence_length("\xE2\x82\xAC", 0), 3u);
  EXPECT_EQ(utf8_sequence_length("\xF0\x9F\x98\x80", 0), 4u);
  EXPECT_EQ(utf8_sequence_length("\x80", 0), 0u);              // stray continuation
  EXPECT_EQ(utf8_sequence_length("\xC0\x80", 0), 0u);          // overlong
  EXPECT_EQ(utf8_sequence_length("\xE0\x80\x80", 0), 0u);      // overlong
  EXPECT_EQ(utf8_sequence_length("\xED\xA0\x80", 0), 0u);      // surrogate U+D800
  EXPECT_EQ(utf8_sequence_length("\xF4\x90\x80\x80", 0), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8_sequence_length("\xE2\x82", 0), 0u);          // truncated
  EXPECT_EQ(utf8_sequence_length("\xC3"
                                 "A",
                                 0),
            0u);
}

TEST(Utf8, StablePrefixHoldsBackOnlyCompletableTails) {
  EXPECT_EQ(utf8_stable_prefix(""), 0u);
  EXPECT_EQ(utf8_stable_prefix("ab"), 2u);
  EXPECT_EQ(utf8_stable_prefix("a\xF0"), 1u);
  EXPECT_EQ(utf8_stable_prefix("a\xF0\x9F"), 1u);
  EXPECT_EQ(utf8_stable_prefix("a\xF0\x9F\x98"), 1u);
  EXPECT_EQ(utf8_stable_prefix("a\xF0\x9F\x98\x80"), 5u);
  EXPECT_EQ(utf8_stable_prefix("a\xE0\x80"), 3u);  // E0 80 can never become valid
  EXPECT_EQ(utf8_stable_prefix("a\xFF"), 2u);
  EXPECT_EQ(utf8_stable_prefix("\x80\x80\x80"), 3u);
  EXPECT_EQ(utf8_stable_prefix("\xC3\xA9\xC3"), 2u);
}

TEST(Nfc, ComposesReordersAndKeepsExclusions) {
  EXPECT_EQ(to_nfc("e\xCC\x81"), "\xC3\xA9");     // e + acute -> é
  EXPECT_EQ(to_nfc("\xE2\x84\xAB"), "\xC3\x85");  // U+212B ANGSTROM SIGN -> Å (singleton)
  EXPECT_EQ(to_nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo G A G -> 각
  EXPECT_EQ(to_nfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");    // dot below (220) before dot above (230)
  EXPECT_EQ(to_nfc("a\xCC\xA3\xCC\x82"), "\xE1\xBA\xAD");         // a + dot below + circumflex -> ậ
  EXPECT_EQ(to_nfc("\xE0\xA5\x98"), "\xE0\xA4\x95\xE0\xA4\xBC");  // U+0958 is excluded: stays decomposed
  EXPECT_EQ(to_nfc("\xCC\x81"
                   "e"),
            "\xCC\x81"
            "e");  // a leading mark composes with nothing
  EXPECT_EQ(to_nfc("plain ASCII"), "plain ASCII");
}

TEST(Nfc, InvalidBytesPassThroughAndBlockComposition) {
  EXPECT_EQ(to_nfc("e\xFF\xCC\x81"), "e\xFF\xCC\x81");
  EXPECT_EQ(to_nfc("\xC3\x28 e\xCC\x81"), "\xC3\x28 \xC3\xA9");
}

TEST(Nfc, MatchesJavaScriptNormalize) {
  const std::string path = anvil::model::test::data_path("tokenizer/nfc.jsonl");
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " is missing (written by tools/tokenizer/gen_goldens.mjs)";
  int n = 0;
  for (std::string line; std::getline(in, line); ++n) {
    const boost::json::object o = boost::json::parse(line).as_object();
    const std::string text(o.at("text").as_string());
    EXPECT_EQ(to_nfc(text), std::string(o.at("nfc").as_string())) << "line " << n + 1;
  }
  EXPECT_GE(n, 500);
}

}  // namespace

// incremental_decoder: streamed text is only ever whole UTF-8 characters, and the pushes plus
// flush() add up to decode() exactly, for both model types.
#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"
#include "tests/model/tokenizer_test_util.h"

namespace {

using anvil::model::incremental_decoder;
using anvil::model::tokenizer;
using anvil::model::tokenizer_spec;
using namespace anvil::model::test;
using ids_t = std::vector<std::int32_t>;

std::vector<std::string> push_all(const tokenizer& t, const ids_t& ids, bool skip_special) {
  incremental_decoder d(t, skip_special);
  std::vector<std::string> chunks;
  for (const std::int32_t id : ids) chunks.push_back(d.push(id));
  chunks.push_back(d.flush());
  return chunks;
}

std::string join(const std::vector<std::string>& chunks) {
  std::string out;
  for (const auto& c : chunks) out += c;
  return out;
}

const std::string grinning = "\xF0\x9F\x98\x80";  // U+1F600, four bytes

TEST(IncrementalDecoder, HoldsAFourByteEmojiUntilItsLastByteToken) {
  tokenizer_spec s = spm_spec();
  s.add_space_prefix = false;
  const tokenizer t(s);
  const ids_t ids = t.encode(grinning, false, false);
  ASSERT_EQ(ids, (ids_t{spm_byte(0xF0), spm_byte(0x9F), spm_byte(0x98), spm_byte(0x80)}));
  EXPECT_EQ(push_all(t, ids, true), (std::vector<std::string>{"", "", "", grinning, ""}));
}

TEST(IncrementalDecoder, ByteLevelTokensSplitAcrossACharacterToo) {
  const tokenizer t(byte_level_spec("qwen2"));
  const ids_t ids = t.encode("a" + grinning + "b", false, false);
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(push_all(t, ids, true), (std::vector<std::string>{"a", "", "", "", grinning, "b", ""}));
}

TEST(IncrementalDecoder, StripsTheSentencePiecePrefixLikeDecode) {
  tokenizer_spec s = spm_spec();
  const std::int32_t space = add_token(s, "\xE2\x96\x81", 1);
  const tokenizer t(s);
  const ids_t ids = t.encode(grinning + " x", false, false);
  EXPECT_EQ(ids.front(), space);
  EXPECT_EQ(join(push_all(t, ids, true)), t.decode(ids));
  EXPECT_EQ(t.decode(ids), grinning + " x");
  EXPECT_EQ(push_all(t, ids_t{space, space}, true), (std::vector<std::string>{"", " ", ""}));
}

TEST(IncrementalDecoder, InvalidBytesPassThroughAtOnceOrAtFlush) {
  const tokenizer t(spm_spec());
  // 0xFF can never start a character: out at once. A lone 0xF0 waits for more, then flush.
  EXPECT_EQ(push_all(t, ids_t{spm_byte(0xFF), spm_byte(0xF0)}, true),
            (std::vector<std::string>{"\xFF", "", "\xF0"}));
  // 0xE2 then 'A': the sequence is broken, so both go out with the 'A'.
  EXPECT_EQ(push_all(t, ids_t{spm_byte(0xE2), spm_byte('A')}, true), (std::vector<std::string>{"",
                                                                                               "\xE2"
                                                                                               "A",
                                                                                               ""}));
  // 0xE0 0x80 is an overlong form: never valid, never held.
  EXPECT_EQ(push_all(t, ids_t{spm_byte(0xE0), spm_byte(0x80)}, true),
            (std::vector<std::string>{"", "\xE0\x80", ""}));
}

TEST(IncrementalDecoder, SkipsControlTokensWhenAsked) {
  tokenizer_spec s = byte_level_spec("qwen2");
  const std::int32_t im_end = add_token(s, "<|im_end|>", 3);
  const std::int32_t think = add_token(s, "<think>", 4);
  const tokenizer t(s);
  const ids_t ids = {'h', 'i', think, im_end};
  EXPECT_EQ(join(push_all(t, ids, true)), "hi<think>");
  EXPECT_EQ(join(push_all(t, ids, false)), "hi<think><|im_end|>");
  EXPECT_EQ(join(push_all(t, ids, true)), t.decode(ids, true));
}

TEST(IncrementalDecoder, RandomIdStreamsNeverEmitHalfACharacter) {
  // Random byte tokens (mostly parts of multi-byte characters) and normal tokens.
  tokenizer_spec s = spm_spec();
  add_token(s, "\xE2\x96\x81", 1);
  add_token(s, "\xC3\xA9", 1);
  add_token(s, "<ctl>", 3);
  const tokenizer t(s);
  std::mt19937 rng(11);
  const std::vector<unsigned char> bytes = {0xF0, 0x9F, 0x98, 0x80, 0xE2, 0x82, 0xAC,
                                            0xC3, 0xA9, 'a',  ' ',  0xFF, 0xED, 0xA0};
  for (int round = 0; round < 2000; ++round) {
    ids_t ids;
    for (int i = std::uniform_int_distribution<int>(0, 12)(rng); i > 0; --i) {
      const int pick = std::uniform_int_distribution<int>(0, static_cast<int>(bytes.size()) + 2)(rng);
      ids.push_back(pick < static_cast<int>(bytes.size()) ? spm_byte(bytes[pick])
                                                          : 259 + (pick - static_cast<int>(bytes.size())));
    }
    for (const bool skip : {true, false}) {
      const std::vector<std::string> chunks = push_all(t, ids, skip);
      const std::string full = t.decode(ids, skip);
      ASSERT_EQ(join(chunks), full);
      // Every push must end where a character of the final text ends (an invalid byte counts
      // as a character of its own), never inside a well-formed sequence.
      std::vector<bool> boundary(full.size() + 1, false);
      boundary[0] = true;
      for (std::size_t pos = 0; pos < full.size();) {
        pos += std::max<std::size_t>(1, anvil::model::utf8_sequence_length(full, pos));
        boundary[pos] = true;
      }
      std::size_t emitted = 0;
      for (std::size_t i = 0; i + 1 < chunks.size(); ++i) {
        emitted += chunks[i].size();
        ASSERT_TRUE(boundary[emitted]) << "push " << i << " ended mid-character";
      }
    }
  }
}

}  // namespace

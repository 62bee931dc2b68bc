// SentencePiece-style tokenisation on a hand-built vocabulary: 0 <unk>, 1 <s>, 2 </s>, 3..258
// the byte tokens, then the pieces below. Every expected id sequence is derived in a comment.
#include <gtest/gtest.h>

#include "model/tokenizer/tokenizer.h"
#include "tests/model/tokenizer_test_util.h"

namespace {

using anvil::model::tokenizer;
using anvil::model::tokenizer_spec;
using namespace anvil::model::test;
using ids_t = std::vector<std::int32_t>;

struct hello_vocab {
  tokenizer_spec spec = spm_spec();
  std::int32_t space = add_token(spec, "\xE2\x96\x81", 1, -10);  // ▁
  std::int32_t h = add_token(spec, "h", 1, -10);
  std::int32_t e = add_token(spec, "e", 1, -10);
  std::int32_t l = add_token(spec, "l", 1, -10);
  std::int32_t o = add_token(spec, "o", 1, -10);
  std::int32_t sp_h = add_token(spec, "\xE2\x96\x81h", 1, -1);  // ▁h
  std::int32_t el = add_token(spec, "el", 1, -2);
  std::int32_t lo = add_token(spec, "lo", 1, -3);
  std::int32_t sp_hel = add_token(spec, "\xE2\x96\x81hel", 1, -4);  // ▁hel
  std::int32_t sp_hello = add_token(spec, "\xE2\x96\x81hello", 1, -5);
};

TEST(TokenizerSpm, MergesHighestScoreFirst) {
  // "▁hello": ▁h (-1) first, then el (-2) -> ▁h el l o, then lo (-3) -> ▁h el lo, then
  // ▁h+el = ▁hel (-4), then ▁hel+lo = ▁hello (-5).
  const hello_vocab v;
  const tokenizer t(v.spec);
  EXPECT_EQ(t.encode("hello", false, false), (ids_t{v.sp_hello}));
  // "▁hell": ▁h, el, then ▁hel; "l" is left over.
  EXPECT_EQ(t.encode("hell", false, false), (ids_t{v.sp_hel, v.l}));
}

TEST(TokenizerSpm, ScoresDecideBetweenOverlappingPairs) {
  tokenizer_spec s = spm_spec();
  s.add_space_prefix = false;
  const std::int32_t a = add_token(s, "a", 1, -10);
  add_token(s, "b", 1, -10);
  const std::int32_t c = add_token(s, "c", 1, -10);
  const std::int32_t ab = add_token(s, "ab", 1, -1);
  const std::int32_t bc = add_token(s, "bc", 1, -2);
  EXPECT_EQ(tokenizer(s).encode("abc", false, false), (ids_t{ab, c}));
  s.scores[bc] = 0;  // now "bc" wins
  EXPECT_EQ(tokenizer(s).encode("abc", false, false), (ids_t{a, bc}));
}

TEST(TokenizerSpm, EqualScoresMergeLeftmostFirst) {
  tokenizer_spec s = spm_spec();
  s.add_space_prefix = false;
  const std::int32_t a = add_token(s, "a", 1, -10);
  const std::int32_t aa = add_token(s, "aa", 1, -1);
  EXPECT_EQ(tokenizer(s).encode("aaa", false, false), (ids_t{aa, a}));
}

TEST(TokenizerSpm, SpacePrefixAndSpacesAsU2581) {
  hello_vocab v;
  EXPECT_EQ(tokenizer(v.spec).encode("hello hello", false, false), (ids_t{v.sp_hello, v.sp_hello}));
  // "  h": ▁▁▁h -> ▁ ▁ ▁h
  EXPECT_EQ(tokenizer(v.spec).encode("  h", false, false), (ids_t{v.space, v.space, v.sp_h}));
  v.spec.add_space_prefix = false;
  // "hello" without the prefix: el, lo; "ello" is no token -> h el lo
  EXPECT_EQ(tokenizer(v.spec).encode("hello", false, false), (ids_t{v.h, v.el, v.lo}));
}

TEST(TokenizerSpm, CharactersOutsideTheVocabularyFallBackToBytes) {
  const hello_vocab v;
  // "é" is not a token: its two UTF-8 bytes become <0xC3> <0xA9>.
  EXPECT_EQ(tokenizer(v.spec).encode("\xC3\xA9", false, false), (ids_t{v.space, spm_byte(0xC3), spm_byte(0xA9)}));
  // An invalid byte is a symbol of its own and falls back the same way.
  EXPECT_EQ(tokenizer(v.spec).encode("h\xFF", false, false), (ids_t{v.sp_h, spm_byte(0xFF)}));
}

TEST(TokenizerSpm, WithoutByteTokensACharacterBecomesOneUnknownToken) {
  tokenizer_spec s;
  s.model = "llama";
  s.tokens = {"<unk>", "\xE2\x96\x81", "a"};
  s.token_types = {2, 1, 1};
  s.unk_id = 0;
  EXPECT_EQ(tokenizer(s).encode("a\xF0\x9F\x98\x80", false, false), (ids_t{1, 2, 0}));
}

TEST(TokenizerSpm, SpecialTokensGetASpacePrefixAfterThem) {
  hello_vocab v;
  const std::int32_t tool = add_token(v.spec, "<tool>", 4);
  v.spec.add_bos = true;
  const tokenizer t(v.spec);
  EXPECT_EQ(t.encode("<s>hello", false, true), (ids_t{1, v.sp_hello}));
  EXPECT_EQ(t.encode("hello<tool>hello", false, false), (ids_t{v.sp_hello, tool, v.sp_hello}));
  EXPECT_EQ(t.encode("hello", true, false), (ids_t{1, v.sp_hello}));
  // Not parsed: "<s>" is text, and none of it is in the vocabulary.
  EXPECT_EQ(t.encode("<s>", false, false), (ids_t{v.space, spm_byte('<'), spm_byte('s'), spm_byte('>')}));
}

TEST(TokenizerSpm, DecodeRemovesTheSpacePrefixOnce) {
  hello_vocab v;
  const tokenizer t(v.spec);
  EXPECT_EQ(t.token_piece(v.sp_hello), " hello");
  EXPECT_EQ(t.token_piece(spm_byte('A')), "A");
  EXPECT_EQ(t.token_piece(1), "<s>");
  EXPECT_EQ(t.decode(ids_t{v.sp_hello, v.sp_hello}), "hello hello");
  EXPECT_EQ(t.decode(ids_t{v.space, v.space, v.sp_h}), "  h");
  EXPECT_EQ(t.decode(ids_t{1, v.sp_hello}), "<s> hello");
  EXPECT_EQ(t.decode(ids_t{1, v.sp_hello}, true), "hello");
  for (const char* text : {"hello", " hello", "  x y  ", "\xC3\xA9t\xC3\xA9", ""})
    EXPECT_EQ(t.decode(t.encode(text, false, false)), text) << text;
  v.spec.add_space_prefix = false;
  const tokenizer no_prefix(v.spec);
  EXPECT_EQ(no_prefix.decode(ids_t{v.sp_hello}), " hello");
}

TEST(TokenizerSpm, LongInputsStayLinear) {
  hello_vocab v;
  std::string text;
  for (int i = 0; i < 50000; ++i) text += "hello ";
  const tokenizer t(v.spec);
  const ids_t ids = t.encode(text, false, false);
  EXPECT_EQ(ids.size(), 50001u);  // 50000 x ▁hello, then the trailing ▁
  EXPECT_EQ(t.decode(ids), text);
}

}  // namespace

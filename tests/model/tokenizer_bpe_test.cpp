// Byte-level BPE on hand-built vocabularies (ids 0..255 are the bytes, so expected ids can be
// read off the text), and the pre-tokenizer regexes piece by piece.
#include <gtest/gtest.h>

#include "model/tokenizer/pretokenize.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/tokenizer_test_util.h"

namespace {

using anvil::model::pre_tokenizer;
using anvil::model::tokenizer;
using namespace anvil::model::test;
using ids_t = std::vector<std::int32_t>;
using pieces_t = std::vector<std::string_view>;

ids_t encode(const tokenizer& t, std::string_view text, bool parse_special = false) {
  return t.encode(text, false, parse_special);
}

TEST(TokenizerBpe, MergesLowestRankFirst) {
  const tokenizer bc_first(byte_level_spec("qwen2", {"ab", "bc"}, {"b c", "a b"}));
  EXPECT_EQ(encode(bc_first, "abc"), (ids_t{'a', 257}));
  const tokenizer ab_first(byte_level_spec("qwen2", {"ab", "bc"}, {"a b", "b c"}));
  EXPECT_EQ(encode(ab_first, "abc"), (ids_t{256, 'c'}));
}

TEST(TokenizerBpe, EqualRanksMergeLeftmostFirst) {
  const tokenizer t(byte_level_spec("qwen2", {"aa"}, {"a a"}));
  EXPECT_EQ(encode(t, "aaa"), (ids_t{256, 'a'}));
  EXPECT_EQ(encode(t, "aaaa"), (ids_t{256, 256}));
}

TEST(TokenizerBpe, MergedSymbolsMergeAgain) {
  const tokenizer t(byte_level_spec("qwen2", {"ab", "abab"}, {"a b", "ab ab"}));
  EXPECT_EQ(encode(t, "abab"), (ids_t{257}));
  EXPECT_EQ(encode(t, "ababab"), (ids_t{257, 256}));
}

TEST(TokenizerBpe, MergesNeverCrossPreTokenizerPieces) {
  const tokenizer t(byte_level_spec("qwen2", {"a1"}, {"a 1"}));
  EXPECT_EQ(encode(t, "a1"), (ids_t{'a', '1'}));  // letters and digits are separate pieces
}

TEST(TokenizerBpe, Llama3EmitsWholePiecesThatAreTokens) {
  // "abc" is a token no merge path reaches: llama-bpe (ignore_merges) still emits it whole.
  EXPECT_EQ(encode(tokenizer(byte_level_spec("llama-bpe", {"abc"})), "abc"), (ids_t{256}));
  EXPECT_EQ(encode(tokenizer(byte_level_spec("qwen2", {"abc"})), "abc"), (ids_t{'a', 'b', 'c'}));
}

TEST(TokenizerBpe, SpacesAndControlBytesUseTheByteLevelAlphabet) {
  const tokenizer t(byte_level_spec("qwen2", {"Ġa", "ĊĊ"}, {"Ġ a", "Ċ Ċ"}));
  EXPECT_EQ(encode(t, " a"), (ids_t{256}));
  EXPECT_EQ(encode(t, "\n\n"), (ids_t{257}));
  EXPECT_EQ(t.token_piece(256), " a");
  EXPECT_EQ(t.token_piece(257), "\n\n");
  EXPECT_EQ(t.token_piece(' '), " ");
  EXPECT_EQ(t.token_piece(0xFF), "\xFF");
  EXPECT_EQ(t.decode(ids_t{256, 257, 'b'}), " a\n\nb");
}

TEST(TokenizerBpe, ControlTokensOnlyWithParseSpecialUserDefinedAlways) {
  auto spec = byte_level_spec("qwen2");
  const std::int32_t a = add_token(spec, "<|a|>", 3);
  const std::int32_t ab = add_token(spec, "<|a|>b", 3);
  const std::int32_t think = add_token(spec, "<think>", 4);
  const tokenizer t(spec);
  EXPECT_EQ(encode(t, "<|a|>b<|a|>c", true), (ids_t{ab, a, 'c'}));  // leftmost-longest
  EXPECT_EQ(encode(t, "<|a|>", false), (ids_t{'<', '|', 'a', '|', '>'}));
  EXPECT_EQ(encode(t, "x<think>y", false), (ids_t{'x', think, 'y'}));
  EXPECT_EQ(encode(t, "x<think>y", true), (ids_t{'x', think, 'y'}));
  EXPECT_EQ(encode(t, "<think", true), (ids_t{'<', 't', 'h', 'i', 'n', 'k'}));
  EXPECT_EQ(t.decode(ids_t{ab, 'x', think}), "<|a|>bx<think>");
  EXPECT_EQ(t.decode(ids_t{ab, 'x', think}, true), "x<think>");  // skip_special drops control only
}

TEST(TokenizerBpe, Qwen2NormalisesToNfcLlama3DoesNot) {
  const tokenizer qwen(byte_level_spec("qwen2"));
  const tokenizer llama(byte_level_spec("llama-bpe"));
  EXPECT_EQ(encode(qwen, "e\xCC\x81"), encode(qwen, "\xC3\xA9"));  // e + U+0301 -> é
  EXPECT_EQ(encode(qwen, "\xC3\xA9"), (ids_t{0xC3, 0xA9}));
  EXPECT_EQ(encode(llama, "e\xCC\x81"), (ids_t{'e', 0xCC, 0x81}));
}

TEST(TokenizerBpe, InvalidUtf8RoundTripsAsBytes) {
  for (const char* pre : {"qwen2", "llama-bpe", "default"}) {
    const tokenizer t(byte_level_spec(pre));
    const std::string text = "ab\xFF\xFE c\xC3 \xE2\x82 \xF0\x9F\x98";
    EXPECT_EQ(t.decode(encode(t, text)), text) << pre;
  }
}

TEST(TokenizerBpe, LongInputsStayLinear) {
  const tokenizer t(byte_level_spec("llama-bpe", {"aa", "ĠĠ"}, {"a a", "Ġ Ġ"}));
  const std::string spaces(200000, ' ');
  const std::string letters(200000, 'a');
  EXPECT_EQ(t.decode(encode(t, spaces + "x")), spaces + "x");
  EXPECT_EQ(encode(t, letters).size(), 100000u);
}

pieces_t split(std::string_view pre, std::string_view text) { return pre_tokenizer(pre).split(text); }

TEST(PreTokenizer, DigitRunsDifferBetweenLlama3Qwen2AndGpt2) {
  EXPECT_EQ(split("llama-bpe", "12345"), (pieces_t{"123", "45"}));
  EXPECT_EQ(split("qwen2", "12345"), (pieces_t{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split("default", "a 12345"), (pieces_t{"a", " 12345"}));
  EXPECT_EQ(split("qwen2", "x²½٣"), (pieces_t{"x", "²", "½", "٣"}));  // \p{N} covers No and Nd
}

TEST(PreTokenizer, Qwen35KeepsCombiningMarksWithTheirLetters) {
  // "नमस्ते": the virama (U+094D) and the vowel sign (U+0947) are marks (\p{M}), not letters.
  const std::string namaste = "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";
  EXPECT_EQ(split("qwen35", namaste), (pieces_t{namaste}));
  EXPECT_EQ(split("qwen2", namaste), (pieces_t{namaste.substr(0, 9), namaste.substr(9, 6), namaste.substr(15)}));
  // A decomposed "é" (e + U+0301) stays in its word, and the mark leaves the punctuation run.
  EXPECT_EQ(split("qwen35", "cafe\xCC\x81!"), (pieces_t{"cafe\xCC\x81", "!"}));
  EXPECT_EQ(split("qwen2", "cafe\xCC\x81!"), (pieces_t{"cafe", "\xCC\x81!"}));
  EXPECT_EQ(split("qwen35", "12345"), (pieces_t{"1", "2", "3", "4", "5"}));  // single digits, as qwen2
}

TEST(PreTokenizer, ContractionsMatchInAnyCase) {
  EXPECT_EQ(split("llama-bpe", "I'M you'Re it's WE'LL"),
            (pieces_t{"I", "'M", " you", "'Re", " it", "'s", " WE", "'LL"}));
  EXPECT_EQ(split("qwen2", "don\xE2\x80\x99t"),
            (pieces_t{"don", "\xE2\x80\x99t"}));                  // U+2019 is not an apostrophe
  EXPECT_EQ(split("default", "I'M"), (pieces_t{"I", "'", "M"}));  // GPT-2's contractions are lower-case only
}

TEST(PreTokenizer, WhitespaceRunsLeaveOneSpaceForTheNextWord) {
  EXPECT_EQ(split("llama-bpe", "a  b"), (pieces_t{"a", " ", " b"}));
  EXPECT_EQ(split("llama-bpe", "a \n\nb"), (pieces_t{"a", " \n\n", "b"}));
  EXPECT_EQ(split("llama-bpe", "x   "), (pieces_t{"x", "   "}));
  EXPECT_EQ(split("qwen2", "hi!!!\n\nok"), (pieces_t{"hi", "!!!\n\n", "ok"}));
  EXPECT_EQ(split("qwen2", "\t\tx"), (pieces_t{"\t", "\tx"}));
}

TEST(PreTokenizer, WhitespaceIsUnicodeWhiteSpaceIncludingNel) {
  // U+0085 (NEL) is White_Space, as in HF tokenizers and tiktoken, though PCRE2's \s omits it.
  EXPECT_EQ(split("qwen2",
                  "a\xC2\x85\xC2\x85"
                  "b"),
            (pieces_t{"a", "\xC2\x85",
                      "\xC2\x85"
                      "b"}));
  EXPECT_EQ(split("qwen2",
                  "a\xE3\x80\x80\xE3\x80\x80"
                  "b"),
            (pieces_t{"a", "\xE3\x80\x80",
                      "\xE3\x80\x80"
                      "b"}));
}

TEST(PreTokenizer, InvalidBytesBecomePiecesOfTheirOwn) {
  EXPECT_EQ(split("qwen2",
                  "a\xFF"
                  "b"),
            (pieces_t{"a", "\xFF", "b"}));
  const std::string messy = "x\x80\xC3(\xED\xA0\x80 yz\xF4\x90\x80\x80!\xC3";
  std::string joined;
  for (auto p : split("llama-bpe", messy)) joined += p;
  EXPECT_EQ(joined, messy);
}

}  // namespace

// gpt-oss on hand-built vocabularies: the gpt-4o (o200k) pre-tokenizer and its aliases, harmony's
// special tokens in text, and harmony's end of generation, a rule on the tokens the vocabulary
// has (not on the pre-tokenizer or a model name). The expected splits are what transformers.js
// gives with the regex of gpt-oss's tokenizer.json; the real vocabulary is covered by the goldens.
#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/model_error.h"
#include "model/tokenizer/pretokenize.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/tokenizer_test_util.h"

namespace {

using anvil::model::model_error;
using anvil::model::pre_tokenizer;
using anvil::model::tokenizer;
using anvil::model::tokenizer_spec;
using anvil::model::test::add_token;
using anvil::model::test::byte_level_spec;
using ids_t = std::vector<std::int32_t>;
using pieces_t = std::vector<std::string_view>;

pieces_t split(std::string_view pre, std::string_view text) { return pre_tokenizer(pre).split(text); }

TEST(PreTokenizerGpt4o, SplitsWordsBeforeAnUpperCaseLetterThatFollowsLowerCase) {
  EXPECT_EQ(split("gpt-4o", "camelCase HTTPServer iPhone"),
            (pieces_t{"camel", "Case", " HTTPServer", " i", "Phone"}));
  EXPECT_EQ(split("gpt-4o", "XMLHttpRequest"), (pieces_t{"XMLHttp", "Request"}));
}

TEST(PreTokenizerGpt4o, KeepsContractionsOnTheirWordInAnyCase) {
  EXPECT_EQ(split("gpt-4o", "Don't WE'LL it'S"), (pieces_t{"Don't", " WE'LL", " it'S"}));
  EXPECT_EQ(split("gpt-4o", "ABC'S abc'd"), (pieces_t{"ABC'S", " abc'd"}));
  EXPECT_EQ(split("gpt-4o", "don\xE2\x80\x99t"), (pieces_t{"don", "\xE2\x80\x99t"}));  // U+2019 is no apostrophe
}

TEST(PreTokenizerGpt4o, CountsTitlecaseModifierOtherLettersAndMarksAsEitherCase) {
  EXPECT_EQ(split("gpt-4o", "\xC7\x85mal \xCA\xB0i"), (pieces_t{"\xC7\x85mal", " \xCA\xB0i"}));  // ǅ (Lt), ʰ (Lm)
  EXPECT_EQ(split("gpt-4o", "e\xCC\x81" "E\xCC\x81x"), (pieces_t{"e\xCC\x81", "E\xCC\x81x"}));   // U+0301 (Mn)
  EXPECT_EQ(split("gpt-4o", "\xE6\x97\xA5\xE6\x9C\xAC" "abc"), (pieces_t{"\xE6\x97\xA5\xE6\x9C\xAC" "abc"}));
}

TEST(PreTokenizerGpt4o, DigitsInThreesAndPunctuationTakesSlashesAndNewlines) {
  EXPECT_EQ(split("gpt-4o", "1234567"), (pieces_t{"123", "456", "7"}));
  EXPECT_EQ(split("gpt-4o", "a/b"), (pieces_t{"a", "/b"}));
  EXPECT_EQ(split("gpt-4o", "x !/\n/y"), (pieces_t{"x", " !/\n/", "y"}));
  EXPECT_EQ(split("gpt-4o", "hi!!!\n\nok"), (pieces_t{"hi", "!!!\n\n", "ok"}));
  EXPECT_EQ(split("llama-bpe", "x !/\n/y"), (pieces_t{"x", " !/\n", "/y"}));  // Llama 3's stops at the newline
}

TEST(PreTokenizerGpt4o, WhitespaceRunsLeaveOneSpaceForTheNextWord) {
  EXPECT_EQ(split("gpt-4o", "a  b"), (pieces_t{"a", " ", " b"}));
  EXPECT_EQ(split("gpt-4o", "x   "), (pieces_t{"x", "   "}));
  EXPECT_EQ(split("gpt-4o", "a\xC2\x85\xC2\x85" "b"), (pieces_t{"a", "\xC2\x85", "\xC2\x85" "b"}));  // NEL
}

TEST(PreTokenizerGpt4o, LlamaCppAliasesNameTheSameRegex) {
  const std::string_view text = "camelCase DON'T 12345 a/b\n\n  x\xC7\x85y";
  for (const char* alias : {"llama4", "kanana2", "talkie"})
    EXPECT_EQ(split(alias, text), split("gpt-4o", text)) << alias;
  try {
    pre_tokenizer bad("gpt-5");
    ADD_FAILURE() << "an unknown pre-tokenizer was accepted";
  } catch (const model_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("gpt-4o (llama4, kanana2, talkie)"));
  }
}

TEST(PreTokenizerGpt4o, LongInputsStayLinear) {
  const tokenizer t(byte_level_spec("gpt-4o"));
  std::string mixed;
  for (int i = 0; i < 100000; ++i) mixed += "aA";
  for (const std::string& text : {std::string(200000, 'A'), mixed, std::string(200000, ' ') + "x",
                                  std::string(200000, '7'), std::string(200000, '/')}) {
    EXPECT_EQ(t.decode(t.encode(text, false, false)), text);
  }
}

// A byte-level vocabulary (ids 0..255 are the bytes) with harmony's control tokens after them.
struct harmony_vocab {
  tokenizer_spec spec = byte_level_spec("gpt-4o");
  std::int32_t endoftext = add_token(spec, "<|endoftext|>", 3);
  std::int32_t ret = add_token(spec, "<|return|>", 3);
  std::int32_t constrain = add_token(spec, "<|constrain|>", 3);
  std::int32_t channel = add_token(spec, "<|channel|>", 3);
  std::int32_t start = add_token(spec, "<|start|>", 3);
  std::int32_t end = add_token(spec, "<|end|>", 3);
  std::int32_t message = add_token(spec, "<|message|>", 3);
  std::int32_t call = add_token(spec, "<|call|>", 3);
};

ids_t bytes(std::string_view s) { return ids_t(s.begin(), s.end()); }

ids_t join(std::initializer_list<ids_t> parts) {
  ids_t out;
  for (const ids_t& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(HarmonyTokens, AreRecognisedInTextOnlyWithParseSpecial) {
  const harmony_vocab v;
  const tokenizer t(v.spec);
  const std::string turn =
      "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>";
  const ids_t want = join({{v.start}, bytes("assistant"), {v.channel}, bytes("commentary to=functions.f "),
                           {v.constrain}, bytes("json"), {v.message}, bytes("{}"), {v.call}});
  EXPECT_EQ(t.encode(turn, false, true), want);
  EXPECT_EQ(t.encode(turn, false, false), bytes(turn));
  EXPECT_EQ(t.encode("<|start|>user<|message|>hi<|end|>", false, true),
            join({{v.start}, bytes("user"), {v.message}, bytes("hi"), {v.end}}));
  EXPECT_EQ(t.decode(want), turn);
  EXPECT_EQ(t.decode(want, true), "assistantcommentary to=functions.f json{}");
}

TEST(HarmonyEndOfGeneration, ReturnAndCallEndGenerationEndDoesNot) {
  harmony_vocab v;
  v.spec.eos_id = v.ret;
  v.spec.eot_id = v.end;  // even when named end-of-turn, as some converters do
  const tokenizer t(v.spec);
  EXPECT_TRUE(t.is_eog(v.ret));
  EXPECT_TRUE(t.is_eog(v.call));
  EXPECT_FALSE(t.is_eog(v.end));
  EXPECT_FALSE(t.is_eog(v.start));
  EXPECT_FALSE(t.is_eog(v.message));
  EXPECT_FALSE(t.is_eog(v.endoftext));  // named by neither eos nor eot here
  EXPECT_FALSE(t.is_eog('a'));
}

TEST(HarmonyEndOfGeneration, ReturnAndCallEndGenerationWhateverEosIs) {
  harmony_vocab v;
  v.spec.eos_id = v.endoftext;  // older gpt-oss GGUF files name <|endoftext|>
  EXPECT_TRUE(tokenizer(v.spec).is_eog(v.endoftext));
  EXPECT_TRUE(tokenizer(v.spec).is_eog(v.ret));
  EXPECT_TRUE(tokenizer(v.spec).is_eog(v.call));
  v.spec.eos_id = v.end;  // named eos, <|end|> still does not end a harmony reply
  EXPECT_FALSE(tokenizer(v.spec).is_eog(v.end));
  EXPECT_TRUE(tokenizer(v.spec).is_eog(v.ret));
}

TEST(HarmonyEndOfGeneration, IsARuleOnTheVocabularyNotThePreTokenizer) {
  harmony_vocab v;
  v.spec.pre = "qwen2";
  v.spec.eot_id = v.end;
  const tokenizer t(v.spec);
  EXPECT_TRUE(t.is_eog(v.ret));
  EXPECT_TRUE(t.is_eog(v.call));
  EXPECT_FALSE(t.is_eog(v.end));
}

TEST(HarmonyEndOfGeneration, NeedsBothReturnAndCall) {
  tokenizer_spec phi = byte_level_spec("gpt-4o");  // <|end|> is Phi-3's end of turn
  phi.eot_id = add_token(phi, "<|end|>", 3);
  const std::int32_t ret = add_token(phi, "<|return|>", 3);
  EXPECT_TRUE(tokenizer(phi).is_eog(phi.eot_id));
  EXPECT_FALSE(tokenizer(phi).is_eog(ret));  // no <|call|>: not harmony, and not named eos/eot
  const std::int32_t call = add_token(phi, "<|call|>", 3);
  EXPECT_FALSE(tokenizer(phi).is_eog(phi.eot_id));
  EXPECT_TRUE(tokenizer(phi).is_eog(ret));
  EXPECT_TRUE(tokenizer(phi).is_eog(call));
}

}  // namespace

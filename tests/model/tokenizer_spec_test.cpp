// Spec validation: a GGUF file is untrusted input, so every malformed spec must be refused with
// a model_error that names the problem. Also the small accessors and BOS/EOS placement.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/model_error.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/tokenizer_test_util.h"

namespace {

using anvil::model::model_error;
using anvil::model::tokenizer;
using anvil::model::tokenizer_spec;
using namespace anvil::model::test;
using ::testing::HasSubstr;

// The message of the model_error that constructing a tokenizer from spec throws ("" if none).
std::string rejection(const tokenizer_spec& spec) {
  try {
    tokenizer t(spec);
  } catch (const model_error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerSpec, AcceptsValidSpecs) {
  EXPECT_EQ(rejection(byte_level_spec("llama-bpe")), "");
  EXPECT_EQ(rejection(byte_level_spec("qwen2")), "");
  EXPECT_EQ(rejection(byte_level_spec("default")), "");
  EXPECT_EQ(rejection(spm_spec()), "");
}

TEST(TokenizerSpec, RejectsUnknownModel) {
  tokenizer_spec s = byte_level_spec("qwen2");
  s.model = "bert";
  EXPECT_THAT(rejection(s), HasSubstr("unknown tokenizer model 'bert'"));
}

TEST(TokenizerSpec, RejectsUnknownPreTokenizer) {
  EXPECT_THAT(rejection(byte_level_spec("falcon")), HasSubstr("unknown pre-tokenizer 'falcon'"));
  tokenizer_spec s = spm_spec();
  s.pre = "qwen2";
  EXPECT_THAT(rejection(s), HasSubstr("pre-tokenizer 'qwen2'"));
}

TEST(TokenizerSpec, RejectsEmptyVocabulary) {
  tokenizer_spec s;
  s.model = "gpt2";
  s.pre = "qwen2";
  EXPECT_THAT(rejection(s), HasSubstr("empty vocabulary"));
}

TEST(TokenizerSpec, RejectsArraysOfMismatchedLength) {
  tokenizer_spec s = spm_spec();
  s.scores.pop_back();
  EXPECT_THAT(rejection(s), HasSubstr("tokenizer.ggml.scores has 258 entries but tokenizer.ggml.tokens has 259"));
  s = spm_spec();
  s.token_types.push_back(1);
  EXPECT_THAT(rejection(s), HasSubstr("tokenizer.ggml.token_type has 260 entries"));
}

TEST(TokenizerSpec, RejectsTokenTypesOutsideTheGgufRange) {
  tokenizer_spec s = byte_level_spec("qwen2");
  s.token_types[65] = 7;
  EXPECT_THAT(rejection(s), HasSubstr("token 65 'A' has token_type 7"));
  s.token_types[65] = 0;
  EXPECT_THAT(rejection(s), HasSubstr("has token_type 0"));
}

TEST(TokenizerSpec, RejectsMalformedByteTokens) {
  for (const char* bad : {"<0x-1>", "<0x1G>", "<0x1>", "<0x100>", "0x41", "<0X41>"}) {
    tokenizer_spec s = spm_spec();
    add_token(s, bad, 6);
    EXPECT_THAT(rejection(s), HasSubstr("'" + std::string(bad) + "' has type byte but is not of the form <0xHH>"))
        << bad;
  }
}

TEST(TokenizerSpec, RejectsMergesNamingUnknownTokens) {
  EXPECT_THAT(rejection(byte_level_spec("qwen2", {"ab"}, {"a zz"})),
              HasSubstr("merge 0 'a zz' does not name two tokens"));
  EXPECT_THAT(rejection(byte_level_spec("qwen2", {"ab"}, {"ab"})),
              HasSubstr("merge 0 'ab' does not name two tokens"));
  EXPECT_THAT(rejection(byte_level_spec("qwen2", {"ab"}, {"a b", "b c"})),
              HasSubstr("merge 1 'b c' produces 'bc', which is not in the vocabulary"));
}

TEST(TokenizerSpec, RejectsSpecialIdsOutsideTheVocabulary) {
  tokenizer_spec s = byte_level_spec("qwen2");
  s.bos_id = 256;
  EXPECT_THAT(rejection(s), HasSubstr("bos_token_id 256 is out of range (vocabulary has 256 tokens)"));
  s = byte_level_spec("qwen2");
  s.eos_id = -2;
  EXPECT_THAT(rejection(s), HasSubstr("eos_token_id -2 is out of range"));
  for (auto field :
       {&tokenizer_spec::unk_id, &tokenizer_spec::pad_id, &tokenizer_spec::eot_id, &tokenizer_spec::eom_id}) {
    s = byte_level_spec("qwen2");
    s.*field = 1000;
    EXPECT_THAT(rejection(s), HasSubstr("1000 is out of range"));
  }
}

TEST(TokenizerSpec, RejectsAddBosOrEosWithoutTheToken) {
  tokenizer_spec s = byte_level_spec("llama-bpe");
  s.add_bos = true;
  EXPECT_THAT(rejection(s), HasSubstr("add_bos_token is set but there is no bos_token_id"));
  s = byte_level_spec("llama-bpe");
  s.add_eos = true;
  EXPECT_THAT(rejection(s), HasSubstr("add_eos_token is set but there is no eos_token_id"));
}

TEST(TokenizerSpec, RejectsByteLevelVocabularyMissingAByte) {
  tokenizer_spec s = byte_level_spec("qwen2");
  s.tokens[10] = "not-a-byte";
  EXPECT_THAT(rejection(s), HasSubstr("has no normal token 'Ċ' for byte 10"));
}

TEST(TokenizerSpec, RejectsSentencePieceWithoutByteFallbackOrUnknownToken) {
  tokenizer_spec s = spm_spec();
  s.unk_id = -1;
  s.token_types[spm_byte(0x41)] = 1;  // <0x41> no longer a byte token
  EXPECT_THAT(rejection(s), HasSubstr("byte 65 has no token and there is no unknown token"));
}

TEST(TokenizerSpec, EmptyScoresAndTypesMeanZeroAndNormal) {
  tokenizer_spec s = byte_level_spec("qwen2", {"ab"}, {"a b"});
  s.token_types.clear();
  const tokenizer t(s);
  EXPECT_EQ(t.encode("ab", false, false), (std::vector<std::int32_t>{256}));
}

TEST(TokenizerSpec, AddsBosAndEosOnlyWithAddSpecial) {
  tokenizer_spec s = byte_level_spec("llama-bpe");
  const std::int32_t bos = add_token(s, "<|begin_of_text|>", 3);
  const std::int32_t eos = add_token(s, "<|end_of_text|>", 3);
  s.bos_id = bos;
  s.eos_id = eos;
  s.add_bos = true;
  const tokenizer with_bos(s);
  EXPECT_EQ(with_bos.encode("A", true, false), (std::vector<std::int32_t>{bos, 'A'}));
  EXPECT_EQ(with_bos.encode("A", false, false), (std::vector<std::int32_t>{'A'}));
  EXPECT_EQ(with_bos.encode("", true, false), (std::vector<std::int32_t>{bos}));
  s.add_eos = true;
  EXPECT_EQ(tokenizer(s).encode("A", true, false), (std::vector<std::int32_t>{bos, 'A', eos}));
  s.add_bos = false;
  EXPECT_EQ(tokenizer(s).encode("A", true, false), (std::vector<std::int32_t>{'A', eos}));
}

TEST(TokenizerSpec, EndOfGenerationIsEosEotAndEom) {
  tokenizer_spec s = byte_level_spec("llama-bpe");
  s.bos_id = add_token(s, "<|begin_of_text|>", 3);
  s.eos_id = add_token(s, "<|end_of_text|>", 3);
  s.eot_id = add_token(s, "<|eot_id|>", 3);
  s.eom_id = add_token(s, "<|eom_id|>", 3);
  const std::int32_t user = add_token(s, "<think>", 4);
  const tokenizer t(s);
  EXPECT_EQ(t.n_vocab(), 261);
  EXPECT_EQ(t.bos(), 256);
  EXPECT_EQ(t.eos(), 257);
  EXPECT_FALSE(t.is_eog(t.bos()));
  EXPECT_TRUE(t.is_eog(257));
  EXPECT_TRUE(t.is_eog(258));
  EXPECT_TRUE(t.is_eog(259));
  EXPECT_FALSE(t.is_eog(user));
  EXPECT_FALSE(t.is_eog(-1));
  EXPECT_TRUE(t.is_control(256));
  EXPECT_FALSE(t.is_control(user));
  EXPECT_FALSE(t.is_control('A'));
  EXPECT_FALSE(t.is_control(100000));
  EXPECT_EQ(t.spec().tokens[user], "<think>");
}

// A file that names no eot: llama.cpp's names, in its order, the first that is not eos.
TEST(TokenizerSpec, EndTokensAreFoundByNameWhereTheFileNamesNone) {
  tokenizer_spec gemma = byte_level_spec("default");
  gemma.eos_id = add_token(gemma, "<eos>", 3);
  const std::int32_t end_of_turn = add_token(gemma, "<end_of_turn>", 3);
  name_end_tokens(gemma);
  EXPECT_EQ(gemma.eot_id, end_of_turn);
  EXPECT_EQ(gemma.eom_id, -1);
  tokenizer_spec qwen = byte_level_spec("qwen2");
  const std::int32_t endoftext = add_token(qwen, "<|endoftext|>", 3);
  qwen.eos_id = add_token(qwen, "<|im_end|>", 3);  // eos is passed over
  name_end_tokens(qwen);
  EXPECT_EQ(qwen.eot_id, endoftext);
  tokenizer_spec llama = byte_level_spec("llama-bpe");
  llama.eos_id = add_token(llama, "<|end_of_text|>", 3);
  const std::int32_t eot = add_token(llama, "<|eot_id|>", 3), eom = add_token(llama, "<|eom_id|>", 3);
  tokenizer_spec named = llama;
  name_end_tokens(llama);
  EXPECT_EQ(llama.eot_id, eot);
  EXPECT_EQ(llama.eom_id, eom);
  named.eot_id = llama.eos_id + 100;  // what a file names stays
  named.eom_id = -1;
  name_end_tokens(named);
  EXPECT_EQ(named.eot_id, llama.eos_id + 100);
  EXPECT_EQ(named.eom_id, eom);
}

TEST(TokenizerSpec, NoEndOfGenerationTokenWhenNoneIsSet) {
  const tokenizer t(byte_level_spec("qwen2"));
  EXPECT_EQ(t.eos(), -1);
  EXPECT_FALSE(t.is_eog(-1));
  EXPECT_FALSE(t.is_eog(0));
}

TEST(TokenizerSpec, BadIdsInDecodeThrowOutOfRange) {
  const tokenizer t(byte_level_spec("qwen2"));
  const std::vector<std::int32_t> ids = {65, 256};
  EXPECT_THROW(t.decode(ids), std::out_of_range);
  EXPECT_THROW(t.token_piece(-1), std::out_of_range);
}

}  // namespace

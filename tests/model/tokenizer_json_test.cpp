// tokenizer.json / tokenizer_config.json import on small hand-written files: what becomes which
// token type, both merge serialisations, pipeline recognition, special ids, chat templates, and
// the errors for files that cannot be converted. (The real files are covered by the golden test.)
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "model/model_error.h"
#include "model/tokenizer/tokenizer_json.h"
#include "tests/model/tokenizer_test_util.h"

namespace {

using anvil::model::chat_template_from_hf_config;
using anvil::model::model_error;
using anvil::model::spec_from_hf_json;
using anvil::model::tokenizer_spec;
using ::testing::HasSubstr;

class TokenizerJson : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "anvil_tokenizer_json_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << content;
    return path;
  }

  std::string rejection(const std::string& json, const std::string& config = "") {
    try {
      spec_from_hf_json(write("tokenizer.json", json),
                        config.empty() ? "" : write("tokenizer_config.json", config));
    } catch (const model_error& e) {
      return e.what();
    }
    return "";
  }

  std::filesystem::path dir_;
};

const std::string qwen2_pre =
    R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )"
    R"("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},)"
    R"( "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})";

std::string byte_level_json(const std::string& merges) {
  return R"({"normalizer": {"type": "NFC"}, )" + qwen2_pre + R"(, "post_processor": null,
    "added_tokens": [{"id": 5, "content": "<|im_end|>", "special": true},
                     {"id": 6, "content": "<think>", "special": false},
                     {"id": 7, "content": "<|fim_prefix|>", "special": false}],
    "model": {"type": "BPE", "byte_fallback": false, "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3}, "merges": )" +
         merges + "}}";
}

TEST_F(TokenizerJson, ByteLevelFileBecomesGpt2WithTypedAddedTokens) {
  const tokenizer_spec s = spec_from_hf_json(write("tokenizer.json", byte_level_json(R"(["a b"])")), "");
  EXPECT_EQ(s.model, "gpt2");
  EXPECT_EQ(s.pre, "qwen2");
  EXPECT_EQ(s.tokens,
            (std::vector<std::string>{"a", "b", "ab", "Ġ", "[PAD4]", "<|im_end|>", "<think>", "<|fim_prefix|>"}));
  EXPECT_EQ(s.token_types, (std::vector<std::int32_t>{1, 1, 1, 1, 5, 3, 4, 3}));
  EXPECT_EQ(s.merges, (std::vector<std::string>{"a b"}));
  EXPECT_TRUE(s.scores.empty());
  EXPECT_EQ(s.eot_id, 5);  // found by name: <|im_end|>
  EXPECT_FALSE(s.add_bos);
}

TEST_F(TokenizerJson, MergePairsAndMergeStringsGiveTheSameSpec) {
  const tokenizer_spec strings = spec_from_hf_json(write("a.json", byte_level_json(R"(["a b", "ab Ġ"])")), "");
  const tokenizer_spec pairs =
      spec_from_hf_json(write("b.json", byte_level_json(R"([["a", "b"], ["ab", "Ġ"]])")), "");
  EXPECT_EQ(strings.merges, pairs.merges);
  EXPECT_THAT(rejection(byte_level_json(R"([["a"]])")), HasSubstr("model.merges[0] is neither"));
}

TEST_F(TokenizerJson, RecognisesTheLlama3Regex) {
  std::string json = byte_level_json("[]");
  json.replace(json.find("\\\\p{N}|"), 7, "\\\\p{N}{1,3}|");
  json.replace(json.find(R"("normalizer": {"type": "NFC"})"), 29, R"("normalizer": null)");
  EXPECT_EQ(spec_from_hf_json(write("tokenizer.json", json), "").pre, "llama-bpe");
}

TEST_F(TokenizerJson, RecognisesTheQwen35RegexWithItsNfc) {
  std::string json = byte_level_json("[]");
  const auto swap = [&json](const std::string& from, const std::string& to) { json.replace(json.find(from), from.size(), to); };
  swap(R"(\\p{L}+|)", R"([\\p{L}\\p{M}]+|)");
  swap(R"([^\\s\\p{L}\\p{N}])", R"([^\\s\\p{L}\\p{M}\\p{N}])");
  EXPECT_EQ(spec_from_hf_json(write("tokenizer.json", json), "").pre, "qwen35");
}

TEST_F(TokenizerJson, RefusesPipelinesItCannotReproduce) {
  std::string json = byte_level_json("[]");
  json.replace(json.find("\\\\p{N}|"), 7, "\\\\p{N}+|");
  EXPECT_THAT(rejection(json), HasSubstr("pre_tokenizer regex is not one this runtime knows"));
  json = byte_level_json("[]");
  json.replace(json.find("NFC"), 3, "NFKC");
  EXPECT_THAT(rejection(json), HasSubstr("normalizer 'NFKC' is not supported"));
  json = byte_level_json("[]");
  json.replace(json.find(R"("type": "BPE")"), 13, R"("type": "Unigram")");
  EXPECT_THAT(rejection(json), HasSubstr("model type 'Unigram' is not supported"));
  EXPECT_THAT(rejection(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})"),
              HasSubstr("neither byte-level BPE nor"));
  EXPECT_THAT(rejection("{not json"), HasSubstr("not valid JSON"));
}

TEST_F(TokenizerJson, UnreadableFilesNameThePath) {
  for (const std::filesystem::path& p : {dir_ / "nope.json", dir_}) {
    try {
      spec_from_hf_json(p.string(), "");
      ADD_FAILURE() << "no exception for " << p;
    } catch (const model_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(p.string() + ": cannot open file"));
    }
  }
}

TEST_F(TokenizerJson, ConfigNamesSpecialTokensAndAddBos) {
  const std::string json = byte_level_json("[]");
  const std::string config =
      R"({"bos_token": {"content": "a"}, "eos_token": "<|im_end|>", "pad_token": null, "add_bos_token": true})";
  const tokenizer_spec s =
      spec_from_hf_json(write("tokenizer.json", json), write("tokenizer_config.json", config));
  EXPECT_EQ(s.bos_id, 0);
  EXPECT_EQ(s.eos_id, 5);
  EXPECT_EQ(s.pad_id, -1);
  EXPECT_TRUE(s.add_bos);
  EXPECT_EQ(s.eot_id, -1);  // <|im_end|> is already eos
  EXPECT_THAT(rejection(json, R"({"eos_token": "<|nope|>"})"),
              HasSubstr("eos_token '<|nope|>' is not in the vocabulary"));
  EXPECT_THAT(rejection(json, R"({"add_bos_token": true})"),
              HasSubstr("add_bos_token is true but no bos_token is named"));
}

const std::string spm_json = R"({
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                 {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}}]},
  "added_tokens": [{"id": 0, "content": "<unk>", "special": true}, {"id": 1, "content": "<s>", "special": true},
                   {"id": 2, "content": "</s>", "special": true}, {"id": 9, "content": "▁tool▁", "special": false}],
  "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
            "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x41>": 3, "▁": 4, "a": 5, "▁a": 6, "aa": 7, "▁aa": 8},
            "merges": ["▁ a", "a a", "▁a a", "▁ aa"]}})";

TEST_F(TokenizerJson, SentencePieceFileBecomesLlamaWithScoresFromMergeRanks) {
  const tokenizer_spec s = spec_from_hf_json(write("tokenizer.json", spm_json), "");
  EXPECT_EQ(s.model, "llama");
  EXPECT_TRUE(s.add_space_prefix);
  EXPECT_EQ(s.token_types, (std::vector<std::int32_t>{2, 3, 3, 6, 1, 1, 1, 1, 1, 4}));
  EXPECT_EQ(s.tokens[9], " tool ");  // user-defined: U+2581 stored as spaces, as llama.cpp does
  EXPECT_TRUE(s.merges.empty());
  // ▁a is made by merge 0, aa by merge 1, ▁aa first by merge 2; the rest by none.
  EXPECT_EQ(s.scores[6], 0.0f);
  EXPECT_EQ(s.scores[7], -1.0f);
  EXPECT_EQ(s.scores[8], -2.0f);
  EXPECT_LT(s.scores[5], -4.0f);
  EXPECT_EQ(s.unk_id, 0);
  EXPECT_EQ(s.bos_id, 1);  // from the post-processor template
  EXPECT_TRUE(s.add_bos);
  EXPECT_EQ(s.eos_id, -1);
}

TEST_F(TokenizerJson, ChatTemplateFromConfig) {
  EXPECT_EQ(chat_template_from_hf_config(write("c1.json", R"({"chat_template": "{{ x }}"})")), "{{ x }}");
  EXPECT_EQ(chat_template_from_hf_config(write("c2.json", R"({"bos_token": "<s>"})")), "");
  EXPECT_EQ(
      chat_template_from_hf_config(write("c3.json", R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                                                          {"name": "default", "template": "D"}]})")),
      "D");
  EXPECT_THROW(chat_template_from_hf_config(write("c4.json", R"({"chat_template": 3})")), model_error);
  const std::string llama3 = anvil::model::test::data_path("tokenizers/llama3/tokenizer_config.json");
  ASSERT_TRUE(std::filesystem::exists(llama3)) << llama3 << " missing: run scripts/fetch-tokenizers.sh";
  EXPECT_THAT(chat_template_from_hf_config(llama3), HasSubstr("<|start_header_id|>"));
}

}  // namespace

// The GGUF path for gpt-oss: gpt-oss's reference vocabulary (tests/data/tokenizers/gptoss) written
// into a GGUF the way llama.cpp's converter writes gpt-oss — pre "gpt-4o", bos <|startoftext|>,
// eos <|return|>, pad <|endoftext|>, no eot and no add_bos key, the vocabulary padded to 201088
// with reserved control tokens — then read back with tokenizer_spec_from_gguf: the goldens still
// match, and harmony's end tokens hold whichever ids the file names eos or eot. And Mistral's
// tekken vocabulary (tests/data/tokenizers/mistral_nemo) the way Mistral Small 3.x files carry it:
// architecture llama, pre "tekken", no add_bos key.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/gguf/gguf.h"
#include "model/gguf/gguf_tokenizer.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/model/tokenizer_golden.h"
#include "tests/model/tokenizer_test_util.h"
#include "tests/scratch_dir.h"

namespace {

using anvil::model::gguf_file;
using anvil::model::gguf_writer;
using anvil::model::tokenizer;
using anvil::model::tokenizer_spec;
using anvil::model::tokenizer_spec_from_gguf;
using anvil::model::test::check_goldens;
using anvil::model::test::data_path;
using anvil::model::test::expect_all_match;
using anvil::model::test::load_reference;
using anvil::model::test::read_goldens;
using ids_t = std::vector<std::int32_t>;

constexpr std::int32_t startoftext = 199998, endoftext = 199999, ret = 200002, start = 200006, end = 200007,
                       call = 200012;
constexpr std::size_t gguf_vocab_size = 201088;  // the embedding rows of gpt-oss

// The reference spec, imported once per process (the tokenizer.json is 27 MB).
const std::optional<tokenizer_spec>& reference() {
  static const std::optional<tokenizer_spec> spec = load_reference("gptoss");
  return spec;
}

// Writes the reference vocabulary as a gpt-oss GGUF naming `eos` and, if >= 0, `eot`.
std::string write_gptoss_gguf(const tokenizer_spec& ref, const std::string& name, std::int32_t eos,
                              std::int32_t eot) {
  std::vector<std::string> tokens = ref.tokens;
  std::vector<std::int32_t> types = ref.token_types;
  for (std::size_t id = tokens.size(); id < gguf_vocab_size; ++id) {
    tokens.push_back("<|reserved_" + std::to_string(id) + "|>");
    types.push_back(3);
  }
  gguf_writer w;
  w.set_string("general.architecture", "gpt-oss");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "gpt-4o");
  w.set_strings("tokenizer.ggml.tokens", std::move(tokens));
  w.set_i32s("tokenizer.ggml.token_type", std::move(types));
  w.set_strings("tokenizer.ggml.merges", ref.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", startoftext);
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(eos));
  w.set_u32("tokenizer.ggml.padding_token_id", endoftext);
  if (eot >= 0) w.set_u32("tokenizer.ggml.eot_token_id", static_cast<std::uint32_t>(eot));
  const std::string path = anvil::testing::scratch_path(name);
  w.write(path);
  return path;
}

tokenizer_spec read_spec(const std::string& path) { return tokenizer_spec_from_gguf(gguf_file::open(path)); }

TEST(TokenizerGguf, GptossMatchesTransformersJs) {
  const auto& ref = reference();
  ASSERT_TRUE(ref);
  const tokenizer_spec spec = read_spec(write_gptoss_gguf(*ref, "gptoss.gguf", ret, -1));
  EXPECT_EQ(spec.model, "gpt2");
  EXPECT_EQ(spec.pre, "gpt-4o");
  EXPECT_EQ(spec.tokens.size(), gguf_vocab_size);
  EXPECT_EQ(spec.merges, ref->merges);
  EXPECT_EQ(spec.bos_id, startoftext);
  EXPECT_FALSE(spec.add_bos);  // llama.cpp's default for gpt-4o when the file does not say
  EXPECT_EQ(spec.eot_id, endoftext);  // not in the file: found by name, as llama.cpp and the JSON path do
  const tokenizer t(spec);
  EXPECT_EQ(t.encode("Hi", true, false), (ids_t{12194}));
  EXPECT_TRUE(t.is_eog(ret));
  EXPECT_TRUE(t.is_eog(call));
  EXPECT_FALSE(t.is_eog(end));
  EXPECT_FALSE(t.is_eog(start));
  EXPECT_TRUE(t.is_eog(endoftext));
  expect_all_match("gptoss (gguf)", check_goldens(t, read_goldens(data_path("tokenizer/gptoss.jsonl")), false, true));
}

TEST(TokenizerGguf, HarmonyEndIsNeverEndOfGeneration) {
  const auto& ref = reference();
  ASSERT_TRUE(ref);
  // Older gpt-oss files name <|endoftext|> eos; a converter may name <|end|> eot.
  const tokenizer old_eos(read_spec(write_gptoss_gguf(*ref, "gptoss-old-eos.gguf", endoftext, -1)));
  for (const std::int32_t id : {endoftext, ret, call}) EXPECT_TRUE(old_eos.is_eog(id)) << id;
  EXPECT_FALSE(old_eos.is_eog(end));
  const tokenizer end_as_eot(read_spec(write_gptoss_gguf(*ref, "gptoss-end-eot.gguf", ret, end)));
  EXPECT_EQ(end_as_eot.spec().eot_id, end);
  EXPECT_FALSE(end_as_eot.is_eog(end));
  EXPECT_TRUE(end_as_eot.is_eog(ret));
  EXPECT_TRUE(end_as_eot.is_eog(call));
}

TEST(TokenizerGguf, TekkenMatchesTransformersJs) {
  const auto ref = load_reference("mistral_nemo");
  ASSERT_TRUE(ref);
  gguf_writer w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "tekken");
  w.set_strings("tokenizer.ggml.tokens", ref->tokens);
  w.set_i32s("tokenizer.ggml.token_type", ref->token_types);
  w.set_strings("tokenizer.ggml.merges", ref->merges);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  const std::string path = anvil::testing::scratch_path("tekken.gguf");
  w.write(path);
  const tokenizer_spec spec = read_spec(path);
  EXPECT_EQ(spec.pre, "tekken");
  EXPECT_TRUE(spec.add_bos);  // llama.cpp's default for tekken when the file does not say
  const tokenizer t(spec);
  EXPECT_EQ(t.encode("Hi", true, false).front(), 1);
  expect_all_match("mistral_nemo (gguf)",
                   check_goldens(t, read_goldens(data_path("tokenizer/mistral_nemo.jsonl")), false, true));
}

}  // namespace

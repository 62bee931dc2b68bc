// Hostile GGUF files: one case per class of malformed file known to have broken GGUF readers,
// each made here from the micro model with one thing broken, written to a file and opened the way
// `anvil generate -m FILE` opens it (hyper-parameters and KV sizing, then engine::create: weights,
// tokenizer, chat template, worker). Each must be refused with a model_error that names the
// problem, without a crash, a hang, or asking for more than a small amount of memory: this
// executable replaces operator new/delete with counting versions (alloc_counter.cpp).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <boost/asio/use_future.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "model/arch/cpu_forward.h"
#include "tests/fuzz/alloc_counter.h"
#include "tests/fuzz/gguf_image.h"
#include "tests/scratch_dir.h"

namespace {

using namespace anvil;
using namespace anvil::fuzz;
using model::ggml_type;
using model::gguf_type;
using ::testing::HasSubstr;

// What a file of a few KB may make the loader ask for, at once and in all: the valid micro model
// needs about 0.3 MiB (its engine's KV pool is kv_budget below).
constexpr std::size_t alloc_bound = 4u << 20;
constexpr std::size_t kv_budget = 256u << 10;

std::string temp_file(const bytes& b) {
  static int n = 0;
  const auto p = anvil::testing::scratch_dir() / ("hostile_" + std::to_string(n++) + ".gguf");
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  return p.string();
}

// Opens `path` as `anvil generate -m path` does; "" when it loads, else the model_error's message.
// Any other exception escapes and fails the test.
std::string load_error(const std::string& path) {
  try {
    const model::hparams hp = model::read_hparams(model::gguf_file::open(path));
    (void)model::kv_cache_storage::bytes_per_block(hp, 16);
    engine_config cfg;
    cfg.model_path = path;
    cfg.backend = worker_backend::cpu;
    cfg.kv_budget_bytes = kv_budget;
    cfg.max_model_len = 64;
    cfg.max_seqs = 2;
    cfg.threads = 1;
    auto eng = engine::create(cfg);
    eng->async_stop(boost::asio::use_future).get();
    return "";
  } catch (const model::model_error& e) {
    return e.what();
  }
}

struct hostile_case {
  std::string name;
  std::function<bytes()> make;
  std::string expect;  // a piece of the error message that names the problem
};

// The micro model with `edit` applied.
std::function<bytes()> edited(std::function<void(gguf_image&)> edit, micro_vocab v = micro_vocab::spm) {
  return [edit, v] {
    gguf_image m = micro_model(v);
    edit(m);
    return m.serialise();
  };
}

std::function<bytes()> with_value(std::string key, gguf_type type, bytes payload, micro_vocab v = micro_vocab::spm) {
  return edited([=](gguf_image& m) { m.set(key, type, payload); }, v);
}

std::function<bytes()> with_dims(std::string tensor, std::vector<std::uint64_t> dims) {
  return edited([=](gguf_image& m) { m.tensor_at(tensor).dims = dims; });
}

std::function<bytes()> with_token(std::size_t id, std::string text) {
  return edited([=](gguf_image& m) {
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<0x0A>", "<0x41>", "\xe2\x96\x81", "a", "b",
                                       "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab", "c", "<|im_start|>",
                                       "<|im_end|>", "ba", "<user>"};
    tokens.at(id) = text;
    m.set("tokenizer.ggml.tokens", gguf_type::array, enc::strings(tokens));
  });
}

bytes str_payload_with_length(std::uint64_t len, std::string_view text) {
  bytes b = enc::u64(len);
  for (const char c : text) b.push_back(std::byte(c));
  return b;
}

std::vector<hostile_case> header_cases() {
  return {
      {"EmptyFile", [] { return bytes{}; }, "is empty"},
      {"BadMagic", edited([](gguf_image& m) { m.magic = 0x47475546; }), "bad magic"},
      {"Version1", edited([](gguf_image& m) { m.version = 1; }), "unsupported GGUF version 1 "},
      {"VersionHuge", edited([](gguf_image& m) { m.version = 0xffffffffu; }), "unsupported GGUF version 4294967295"},
      {"TensorCountNear2To64", edited([](gguf_image& m) { m.n_tensors = ~0ull; }), "tensor count 18446744073709551615 cannot fit"},
      {"MetadataCountNear2To64", edited([](gguf_image& m) { m.n_kv = ~0ull - 1; }), "metadata count 18446744073709551614 cannot fit"},
      {"KeyLengthNear2To64", edited([](gguf_image& m) { m.kvs[0].key_len = ~0ull; }), "metadata key needs 18446744073709551615 bytes"},
      {"KeyLengthPastTheEnd", edited([](gguf_image& m) { m.kvs[3].key_len = 1u << 20; }), "metadata key needs 1048576 bytes"},
      {"EmptyKey", edited([](gguf_image& m) { m.kvs[2].key = ""; }), "metadata key 2 is empty"},
      {"DuplicateKey", edited([](gguf_image& m) { m.kvs.push_back(m.kvs[1]); }), "duplicate metadata key 'general.name'"},
  };
}

std::vector<hostile_case> value_cases() {
  return {
      {"StringLengthHuge", with_value("general.name", gguf_type::string, str_payload_with_length(1ull << 62, "micro")), "string value needs 4611686018427387904 bytes"},
      {"StringArrayCountHuge", with_value("tokenizer.ggml.merges", gguf_type::array, enc::array(gguf_type::string, 1ull << 61, str_payload_with_length(1, "a"))), "array of 2305843009213693952 strings cannot fit"},
      {"StringArrayElementLengthHuge", with_value("tokenizer.ggml.merges", gguf_type::array, enc::array(gguf_type::string, 1, str_payload_with_length(~0ull, "a b"))), "string array element needs 18446744073709551615 bytes"},
      {"NumericArrayCountHuge", with_value("tokenizer.ggml.scores", gguf_type::array, enc::array(gguf_type::f32, 1ull << 62)), "array of 4611686018427387904 elements runs past the end"},
      {"NumericArraySizeOverflows", with_value("x.big", gguf_type::array, enc::array(gguf_type::u64, (1ull << 61) + 1)), "array of 2305843009213693953 elements runs past the end"},
      {"NestedArray", with_value("x.nested", gguf_type::array, enc::array(gguf_type::array, 1, enc::array(gguf_type::u32, 1, enc::u32(7)))), "'x.nested': nested arrays are not supported"},
      {"UnknownValueType", edited([](gguf_image& m) { m.at("general.name").type = 13; }), "'general.name' has unknown type 13"},
      {"NegativeValueType", edited([](gguf_image& m) { m.at("general.name").type = 0xffffffffu; }), "'general.name' has unknown type 4294967295"},
      {"UnknownArrayElementType", with_value("x.odd", gguf_type::array, enc::array(gguf_type(99), 1, enc::u32(0))), "'x.odd': array of unknown type 99"},
      {"BoolNotZeroOrOne", with_value("tokenizer.ggml.add_bos_token", gguf_type::boolean, bytes{std::byte{2}}), "bool value 2 is not 0 or 1"},
      // Known keys holding the wrong type.
      {"AlignmentAsString", with_value("general.alignment", gguf_type::string, enc::str("32")), "general.alignment must be a u32, not string"},
      {"AlignmentAsU64", with_value("general.alignment", gguf_type::u64, enc::u64(32)), "general.alignment must be a u32, not u64"},
      {"AlignmentZero", with_value("general.alignment", gguf_type::u32, enc::u32(0)), "general.alignment 0 is not a power of two"},
      {"AlignmentNotAPowerOfTwo", with_value("general.alignment", gguf_type::u32, enc::u32(48)), "general.alignment 48 is not a power of two"},
      {"BlockCountAsFloat", with_value("llama.block_count", gguf_type::f32, enc::f32(1.f)), "'llama.block_count' is f32, expected an integer"},
      {"ArchitectureAsInteger", with_value("general.architecture", gguf_type::u32, enc::u32(1)), "'general.architecture' is u32, expected a string"},
      {"EpsilonAsString", with_value("llama.attention.layer_norm_rms_epsilon", gguf_type::string, enc::str("1e-5")), "'llama.attention.layer_norm_rms_epsilon' is string, expected a number"},
      {"TokensAsIntegers", with_value("tokenizer.ggml.tokens", gguf_type::array, enc::i32s(std::vector<std::int32_t>(16, 1))), "'tokenizer.ggml.tokens' is array of i32, expected an array of strings"},
      {"ScoresAsStrings", with_value("tokenizer.ggml.scores", gguf_type::array, enc::strings(std::vector<std::string>(16, "0"))), "'tokenizer.ggml.scores' is array of string, expected an array of f32"},
      {"TokenTypesAsFloats", with_value("tokenizer.ggml.token_type", gguf_type::array, enc::f32s(std::vector<float>(16, 1.f))), "'tokenizer.ggml.token_type' is array of f32, expected an array of integers"},
      {"TokenTypesOutOfInt32", with_value("tokenizer.ggml.token_type", gguf_type::array, enc::array(gguf_type::u64, 1, enc::u64(~0ull))), "'tokenizer.ggml.token_type' is array of u64, expected integers in range"},
      {"BosIdAsString", with_value("tokenizer.ggml.bos_token_id", gguf_type::string, enc::str("1")), "'tokenizer.ggml.bos_token_id' is string, expected an integer"},
      {"AddBosAsInteger", with_value("tokenizer.ggml.add_bos_token", gguf_type::u32, enc::u32(1)), "'tokenizer.ggml.add_bos_token' is u32, expected a bool"},
      {"ChatTemplateAsArray", with_value("tokenizer.chat_template", gguf_type::array, enc::strings({"{{ x }}"})), "'tokenizer.chat_template' is array of string, expected a string"},
  };
}

std::vector<hostile_case> tensor_cases() {
  return {
      {"DimsProductOverflows", with_dims("token_embd.weight", {1ull << 32, 1ull << 32}), "'token_embd.weight': the element count overflows"},
      {"DimsProductPastInt64", with_dims("token_embd.weight", {1ull << 32, 1ull << 31}), "'token_embd.weight': the element count overflows"},
      {"ByteSizeOverflows", with_dims("output_norm.weight", {1ull << 62}), "'output_norm.weight': its size overflows"},
      {"DimZero", with_dims("blk.0.attn_q.weight", {0, 8}), "'blk.0.attn_q.weight': dimension 0 is 0"},
      {"DimNegative", with_dims("blk.0.attn_q.weight", {8, ~0ull}), "'blk.0.attn_q.weight': dimension 1 is 18446744073709551615"},
      {"FiveDims", with_dims("blk.0.attn_q.weight", {8, 8, 1, 1, 1}), "'blk.0.attn_q.weight' has 5 dimensions (1 to 4 allowed)"},
      {"NoDims", with_dims("blk.0.attn_q.weight", {}), "'blk.0.attn_q.weight' has 0 dimensions"},
      {"DimCountHuge", edited([](gguf_image& m) { m.tensor_at("blk.0.attn_q.weight").n_dims = 0xffffffffu; }), "has 4294967295 dimensions"},
      {"NegativeType", edited([](gguf_image& m) { m.tensor_at("blk.0.attn_k.weight").type = 0xffffffffu; }), "'blk.0.attn_k.weight' has unknown type 4294967295"},
      {"RemovedType", edited([](gguf_image& m) { m.tensor_at("blk.0.attn_k.weight").type = 4; }), "'blk.0.attn_k.weight' has unknown type 4"},
      {"UnknownType", edited([](gguf_image& m) { m.tensor_at("blk.0.attn_k.weight").type = 1000; }), "'blk.0.attn_k.weight' has unknown type 1000"},
      {"RowNotAWholeBlock", edited([](gguf_image& m) { m.tensor_at("blk.0.attn_k.weight").type = std::uint32_t(ggml_type::Q8_0); }), "row length 8 is not a multiple of the Q8_0 block (32)"},
      {"TensorNameTooLong", edited([](gguf_image& m) { m.tensors[1].name = std::string(64, 'x'); }), "is longer than 63 bytes"},
      {"TensorNameLengthHuge", edited([](gguf_image& m) { m.tensors[1].name_len = ~0ull; }), "tensor name needs 18446744073709551615 bytes"},
      {"DuplicateTensorName", edited([](gguf_image& m) { m.tensors[2].name = m.tensors[1].name; }), "duplicate tensor name 'output_norm.weight'"},
      {"OffsetPastTheEnd", edited([](gguf_image& m) { m.tensors.back().offset += 1024; }), "'blk.0.ffn_down.weight': data [2656, +256) runs past the end of the file (data section holds 1888 bytes)"},
      {"OffsetNear2To64", edited([](gguf_image& m) { m.tensors[3].offset = ~0ull & ~31ull; }), "'blk.0.attn_q.weight': data [18446744073709551584, +256) runs past the end"},
      {"OffsetUnaligned", edited([](gguf_image& m) { m.tensors[3].offset += 4; }), "'blk.0.attn_q.weight': offset 324 is not a multiple of the alignment 32"},
      {"TensorsOverlap", edited([](gguf_image& m) { m.tensor_at("blk.0.attn_k.weight").offset = m.tensor_at("blk.0.attn_q.weight").offset + 32; }), "tensors 'blk.0.attn_q.weight' and 'blk.0.attn_k.weight' overlap"},
      {"DataOneByteShort", [] { bytes b = micro_model().serialise(); b.pop_back(); return b; }, "'blk.0.ffn_down.weight': data [1632, +256) runs past the end of the file (data section holds 1887 bytes)"},
      {"DataSectionMissing", edited([](gguf_image& m) { m.data.clear(); }), "runs past the end of the file (data section holds 0 bytes)"},
  };
}

std::vector<hostile_case> model_cases() {
  return {
      {"UnknownArchitecture", with_value("general.architecture", gguf_type::string, enc::str("gemma2")), "unsupported architecture 'gemma2'"},
      {"MissingTensor", edited([](gguf_image& m) { m.tensor_at("blk.0.ffn_up.weight").name = "blk.0.ffn_upp.weight"; }), "missing tensor 'blk.0.ffn_up.weight'"},
      {"WrongShape", with_dims("blk.0.attn_k.weight", {4, 8}), "tensor 'blk.0.attn_k.weight' has shape [4, 8], expected [8, 4]"},
      {"BlockCountHuge", with_value("llama.block_count", gguf_type::u64, enc::u64(1ull << 62)), "block_count 4611686018427387904 x head_count 2 x head size 4 is too large"},
      {"HeadsHuge", edited([](gguf_image& m) {
         m.set("llama.attention.head_count", gguf_type::u64, enc::u64(1ull << 40));
         m.set("llama.attention.head_count_kv", gguf_type::u64, enc::u64(1ull << 40));
         m.set("llama.attention.key_length", gguf_type::u64, enc::u64(1ull << 40));
         m.set("llama.attention.value_length", gguf_type::u64, enc::u64(1ull << 40));
         m.set("llama.rope.dimension_count", gguf_type::u64, enc::u64(1ull << 40));
       }), "block_count 1 x head_count 1099511627776 x head size 1099511627776 is too large"},
      {"HeadCountKvZero", with_value("llama.attention.head_count_kv", gguf_type::u32, enc::u32(0)), "'llama.attention.head_count_kv' is 0, expected a positive integer"},
      {"HeadCountNotAMultiple", with_value("llama.attention.head_count_kv", gguf_type::u32, enc::u32(3)), "attention.head_count 2 is not a multiple of head_count_kv 3"},
      {"RopeDimensionOdd", with_value("llama.rope.dimension_count", gguf_type::u32, enc::u32(3)), "rope.dimension_count must be even"},
      {"EpsilonNaN", with_value("llama.attention.layer_norm_rms_epsilon", gguf_type::f32, enc::f32(std::nanf(""))), "layer_norm_rms_epsilon must be positive"},
  };
}

std::vector<hostile_case> tokenizer_cases() {
  using v = micro_vocab;
  return {
      {"NoTokenizer", edited([](gguf_image& m) { m.erase("tokenizer.ggml.model"); }), "missing 'tokenizer.ggml.model'"},
      {"UnknownTokenizerModel", with_value("tokenizer.ggml.model", gguf_type::string, enc::str("bert")), "unknown tokenizer model 'bert'"},
      {"UnknownPreTokenizer", with_value("tokenizer.ggml.pre", gguf_type::string, enc::str("gpt-9"), v::byte_level), "unknown pre-tokenizer 'gpt-9'"},
      {"EmptyVocabulary", edited([](gguf_image& m) {
         m.set("tokenizer.ggml.tokens", gguf_type::array, enc::strings({}));
         m.erase("tokenizer.ggml.scores");
         m.erase("tokenizer.ggml.token_type");
       }), "tokenizer.ggml.tokens has 0 entries but token_embd.weight has 16 rows"},
      {"VocabularyLargerThanTheEmbedding", edited([](gguf_image& m) {
         gguf_image big = micro_model(v::byte_level);
         for (const char* k : {"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                               "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
           m.set(k, gguf_type(big.at(k).type), big.at(k).payload);
         }
         for (const char* k : {"tokenizer.ggml.scores", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.unknown_token_id"}) m.erase(k);
         m.set("tokenizer.ggml.add_bos_token", gguf_type::boolean, enc::boolean(false));
       }), "tokenizer.ggml.tokens has 261 entries but token_embd.weight has 16 rows"},
      {"EmbeddingLargerThanTheVocabulary", edited([](gguf_image& m) {
         gguf_image::tensor& t = m.tensor_at("token_embd.weight");
         t.dims = {8, 32};
         t.offset = (m.data.size() + 31) / 32 * 32;
         m.data.resize(t.offset + 8 * 32 * 2);
       }), "tokenizer.ggml.tokens has 16 entries but token_embd.weight has 32 rows"},
      {"ScoresShorterThanTokens", with_value("tokenizer.ggml.scores", gguf_type::array, enc::f32s(std::vector<float>(15))), "tokenizer.ggml.scores has 15 entries but tokenizer.ggml.tokens has 16"},
      {"TokenTypesLongerThanTokens", with_value("tokenizer.ggml.token_type", gguf_type::array, enc::i32s(std::vector<std::int32_t>(17, 1))), "tokenizer.ggml.token_type has 17 entries but tokenizer.ggml.tokens has 16"},
      {"MergeOfUnknownTokens", with_value("tokenizer.ggml.merges", gguf_type::array, enc::strings({"a b", "zz qq"}), v::byte_level), "merge 1 'zz qq' does not name two tokens"},
      {"MergeOfManySpaces", with_value("tokenizer.ggml.merges", gguf_type::array, enc::strings({"a" + std::string(200000, ' ') + "b"}), v::byte_level), "merge 0 'a" + std::string(79, ' ') + "' does not name two tokens"},
      {"MergeWithoutASpace", with_value("tokenizer.ggml.merges", gguf_type::array, enc::strings({"ab"}), v::byte_level), "merge 0 'ab' does not name two tokens"},
      {"MergeOfATokenNotInTheVocabulary", with_value("tokenizer.ggml.merges", gguf_type::array, enc::strings({"b a"}), v::byte_level), "merge 0 'b a' produces 'ba', which is not in the vocabulary"},
      {"ByteLevelVocabularyMissingAByte", edited([](gguf_image& m) {
         std::vector<std::string> tokens;
         for (int i = 0; i < 256; ++i) tokens.push_back(std::string(1, char(i)));  // raw bytes, not GPT-2's mapping
         tokens.insert(tokens.end(), {"x", "y", "<|endoftext|>", "<|im_start|>", "<|im_end|>"});
         m.set("tokenizer.ggml.tokens", gguf_type::array, enc::strings(tokens));
       }, v::byte_level), "byte-level BPE vocabulary has no normal token"},
      {"SpmWithoutByteTokensOrUnknown", edited([](gguf_image& m) { m.erase("tokenizer.ggml.unknown_token_id"); }), "byte 0 has no token and there is no unknown token"},
      {"BosIdPastTheVocabulary", with_value("tokenizer.ggml.bos_token_id", gguf_type::u32, enc::u32(16)), "bos_token_id 16 is out of range (vocabulary has 16 tokens)"},
      {"EosIdHuge", with_value("tokenizer.ggml.eos_token_id", gguf_type::u64, enc::u64(1ull << 40)), "'tokenizer.ggml.eos_token_id' = 1099511627776 is not a token id"},
      {"PadIdNegative", with_value("tokenizer.ggml.padding_token_id", gguf_type::i32, enc::i32(-2)), "'tokenizer.ggml.padding_token_id' = -2 is not a token id"},
      {"UnknownIdPastTheVocabulary", with_value("tokenizer.ggml.unknown_token_id", gguf_type::u32, enc::u32(0x7fffffff)), "unknown_token_id 2147483647 is out of range"},
      {"EotIdPastTheVocabulary", with_value("tokenizer.ggml.eot_token_id", gguf_type::u32, enc::u32(1000)), "eot_token_id 1000 is out of range"},
      {"EomIdPastTheVocabulary", with_value("tokenizer.ggml.eom_token_id", gguf_type::i64, bytes(enc::u64(16))), "eom_token_id 16 is out of range"},
      {"AddBosWithoutBos", edited([](gguf_image& m) { m.erase("tokenizer.ggml.bos_token_id"); }), "add_bos_token is set but there is no bos_token_id"},
      {"TokenTypeOutOfRange", with_value("tokenizer.ggml.token_type", gguf_type::array, enc::i32s({2, 3, 3, 6, 6, 1, 7, 1, 1, 1, 1, 1, 3, 3, 1, 4})), "token 6 'a' has token_type 7"},
      {"TokenTypeNegative", with_value("tokenizer.ggml.token_type", gguf_type::array, enc::i32s({-1, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1, 3, 3, 1, 4})), "token 0 '<unk>' has token_type -1"},
      {"ByteTokenNegative", with_token(3, "<0x-1>"), "token 3 '<0x-1>' has type byte but is not of the form <0xHH>"},
      {"ByteTokenNotHex", with_token(3, "<0xZZ>"), "token 3 '<0xZZ>' has type byte but is not of the form <0xHH>"},
      {"ByteTokenPast255", with_token(4, "<0x100>"), "token 4 '<0x100>' has type byte but is not of the form <0xHH>"},
      {"ByteTokenEmpty", with_token(4, ""), "token 4 '' has type byte but is not of the form <0xHH>"},
  };
}

std::vector<hostile_case> all_cases() {
  std::vector<hostile_case> all;
  for (auto part : {header_cases(), value_cases(), tensor_cases(), model_cases(), tokenizer_cases()}) {
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

void PrintTo(const hostile_case& c, std::ostream* os) { *os << c.name; }

class HostileGguf : public ::testing::TestWithParam<hostile_case> {};

TEST_P(HostileGguf, IsRefusedWithASpecificErrorAndLittleMemory) {
  const bytes file = GetParam().make();
  ASSERT_LT(file.size(), 256u << 10) << "a hostile file stays small";
  const std::string path = temp_file(file);
  alloc_counter::reset();
  const auto start = std::chrono::steady_clock::now();
  const std::string err = load_error(path);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  const std::size_t largest = alloc_counter::largest(), peak = alloc_counter::peak_growth();
  EXPECT_LT(took.count(), 10.0) << "seconds to refuse a small file";
  std::filesystem::remove(path);
  EXPECT_THAT(err, HasSubstr(GetParam().expect));
  EXPECT_LE(largest, alloc_bound) << "largest single allocation";
  EXPECT_LE(peak, alloc_bound) << "peak live bytes";
}

INSTANTIATE_TEST_SUITE_P(Cases, HostileGguf, ::testing::ValuesIn(all_cases()),
                         [](const auto& p) { return p.param.name; });

// The control: both micro models load through the same path and generate, within the same bound,
// so every refusal above is caused by its one edit.
TEST(MicroModel, LoadsAndGeneratesWithinTheBound) {
  for (const micro_vocab v : {micro_vocab::spm, micro_vocab::byte_level}) {
    const std::string path = temp_file(micro_model(v).serialise());
    alloc_counter::reset();
    EXPECT_EQ(load_error(path), "");
    EXPECT_LE(alloc_counter::largest(), alloc_bound);
    EXPECT_LE(alloc_counter::peak_growth(), alloc_bound);

    engine_config cfg;
    cfg.model_path = path;
    cfg.backend = worker_backend::cpu;
    cfg.kv_budget_bytes = kv_budget;
    cfg.max_model_len = 64;
    auto eng = engine::create(cfg);
    EXPECT_NE(eng->chat_template(), nullptr);
    generate_request req;
    req.prompt = "ab c";
    req.max_tokens = 8;
    req.ignore_eos = true;
    const completion c = eng->async_generate(req, boost::asio::use_future).get();
    EXPECT_EQ(c.usage.completion_tokens, 8);
    eng->async_stop(boost::asio::use_future).get();
    std::filesystem::remove(path);
  }
}

// Every strict prefix of a valid file — a download cut short at any byte — is refused cleanly.
TEST(MicroModel, EveryTruncationIsRefused) {
  const bytes full = micro_model().serialise();
  const std::string path = temp_file(full);
  for (std::size_t n = 0; n < full.size(); ++n) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(full.data()), std::streamsize(n));
    alloc_counter::reset();
    const std::string err = load_error(path);
    ASSERT_NE(err, "") << "a file cut at byte " << n << " of " << full.size() << " loaded";
    ASSERT_LE(alloc_counter::largest(), alloc_bound) << "cut at " << n;
  }
  std::filesystem::remove(path);
}

// The GGUF fuzz corpus starts from the micro models: the committed seeds are exactly what
// micro_model() makes (ANVIL_WRITE_FUZZ_SEEDS=1 rewrites them after a change to gguf_image.cpp).
TEST(MicroModel, SeedCorpusIsCurrent) {
  const std::filesystem::path dir = ANVIL_FUZZ_CORPUS "/gguf";
  for (const auto& [name, v] : {std::pair{"micro-spm.gguf", micro_vocab::spm}, std::pair{"micro-byte-level.gguf", micro_vocab::byte_level}}) {
    const bytes want = micro_model(v).serialise();
    if (std::getenv("ANVIL_WRITE_FUZZ_SEEDS")) {
      std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(want.data()), std::streamsize(want.size()));
    }
    std::ifstream in(dir / name, std::ios::binary);
    const std::vector<char> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_EQ(got.size(), want.size()) << name;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0) << name;
  }
}

}  // namespace

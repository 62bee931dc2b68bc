// A GGUF file as editable parts, serialised field by field: the hostile-file suite starts from a
// small valid model (micro_model) and breaks one thing at a time — a count, a length, a type, a
// dimension, an offset — including what the writer (model/gguf/gguf_writer.cpp) would never produce.
// micro_model is also what the fuzz targets that need a model (line and HTTP sessions) load, and
// the seed of the GGUF fuzz corpus.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf/gguf.h"

namespace anvil::fuzz {

using bytes = std::vector<std::byte>;

// Encoders for metadata payloads (what follows the key and the type).
namespace enc {
bytes u32(std::uint32_t v);
bytes i32(std::int32_t v);
bytes u64(std::uint64_t v);
bytes f32(float v);
bytes boolean(bool v);
bytes str(std::string_view s);                                  // the payload of a string value
bytes strings(const std::vector<std::string>& v);               // array of strings
bytes f32s(const std::vector<float>& v);                        // array of f32
bytes i32s(const std::vector<std::int32_t>& v);                 // array of i32
// An array header claiming `count` elements of `elem` followed by `raw` (which may hold fewer).
bytes array(model::gguf_type elem, std::uint64_t count, const bytes& raw = {});
}  // namespace enc

struct gguf_image {
  struct kv {
    std::string key;
    std::uint32_t type = 0;                 // a model::gguf_type, or any number
    bytes payload;
    std::optional<std::uint64_t> key_len;   // written instead of key.size() when set
  };
  struct tensor {
    std::string name;
    std::vector<std::uint64_t> dims;        // ggml order
    std::uint32_t type = 0;                 // a model::ggml_type, or any number
    std::uint64_t offset = 0;               // in the data section
    std::optional<std::uint64_t> name_len;  // written instead of name.size() when set
    std::optional<std::uint32_t> n_dims;    // written instead of dims.size() when set
  };

  std::uint32_t magic = 0x46554747;  // "GGUF"
  std::uint32_t version = 3;
  std::optional<std::uint64_t> n_tensors;  // written instead of tensors.size() when set
  std::optional<std::uint64_t> n_kv;       // written instead of kvs.size() when set
  std::vector<kv> kvs;
  std::vector<tensor> tensors;
  std::size_t pad_to = 32;  // padding between the tensor infos and the data section
  bytes data;               // the data section

  bytes serialise() const;

  kv& at(std::string_view key);               // the entry; throws std::out_of_range when absent
  void set(std::string key, model::gguf_type type, bytes payload);  // replaces or appends
  void erase(std::string_view key);
  tensor& tensor_at(std::string_view name);   // throws std::out_of_range when absent
  // Appends a tensor and its data (aligned to 32 in the data section).
  void add_tensor(std::string name, model::ggml_type type, std::vector<std::uint64_t> dims, const bytes& content);
};

enum class micro_vocab {
  spm,         // "llama" (SentencePiece-style): 16 tokens, <unk>, byte tokens, no merges
  byte_level,  // "gpt2": the 256 byte tokens, merges, control tokens
};

// A valid llama model of a few KB (n_embd 8, one layer, F32 and F16 weights) with a ChatML
// template: loads through every step of `anvil generate -m` and generates (nonsense) text.
gguf_image micro_model(micro_vocab vocab = micro_vocab::spm);

}  // namespace anvil::fuzz

// GGUF files: a validating, zero-copy reader over an mmap'd file and a streaming writer.
//
// Layout (v2/v3, little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count, the
// metadata key/values, the tensor infos (name, dims, type, offset), padding to the alignment
// (`general.alignment`, default 32), then the tensor data. Everything is validated before use:
// lengths and counts against the bytes that remain, dims and their products against overflow,
// types, offsets (aligned, in bounds, not overlapping), duplicate names. A malformed file throws
// model_error naming the problem — never a crash, a huge allocation or a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/model_error.h"
#include "model/quant/quant.h"

namespace anvil::model {

enum class gguf_type : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};
std::string_view gguf_type_name(gguf_type t);

// One metadata value. Scalars are stored widened (integers in i/u, floats in f); strings and
// string arrays are views into the file; numeric arrays keep a pointer to their raw bytes.
struct gguf_value {
  gguf_type type = gguf_type::u8;
  gguf_type elem_type = gguf_type::u8;    // arrays only
  std::uint64_t count = 0;                // arrays only: number of elements
  std::uint64_t u = 0;                    // u8/u16/u32/u64, bool
  std::int64_t i = 0;                     // i8/i16/i32/i64
  double f = 0;                           // f32/f64
  std::string_view str;                   // string
  std::vector<std::string_view> strings;  // array of strings
  const std::byte* raw = nullptr;         // array of numbers: the first element (unaligned)
};

struct gguf_kv {
  std::string_view key;
  gguf_value value;
};

struct gguf_tensor {
  std::string_view name;
  std::vector<std::int64_t> dims;  // ggml order: dims[0] is the contiguous (row) length
  ggml_type type = ggml_type::F32;
  std::uint64_t offset = 0;        // from the start of the data section
  std::size_t nbytes = 0;
  std::int64_t n_elements = 0;
  const std::byte* data = nullptr;  // into the mapped file
  std::int64_t rows() const { return n_elements / dims[0]; }
};

class gguf_file {
 public:
  // Maps and validates the file; throws model_error naming the problem.
  static gguf_file open(const std::string& path);
  // Validates a GGUF image held in memory (tests, fuzzers); `bytes` must outlive the result.
  static gguf_file parse(std::span<const std::byte> bytes);

  std::uint32_t version() const { return version_; }
  std::size_t alignment() const { return alignment_; }
  std::size_t file_size() const { return bytes_.size(); }
  std::size_t data_offset() const { return data_offset_; }

  const std::vector<gguf_kv>& metadata() const { return kvs_; }
  const gguf_value* find(std::string_view key) const;
  const std::vector<gguf_tensor>& tensors() const { return tensors_; }
  const gguf_tensor* find_tensor(std::string_view name) const;

  // Typed getters: nullopt when the key is absent; model_error when present with a type that
  // cannot hold the requested value (integers convert when in range).
  std::optional<std::string_view> get_string(std::string_view key) const;
  std::optional<std::uint64_t> get_uint(std::string_view key) const;
  std::optional<std::int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  std::optional<std::vector<float>> get_f32_array(std::string_view key) const;
  std::optional<std::vector<std::int32_t>> get_i32_array(std::string_view key) const;
  std::optional<std::vector<bool>> get_bool_array(std::string_view key) const;

 private:
  struct mapping;
  std::shared_ptr<const mapping> map_;  // keeps the mmap alive for every view handed out
  std::span<const std::byte> bytes_;
  std::uint32_t version_ = 0;
  std::size_t alignment_ = 32;
  std::size_t data_offset_ = 0;
  std::vector<gguf_kv> kvs_;
  std::vector<gguf_tensor> tensors_;

  friend class gguf_parser;
};

// Writes a GGUF v3 file. Metadata keeps insertion order; tensor data is produced by a callback
// at write time so a multi-gigabyte model never has to sit in memory.
class gguf_writer {
 public:
  using fill_fn = std::function<void(std::span<std::byte> dst)>;

  void set_u32(std::string key, std::uint32_t v);
  void set_i32(std::string key, std::int32_t v);
  void set_u64(std::string key, std::uint64_t v);
  void set_f32(std::string key, float v);
  void set_bool(std::string key, bool v);
  void set_string(std::string key, std::string v);
  void set_strings(std::string key, std::vector<std::string> v);
  void set_f32s(std::string key, std::vector<float> v);
  void set_i32s(std::string key, std::vector<std::int32_t> v);
  void set_bools(std::string key, const std::vector<bool>& v);
  // Any value, raw: for tests that need odd types. `payload` is the encoded value after the type.
  void set_raw(std::string key, gguf_type type, std::vector<std::byte> payload);

  // dims in ggml order (dims[0] = row length). Throws std::invalid_argument for bad shapes.
  void add_tensor(std::string name, ggml_type type, std::vector<std::int64_t> dims, fill_fn fill);
  void add_tensor(std::string name, ggml_type type, std::vector<std::int64_t> dims, std::vector<std::byte> data);

  void set_alignment(std::uint32_t a);  // power of two; also written as general.alignment
  // Writes the file; `progress(done_bytes, total_bytes)` is called after each tensor if given.
  void write(const std::string& path, const std::function<void(std::size_t, std::size_t)>& progress = {}) const;
  std::size_t tensor_count() const { return tensors_.size(); }

 private:
  struct kv_entry {
    std::string key;
    gguf_type type;
    std::vector<std::byte> payload;
  };
  struct tensor_entry {
    std::string name;
    ggml_type type;
    std::vector<std::int64_t> dims;
    std::size_t nbytes;
    fill_fn fill;
  };
  void put(std::string key, gguf_type type, std::vector<std::byte> payload);
  std::vector<kv_entry> kvs_;
  std::vector<tensor_entry> tensors_;
  std::uint32_t alignment_ = 32;
};

}  // namespace anvil::model

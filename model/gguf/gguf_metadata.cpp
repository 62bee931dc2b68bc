// Typed access to GGUF metadata: the conversions a loader needs, with an error that names the key
// and both types when a value cannot be read as asked.
#include <cstring>
#include <limits>

#include "model/gguf/gguf.h"

namespace anvil::model {
namespace {

bool is_unsigned(gguf_type t) {
  return t == gguf_type::u8 || t == gguf_type::u16 || t == gguf_type::u32 || t == gguf_type::u64;
}
bool is_signed(gguf_type t) {
  return t == gguf_type::i8 || t == gguf_type::i16 || t == gguf_type::i32 || t == gguf_type::i64;
}

[[noreturn]] void wrong_type(std::string_view key, const gguf_value& v, const char* wanted) {
  std::string got(gguf_type_name(v.type));
  if (v.type == gguf_type::array) got = "array of " + std::string(gguf_type_name(v.elem_type));
  throw model_error("GGUF: metadata '" + std::string(key) + "' is " + got + ", expected " + wanted);
}

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Element i of a numeric array, widened to int64 (throws for out-of-range u64).
std::int64_t int_element(std::string_view key, const gguf_value& v, std::uint64_t i) {
  switch (v.elem_type) {
    case gguf_type::u8: return load<std::uint8_t>(v.raw + i);
    case gguf_type::i8: return load<std::int8_t>(v.raw + i);
    case gguf_type::u16: return load<std::uint16_t>(v.raw + 2 * i);
    case gguf_type::i16: return load<std::int16_t>(v.raw + 2 * i);
    case gguf_type::u32: return load<std::uint32_t>(v.raw + 4 * i);
    case gguf_type::i32: return load<std::int32_t>(v.raw + 4 * i);
    case gguf_type::i64: return load<std::int64_t>(v.raw + 8 * i);
    case gguf_type::u64: {
      const auto u = load<std::uint64_t>(v.raw + 8 * i);
      if (u > std::uint64_t(std::numeric_limits<std::int64_t>::max())) wrong_type(key, v, "integers in range");
      return static_cast<std::int64_t>(u);
    }
    default: wrong_type(key, v, "an array of integers");
  }
}

}  // namespace

std::optional<std::string_view> gguf_file::get_string(std::string_view key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::string) wrong_type(key, *v, "a string");
  return v->str;
}

std::optional<std::uint64_t> gguf_file::get_uint(std::string_view key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (is_unsigned(v->type)) return v->u;
  if (is_signed(v->type) && v->i >= 0) return static_cast<std::uint64_t>(v->i);
  wrong_type(key, *v, "a non-negative integer");
}

std::optional<std::int64_t> gguf_file::get_int(std::string_view key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (is_signed(v->type)) return v->i;
  if (is_unsigned(v->type) && v->u <= std::uint64_t(std::numeric_limits<std::int64_t>::max())) {
    return static_cast<std::int64_t>(v->u);
  }
  wrong_type(key, *v, "an integer");
}

std::optional<double> gguf_file::get_float(std::string_view key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type == gguf_type::f32 || v->type == gguf_type::f64) return v->f;
  if (is_unsigned(v->type)) return static_cast<double>(v->u);
  if (is_signed(v->type)) return static_cast<double>(v->i);
  wrong_type(key, *v, "a number");
}

std::optional<bool> gguf_file::get_bool(std::string_view key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::boolean) wrong_type(key, *v, "a bool");
  return v->u != 0;
}

std::optional<std::vector<std::string_view>> gguf_file::get_string_array(std::string_view key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::array || v->elem_type != gguf_type::string) wrong_type(key, *v, "an array of strings");
  return v->strings;
}

std::optional<std::vector<float>> gguf_file::get_f32_array(std::string_view key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::array || v->elem_type != gguf_type::f32) wrong_type(key, *v, "an array of f32");
  std::vector<float> out(v->count);
  if (v->count) std::memcpy(out.data(), v->raw, v->count * sizeof(float));
  return out;
}

std::optional<std::vector<std::int32_t>> gguf_file::get_i32_array(std::string_view key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::array) wrong_type(key, *v, "an array of integers");
  std::vector<std::int32_t> out;
  out.reserve(v->count);
  for (std::uint64_t i = 0; i < v->count; ++i) {
    const std::int64_t x = int_element(key, *v, i);
    if (x < std::numeric_limits<std::int32_t>::min() || x > std::numeric_limits<std::int32_t>::max()) {
      wrong_type(key, *v, "32-bit integers");
    }
    out.push_back(static_cast<std::int32_t>(x));
  }
  return out;
}

std::optional<std::vector<bool>> gguf_file::get_bool_array(std::string_view key) const {
  const gguf_value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::array || v->elem_type != gguf_type::boolean) wrong_type(key, *v, "an array of bools");
  std::vector<bool> out;
  out.reserve(v->count);
  for (std::uint64_t i = 0; i < v->count; ++i) out.push_back(load<std::uint8_t>(v->raw + i) != 0);
  return out;
}

}  // namespace anvil::model

// GGUF v3 writer: metadata in insertion order, tensor infos with aligned offsets, then each
// tensor's bytes produced by its fill callback into one reusable buffer and streamed to disk.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>

#include "model/gguf/gguf.h"

namespace anvil::model {
namespace {

void append_bytes(std::vector<std::byte>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}
template <class T>
void append(std::vector<std::byte>& out, T v) {
  append_bytes(out, &v, sizeof v);
}
void append_string(std::vector<std::byte>& out, std::string_view s) {
  append<std::uint64_t>(out, s.size());
  append_bytes(out, s.data(), s.size());
}
std::size_t align_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

struct file_closer {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

void gguf_writer::put(std::string key, gguf_type type, std::vector<std::byte> payload) {
  for (auto& kv : kvs_) {
    if (kv.key == key) {
      kv.type = type;
      kv.payload = std::move(payload);
      return;
    }
  }
  kvs_.push_back({std::move(key), type, std::move(payload)});
}

void gguf_writer::set_u32(std::string key, std::uint32_t v) {
  std::vector<std::byte> p;
  append(p, v);
  put(std::move(key), gguf_type::u32, std::move(p));
}
void gguf_writer::set_i32(std::string key, std::int32_t v) {
  std::vector<std::byte> p;
  append(p, v);
  put(std::move(key), gguf_type::i32, std::move(p));
}
void gguf_writer::set_u64(std::string key, std::uint64_t v) {
  std::vector<std::byte> p;
  append(p, v);
  put(std::move(key), gguf_type::u64, std::move(p));
}
void gguf_writer::set_f32(std::string key, float v) {
  std::vector<std::byte> p;
  append(p, v);
  put(std::move(key), gguf_type::f32, std::move(p));
}
void gguf_writer::set_bool(std::string key, bool v) {
  std::vector<std::byte> p;
  append<std::uint8_t>(p, v ? 1 : 0);
  put(std::move(key), gguf_type::boolean, std::move(p));
}
void gguf_writer::set_string(std::string key, std::string v) {
  std::vector<std::byte> p;
  append_string(p, v);
  put(std::move(key), gguf_type::string, std::move(p));
}
void gguf_writer::set_strings(std::string key, std::vector<std::string> v) {
  std::vector<std::byte> p;
  append(p, static_cast<std::uint32_t>(gguf_type::string));
  append<std::uint64_t>(p, v.size());
  for (const auto& s : v) append_string(p, s);
  put(std::move(key), gguf_type::array, std::move(p));
}
void gguf_writer::set_f32s(std::string key, std::vector<float> v) {
  std::vector<std::byte> p;
  append(p, static_cast<std::uint32_t>(gguf_type::f32));
  append<std::uint64_t>(p, v.size());
  append_bytes(p, v.data(), v.size() * sizeof(float));
  put(std::move(key), gguf_type::array, std::move(p));
}
void gguf_writer::set_i32s(std::string key, std::vector<std::int32_t> v) {
  std::vector<std::byte> p;
  append(p, static_cast<std::uint32_t>(gguf_type::i32));
  append<std::uint64_t>(p, v.size());
  append_bytes(p, v.data(), v.size() * sizeof(std::int32_t));
  put(std::move(key), gguf_type::array, std::move(p));
}
void gguf_writer::set_bools(std::string key, const std::vector<bool>& v) {
  std::vector<std::byte> p;
  append(p, static_cast<std::uint32_t>(gguf_type::boolean));
  append<std::uint64_t>(p, v.size());
  for (const bool b : v) append<std::uint8_t>(p, b ? 1 : 0);
  put(std::move(key), gguf_type::array, std::move(p));
}
void gguf_writer::set_raw(std::string key, gguf_type type, std::vector<std::byte> payload) {
  put(std::move(key), type, std::move(payload));
}

void gguf_writer::set_alignment(std::uint32_t a) {
  if (a == 0 || !std::has_single_bit(a)) throw std::invalid_argument("GGUF alignment must be a power of two");
  alignment_ = a;
  set_u32("general.alignment", a);
}

void gguf_writer::add_tensor(std::string name, ggml_type type, std::vector<std::int64_t> dims, fill_fn fill) {
  if (dims.empty() || dims.size() > 4) throw std::invalid_argument("tensor '" + name + "': 1 to 4 dimensions");
  std::int64_t rows = 1;
  for (std::size_t d = 1; d < dims.size(); ++d) {
    if (dims[d] <= 0) throw std::invalid_argument("tensor '" + name + "': dimensions must be positive");
    rows *= dims[d];
  }
  const auto row = row_bytes(type, dims[0]);
  if (dims[0] <= 0 || !row) throw std::invalid_argument("tensor '" + name + "': bad row length for its type");
  const std::size_t nbytes = *row * static_cast<std::size_t>(rows);
  tensors_.push_back({std::move(name), type, std::move(dims), nbytes, std::move(fill)});
}

void gguf_writer::add_tensor(std::string name, ggml_type type, std::vector<std::int64_t> dims, std::vector<std::byte> data) {
  auto shared = std::make_shared<std::vector<std::byte>>(std::move(data));
  add_tensor(std::move(name), type, std::move(dims), [shared](std::span<std::byte> dst) {
    if (dst.size() != shared->size()) throw std::invalid_argument("tensor data has the wrong size");
    std::memcpy(dst.data(), shared->data(), dst.size());
  });
  if (tensors_.back().nbytes != shared->size()) {
    const std::string n = tensors_.back().name;
    tensors_.pop_back();
    throw std::invalid_argument("tensor '" + n + "': " + std::to_string(shared->size()) + " bytes of data for a shape that needs a different size");
  }
}

void gguf_writer::write(const std::string& path, const std::function<void(std::size_t, std::size_t)>& progress) const {
  std::vector<std::byte> header;
  append<std::uint32_t>(header, 0x46554747);
  append<std::uint32_t>(header, 3);
  append<std::uint64_t>(header, tensors_.size());
  append<std::uint64_t>(header, kvs_.size());
  for (const auto& kv : kvs_) {
    append_string(header, kv.key);
    append(header, static_cast<std::uint32_t>(kv.type));
    header.insert(header.end(), kv.payload.begin(), kv.payload.end());
  }
  std::size_t offset = 0, total = 0;
  for (const auto& t : tensors_) {
    append_string(header, t.name);
    append<std::uint32_t>(header, static_cast<std::uint32_t>(t.dims.size()));
    for (auto d : t.dims) append<std::uint64_t>(header, static_cast<std::uint64_t>(d));
    append(header, static_cast<std::uint32_t>(t.type));
    append<std::uint64_t>(header, offset);
    offset = align_up(offset + t.nbytes, alignment_);
    total += t.nbytes;
  }
  header.resize(align_up(header.size(), alignment_), std::byte{0});

  std::unique_ptr<std::FILE, file_closer> f(std::fopen(path.c_str(), "wb"));
  if (!f) throw model_error("cannot write '" + path + "': " + std::strerror(errno));
  auto put_bytes = [&](const void* p, std::size_t n) {
    if (n && std::fwrite(p, 1, n, f.get()) != n) throw model_error("writing '" + path + "' failed: " + std::strerror(errno));
  };
  put_bytes(header.data(), header.size());
  std::vector<std::byte> buf;
  std::size_t done = 0;
  for (const auto& t : tensors_) {
    buf.assign(align_up(t.nbytes, alignment_), std::byte{0});
    t.fill(std::span<std::byte>(buf.data(), t.nbytes));
    put_bytes(buf.data(), buf.size());
    done += t.nbytes;
    if (progress) progress(done, total);
  }
  if (std::fflush(f.get()) != 0) throw model_error("writing '" + path + "' failed: " + std::strerror(errno));
}

}  // namespace anvil::model

// Validating GGUF reader. Every length, count and offset read from the file is checked against
// the bytes that remain before it is used, so a hostile file can neither read out of bounds nor
// make us allocate more than a small multiple of its own size.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "model/gguf/gguf.h"

namespace anvil::model {

struct gguf_file::mapping {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  ~mapping() {
    if (data) munmap(const_cast<std::byte*>(data), size);
  }
};

namespace {

constexpr std::uint32_t gguf_magic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr std::size_t max_dims = 4;               // GGML_MAX_DIMS
constexpr std::size_t max_tensor_name = 63;       // GGML_MAX_NAME - 1

std::size_t scalar_size(gguf_type t) {
  switch (t) {
    case gguf_type::u8: case gguf_type::i8: case gguf_type::boolean: return 1;
    case gguf_type::u16: case gguf_type::i16: return 2;
    case gguf_type::u32: case gguf_type::i32: case gguf_type::f32: return 4;
    case gguf_type::u64: case gguf_type::i64: case gguf_type::f64: return 8;
    default: return 0;
  }
}

bool known_type(std::uint32_t t) { return t <= static_cast<std::uint32_t>(gguf_type::f64); }

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

}  // namespace

std::string_view gguf_type_name(gguf_type t) {
  static constexpr std::string_view names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                               "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<std::uint32_t>(t);
  return i < std::size(names) ? names[i] : "unknown";
}

class gguf_parser {
 public:
  gguf_parser(gguf_file& f) : f_(f), b_(f.bytes_) {}

  void run() {
    const std::uint32_t magic = read<std::uint32_t>("magic");
    if (magic != gguf_magic) fail("not a GGUF file (bad magic)");
    f_.version_ = read<std::uint32_t>("version");
    if (f_.version_ != 2 && f_.version_ != 3) {
      fail("unsupported GGUF version " + std::to_string(f_.version_) + " (anvil reads versions 2 and 3)");
    }
    const std::uint64_t n_tensors = read<std::uint64_t>("tensor count");
    const std::uint64_t n_kv = read<std::uint64_t>("metadata count");
    // Smallest encodings: a key/value is 8 (key length) + 4 (type) + 1 bytes; a tensor info is
    // 8 (name length) + 4 (dims) + 8 (one dim) + 4 (type) + 8 (offset) bytes.
    if (n_kv > remaining() / 13) fail("metadata count " + std::to_string(n_kv) + " cannot fit in the file");
    if (n_tensors > remaining() / 32) fail("tensor count " + std::to_string(n_tensors) + " cannot fit in the file");

    read_metadata(n_kv);
    read_alignment();
    read_tensor_infos(n_tensors);
    place_data();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw model_error("GGUF: " + what + " (at byte " + std::to_string(pos_) + ")");
  }
  std::size_t remaining() const { return b_.size() - pos_; }
  void need(std::uint64_t n, const char* what) const {
    if (n > remaining()) {
      fail(std::string(what) + " needs " + std::to_string(n) + " bytes, only " + std::to_string(remaining()) +
           " remain");
    }
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view read_string(const char* what) {
    const std::uint64_t len = read<std::uint64_t>(what);
    need(len, what);
    std::string_view s(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return s;
  }

  void read_metadata(std::uint64_t n_kv) {
    std::unordered_set<std::string_view> seen;
    f_.kvs_.reserve(n_kv);
    for (std::uint64_t i = 0; i < n_kv; ++i) {
      gguf_kv kv;
      kv.key = read_string("metadata key");
      if (kv.key.empty()) fail("metadata key " + std::to_string(i) + " is empty");
      if (!seen.insert(kv.key).second) fail("duplicate metadata key '" + std::string(kv.key) + "'");
      const std::uint32_t type = read<std::uint32_t>("metadata type");
      if (!known_type(type)) fail("metadata '" + std::string(kv.key) + "' has unknown type " + std::to_string(type));
      kv.value = read_value(static_cast<gguf_type>(type), kv.key);
      f_.kvs_.push_back(std::move(kv));
    }
  }

  gguf_value read_value(gguf_type type, std::string_view key) {
    gguf_value v;
    v.type = type;
    switch (type) {
      case gguf_type::u8: v.u = read<std::uint8_t>("u8"); break;
      case gguf_type::u16: v.u = read<std::uint16_t>("u16"); break;
      case gguf_type::u32: v.u = read<std::uint32_t>("u32"); break;
      case gguf_type::u64: v.u = read<std::uint64_t>("u64"); break;
      case gguf_type::i8: v.i = read<std::int8_t>("i8"); break;
      case gguf_type::i16: v.i = read<std::int16_t>("i16"); break;
      case gguf_type::i32: v.i = read<std::int32_t>("i32"); break;
      case gguf_type::i64: v.i = read<std::int64_t>("i64"); break;
      case gguf_type::f32: v.f = read<float>("f32"); break;
      case gguf_type::f64: v.f = read<double>("f64"); break;
      case gguf_type::boolean: {
        const std::uint8_t b = read<std::uint8_t>("bool");
        if (b > 1) fail("metadata '" + std::string(key) + "': bool value " + std::to_string(b) + " is not 0 or 1");
        v.u = b;
        break;
      }
      case gguf_type::string: v.str = read_string("string value"); break;
      case gguf_type::array: read_array(v, key); break;
    }
    return v;
  }

  void read_array(gguf_value& v, std::string_view key) {
    const std::uint32_t elem = read<std::uint32_t>("array element type");
    if (!known_type(elem)) fail("metadata '" + std::string(key) + "': array of unknown type " + std::to_string(elem));
    v.elem_type = static_cast<gguf_type>(elem);
    if (v.elem_type == gguf_type::array) fail("metadata '" + std::string(key) + "': nested arrays are not supported");
    v.count = read<std::uint64_t>("array length");
    if (v.elem_type == gguf_type::string) {
      if (v.count > remaining() / 8) fail("metadata '" + std::string(key) + "': array of " + std::to_string(v.count) + " strings cannot fit in the file");
      v.strings.reserve(v.count);
      for (std::uint64_t i = 0; i < v.count; ++i) v.strings.push_back(read_string("string array element"));
      return;
    }
    const std::size_t size = scalar_size(v.elem_type);
    if (v.count > remaining() / size) fail("metadata '" + std::string(key) + "': array of " + std::to_string(v.count) + " elements runs past the end of the file");
    v.raw = b_.data() + pos_;
    if (v.elem_type == gguf_type::boolean) {
      for (std::uint64_t i = 0; i < v.count; ++i) {
        if (std::to_integer<std::uint8_t>(v.raw[i]) > 1) fail("metadata '" + std::string(key) + "': bool array element is not 0 or 1");
      }
    }
    pos_ += v.count * size;
  }

  void read_alignment() {
    const gguf_value* a = f_.find("general.alignment");
    if (!a) return;
    if (a->type != gguf_type::u32) fail("general.alignment must be a u32, not " + std::string(gguf_type_name(a->type)));
    if (a->u == 0 || !std::has_single_bit(a->u)) fail("general.alignment " + std::to_string(a->u) + " is not a power of two");
    f_.alignment_ = a->u;
  }

  void read_tensor_infos(std::uint64_t n_tensors) {
    std::unordered_set<std::string_view> seen;
    f_.tensors_.reserve(n_tensors);
    for (std::uint64_t i = 0; i < n_tensors; ++i) {
      gguf_tensor t;
      t.name = read_string("tensor name");
      const std::string name(t.name);
      if (t.name.empty()) fail("tensor " + std::to_string(i) + " has an empty name");
      if (t.name.size() > max_tensor_name) fail("tensor name '" + name.substr(0, 80) + "' is longer than 63 bytes");
      if (!seen.insert(t.name).second) fail("duplicate tensor name '" + name + "'");
      const std::uint32_t n_dims = read<std::uint32_t>("tensor dimension count");
      if (n_dims == 0 || n_dims > max_dims) fail("tensor '" + name + "' has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
      std::uint64_t n_elements = 1;
      for (std::uint32_t d = 0; d < n_dims; ++d) {
        const std::uint64_t dim = read<std::uint64_t>("tensor dimension");
        if (dim == 0 || dim > std::uint64_t(std::numeric_limits<std::int64_t>::max())) fail("tensor '" + name + "': dimension " + std::to_string(d) + " is " + std::to_string(dim));
        if (!checked_mul(n_elements, dim, n_elements) || n_elements > std::uint64_t(std::numeric_limits<std::int64_t>::max())) {
          fail("tensor '" + name + "': the element count overflows");
        }
        t.dims.push_back(static_cast<std::int64_t>(dim));
      }
      t.n_elements = static_cast<std::int64_t>(n_elements);
      const std::uint32_t type = read<std::uint32_t>("tensor type");
      const type_info* ti = find_type(type);
      if (!ti) fail("tensor '" + name + "' has unknown type " + std::to_string(type));
      t.type = static_cast<ggml_type>(type);
      if (t.dims[0] % ti->block_elems != 0) {
        fail("tensor '" + name + "': row length " + std::to_string(t.dims[0]) + " is not a multiple of the " +
             std::string(ti->name) + " block (" + std::to_string(ti->block_elems) + ")");
      }
      const auto row = row_bytes(t.type, t.dims[0]);
      if (!row) fail("tensor '" + name + "': its size overflows");
      std::uint64_t nbytes = 0;
      if (!checked_mul(*row, n_elements / std::uint64_t(t.dims[0]), nbytes)) fail("tensor '" + name + "': its size overflows");
      t.nbytes = nbytes;
      t.offset = read<std::uint64_t>("tensor offset");
      if (t.offset % f_.alignment_ != 0) fail("tensor '" + name + "': offset " + std::to_string(t.offset) + " is not a multiple of the alignment " + std::to_string(f_.alignment_));
      f_.tensors_.push_back(std::move(t));
    }
  }

  void place_data() {
    const std::size_t a = f_.alignment_;
    const std::size_t data = (pos_ + a - 1) / a * a;
    f_.data_offset_ = data;
    if (f_.tensors_.empty()) return;
    if (data > b_.size()) fail("the tensor data section starts past the end of the file");
    const std::size_t data_size = b_.size() - data;
    for (gguf_tensor& t : f_.tensors_) {
      if (t.offset > data_size || t.nbytes > data_size - t.offset) {
        fail("tensor '" + std::string(t.name) + "': data [" + std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
             ") runs past the end of the file (data section holds " + std::to_string(data_size) + " bytes)");
      }
      t.data = b_.data() + data + t.offset;
    }
    std::vector<const gguf_tensor*> by_offset;
    for (const auto& t : f_.tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* x, auto* y) { return x->offset < y->offset; });
    for (std::size_t i = 1; i < by_offset.size(); ++i) {
      const gguf_tensor& prev = *by_offset[i - 1];
      if (by_offset[i]->offset < prev.offset + prev.nbytes) {
        fail("tensors '" + std::string(prev.name) + "' and '" + std::string(by_offset[i]->name) + "' overlap");
      }
    }
  }

  gguf_file& f_;
  std::span<const std::byte> b_;
  std::size_t pos_ = 0;
};

gguf_file gguf_file::parse(std::span<const std::byte> bytes) {
  gguf_file f;
  f.bytes_ = bytes;
  gguf_parser(f).run();
  return f;
}

gguf_file gguf_file::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw model_error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw model_error("'" + path + "' is not a regular file");
  }
  auto m = std::make_shared<mapping>();
  m->size = static_cast<std::size_t>(st.st_size);
  if (m->size == 0) {
    ::close(fd);
    throw model_error("'" + path + "' is empty");
  }
  void* p = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw model_error("cannot map '" + path + "': " + std::strerror(errno));
  m->data = static_cast<const std::byte*>(p);
  try {
    gguf_file f = parse({m->data, m->size});
    f.map_ = std::move(m);
    return f;
  } catch (const model_error& e) {
    throw model_error(path + ": " + e.what());
  }
}

const gguf_value* gguf_file::find(std::string_view key) const {
  for (const auto& kv : kvs_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

const gguf_tensor* gguf_file::find_tensor(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace anvil::model

// GGUF reader and writer: round trips, typed getters, and malformed files that must each get a
// clear model_error (the hostile corpus and the fuzzer live with the reliability suites).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/gguf/gguf.h"
#include "tests/scratch_dir.h"

namespace {

using namespace anvil::model;

// Little-endian GGUF bytes built field by field, for files the writer would never produce.
struct raw_gguf {
  std::vector<std::byte> b;
  template <class T>
  raw_gguf& put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  raw_gguf& str(std::string_view s) {
    put<std::uint64_t>(s.size());
    for (char c : s) b.push_back(std::byte(c));
    return *this;
  }
  raw_gguf& header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = 3) {
    return put<std::uint32_t>(0x46554747).put(version).put(n_tensors).put(n_kv);
  }
  raw_gguf& pad_to(std::size_t a) {
    while (b.size() % a) b.push_back(std::byte{0});
    return *this;
  }
  raw_gguf& zeros(std::size_t n) {
    b.insert(b.end(), n, std::byte{0});
    return *this;
  }
};

std::string parse_error(const std::vector<std::byte>& bytes) {
  try {
    gguf_file::parse(bytes);
  } catch (const model_error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_PARSE_ERROR(bytes, needle)                                  \
  do {                                                                     \
    const std::string err_ = parse_error(bytes);                           \
    EXPECT_NE(err_.find(needle), std::string::npos) << "error was: '" << err_ << "'"; \
  } while (0)

std::filesystem::path temp_path(const std::string& name) {
  return anvil::testing::scratch_dir() / name;
}

std::vector<std::byte> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

TEST(GgufWriter, RoundTripsMetadataAndTensors) {
  gguf_writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_i32("neg", -7);
  w.set_u64("big", 1ull << 40);
  w.set_f32("llama.rope.freq_base", 500000.f);
  w.set_bool("flag", true);
  w.set_strings("tokenizer.ggml.tokens", {"a", "", "hello world", "\xe2\x96\x81"});
  w.set_f32s("scores", {0.5f, -1.f});
  w.set_i32s("types", {1, 3, 6});
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  std::vector<std::byte> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  w.add_tensor("t0", ggml_type::F32, {3, 2}, bytes);
  w.add_tensor("t1", ggml_type::F32, {5}, [](std::span<std::byte> dst) {
    for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = std::byte(i);
  });
  const auto path = temp_path("roundtrip.gguf");
  w.write(path.string());

  const gguf_file f = gguf_file::open(path.string());
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_uint("llama.block_count"), 2u);
  EXPECT_EQ(f.get_int("neg"), -7);
  EXPECT_EQ(f.get_uint("big"), 1ull << 40);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 500000.0);
  EXPECT_EQ(f.get_bool("flag"), true);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens"),
            (std::vector<std::string_view>{"a", "", "hello world", "\xe2\x96\x81"}));
  EXPECT_EQ(f.get_f32_array("scores"), (std::vector<float>{0.5f, -1.f}));
  EXPECT_EQ(f.get_i32_array("types"), (std::vector<std::int32_t>{1, 3, 6}));
  EXPECT_FALSE(f.get_string("absent").has_value());

  ASSERT_EQ(f.tensors().size(), 2u);
  const gguf_tensor* t0 = f.find_tensor("t0");
  ASSERT_NE(t0, nullptr);
  EXPECT_EQ(t0->dims, (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(t0->n_elements, 6);
  EXPECT_EQ(t0->rows(), 2);
  EXPECT_EQ(std::memcmp(t0->data, values.data(), 24), 0);
  const gguf_tensor* t1 = f.find_tensor("t1");
  ASSERT_NE(t1, nullptr);
  EXPECT_EQ(t1->offset % f.alignment(), 0u);
  EXPECT_EQ(std::to_integer<int>(t1->data[19]), 19);
  EXPECT_EQ((f.data_offset() + t1->offset) % 32, 0u);
  std::filesystem::remove(path);
}

TEST(GgufWriter, HonoursACustomAlignment) {
  gguf_writer w;
  w.set_alignment(64);
  w.add_tensor("a", ggml_type::F32, {3}, std::vector<std::byte>(12));
  w.add_tensor("b", ggml_type::F32, {1}, std::vector<std::byte>(4));
  const auto path = temp_path("align.gguf");
  w.write(path.string());
  const gguf_file f = gguf_file::open(path.string());
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.find_tensor("b")->offset, 64u);
  std::filesystem::remove(path);
  EXPECT_THROW(w.set_alignment(48), std::invalid_argument);
}

TEST(GgufWriter, RefusesDataOfTheWrongSize) {
  gguf_writer w;
  EXPECT_THROW(w.add_tensor("a", ggml_type::F32, {3}, std::vector<std::byte>(11)), std::invalid_argument);
  EXPECT_THROW(w.add_tensor("q", ggml_type::Q8_0, {33}, std::vector<std::byte>(34)), std::invalid_argument);
  EXPECT_EQ(w.tensor_count(), 0u);
}

TEST(GgufReader, ReadsVersion2) {
  raw_gguf r;
  r.header(0, 1, 2).str("k").put<std::uint32_t>(4).put<std::uint32_t>(9);
  const gguf_file f = gguf_file::parse(r.b);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_EQ(f.get_uint("k"), 9u);
}

TEST(GgufReader, TypedGettersRefuseTheWrongType) {
  raw_gguf r;
  r.header(0, 3).str("s").put<std::uint32_t>(8).str("text");
  r.str("n").put<std::uint32_t>(5).put<std::int32_t>(-1);
  r.str("a").put<std::uint32_t>(9).put<std::uint32_t>(8).put<std::uint64_t>(1).str("x");
  const gguf_file f = gguf_file::parse(r.b);
  EXPECT_THROW(f.get_uint("s"), model_error);
  EXPECT_THROW(f.get_uint("n"), model_error);  // negative
  EXPECT_EQ(f.get_int("n"), -1);
  EXPECT_THROW(f.get_f32_array("a"), model_error);
  EXPECT_THROW(f.get_string("a"), model_error);
  try {
    f.get_bool("s");
  } catch (const model_error& e) {
    EXPECT_NE(std::string(e.what()).find("'s' is string, expected a bool"), std::string::npos) << e.what();
  }
}

TEST(GgufReader, RejectsBadMagicAndVersions) {
  raw_gguf bad_magic;
  bad_magic.put<std::uint32_t>(0x46554746).put<std::uint32_t>(3).put<std::uint64_t>(0).put<std::uint64_t>(0);
  EXPECT_PARSE_ERROR(bad_magic.b, "bad magic");
  for (std::uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    raw_gguf r;
    r.header(0, 0, v);
    EXPECT_PARSE_ERROR(r.b, "unsupported GGUF version " + std::to_string(v));
  }
  EXPECT_PARSE_ERROR(std::vector<std::byte>(3), "magic needs 4 bytes");
}

TEST(GgufReader, RejectsCountsThatCannotFit) {
  raw_gguf kv;
  kv.header(0, 1ull << 62);
  EXPECT_PARSE_ERROR(kv.b, "metadata count");
  raw_gguf t;
  t.header(~0ull, 0);
  EXPECT_PARSE_ERROR(t.b, "tensor count");
}

TEST(GgufReader, RejectsLengthsPastTheEnd) {
  raw_gguf key;
  key.header(0, 1).put<std::uint64_t>(1000).zeros(8);
  EXPECT_PARSE_ERROR(key.b, "metadata key needs 1000 bytes");
  raw_gguf val;
  val.header(0, 1).str("k").put<std::uint32_t>(8).put<std::uint64_t>(~0ull);
  EXPECT_PARSE_ERROR(val.b, "string value needs");
  raw_gguf arr;
  arr.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(6).put<std::uint64_t>(1ull << 61).zeros(16);
  EXPECT_PARSE_ERROR(arr.b, "runs past the end");
  raw_gguf strs;
  strs.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(8).put<std::uint64_t>(1ull << 40);
  EXPECT_PARSE_ERROR(strs.b, "cannot fit");
}

TEST(GgufReader, RejectsMalformedValues) {
  raw_gguf nested;
  nested.header(0, 1).str("k").put<std::uint32_t>(9).put<std::uint32_t>(9).put<std::uint64_t>(1);
  EXPECT_PARSE_ERROR(nested.b, "nested arrays");
  raw_gguf unknown;
  unknown.header(0, 1).str("k").put<std::uint32_t>(13).zeros(8);
  EXPECT_PARSE_ERROR(unknown.b, "unknown type 13");
  raw_gguf boolean;
  boolean.header(0, 1).str("k").put<std::uint32_t>(7).put<std::uint8_t>(2);
  EXPECT_PARSE_ERROR(boolean.b, "not 0 or 1");
  raw_gguf dup;
  dup.header(0, 2).str("k").put<std::uint32_t>(0).put<std::uint8_t>(1).str("k").put<std::uint32_t>(0).put<std::uint8_t>(2);
  EXPECT_PARSE_ERROR(dup.b, "duplicate metadata key 'k'");
  raw_gguf empty_key;
  empty_key.header(0, 1).str("").put<std::uint32_t>(0).put<std::uint8_t>(1);
  EXPECT_PARSE_ERROR(empty_key.b, "empty");
}

TEST(GgufReader, RejectsBadAlignment) {
  for (std::uint32_t a : {0u, 3u, 48u}) {
    raw_gguf r;
    r.header(0, 1).str("general.alignment").put<std::uint32_t>(4).put<std::uint32_t>(a);
    EXPECT_PARSE_ERROR(r.b, "not a power of two");
  }
  raw_gguf wrong;
  wrong.header(0, 1).str("general.alignment").put<std::uint32_t>(10).put<std::uint64_t>(32);
  EXPECT_PARSE_ERROR(wrong.b, "general.alignment must be a u32");
}

// One tensor info after an empty metadata section; data follows at offset 32.
raw_gguf one_tensor(std::string_view name, std::vector<std::uint64_t> dims, std::uint32_t type, std::uint64_t offset,
                    std::size_t data_bytes) {
  raw_gguf r;
  r.header(1, 0).str(name).put<std::uint32_t>(static_cast<std::uint32_t>(dims.size()));
  for (auto d : dims) r.put(d);
  r.put(type).put(offset).pad_to(32).zeros(data_bytes);
  return r;
}

TEST(GgufReader, AcceptsAWellFormedTensor) {
  const raw_gguf r = one_tensor("w", {4, 2}, 0, 0, 32);
  const gguf_file f = gguf_file::parse(r.b);
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors()[0].nbytes, 32u);
}

TEST(GgufReader, RejectsBadTensorInfos) {
  EXPECT_PARSE_ERROR(one_tensor("w", {}, 0, 0, 0).b, "has 0 dimensions");
  EXPECT_PARSE_ERROR(one_tensor("w", {1, 1, 1, 1, 1}, 0, 0, 4).b, "has 5 dimensions");
  EXPECT_PARSE_ERROR(one_tensor("w", {4, 0}, 0, 0, 0).b, "dimension 1 is 0");
  EXPECT_PARSE_ERROR(one_tensor("w", {1ull << 32, 1ull << 32}, 0, 0, 0).b, "element count overflows");
  EXPECT_PARSE_ERROR(one_tensor("w", {1ull << 63, 1}, 0, 0, 0).b, "dimension 0 is");
  EXPECT_PARSE_ERROR(one_tensor("w", {4}, 4, 0, 16).b, "unknown type 4");
  EXPECT_PARSE_ERROR(one_tensor("w", {4}, 99, 0, 16).b, "unknown type 99");
  EXPECT_PARSE_ERROR(one_tensor("w", {33}, 8, 0, 64).b, "not a multiple of the Q8_0 block");
  EXPECT_PARSE_ERROR(one_tensor("w", {4}, 0, 16, 64).b, "not a multiple of the alignment");
  EXPECT_PARSE_ERROR(one_tensor("w", {4}, 0, 64, 32).b, "runs past the end");
  EXPECT_PARSE_ERROR(one_tensor("w", {8}, 0, 0, 31).b, "runs past the end");  // one byte short
  EXPECT_PARSE_ERROR(one_tensor("", {4}, 0, 0, 16).b, "empty name");
  EXPECT_PARSE_ERROR(one_tensor(std::string(64, 'x'), {4}, 0, 0, 16).b, "longer than 63 bytes");
  EXPECT_PARSE_ERROR(one_tensor("w", {1ull << 62}, 0, 0, 0).b, "size overflows");               // 2^62 floats
  EXPECT_PARSE_ERROR(one_tensor("w", {1ull << 40, 1ull << 21}, 12, 0, 0).b, "runs past the end");
}

TEST(GgufReader, RejectsDuplicateAndOverlappingTensors) {
  auto two = [](std::string_view a, std::string_view b, std::uint64_t off_b) {
    raw_gguf r;
    r.header(2, 0);
    r.str(a).put<std::uint32_t>(1).put<std::uint64_t>(16).put<std::uint32_t>(0).put<std::uint64_t>(0);
    r.str(b).put<std::uint32_t>(1).put<std::uint64_t>(16).put<std::uint32_t>(0).put<std::uint64_t>(off_b);
    r.pad_to(32).zeros(256);
    return r.b;
  };
  EXPECT_PARSE_ERROR(two("a", "a", 64), "duplicate tensor name 'a'");
  EXPECT_PARSE_ERROR(two("a", "b", 32), "overlap");
  EXPECT_EQ(parse_error(two("a", "b", 64)), "");
}

TEST(GgufReader, ReportsMissingAndEmptyFiles) {
  try {
    gguf_file::open("/nonexistent/model.gguf");
    ADD_FAILURE();
  } catch (const model_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open '/nonexistent/model.gguf'"), std::string::npos);
  }
  const auto path = temp_path("empty.gguf");
  std::ofstream(path).close();
  EXPECT_THROW(gguf_file::open(path.string()), model_error);
  std::filesystem::remove(path);
}

TEST(GgufReader, EveryTruncationOfAValidFileIsRejectedCleanly) {
  gguf_writer w;
  w.set_string("general.architecture", "llama");
  w.set_strings("tokens", {"a", "bc"});
  w.add_tensor("t", ggml_type::F32, {4}, std::vector<std::byte>(16));
  const auto path = temp_path("trunc.gguf");
  w.write(path.string());
  const std::vector<std::byte> full = read_all(path);
  std::filesystem::remove(path);
  const gguf_file f = gguf_file::parse(full);
  // Every byte up to the end of the last tensor's data matters (the padding after it does not).
  const std::size_t end = f.data_offset() + f.tensors()[0].offset + f.tensors()[0].nbytes;
  ASSERT_LE(end, full.size());
  for (std::size_t n = 0; n < end; ++n) {
    const std::vector<std::byte> cut(full.begin(), full.begin() + std::ptrdiff_t(n));
    EXPECT_NE(parse_error(cut), "") << "a file cut to " << n << " bytes was accepted";
  }
}

}  // namespace

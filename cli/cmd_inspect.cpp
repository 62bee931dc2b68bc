// `anvil inspect FILE`: a GGUF file's metadata and tensors, in the manner of gguf-dump.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <boost/json.hpp>

#include "cli/commands.h"
#include "model/gguf/gguf.h"

namespace anvil::cli {
namespace {

using namespace anvil::model;

std::string quoted(std::string_view s, std::size_t max = 60) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const char c = s[i];
    if (c == '\n') {
      out += "\\n";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
  }
  return out + (s.size() > max ? "\"..." : "\"");
}

std::string scalar_text(const gguf_value& v) {
  switch (v.type) {
    case gguf_type::u8: case gguf_type::u16: case gguf_type::u32: case gguf_type::u64: return std::to_string(v.u);
    case gguf_type::i8: case gguf_type::i16: case gguf_type::i32: case gguf_type::i64: return std::to_string(v.i);
    case gguf_type::f32: case gguf_type::f64: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", v.f);
      return buf;
    }
    case gguf_type::boolean: return v.u ? "true" : "false";
    case gguf_type::string: return quoted(v.str);
    case gguf_type::array: break;
  }
  return "";
}

std::string value_text(const gguf_value& v) {
  if (v.type != gguf_type::array) return scalar_text(v);
  std::string out = "[" + std::string(gguf_type_name(v.elem_type)) + " x " + std::to_string(v.count) + "]";
  if (v.elem_type == gguf_type::string) {
    out += " ";
    for (std::size_t i = 0; i < v.strings.size() && i < 5; ++i) out += (i ? ", " : "") + quoted(v.strings[i], 20);
    if (v.strings.size() > 5) out += ", ...";
  }
  return out;
}

// Numeric array element i as JSON (all integer and float element types).
boost::json::value array_element(const gguf_value& v, std::size_t i) {
  auto load = [&](auto tag) {
    decltype(tag) x;
    std::memcpy(&x, v.raw + i * sizeof x, sizeof x);
    return x;
  };
  switch (v.elem_type) {
    case gguf_type::u8: return load(std::uint8_t{});
    case gguf_type::i8: return load(std::int8_t{});
    case gguf_type::u16: return load(std::uint16_t{});
    case gguf_type::i16: return load(std::int16_t{});
    case gguf_type::u32: return load(std::uint32_t{});
    case gguf_type::i32: return load(std::int32_t{});
    case gguf_type::u64: return load(std::uint64_t{});
    case gguf_type::i64: return load(std::int64_t{});
    case gguf_type::f32: return load(float{});
    case gguf_type::f64: return load(double{});
    case gguf_type::boolean: return load(std::uint8_t{}) != 0;
    default: return nullptr;
  }
}

boost::json::value json_value(const gguf_value& v) {
  switch (v.type) {
    case gguf_type::u8: case gguf_type::u16: case gguf_type::u32: case gguf_type::u64: return v.u;
    case gguf_type::i8: case gguf_type::i16: case gguf_type::i32: case gguf_type::i64: return v.i;
    case gguf_type::f32: case gguf_type::f64: return v.f;
    case gguf_type::boolean: return v.u != 0;
    case gguf_type::string: return boost::json::string(v.str);
    case gguf_type::array: {
      boost::json::array a;
      if (v.elem_type == gguf_type::string) {
        for (auto s : v.strings) a.emplace_back(boost::json::string(s));
      } else {
        for (std::size_t i = 0; i < v.count; ++i) a.push_back(array_element(v, i));
      }
      return a;
    }
  }
  return nullptr;
}

// The whole file as JSON: what tests compare against other GGUF readers.
int run_inspect_json(const std::string& path, const std::string& out) {
  const gguf_file f = gguf_file::open(path);
  boost::json::object root, meta;
  root["version"] = f.version();
  root["alignment"] = f.alignment();
  for (const auto& kv : f.metadata()) meta[kv.key] = json_value(kv.value);
  root["metadata"] = std::move(meta);
  boost::json::array tensors;
  for (const auto& t : f.tensors()) {
    boost::json::array shape;
    for (auto d : t.dims) shape.push_back(d);
    tensors.push_back({{"name", t.name}, {"type", info(t.type).name}, {"type_id", static_cast<std::uint32_t>(t.type)},
                       {"shape", shape}, {"offset", t.offset}, {"bytes", t.nbytes}});
  }
  root["tensors"] = std::move(tensors);
  const std::string text = boost::json::serialize(root);
  if (out.empty() || out == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  } else {
    std::ofstream(out) << text << '\n';
  }
  return 0;
}

int run_inspect(const std::string& path) {
  const gguf_file f = gguf_file::open(path);
  std::printf("%s: GGUF v%u, %zu metadata entries, %zu tensors, alignment %zu, data at byte %zu, %zu bytes\n",
              path.c_str(), f.version(), f.metadata().size(), f.tensors().size(), f.alignment(), f.data_offset(),
              f.file_size());
  std::printf("\nmetadata:\n");
  for (const auto& kv : f.metadata()) {
    std::printf("  %-45s %-7s %s\n", std::string(kv.key).c_str(), std::string(gguf_type_name(kv.value.type)).c_str(),
                value_text(kv.value).c_str());
  }
  std::printf("\ntensors:\n");
  std::size_t total = 0;
  for (const auto& t : f.tensors()) {
    std::string shape;
    for (std::size_t i = 0; i < t.dims.size(); ++i) shape += (i ? " x " : "") + std::to_string(t.dims[i]);
    std::printf("  %-36s %-6s %-22s offset %-12llu %12zu bytes\n", std::string(t.name).c_str(),
                std::string(info(t.type).name).c_str(), shape.c_str(), static_cast<unsigned long long>(t.offset), t.nbytes);
    total += t.nbytes;
  }
  std::printf("\n%zu tensors, %.3f GB of weights\n", f.tensors().size(), double(total) / 1e9);
  return 0;
}

}  // namespace

void add_inspect_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("inspect", "print a GGUF file's metadata and tensors");
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<std::string>();
  cmd->add_option("file", *path, "GGUF file")->required();
  cmd->add_option("--json", *json_out, "write everything (all metadata values, all tensors) as JSON to this file, - for stdout");
  cmd->callback([&exit_code, path, json_out] {
    exit_code = json_out->empty() ? run_inspect(*path) : run_inspect_json(*path, *json_out);
  });
}

}  // namespace anvil::cli

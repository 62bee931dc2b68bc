// The PyTorch goldens of the reference models (tests/data/reference/, made on the GPU machine by
// tools/reference/make_model_goldens.py): each architecture's two prompts, PyTorch's 64 greedy
// tokens for the first, and the float32 logits of every position of both; and the relative L2
// distance the suites compare logits by.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/json.hpp>

namespace anvil::model::testing {

struct golden {
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::int32_t> greedy;
  std::vector<float> logits;  // every position of every prompt, prompt after prompt
};

// `dir` holds ref-ARCH.json and ref-ARCH.logits.f32.
inline golden read_golden(const std::string& dir, const std::string& arch) {
  namespace json = boost::json;
  std::ifstream js(dir + "ref-" + arch + ".json");
  if (!js) throw std::runtime_error("missing golden " + dir + "ref-" + arch + ".json");
  std::stringstream ss;
  ss << js.rdbuf();
  const json::object o = json::parse(ss.str()).as_object();
  golden g;
  for (const auto& p : o.at("prompts").as_array()) g.prompts.push_back(json::value_to<std::vector<std::int32_t>>(p));
  g.greedy = json::value_to<std::vector<std::int32_t>>(o.at("greedy"));
  std::ifstream bin(dir + "ref-" + arch + ".logits.f32", std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(bin)), std::istreambuf_iterator<char>());
  g.logits.resize(raw.size() / sizeof(float));
  std::memcpy(g.logits.data(), raw.data(), raw.size());
  return g;
}

inline double rel_l2(const float* a, const float* b, std::size_t n) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

}  // namespace anvil::model::testing

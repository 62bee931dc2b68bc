#include "bench/load/prompts.h"

#include <array>
#include <fstream>
#include <random>

#include <boost/json.hpp>

namespace anvil::bench {
namespace {

// Common English words, each a single token in the usual BPE vocabularies (with its leading space).
constexpr const char* common_words[] = {
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as", "with",
    "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what",
    "all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do",
    "how", "their", "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some",
    "her", "would", "make", "like", "him", "into", "time", "has", "look", "two", "more", "write", "go", "see",
    "number", "no", "way", "could", "people", "my", "than", "first", "water", "been", "call", "who", "oil",
    "its", "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part", "over", "new",
    "sound", "take", "only", "little", "work", "know", "place", "year", "live", "me", "back", "give", "most",
    "very", "after", "thing", "our", "just", "name", "good", "sentence", "man", "think", "say", "great",
    "where", "help", "through", "much", "before", "line", "right", "too", "mean", "old", "any", "same", "tell",
    "boy", "follow", "came", "want", "show", "also", "around", "form", "three", "small", "set", "put", "end",
    "does", "another", "well", "large", "must", "big", "even", "such", "because", "turn", "here"};

std::int64_t estimate_tokens(const std::string& text) { return std::max<std::int64_t>(1, std::int64_t(text.size() / 4)); }

std::optional<bench_prompt> parse_dataset_line(const std::string& line, int default_output_len, std::string& error) {
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(line, ec);
  if (ec || !v.is_object()) {
    error = "not a JSON object";
    return std::nullopt;
  }
  const auto& o = v.get_object();
  bench_prompt p;
  p.output_len = default_output_len;
  if (const auto* n = o.if_contains("output_len")) {
    if (!n->is_int64() || n->as_int64() < 1) {
      error = "\"output_len\" must be an integer >= 1";
      return std::nullopt;
    }
    p.output_len = static_cast<int>(n->as_int64());
  }
  if (const auto* prompt = o.if_contains("prompt"); prompt && prompt->is_string()) {
    p.text = std::string(prompt->as_string());
    p.estimated_input_len = estimate_tokens(p.text);
    return p;
  }
  if (const auto* msgs = o.if_contains("messages"); msgs && msgs->is_array() && !msgs->as_array().empty()) {
    for (const auto& m : msgs->as_array()) {
      const auto* mo = m.if_object();
      const auto* role = mo ? mo->if_contains("role") : nullptr;
      const auto* content = mo ? mo->if_contains("content") : nullptr;
      if (!role || !role->is_string() || !content || !content->is_string()) {
        error = "each message needs a string \"role\" and a string \"content\"";
        return std::nullopt;
      }
      p.messages.push_back({std::string(role->as_string()), std::string(content->as_string())});
      p.estimated_input_len += estimate_tokens(p.messages.back().content) + 4;
    }
    return p;
  }
  error = "needs a string \"prompt\" or a non-empty \"messages\" array";
  return std::nullopt;
}

}  // namespace

std::vector<bench_prompt> random_prompts(const bench_options& o) {
  std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ULL);
  std::uniform_int_distribution<std::size_t> word(0, std::size(common_words) - 1);
  std::uniform_int_distribution<std::int64_t> token(o.token_min, o.token_max);
  std::vector<bench_prompt> out(static_cast<std::size_t>(o.num_prompts));
  for (auto& p : out) {
    p.output_len = o.output_len;
    p.estimated_input_len = o.input_len;
    if (o.random_token_ids) {
      p.token_ids.resize(static_cast<std::size_t>(o.input_len));
      for (auto& t : p.token_ids) t = token(rng);
      continue;
    }
    for (int i = 0; i < o.input_len; ++i) {
      if (i) p.text += ' ';
      p.text += common_words[word(rng)];
    }
  }
  return out;
}

std::optional<std::vector<bench_prompt>> load_dataset(const std::string& path, int num_prompts, int default_output_len,
                                                      std::string& error) {
  std::ifstream in(path);
  if (!in) {
    error = "cannot open dataset '" + path + "'";
    return std::nullopt;
  }
  std::vector<bench_prompt> lines;
  std::string line;
  for (int n = 1; std::getline(in, line) && int(lines.size()) < num_prompts; ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string why;
    auto p = parse_dataset_line(line, default_output_len, why);
    if (!p) {
      error = path + ":" + std::to_string(n) + ": " + why;
      return std::nullopt;
    }
    lines.push_back(std::move(*p));
  }
  if (lines.empty()) {
    error = "dataset '" + path + "' has no prompts";
    return std::nullopt;
  }
  std::vector<bench_prompt> out;
  out.reserve(static_cast<std::size_t>(num_prompts));
  for (int i = 0; i < num_prompts; ++i) out.push_back(lines[static_cast<std::size_t>(i) % lines.size()]);
  return out;
}

std::optional<std::vector<bench_prompt>> make_prompts(const bench_options& o, std::string& error) {
  if (!o.dataset.empty()) return load_dataset(o.dataset, o.num_prompts, o.output_len, error);
  return random_prompts(o);
}

}  // namespace anvil::bench

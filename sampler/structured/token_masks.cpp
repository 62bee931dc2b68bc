#include "sampler/structured/token_masks.h"

#include <algorithm>
#include <numeric>

namespace anvil::sampler::structured {

vocab_trie::vocab_trie(std::vector<std::string> bytes, std::vector<std::int32_t> eog)
    : bytes_(std::move(bytes)), eog_(std::move(eog)) {
  std::sort(eog_.begin(), eog_.end());
  std::vector<std::int32_t> order;
  for (std::int32_t id = 0; id < std::int32_t(bytes_.size()); ++id) {
    if (!bytes_[std::size_t(id)].empty() && !is_eog(id)) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return bytes_[std::size_t(a)] < bytes_[std::size_t(b)]; });
  ids_.reserve(order.size());
  // Breadth-first over ranges of `order` that share a prefix of `depth` bytes; a node's children
  // are created together, so they sit side by side.
  struct pending {
    std::int32_t node;
    std::size_t lo, hi, depth;
  };
  nodes_.push_back({});
  std::vector<pending> queue{{0, 0, order.size(), 0}};
  for (std::size_t q = 0; q < queue.size(); ++q) {
    const pending p = queue[q];
    std::size_t i = p.lo;
    nodes_[std::size_t(p.node)].first_token = std::int32_t(ids_.size());
    while (i < p.hi && bytes_[std::size_t(order[i])].size() == p.depth) ids_.push_back(order[i++]);  // end here
    nodes_[std::size_t(p.node)].n_tokens = std::int32_t(ids_.size()) - nodes_[std::size_t(p.node)].first_token;
    nodes_[std::size_t(p.node)].first_child = std::int32_t(nodes_.size());
    while (i < p.hi) {
      const unsigned char b = static_cast<unsigned char>(bytes_[std::size_t(order[i])][p.depth]);
      std::size_t j = i;
      while (j < p.hi && static_cast<unsigned char>(bytes_[std::size_t(order[j])][p.depth]) == b) ++j;
      node child;
      child.byte = b;
      nodes_.push_back(child);
      queue.push_back({std::int32_t(nodes_.size() - 1), i, j, p.depth + 1});
      i = j;
    }
    nodes_[std::size_t(p.node)].n_children = std::int32_t(nodes_.size()) - nodes_[std::size_t(p.node)].first_child;
  }
}

bool vocab_trie::is_eog(std::int32_t id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

token_masks::token_masks(dfa automaton, std::shared_ptr<const vocab_trie> vocab)
    : dfa_(std::move(automaton)), vocab_(std::move(vocab)) {}

bool token_masks::complete(std::int32_t state) const {
  const auto& row = dfa_.next[std::size_t(state)];
  return std::all_of(row.begin(), row.end(), [](std::int32_t s) { return s == dfa::dead; });
}

std::int32_t token_masks::advance(std::int32_t state, std::int32_t token) const {
  if (state == dfa::dead || token < 0 || token >= vocab_->n_vocab()) return dfa::dead;
  if (vocab_->is_eog(token)) return accepting(state) ? state : dfa::dead;
  const std::string& b = vocab_->bytes(token);
  if (b.empty()) return dfa::dead;
  return dfa_.walk(state, b);
}

std::vector<std::uint32_t> token_masks::mask(std::int32_t state) const {
  {
    std::lock_guard lock(mutex_);
    if (auto it = masks_.find(state); it != masks_.end()) return *it->second;
  }
  auto bits = std::make_shared<std::vector<std::uint32_t>>((std::size_t(vocab_->n_vocab()) + 31) / 32, 0u);
  const auto set = [&](std::int32_t id) { (*bits)[std::size_t(id) / 32] |= 1u << (std::uint32_t(id) % 32); };
  const auto& nodes = vocab_->nodes();
  const auto& ids = vocab_->ids();
  std::vector<std::pair<std::int32_t, std::int32_t>> stack;  // (trie node, automaton state)
  const vocab_trie::node& root = nodes[0];
  for (std::int32_t c = root.first_child; c < root.first_child + root.n_children; ++c) {
    const std::int32_t s = dfa_.next[std::size_t(state)][nodes[std::size_t(c)].byte];
    if (s != dfa::dead) stack.emplace_back(c, s);
  }
  while (!stack.empty()) {
    const auto [n, s] = stack.back();
    stack.pop_back();
    const vocab_trie::node& nd = nodes[std::size_t(n)];
    for (std::int32_t k = nd.first_token; k < nd.first_token + nd.n_tokens; ++k) set(ids[std::size_t(k)]);
    const auto& row = dfa_.next[std::size_t(s)];
    for (std::int32_t c = nd.first_child; c < nd.first_child + nd.n_children; ++c) {
      const std::int32_t t = row[nodes[std::size_t(c)].byte];
      if (t != dfa::dead) stack.emplace_back(c, t);
    }
  }
  if (accepting(state)) {
    for (const std::int32_t id : vocab_->eog()) set(id);
  }
  std::lock_guard lock(mutex_);
  masks_.emplace(state, bits);
  return *bits;
}

}  // namespace anvil::sampler::structured

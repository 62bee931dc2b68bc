// Constrained decoding's token masks: which tokens of the vocabulary may come next in each state
// of a byte-level DFA (regex.h). A mask is computed the first time its state is reached, by one
// walk of the vocabulary's byte trie through the automaton (shared prefixes walked once, dead
// branches cut), and kept: later requests with the same constraint reuse it. Stepping a state by
// a token walks only that token's bytes. So decoding never scans the vocabulary per token.
//
// End-of-generation tokens are allowed exactly where the automaton accepts; control and unused
// tokens never are.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "sampler/structured/regex.h"

namespace anvil::sampler::structured {

// The vocabulary's byte strings in a trie, built once per tokenizer.
class vocab_trie {
 public:
  // bytes[id]: the token's bytes, "" for a token never to be generated under a constraint;
  // eog: the end-of-generation ids.
  vocab_trie(std::vector<std::string> bytes, std::vector<std::int32_t> eog);

  std::int32_t n_vocab() const { return std::int32_t(bytes_.size()); }
  const std::string& bytes(std::int32_t id) const { return bytes_[std::size_t(id)]; }
  bool is_eog(std::int32_t id) const;
  const std::vector<std::int32_t>& eog() const { return eog_; }

  struct node {
    std::int32_t first_child = 0, n_children = 0;  // children are nodes_[first_child, +n_children)
    std::int32_t first_token = 0, n_tokens = 0;    // tokens ending here: ids_[first_token, +n_tokens)
    unsigned char byte = 0;                        // the edge from the parent
  };
  const std::vector<node>& nodes() const { return nodes_; }
  const std::vector<std::int32_t>& ids() const { return ids_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<std::int32_t> eog_;
  std::vector<node> nodes_;  // nodes_[0] is the root
  std::vector<std::int32_t> ids_;
};

class token_masks {
 public:
  token_masks(dfa automaton, std::shared_ptr<const vocab_trie> vocab);

  std::int32_t start() const { return dfa_.start; }
  bool accepting(std::int32_t state) const { return dfa_.accepting[std::size_t(state)] != 0; }
  // No byte can follow: the output is complete.
  bool complete(std::int32_t state) const;
  // The state after `token`, or dfa::dead when the token is not allowed there (an end-of-
  // generation token keeps the state where the automaton accepts).
  std::int32_t advance(std::int32_t state, std::int32_t token) const;
  // Bit t of word t / 32 set: token t may come next. Thread-safe; computed once per state.
  std::vector<std::uint32_t> mask(std::int32_t state) const;
  std::int32_t n_states() const { return dfa_.size(); }

 private:
  dfa dfa_;
  std::shared_ptr<const vocab_trie> vocab_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::int32_t, std::shared_ptr<const std::vector<std::uint32_t>>> masks_;
};

}  // namespace anvil::sampler::structured

// Byte-level BPE (GPT-2 family: Llama 3, Qwen2). Merges are keyed by the ids of their two sides,
// so the merge loop works on integers; a min-heap orders candidates by (rank, position) and
// stale entries are recognised on pop because a symbol's id changes whenever it merges.
#include <algorithm>

#include "model/model_error.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode.h"

namespace anvil::model::detail {
namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes
// (controls, space, DEL, NBSP, soft hyphen) map to U+0100 upwards in byte order.
struct byte_level_tables {
  std::array<char32_t, 256> to_cp{};
  std::array<std::int16_t, 324> to_byte{};  // indexed by code point, -1 where unmapped
  std::array<std::string, 256> to_utf8{};

  byte_level_tables() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      to_cp[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_cp[b]] = static_cast<std::int16_t>(b);
      utf8_append(to_utf8[b], to_cp[b]);
    }
  }
};

const byte_level_tables& tables() {
  static const byte_level_tables t;
  return t;
}

// The one place a merge line is split: "left right" at the space that leaves a token on both
// sides (a token may itself contain a space in vocabularies that are not byte-level). Only the
// first few spaces are tried: each try hashes the whole line, and a hostile line of a million
// spaces would otherwise take hours (real merges split at their first or second space).
bool split_merge(const token_map& tokens, std::string_view line, std::int32_t& left, std::int32_t& right) {
  constexpr int max_tries = 16;
  int tries = 0;
  for (std::size_t sp = line.find(' '); sp != std::string_view::npos && tries++ < max_tries; sp = line.find(' ', sp + 1)) {
    const auto l = tokens.find(line.substr(0, sp));
    const auto r = tokens.find(line.substr(sp + 1));
    if (l != tokens.end() && r != tokens.end()) {
      left = l->second;
      right = r->second;
      return true;
    }
  }
  return false;
}

}  // namespace

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += tables().to_utf8[static_cast<unsigned char>(c)];
  return out;
}

std::string byte_level_decode(std::string_view token_text) {
  std::string out;
  out.reserve(token_text.size());
  for (std::size_t pos = 0; pos < token_text.size();) {
    const std::size_t len = utf8_sequence_length(token_text, pos);
    if (len == 0) {  // not UTF-8 at all: keep the byte
      out += token_text[pos++];
      continue;
    }
    const char32_t cp = utf8_decode(token_text, pos, len);
    if (cp < tables().to_byte.size() && tables().to_byte[cp] >= 0)
      out += static_cast<char>(tables().to_byte[cp]);
    else
      out.append(token_text.substr(pos, len));  // not part of the mapping: pass through
    pos += len;
  }
  return out;
}

bpe_encoder::bpe_encoder(const tokenizer_spec& spec, const vocab_index& vocab, bool ignore_merges)
    : vocab_(vocab), ignore_merges_(ignore_merges) {
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab.normal.find(tables().to_utf8[b]);
    if (it == vocab.normal.end())
      throw model_error("tokenizer: byte-level BPE vocabulary has no normal token '" + tables().to_utf8[b] +
                        "' for byte " + std::to_string(b));
    byte_ids_[b] = it->second;
  }
  merges_.reserve(spec.merges.size());
  for (std::size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string& line = spec.merges[rank];
    std::int32_t left = -1, right = -1;
    if (!split_merge(vocab.normal, line, left, right))
      throw model_error("tokenizer: merge " + std::to_string(rank) + " '" + line.substr(0, 80) +
                        "' does not name two tokens of the vocabulary (tokenizer.ggml.merges)");
    const auto result = vocab.normal.find(spec.tokens[left] + spec.tokens[right]);
    if (result == vocab.normal.end())
      throw model_error("tokenizer: merge " + std::to_string(rank) + " '" + line + "' produces '" +
                        spec.tokens[left] + spec.tokens[right] + "', which is not in the vocabulary");
    merges_.emplace(key(left, right),
                    merge_rule{static_cast<std::int32_t>(rank), result->second});  // first rank wins
  }
}

const bpe_encoder::merge_rule* bpe_encoder::find_merge(std::int32_t left, std::int32_t right) const {
  const auto it = merges_.find(key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void bpe_encoder::encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.normal.find(byte_level_encode(piece)); it != vocab_.normal.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct symbol {
    std::int32_t id, prev, next;  // id -1 once merged into its left neighbour
  };
  struct candidate {
    std::int32_t rank, left, left_id, right_id, result;
  };
  const auto n = static_cast<std::int32_t>(piece.size());
  std::vector<symbol> syms(piece.size());
  for (std::int32_t i = 0; i < n; ++i)
    syms[i] = {byte_ids_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};

  std::vector<candidate> heap;
  const auto later = [](const candidate& a, const candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  const auto consider = [&](std::int32_t left) {
    if (left < 0 || syms[left].next < 0) return;
    const symbol& r = syms[syms[left].next];
    if (const merge_rule* m = find_merge(syms[left].id, r.id)) {
      heap.push_back({m->rank, left, syms[left].id, r.id, m->result});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const candidate c = heap.back();
    heap.pop_back();
    symbol& l = syms[c.left];
    if (l.id != c.left_id || l.next < 0 || syms[l.next].id != c.right_id) continue;  // stale
    symbol& r = syms[l.next];
    l.id = c.result;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.id = -1;
    consider(l.prev);
    consider(c.left);
  }
  for (std::int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace anvil::model::detail

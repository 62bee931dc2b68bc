// SentencePiece-style BPE as llama.cpp's llm_tokenizer_spm runs it on GGUF "llama" vocabularies:
// symbols are UTF-8 characters (an invalid byte is a symbol of its own); the best-scoring
// adjacent pair whose text is a normal token merges next. Only normal tokens take part: control
// and user-defined tokens are matched before encoding, byte tokens only by the fallback.
#include <algorithm>

#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode.h"

namespace anvil::model::detail {

spm_encoder::spm_encoder(const tokenizer_spec& spec, const vocab_index& vocab)
    : vocab_(vocab), scores_(spec.scores), unk_id_(spec.unk_id) {
  if (scores_.empty()) scores_.assign(spec.tokens.size(), 0.0f);
}

void spm_encoder::encode_fragment(std::string_view text, std::vector<std::int32_t>& out) const {
  struct symbol {
    std::size_t begin, len;  // bytes of text; len 0 once merged into the left neighbour
    std::int32_t prev, next;
  };
  struct candidate {
    float score;
    std::int32_t left, right;
    std::size_t len;  // combined length when queued, to recognise stale entries
  };
  std::vector<symbol> syms;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t len = std::max<std::size_t>(1, utf8_sequence_length(text, pos));
    const auto i = static_cast<std::int32_t>(syms.size());
    syms.push_back({pos, len, i - 1, pos + len < text.size() ? i + 1 : -1});
    pos += len;
  }
  if (syms.empty()) return;

  std::vector<candidate> heap;
  const auto worse = [](const candidate& a, const candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  const auto consider = [&](std::int32_t left, std::int32_t right) {
    if (left < 0 || right < 0) return;
    const std::size_t len = syms[left].len + syms[right].len;
    const auto it = vocab_.normal.find(text.substr(syms[left].begin, len));
    if (it == vocab_.normal.end()) return;
    heap.push_back({scores_[static_cast<std::size_t>(it->second)], left, right, len});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (std::size_t i = 1; i < syms.size(); ++i)
    consider(static_cast<std::int32_t>(i - 1), static_cast<std::int32_t>(i));

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const candidate c = heap.back();
    heap.pop_back();
    symbol& l = syms[c.left];
    symbol& r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.len) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }

  for (std::int32_t i = 0; i >= 0; i = syms[i].next) {
    const std::string_view piece = text.substr(syms[i].begin, syms[i].len);
    if (const auto it = vocab_.normal.find(piece); it != vocab_.normal.end()) {
      out.push_back(it->second);
      continue;
    }
    // Byte fallback; if a byte token is missing the character becomes one unknown token (the
    // constructor made sure there is one then), as HF's byte_fallback does.
    const bool all_bytes = std::all_of(piece.begin(), piece.end(), [&](char b) {
      return vocab_.byte_tokens[static_cast<unsigned char>(b)] >= 0;
    });
    if (!all_bytes) {
      out.push_back(unk_id_);
      continue;
    }
    for (char b : piece) out.push_back(vocab_.byte_tokens[static_cast<unsigned char>(b)]);
  }
}

}  // namespace anvil::model::detail

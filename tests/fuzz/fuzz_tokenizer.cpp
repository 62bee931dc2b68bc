// Fuzz target: the tokenizers on arbitrary bytes. The first input byte picks the tokenizer — the
// shipped model's byte-level BPE (Llama 3 pre-tokenizer), the micro models' SentencePiece-style
// and byte-level vocabularies — and the flags; the rest is text to encode or token ids to decode.
// Checked on every input: encoded ids are in the vocabulary; streaming detokenisation
// (incremental_decoder) concatenates to exactly decode(); byte-level BPE without added specials
// decodes back to the very input bytes; a bad id is std::out_of_range, nothing worse.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "model/gguf/gguf_tokenizer.h"
#include "tests/fuzz/gguf_image.h"

namespace {

using namespace anvil;

struct fuzz_tokenizer {
  model::tokenizer tok;
  bool byte_level;
};

fuzz_tokenizer from_micro(fuzz::micro_vocab v) {
  const fuzz::bytes b = fuzz::micro_model(v).serialise();
  return {model::tokenizer(model::tokenizer_spec_from_gguf(model::gguf_file::parse(b))), v == fuzz::micro_vocab::byte_level};
}

const std::vector<fuzz_tokenizer>& tokenizers() {
  static const std::vector<fuzz_tokenizer> all = [] {
    std::vector<fuzz_tokenizer> t;
    const auto shipped = model::gguf_file::open(ANVIL_SOURCE_DIR "/models/anvil-kjv-q8_0.gguf");
    t.push_back({model::tokenizer(model::tokenizer_spec_from_gguf(shipped)), true});
    t.push_back(from_micro(fuzz::micro_vocab::spm));
    t.push_back(from_micro(fuzz::micro_vocab::byte_level));
    return t;
  }();
  return all;
}

std::string streamed(const model::tokenizer& tok, const std::vector<std::int32_t>& ids, bool skip_special) {
  model::incremental_decoder d(tok, skip_special);
  std::string out;
  for (const std::int32_t id : ids) out += d.push(id);
  return out + d.flush();
}

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t flags = data[0];
  const fuzz_tokenizer& t = tokenizers()[(flags & 3) % tokenizers().size()];
  const bool add_special = flags & 4, parse_special = flags & 8, skip_special = flags & 16, decode_mode = flags & 32;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);

  if (decode_mode) {  // little-endian u16s, mapped onto [-1, n_vocab]
    std::vector<std::int32_t> ids;
    const auto n = std::uint32_t(t.tok.n_vocab());
    for (std::size_t i = 0; i + 1 < rest.size(); i += 2) {
      const std::uint32_t v = std::uint8_t(rest[i]) | std::uint32_t(std::uint8_t(rest[i + 1])) << 8;
      ids.push_back(std::int32_t(v % (n + 2)) - 1);
    }
    std::string whole;
    try {
      whole = t.tok.decode(ids, skip_special);
    } catch (const std::out_of_range&) {
      for (const std::int32_t id : ids) {
        if (id >= 0 && id < t.tok.n_vocab()) continue;
        try {
          (void)t.tok.token_piece(id);
          std::abort();  // a bad id must be refused
        } catch (const std::out_of_range&) {
        }
        return 0;
      }
      std::abort();  // refused ids that are all in range
    }
    check(streamed(t.tok, ids, skip_special) == whole);
    return 0;
  }

  const std::vector<std::int32_t> ids = t.tok.encode(rest, add_special, parse_special);
  for (const std::int32_t id : ids) check(id >= 0 && id < t.tok.n_vocab());
  const std::string whole = t.tok.decode(ids, false);
  check(streamed(t.tok, ids, false) == whole);
  if (t.byte_level && !add_special) check(whole == rest);
  (void)t.tok.decode(ids, true);
  return 0;
}

// The tokenizer: builds its state from a spec, splits text at special tokens, hands the plain
// text between them to the model's encoder, and maps ids back to bytes.
#include "model/tokenizer/tokenizer.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "model/model_error.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode.h"
#include "model/tokenizer/unicode_nfc.h"

namespace anvil::model {
namespace {

using detail::token_type;

using detail::spm_space;

bool is_special_type(token_type t) {  // what parse_special governs and skip_special drops
  return t == token_type::control || t == token_type::unknown || t == token_type::unused;
}

std::string make_piece(const tokenizer::state& s, std::size_t id) {
  const std::string& text = s.spec.tokens[id];
  switch (s.vocab.types[id]) {
    case token_type::normal:
      return s.byte_level ? detail::byte_level_decode(text) : detail::replace_all(text, spm_space, " ");
    case token_type::byte:
      return std::string(1, static_cast<char>(detail::parse_byte_token(text)));
    default:
      return text;  // control, user-defined, unknown, unused: their text as written
  }
}

}  // namespace

namespace detail {

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t pos = 0;;) {
    const std::size_t hit = s.find(from, pos);
    out += s.substr(pos, hit - pos);
    if (hit == std::string_view::npos) return out;
    out += to;
    pos = hit + from.size();
  }
}

harmony_ends find_harmony_ends(const std::vector<std::string>& tokens) {
  harmony_ends h;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    std::int32_t* slot = t == "<|return|>" ? &h.return_id
                         : t == "<|call|>"   ? &h.call_id
                         : t == "<|end|>"    ? &h.end_id
                                             : nullptr;
    if (slot != nullptr && *slot < 0) *slot = static_cast<std::int32_t>(i);
  }
  return h;
}

std::vector<std::int32_t> end_of_generation_ids(const tokenizer_spec& spec) {
  std::vector<std::int32_t> ids;
  for (const std::int32_t id : {spec.eos_id, spec.eot_id, spec.eom_id})
    if (id >= 0) ids.push_back(id);
  if (const harmony_ends h = find_harmony_ends(spec.tokens); h.present()) {
    ids.push_back(h.return_id);
    ids.push_back(h.call_id);
    std::erase(ids, h.end_id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

special_matcher::special_matcher(const tokenizer_spec& spec, const vocab_index& vocab)
    : spec_(spec), vocab_(vocab) {
  for (std::size_t i = 0; i < spec.tokens.size(); ++i) {
    const token_type t = vocab.types[i];
    const bool matchable = t == token_type::user_defined || t == token_type::control || t == token_type::unknown;
    if (matchable && !spec.tokens[i].empty())
      by_first_byte_[static_cast<unsigned char>(spec.tokens[i][0])].push_back(static_cast<std::int32_t>(i));
  }
  for (auto& ids : by_first_byte_)
    std::stable_sort(ids.begin(), ids.end(), [&](std::int32_t a, std::int32_t b) {
      return spec.tokens[a].size() > spec.tokens[b].size();
    });
}

special_matcher::match special_matcher::find(std::string_view text, std::size_t from, bool parse_special) const {
  for (std::size_t pos = from; pos < text.size(); ++pos) {
    for (const std::int32_t id : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
      if (!parse_special && vocab_.types[id] != token_type::user_defined) continue;
      if (text.compare(pos, spec_.tokens[id].size(), spec_.tokens[id]) == 0) return {pos, id};
    }
  }
  return {};
}

}  // namespace detail

void name_end_tokens(tokenizer_spec& spec) {
  static constexpr std::string_view eot_names[] = {"<|eot_id|>",    "<|im_end|>",      "<|end|>", "<end_of_turn>",
                                                    "<|endoftext|>", "<|end_of_text|>", "<EOT>"};
  const auto id_of = [&](std::string_view name) {
    const auto it = std::find(spec.tokens.begin(), spec.tokens.end(), name);
    return it == spec.tokens.end() ? -1 : std::int32_t(it - spec.tokens.begin());
  };
  if (spec.eot_id < 0) {
    const bool harmony = detail::find_harmony_ends(spec.tokens).present();
    for (const std::string_view name : eot_names) {
      if (harmony && name == "<|end|>") continue;
      if (const std::int32_t id = id_of(name); id >= 0 && id != spec.eos_id) {
        spec.eot_id = id;
        break;
      }
    }
  }
  if (spec.eom_id < 0) spec.eom_id = id_of("<|eom_id|>");
}

tokenizer::state::state(tokenizer_spec s) : spec(std::move(s)) {
  detail::validate_spec(spec);
  byte_level = spec.model == "gpt2";
  vocab = detail::build_vocab_index(spec);
  if (byte_level) {
    pre.emplace(spec.pre);
    nfc = spec.pre == "qwen2" || spec.pre == "qwen35";  // their tokenizer.json normalise to NFC first
    // A piece that is itself a token is emitted whole for llama-bpe and tekken (HF's
    // ignore_merges, as llama.cpp does). gpt-oss's tokenizer.json sets ignore_merges too, but llama.cpp does not for
    // gpt-4o and need not: the merges rebuild every one of the o200k tokens, so the ids agree.
    const bool ignore_merges =
        spec.pre == "llama-bpe" || spec.pre == "llama3" || spec.pre == "llama-v3" || spec.pre == "tekken";
    bpe = std::make_unique<detail::bpe_encoder>(spec, vocab, ignore_merges);
  } else {
    spm = std::make_unique<detail::spm_encoder>(spec, vocab);
    strip_leading_space = spec.add_space_prefix;
  }
  specials = std::make_unique<detail::special_matcher>(spec, vocab);
  eog = detail::end_of_generation_ids(spec);
  pieces.reserve(spec.tokens.size());
  for (std::size_t i = 0; i < spec.tokens.size(); ++i) pieces.push_back(make_piece(*this, i));
}

tokenizer::tokenizer(tokenizer_spec spec) : state_(std::make_shared<const state>(std::move(spec))) {}

std::vector<std::int32_t> tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const state& s = *state_;
  std::vector<std::int32_t> out;
  if (add_special && s.spec.add_bos) out.push_back(s.spec.bos_id);
  bool after_special = true;  // SentencePiece prefixes a space at the start and after each special token
  const auto encode_plain = [&](std::string_view plain) {
    if (plain.empty()) return;
    if (s.byte_level) {
      const std::string normalized = s.nfc ? to_nfc(plain) : std::string(plain);
      for (const std::string_view piece : s.pre->split(normalized)) s.bpe->encode_piece(piece, out);
    } else {
      const std::string_view prefix = s.spec.add_space_prefix && after_special ? spm_space : "";
      s.spm->encode_fragment(std::string(prefix) + detail::replace_all(plain, " ", spm_space), out);
    }
    after_special = false;
  };
  for (std::size_t pos = 0; pos < text.size();) {
    const detail::special_matcher::match m = s.specials->find(text, pos, parse_special);
    if (m.id < 0) {
      encode_plain(text.substr(pos));
      break;
    }
    encode_plain(text.substr(pos, m.pos - pos));
    out.push_back(m.id);
    after_special = true;
    pos = m.pos + s.spec.tokens[m.id].size();
  }
  if (add_special && s.spec.add_eos) out.push_back(s.spec.eos_id);
  return out;
}

const std::string* tokenizer::piece_for_output(std::int32_t id, bool skip_special) const {
  if (id < 0 || id >= n_vocab())
    throw std::out_of_range("tokenizer: token id " + std::to_string(id) + " out of range");
  if (skip_special && is_special_type(state_->vocab.types[id])) return nullptr;
  return &state_->pieces[id];
}

std::string tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string out;
  for (const std::int32_t id : ids) {
    if (const std::string* piece = piece_for_output(id, skip_special)) out += *piece;
  }
  if (state_->strip_leading_space && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

std::string tokenizer::token_piece(std::int32_t id) const { return *piece_for_output(id, false); }

std::int32_t tokenizer::n_vocab() const { return static_cast<std::int32_t>(state_->spec.tokens.size()); }
std::int32_t tokenizer::bos() const { return state_->spec.bos_id; }
std::int32_t tokenizer::eos() const { return state_->spec.eos_id; }

bool tokenizer::is_eog(std::int32_t id) const {
  return std::binary_search(state_->eog.begin(), state_->eog.end(), id);
}

bool tokenizer::is_control(std::int32_t id) const {
  return id >= 0 && id < n_vocab() && state_->vocab.types[id] == token_type::control;
}

const tokenizer_spec& tokenizer::spec() const { return state_->spec; }

incremental_decoder::incremental_decoder(const tokenizer& t, bool skip_special, std::vector<std::int32_t> shown)
    : tokenizer_(&t), skip_special_(skip_special), shown_(std::move(shown)),
      strip_leading_space_(t.state_->strip_leading_space) {}

std::string incremental_decoder::push(std::int32_t id) {
  const bool skip = skip_special_ && std::find(shown_.begin(), shown_.end(), id) == shown_.end();
  if (const std::string* piece = tokenizer_->piece_for_output(id, skip)) pending_ += *piece;
  if (strip_leading_space_ && !pending_.empty()) {  // the space decode() strips from the whole text
    if (pending_[0] == ' ') pending_.erase(0, 1);
    strip_leading_space_ = false;
  }
  const std::size_t ready = utf8_stable_prefix(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string incremental_decoder::flush() { return std::exchange(pending_, std::string()); }

}  // namespace anvil::model

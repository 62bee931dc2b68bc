// Host side of the GPU candidates op: packing a batch's whole-vocabulary parameters into the flat
// arrays the kernel reads, and reading its records back.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/candidates.h"
#include "kernels/draw.h"

namespace anvil::kernels {
namespace {

void check_token(std::int32_t id, std::int64_t vocab, const char* what) {
  if (id < 0 || id >= vocab) {
    throw std::invalid_argument(std::string("pack_candidates: ") + what + " token " + std::to_string(id) +
                                " is outside the vocabulary of " + std::to_string(vocab));
  }
}

}  // namespace

candidates_batch pack_candidates(std::span<const gpu_worker::logit_params> params,
                                 std::span<const std::int64_t> positions, std::int64_t vocab, std::int32_t max_k) {
  if (params.size() != positions.size()) throw std::invalid_argument("pack_candidates: one position per sequence");
  if (max_k < 1 || max_k > candidates_max_k) throw std::invalid_argument("pack_candidates: max_k out of range");
  candidates_batch b;
  b.seqs.reserve(params.size());
  std::vector<std::int32_t> ids;
  for (std::size_t s = 0; s < params.size(); ++s) {
    const gpu_worker::logit_params& p = params[s];
    if (p.top_k < 1 || p.top_k > max_k) {
      throw std::invalid_argument("pack_candidates: top_k " + std::to_string(p.top_k) + " outside [1, " +
                                  std::to_string(max_k) + "]");
    }
    candidates_seq c;
    c.temperature = p.temperature;
    c.repetition_penalty = p.repetition_penalty;
    c.presence_penalty = p.presence_penalty;
    c.frequency_penalty = p.frequency_penalty;
    c.top_k = p.top_k;
    c.bias_begin = std::int32_t(b.bias_ids.size());
    c.bias_count = std::int32_t(p.logit_bias.size());
    for (const auto& [id, v] : p.logit_bias) {
      check_token(id, vocab, "logit_bias");
      b.bias_ids.push_back(id);
      b.bias_values.push_back(v);
    }
    ids.clear();
    c.counts_begin = std::int32_t(b.count_ids.size());
    c.counts_count = std::int32_t(p.token_counts.size());
    for (const auto& [id, n] : p.token_counts) {
      check_token(id, vocab, "token_counts");
      if (n < 0) throw std::invalid_argument("pack_candidates: negative count for token " + std::to_string(id));
      ids.push_back(id);
      b.count_ids.push_back(id);
      b.count_values.push_back(n);
    }
    std::sort(ids.begin(), ids.end());
    if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) {
      throw std::invalid_argument("pack_candidates: token_counts lists a token twice");
    }
    if (!p.allowed.empty()) {
      if (p.allowed.size() != std::size_t((vocab + 31) / 32)) {
        throw std::invalid_argument("pack_candidates: the mask does not cover the vocabulary");
      }
      c.mask_begin = std::int32_t(b.mask_words.size());
      b.mask_words.insert(b.mask_words.end(), p.allowed.begin(), p.allowed.end());
    }
    c.tail_u = tail_uniform(p.seed, positions[s]);
    if (p.draw.on) {
      c.draw = gpu_worker::is_greedy(p.temperature) ? 1 : 2;
      c.draw_top_k = p.draw.top_k;
      c.draw_top_p = p.draw.top_p;
      c.draw_min_p = p.draw.min_p;
      c.draw_u = draw_uniform(p.seed, positions[s]);
    }
    b.seqs.push_back(c);
  }
  return b;
}

gpu_worker::seq_output unpack_candidates(const void* record) {
  candidates_record_header h;
  std::memcpy(&h, record, sizeof h);
  gpu_worker::seq_output out;
  out.log_normalizer = h.log_normalizer;
  out.tail_mass = h.tail_mass;
  out.tail = {h.tail_token, h.tail_logit};
  out.drawn = h.drawn;
  out.top.resize(std::size_t(std::max(h.n_top, 0)));
  const auto* entries = static_cast<const unsigned char*>(record) + sizeof h;
  for (std::size_t i = 0; i < out.top.size(); ++i) {
    candidates_record_entry e;
    std::memcpy(&e, entries + i * sizeof e, sizeof e);
    out.top[i] = {e.token, e.logit};
  }
  return out;
}

}  // namespace anvil::kernels

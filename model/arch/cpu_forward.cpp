#include "model/arch/cpu_forward.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/output_gate.h"
#include "kernels/per_layer_inputs.h"
#include "kernels/rms_norm.h"
#include "kernels/softcap.h"
#include "kernels/swiglu.h"
#include "messages/step.h"

namespace anvil::model {
namespace {

void matmul(const weight& w, const float* bias, const std::pmr::vector<float>& x, std::int64_t n_tokens, float* y) {
  kernels::matmul_ref({.w = w.data,
                       .w_type = w.type,
                       .in = w.in,
                       .out = w.out,
                       .bias = bias,
                       .x = x.data(),
                       .y = y,
                       .n_tokens = n_tokens});
}

void matmul(const weight& w, const std::vector<float>& bias, const std::pmr::vector<float>& x, std::int64_t n_tokens,
            float* y) {
  matmul(w, bias.empty() ? nullptr : bias.data(), x, n_tokens, y);
}

// Expert e's slice of a layer's stacked expert biases, or null where the model has none.
const float* expert_bias(const std::vector<float>& b, std::int64_t e, std::int64_t out) {
  return b.empty() ? nullptr : b.data() + e * out;
}

void rms_norm(const float* x, const std::vector<float>& w, float* y, std::int64_t rows, std::int64_t cols, float eps) {
  kernels::rms_norm_ref({.x = x, .weight = w.data(), .y = y, .rows = rows, .cols = cols, .eps = eps});
}

}  // namespace

cpu_forward::cpu_forward(const llm& m, std::int64_t max_tokens, std::pmr::memory_resource* arena, tp_link tp)
    : m_(m), tp_(tp), tp_send_(arena), tp_all_(arena), ids_(arena), positions_(arena), slots_(arena), window_slots_(arena), x_(arena), h_(arena), q_(arena),
      k_(arena), v_(arena), attn_(arena), o_(arena), gate_(arena), up_(arena), router_(arena), chosen_w_(arena),
      xe_(arena), ye_(arena), pair_out_(arena), chosen_(arena), routed_(arena), seqs_(arena), window_seqs_(arena),
      rseqs_(arena), mix_(arena), z_(arena), beta_(arena), alpha_(arena), qgate_(arena), dense_out_(arena),
      logit_rows_(arena) {
  const auto t = static_cast<std::size_t>(std::max<std::int64_t>(max_tokens, 1));
  const hparams& hp = m.hp;
  ids_.reserve(t);
  positions_.reserve(t);
  slots_.reserve(t);
  seqs_.reserve(t);
  if (hp.sliding_window > 0) {  // a window pool's slots and tables (kv_cache_storage)
    window_slots_.reserve(t);
    window_seqs_.reserve(t);
  }
  logit_rows_.reserve(t);
  if (tp_.comm) {
    const auto rows = std::size_t(std::max<std::int64_t>(tp_.max_logit_rows, 1)), stride = std::size_t(tp_.vocab.stride);
    tp_send_.reserve(rows * stride);
    tp_all_.reserve(rows * stride * std::size_t(tp_.comm->size()));
  }
  for (auto* v : {&x_, &h_, &o_}) v->reserve(t * std::size_t(hp.n_embd));
  std::int64_t q_width = 0, kv_width = 0;  // the widest layer's (gemma4's differ)
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    q_width = std::max(q_width, hp.n_head * hp.layer_head_dim(l));
    kv_width = std::max(kv_width, hp.layer_kv_heads(l) * hp.layer_head_dim(l));
  }
  for (auto* v : {&q_, &attn_}) v->reserve(t * std::size_t(q_width));
  if (hp.v_norm) v_norm_ones_.assign(std::size_t(std::max(hp.head_dim, hp.head_dim_swa)), 1.f);
  for (auto* v : {&k_, &v_}) v->reserve(t * std::size_t(kv_width));
  for (auto* v : {&gate_, &up_}) v->reserve(t * std::size_t(std::max({hp.n_ff, hp.n_ff_exp, hp.n_ff_shexp})));
  if (hp.has_recurrent()) {
    rseqs_.reserve(t);
    mix_.reserve(t * std::size_t(hp.ssm_conv_channels()));
    z_.reserve(t * std::size_t(hp.ssm_v_heads * hp.ssm_head_v));
    for (auto* v : {&beta_, &alpha_}) v->reserve(t * std::size_t(hp.ssm_v_heads));
    attn_.reserve(std::max(attn_.capacity(), t * std::size_t(hp.ssm_v_heads * hp.ssm_head_v)));
  }
  if (hp.attn_out_gate) {  // the q projection's rows hold each head's gate too
    qgate_.reserve(t * std::size_t(hp.n_head * hp.head_dim));
    q_.reserve(2 * qgate_.capacity());
  }
  if (hp.ple_dim > 0) {
    for (auto* v : {&ple_, &ple_h_}) v->reserve(t * std::size_t(hp.n_layer * hp.ple_dim));
  }
  if (m.has_experts()) {
    router_.reserve(t * std::size_t(hp.n_expert));
    chosen_w_.reserve(t * std::size_t(hp.n_expert_used));
    for (auto* v : {&chosen_, &routed_}) v->reserve(t * std::size_t(hp.n_expert_used));
    pair_out_.reserve(t * std::size_t(hp.n_expert_used * hp.n_embd));
    for (auto* v : {&xe_, &ye_}) v->reserve(t * std::size_t(hp.n_embd));
    if (hp.architecture == arch::gemma4) dense_out_.reserve(t * std::size_t(hp.n_embd));
  }
}

kv_cache_storage::kv_cache_storage(const hparams& hp, std::int64_t n_blocks, std::int64_t block_size,
                                   kernels::kv_dtype dtype, std::pmr::memory_resource* arena, std::int64_t n_window_blocks,
                                   std::int64_t n_state_slots)
    : block_size_(block_size), dtype_(dtype), main_(arena),
      window_(arena), conv_(arena), matrix_(arena), state_pos_(arena) {
  if (n_blocks <= 0 || block_size <= 0 || n_window_blocks < 0 || n_state_slots < 0) {
    throw std::invalid_argument("kv cache needs at least one block of one slot");
  }
  if (hp.has_recurrent() != (n_state_slots > 0)) {
    throw std::invalid_argument(hp.has_recurrent() ? "kv cache: a model with recurrent layers needs state slots"
                                                   : "kv cache: state slots for a model without recurrent layers");
  }
  layers_ = map_kv_layers(hp, n_window_blocks > 0);
  main_.n_layers = layers_.main_layers;
  window_.n_layers = layers_.window_layers;
  if (n_window_blocks > 0 && window_.n_layers == 0) {
    throw std::invalid_argument("kv cache: a window pool for a model without sliding-window layers");
  }
  main_.n_blocks = n_blocks;
  window_.n_blocks = window_.n_layers > 0 ? n_window_blocks : 0;
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {  // in layer order, which is each pool's index order
    if (layers_.stateful(l) || hp.kv_source(l) != l) continue;  // a shared layer's KV is its source's
    pool& p = layers_.windowed(l) ? window_ : main_;
    p.heads.push_back(hp.layer_kv_heads(l));
    p.dims.push_back(hp.layer_head_dim(l));
  }
  for (pool* p : {&main_, &window_}) {
    p->rows_at.assign(1, 0);
    p->elems_at.assign(1, 0);
    for (std::size_t i = 0; i < p->heads.size(); ++i) {
      const std::int64_t rows = p->n_blocks * block_size * p->heads[i];
      p->rows_at.push_back(p->rows_at.back() + rows);
      p->elems_at.push_back(p->elems_at.back() + rows * p->dims[i]);
    }
  }
  allocate(main_);
  allocate(window_);
  n_state_slots_ = n_state_slots;
  conv_floats_ = hp.ssm_conv_state();
  matrix_floats_ = hp.ssm_matrix_state();
  conv_.assign(std::size_t(layers_.state_layers * n_state_slots * conv_floats_), 0.f);
  matrix_.assign(std::size_t(layers_.state_layers * n_state_slots * matrix_floats_), 0.f);
  state_pos_.assign(std::size_t(n_state_slots), 0);
}

kv_cache_storage::state_view kv_cache_storage::state(std::int64_t l) {
  const auto i = std::size_t(layers_.index[std::size_t(l)] * n_state_slots_);
  return {.conv = conv_.data() + i * std::size_t(conv_floats_), .matrix = matrix_.data() + i * std::size_t(matrix_floats_)};
}

void kv_cache_storage::copy_state(std::int32_t src, std::int32_t dst) {
  if (src < 0 || dst < 0 || src >= n_state_slots_ || dst >= n_state_slots_) {
    throw std::invalid_argument("copy_state: slot out of range");
  }
  const auto copy = [&](std::pmr::vector<float>& v, std::int64_t per_slot) {
    for (std::int64_t l = 0; l < layers_.state_layers; ++l) {
      const float* from = v.data() + (l * n_state_slots_ + src) * per_slot;
      std::copy_n(from, per_slot, v.data() + (l * n_state_slots_ + dst) * per_slot);
    }
  };
  copy(conv_, conv_floats_);
  copy(matrix_, matrix_floats_);
  state_pos_[std::size_t(dst)] = state_pos_[std::size_t(src)];
}

std::size_t kv_cache_storage::bytes_per_state_slot(const hparams& hp) {
  return std::size_t(count_kv_layers(hp, false).state_layers * (hp.ssm_conv_state() + hp.ssm_matrix_state())) *
         sizeof(float);
}

void kv_cache_storage::allocate(pool& p) const {
  const auto rows = static_cast<std::size_t>(p.rows_at.back());
  const auto n = static_cast<std::size_t>(p.elems_at.back());
  if (!kernels::kv_is_8bit(dtype_)) {
    p.k.assign(n, 0.f);
    p.v.assign(n, 0.f);
    return;
  }
  p.k8.assign(n, 0);
  p.v8.assign(n, 0);
  p.k_scales.assign(rows, 0.f);
  p.v_scales.assign(rows, 0.f);
}

std::size_t kv_cache_storage::bytes() const {
  std::size_t b = 0;
  for (const pool* p : {&main_, &window_}) {
    b += (p->k.size() + p->v.size() + p->k_scales.size() + p->v_scales.size()) * sizeof(float) + p->k8.size() + p->v8.size();
  }
  return b + (conv_.size() + matrix_.size()) * sizeof(float) + state_pos_.size() * sizeof(std::int64_t);
}

std::size_t kv_cache_storage::bytes_per_block(const hparams& hp, std::int64_t block_size, kernels::kv_dtype dtype) {
  return bytes_per_block(hp, block_size, dtype, false, false);
}

std::size_t kv_cache_storage::bytes_per_block(const hparams& hp, std::int64_t block_size, kernels::kv_dtype dtype,
                                              bool window_pool, bool window) {
  using pool = kv_layer_map::pool;
  std::size_t bytes = 0;
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    if (kv_home(hp, window_pool, l) != (window ? pool::window : pool::main) || hp.kv_source(l) != l) continue;
    const auto rows = std::size_t(block_size * hp.layer_kv_heads(l)) * 2;  // K and V
    const auto hd = std::size_t(hp.layer_head_dim(l));
    bytes += rows * (kernels::kv_is_8bit(dtype) ? hd + sizeof(float) : hd * sizeof(float));
  }
  return bytes;
}

void kv_cache_storage::copy_block(std::int64_t src, std::int64_t dst, bool window) {
  pool& p = window ? window_ : main_;
  for (std::int64_t i = 0; i < p.n_layers; ++i) {
    const std::int64_t rows = block_size_ * p.heads[std::size_t(i)], width = rows * p.dims[std::size_t(i)];
    const std::int64_t row0 = p.rows_at[std::size_t(i)], elem0 = p.elems_at[std::size_t(i)];
    const auto copy = [&](auto& data, std::int64_t at, std::int64_t n) {
      if (!data.empty()) std::copy_n(data.begin() + at + src * n, n, data.begin() + at + dst * n);
    };
    copy(p.k, elem0, width);
    copy(p.v, elem0, width);
    copy(p.k8, elem0, width);
    copy(p.v8, elem0, width);
    copy(p.k_scales, row0, rows);
    copy(p.v_scales, row0, rows);
  }
}

kernels::paged_kv_view kv_cache_storage::layer(std::int64_t l) {
  pool& p = layers_.windowed(l) ? window_ : main_;
  const std::int64_t i = layers_.index[std::size_t(l)];
  const std::int64_t row0 = p.rows_at[std::size_t(i)], elem0 = p.elems_at[std::size_t(i)];
  const bool q8 = kernels::kv_is_8bit(dtype_);
  return {.k = q8 ? nullptr : p.k.data() + elem0,
          .v = q8 ? nullptr : p.v.data() + elem0,
          .n_blocks = p.n_blocks,
          .block_size = block_size_,
          .n_kv_heads = p.heads[std::size_t(i)],
          .head_dim = p.dims[std::size_t(i)],
          .dtype = dtype_,
          .k8 = q8 ? p.k8.data() + elem0 : nullptr,
          .v8 = q8 ? p.v8.data() + elem0 : nullptr,
          .k_scales = q8 ? p.k_scales.data() + row0 : nullptr,
          .v_scales = q8 ? p.v_scales.data() + row0 : nullptr};
}

void cpu_forward::check(std::span<const forward_seq> batch, const kv_cache_storage& cache) const {
  for (std::size_t s = 0; s < batch.size(); ++s) {
    const forward_seq& seq = batch[s];
    const std::string where = "forward: sequence " + std::to_string(s) + ": ";
    if (seq.tokens.empty()) throw std::invalid_argument(where + "no tokens");
    if (seq.start_pos < 0) throw std::invalid_argument(where + "negative start position");
    const std::int64_t end = seq.start_pos + std::int64_t(seq.tokens.size());
    const std::int64_t blocks_needed = (end + cache.block_size() - 1) / cache.block_size();
    if (std::int64_t(seq.block_table.size()) < blocks_needed) {
      throw std::invalid_argument(where + "block table covers " + std::to_string(seq.block_table.size()) + " blocks, " +
                                  std::to_string(blocks_needed) + " needed");
    }
    for (std::int64_t b = 0; b < blocks_needed; ++b) {
      if (seq.block_table[b] < 0 || seq.block_table[b] >= cache.n_blocks()) {
        throw std::invalid_argument(where + "block id " + std::to_string(seq.block_table[b]) + " out of range");
      }
    }
    if (cache.n_window_blocks() > 0) {
      // The window layers read from the first fed token's window on.
      if (std::int64_t(seq.window_table.size()) < blocks_needed) {
        throw std::invalid_argument(where + "window table covers " + std::to_string(seq.window_table.size()) +
                                    " blocks, " + std::to_string(blocks_needed) + " needed");
      }
      const std::int64_t first = gpu_worker::first_window_block(seq.start_pos, m_.hp.sliding_window, cache.block_size());
      for (std::int64_t b = first; b < blocks_needed; ++b) {
        if (seq.window_table[b] < 0 || seq.window_table[b] >= cache.n_window_blocks()) {
          throw std::invalid_argument(where + "window block id " + std::to_string(seq.window_table[b]) + " out of range");
        }
      }
    }
    for (std::int32_t id : seq.tokens) {
      if (id < 0 || id >= m_.hp.n_vocab) throw std::invalid_argument(where + "token id " + std::to_string(id) + " outside the vocabulary");
    }
    if (cache.n_state_slots() > 0) {
      check_state_slot(batch, s, cache);
    } else if (seq.state_slot != -1) {
      throw std::invalid_argument(where + "a state slot for a model without recurrent layers");
    }
  }
}

void cpu_forward::check_state_slot(std::span<const forward_seq> batch, std::size_t s, const kv_cache_storage& cache) const {
  const forward_seq& seq = batch[s];
  const std::string where = "forward: sequence " + std::to_string(s) + ": ";
  if (seq.state_slot < 0 || seq.state_slot >= cache.n_state_slots()) {
    throw std::invalid_argument(where + "state slot " + std::to_string(seq.state_slot) + " out of range");
  }
  for (std::size_t o = 0; o < s; ++o) {
    if (batch[o].state_slot == seq.state_slot) {
      throw std::invalid_argument(where + "state slot " + std::to_string(seq.state_slot) + " is sequence " +
                                  std::to_string(o) + "'s too");
    }
  }
  // A recurrent state cannot be rewound: a step continues it exactly where the last one left it.
  if (const std::int64_t held = cache.state_pos(seq.state_slot); seq.start_pos != 0 && held != seq.start_pos) {
    throw std::invalid_argument(where + "state slot " + std::to_string(seq.state_slot) + " holds " +
                                (held < 0 ? std::string("an unfinished step's state") : std::to_string(held) + " positions") +
                                ", the step starts at " + std::to_string(seq.start_pos));
  }
}

std::size_t cpu_forward::layers(std::span<const forward_seq> batch, kv_cache_storage& cache) {
  check(batch, cache);
  const hparams& hp = m_.hp;
  std::size_t n_tokens = 0;
  for (const forward_seq& s : batch) n_tokens += s.tokens.size();
  ids_.resize(n_tokens);
  positions_.resize(n_tokens);
  slots_.resize(n_tokens);
  seqs_.resize(batch.size());
  const bool window_pool = cache.n_window_blocks() > 0;
  window_slots_.resize(window_pool ? n_tokens : 0);
  window_seqs_.resize(window_pool ? batch.size() : 0);
  const bool recurrent = cache.n_state_slots() > 0;
  rseqs_.resize(recurrent ? batch.size() : 0);
  logit_rows_.clear();
  std::size_t t = 0;
  const std::int64_t bs = cache.block_size();
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const forward_seq& s = batch[i];
    const std::int64_t first = std::int64_t(t), n = std::int64_t(s.tokens.size());
    seqs_[i] = {first, n, s.start_pos, s.block_table.data()};
    if (recurrent) {
      rseqs_[i] = {.first = first, .n_tokens = n, .slot = s.state_slot, .fresh = s.start_pos == 0};
      cache.state_pos(s.state_slot) = -1;  // until every layer has run
    }
    if (window_pool) window_seqs_[i] = {first, n, s.start_pos, s.window_table.data()};
    for (std::int64_t j = 0; j < n; ++j, ++t) {
      const std::int64_t pos = s.start_pos + j;
      ids_[t] = s.tokens[std::size_t(j)];
      positions_[t] = static_cast<std::int32_t>(pos);
      slots_[t] = std::int64_t(s.block_table[std::size_t(pos / bs)]) * bs + pos % bs;
      if (window_pool) window_slots_[t] = std::int64_t(s.window_table[std::size_t(pos / bs)]) * bs + pos % bs;
      if (s.all_logits || j == n - 1) logit_rows_.push_back(first + j);
    }
  }

  x_.resize(n_tokens * std::size_t(hp.n_embd));
  if (tp_.comm) {
    embed_slice(std::int64_t(n_tokens));
  } else {
    kernels::embedding_ref({.table = m_.tok_embd.data,
                            .type = m_.tok_embd.type,
                            .n_embd = hp.n_embd,
                            .n_vocab = hp.n_vocab,
                            .ids = ids_.data(),
                            .n_tokens = std::int64_t(n_tokens),
                            .out = x_.data(),
                            .scale = hp.embd_scale});
  }
  if (hp.ple_dim > 0) per_layer_inputs(std::int64_t(n_tokens));
  for (std::int64_t l = 0; l < hp.n_layer; ++l) layer(l, cache);
  for (const forward_seq& s : batch) {
    if (recurrent) cache.state_pos(s.state_slot) = s.start_pos + std::int64_t(s.tokens.size());
  }
  return logit_rows_.size();
}

void cpu_forward::head(float* logits) {
  // Final norm on the rows that need logits only, then the head.
  const hparams& hp = m_.hp;
  const std::int64_t rows = std::int64_t(logit_rows_.size());
  h_.resize(std::size_t(rows * hp.n_embd));
  for (std::int64_t r = 0; r < rows; ++r) {
    rms_norm(x_.data() + logit_rows_[std::size_t(r)] * hp.n_embd, m_.output_norm, h_.data() + r * hp.n_embd, 1, hp.n_embd, hp.rms_eps);
  }
  if (tp_.comm) {
    gather_logits(rows, logits);
    return;
  }
  matmul(m_.output, {}, h_, rows, logits);
  if (hp.final_softcap > 0) {  // gemma4: cap * tanh(logit / cap)
    kernels::softcap_ref({.x = logits, .n = std::int64_t(rows) * hp.n_vocab, .cap = hp.final_softcap});
  }
}

void cpu_forward::reduce(std::pmr::vector<float>& v) {
  if (tp_.comm) tp_.comm->all_reduce_sum(std::span(v.data(), std::size_t(std::int64_t(ids_.size()) * m_.hp.n_embd)));
}

// Each rank writes the rows of the tokens in its vocabulary slice, zeros for the others', and the
// sum over the ranks is the embedding (each element one rank's value plus zeros: exact).
void cpu_forward::embed_slice(std::int64_t n_tokens) {
  const hparams& hp = m_.hp;
  std::fill(x_.begin(), x_.end(), 0.f);
  for (std::int64_t t = 0; t < n_tokens; ++t) {
    const std::int32_t id = ids_[std::size_t(t)];
    if (id < tp_.vocab.begin || id >= tp_.vocab.end) continue;
    const auto local = std::int32_t(id - tp_.vocab.begin);
    kernels::embedding_ref({.table = m_.tok_embd.data,
                            .type = m_.tok_embd.type,
                            .n_embd = hp.n_embd,
                            .n_vocab = tp_.vocab.end - tp_.vocab.begin,
                            .ids = &local,
                            .n_tokens = 1,
                            .out = x_.data() + t * hp.n_embd,
                            .scale = hp.embd_scale});
  }
  reduce(x_);
}

// The head's rows of this rank's vocabulary slice, gathered from every rank into whole rows.
void cpu_forward::gather_logits(std::int64_t rows, float* logits) {
  const hparams& hp = m_.hp;
  const std::int64_t mine = tp_.vocab.end - tp_.vocab.begin, stride = tp_.vocab.stride, n = tp_.comm->size();
  tp_send_.assign(std::size_t(rows * stride), 0.f);
  if (mine > 0) {
    std::pmr::vector<float>& local = tp_all_;  // its space until the gather
    local.resize(std::size_t(rows * mine));
    matmul(m_.output, {}, h_, rows, local.data());
    if (hp.final_softcap > 0) kernels::softcap_ref({.x = local.data(), .n = rows * mine, .cap = hp.final_softcap});
    for (std::int64_t r = 0; r < rows; ++r) std::copy_n(local.data() + r * mine, mine, tp_send_.data() + r * stride);
  }
  tp_all_.resize(std::size_t(rows * stride * n));
  tp_.comm->all_gather(tp_send_, tp_all_);
  for (std::int64_t q = 0; q < n; ++q) {
    const vocab_slice v = vocab_slice_of(hp.n_vocab, int(q), int(n));
    for (std::int64_t r = 0; r < rows; ++r) {
      std::copy_n(tp_all_.data() + (q * rows + r) * stride, v.end - v.begin, logits + r * hp.n_vocab + v.begin);
    }
  }
}

void cpu_forward::layer(std::int64_t l, kv_cache_storage& cache) {
  const hparams& hp = m_.hp;
  const layer_weights& w = m_.layers[std::size_t(l)];
  const std::int64_t n = std::int64_t(ids_.size());

  // Attention (or gated DeltaNet) block.
  h_.resize(x_.size());
  rms_norm(x_.data(), w.attn_norm, h_.data(), n, hp.n_embd, hp.rms_eps);
  o_.resize(x_.size());
  if (w.recurrent()) {
    delta_net(l, cache);
  } else {
    attention(l, cache);
  }
  add_block_output(w.post_attn_norm);

  // Feed-forward block.
  rms_norm(x_.data(), w.ffn_norm, h_.data(), n, hp.n_embd, hp.rms_eps);
  if (w.moe() && w.gate.data) {
    dense_beside_experts(w);
  } else if (w.moe()) {
    experts(w);
  } else {
    swiglu_ffn({.gate = w.gate, .up = w.up, .down = w.down}, h_, n, o_.data());
  }
  if (!(w.moe() && w.gate.data)) reduce(o_);  // dense_beside_experts sums its two parts itself
  add_block_output(w.post_ffn_norm);
  if (hp.ple_dim > 0) per_layer_block(l);
  if (w.out_scale != 1.f) {  // gemma4: the whole residual stream scaled after the layer
    for (float& x : x_) x *= w.out_scale;
  }
}

void cpu_forward::delta_net(std::int64_t l, kv_cache_storage& cache) {
  const hparams& hp = m_.hp;
  const layer_weights& w = m_.layers[std::size_t(l)];
  const std::int64_t n = std::int64_t(ids_.size()), value = hp.ssm_v_heads * hp.ssm_head_v;
  mix_.resize(std::size_t(n * hp.ssm_conv_channels()));
  z_.resize(std::size_t(n * value));
  beta_.resize(std::size_t(n * hp.ssm_v_heads));
  alpha_.resize(beta_.size());
  matmul(w.ssm_qkv, nullptr, h_, n, mix_.data());
  matmul(w.ssm_z, nullptr, h_, n, z_.data());
  matmul(w.ssm_beta, nullptr, h_, n, beta_.data());
  matmul(w.ssm_alpha, nullptr, h_, n, alpha_.data());
  const kv_cache_storage::state_view st = cache.state(l);
  kernels::conv1d_silu_ref({.x = mix_.data(),
                            .channels = hp.ssm_conv_channels(),
                            .kernel = hp.ssm_conv_kernel,
                            .taps = w.ssm_conv.data(),
                            .state = st.conv,
                            .n_slots = cache.n_state_slots(),
                            .seqs = rseqs_});
  attn_.resize(std::size_t(n * value));
  kernels::delta_rule_ref({.qkv = mix_.data(),
                           .b = beta_.data(),
                           .alpha = alpha_.data(),
                           .a = w.ssm_a.data(),
                           .dt_bias = w.ssm_dt_bias.data(),
                           .z = z_.data(),
                           .norm = w.ssm_norm.data(),
                           .eps = hp.rms_eps,
                           .y = attn_.data(),
                           .state = st.matrix,
                           .n_slots = cache.n_state_slots(),
                           .k_heads = hp.ssm_k_heads,
                           .v_heads = hp.ssm_v_heads,
                           .head_k = hp.ssm_head_k,
                           .head_v = hp.ssm_head_v,
                           .seqs = rseqs_});
  matmul(w.ssm_out, nullptr, attn_, n, o_.data());
  reduce(o_);
}

void cpu_forward::attention(std::int64_t l, kv_cache_storage& cache) {
  const hparams& hp = m_.hp;
  const layer_weights& w = m_.layers[std::size_t(l)];
  const std::int64_t n = std::int64_t(ids_.size());
  const auto rows = [n](std::int64_t width) { return std::size_t(n * width); };
  // This layer's attention shape (gemma4's sliding and global layers differ).
  const std::int64_t hd = hp.layer_head_dim(l), kv_heads = hp.layer_kv_heads(l), q_dim = hp.n_head * hd;
  // gemma4 E2B / E4B: a shared layer attends over its source layer's KV (cache.layer(l) is the
  // source's) and writes none.
  const bool own_kv = hp.kv_source(l) == l;
  q_.resize(rows(w.wq.out));
  k_.resize(rows(w.wk.out));
  v_.resize(rows(w.wk.out));
  matmul(w.wq, w.bq, h_, n, q_.data());
  if (hp.attn_out_gate) {
    // Each head's query is followed by its gate: the gates go to qgate_, the queries close up.
    qgate_.resize(rows(q_dim));
    for (std::int64_t t = 0; t < n; ++t) {
      for (std::int64_t h = 0; h < hp.n_head; ++h) {
        const float* src = q_.data() + (t * hp.n_head + h) * 2 * hd;
        std::copy_n(src + hd, hd, qgate_.data() + (t * hp.n_head + h) * hd);
        std::copy_n(src, hd, q_.data() + (t * hp.n_head + h) * hd);  // never ahead of src
      }
    }
    q_.resize(rows(q_dim));
  }
  if (own_kv) {
    matmul(w.wk, w.bk, h_, n, k_.data());
    if (w.wv.data) {
      matmul(w.wv, w.bv, h_, n, v_.data());
    } else {
      std::copy(k_.begin(), k_.end(), v_.begin());  // gemma4's global layers: V is K's projection
    }
  }
  if (hp.qk_norm) {
    rms_norm(q_.data(), w.q_norm, q_.data(), n * hp.n_head, hd, hp.rms_eps);
    if (own_kv) rms_norm(k_.data(), w.k_norm, k_.data(), n * kv_heads, hd, hp.rms_eps);
  }
  if (hp.v_norm && own_kv) {  // gemma4: each V head normalised, without a weight (a gain of ones)
    rms_norm(v_.data(), v_norm_ones_, v_.data(), n * kv_heads, hd, hp.rms_eps);
  }
  // The rotation's frequency factors (Llama 3.1's, YaRN's, gemma4's proportional RoPE) belong to
  // the layers of the model's main RoPE, not to sliding layers with their own.
  const float* factors = m_.rope_freqs.empty() || hp.own_rope(l) ? nullptr : m_.rope_freqs.data();
  const hparams::rope_of_layer lr = hp.layer_rope(l);
  kernels::rope_params rope{.x = q_.data(),
                            .n_tokens = n,
                            .n_heads = hp.n_head,
                            .head_dim = hd,
                            .rot_dim = hp.layer_rope_dim(l),
                            .positions = positions_.data(),
                            .freq_base = lr.base,
                            .freq_scale = lr.freq_scale,
                            .freq_factors = factors,
                            .style = hp.rope};
  kernels::rope_ref(rope);
  if (hp.attn_temp_scale > 0) {  // mistral3: the query's temperature at long positions
    for (std::int64_t t = 0; t < n; ++t) {
      const float temp = kernels::attn_temperature(positions_[std::size_t(t)], hp.attn_temp_scale, hp.attn_temp_floor);
      for (float& x : std::span(q_.data() + t * q_dim, std::size_t(q_dim))) x *= temp;
    }
  }
  const kernels::paged_kv_view kv = cache.layer(l);
  const bool windowed = cache.windowed(l);  // its KV in the window pool, through the window tables
  if (own_kv) {
    rope.x = k_.data();  // K: the same rotation over the KV heads
    rope.n_heads = kv_heads;
    kernels::rope_ref(rope);
    kernels::kv_write_ref({.cache = kv, .k = k_.data(), .v = v_.data(), .slots = (windowed ? window_slots_ : slots_).data(),
                           .n_tokens = n});
  }
  attn_.resize(q_.size());
  kernels::attention_ref({.q = q_.data(),
                          .out = attn_.data(),
                          .n_heads = hp.n_head,
                          .cache = kv,
                          .scale = hp.attention_scale(),
                          .seqs = windowed ? window_seqs_ : seqs_,
                          .window = hp.layer_window(l),
                          .sinks = w.sinks.empty() ? nullptr : w.sinks.data()});
  if (hp.attn_out_gate) {
    kernels::output_gate_ref({.x = attn_.data(),
                              .gate = qgate_.data(),
                              .rows = n,
                              .heads = hp.n_head,
                              .head_dim = hd,
                              .gate_row_stride = q_dim,
                              .gate_head_stride = hd});
  }
  matmul(w.wo, w.bo, attn_, n, o_.data());
  reduce(o_);
}

// x += o, o normed first where the model norms each block's output (post_norm non-empty).
void cpu_forward::add_block_output(const std::vector<float>& post_norm) {
  if (!post_norm.empty()) {
    rms_norm(o_.data(), post_norm, o_.data(), std::int64_t(ids_.size()), m_.hp.n_embd, m_.hp.rms_eps);
  }
  for (std::size_t i = 0; i < x_.size(); ++i) x_[i] += o_[i];
}

// HF's get_per_layer_inputs and project_per_layer_inputs (gemma4 E2B / E4B): the scaled
// embedding's projection and the token's row of per_layer_token_embd times sqrt(ple_dim), combined
// by kernels/per_layer_inputs.h.
void cpu_forward::per_layer_inputs(std::int64_t n) {
  const hparams& hp = m_.hp;
  const std::int64_t width = hp.n_layer * hp.ple_dim;
  ple_.resize(std::size_t(n * width));
  matmul(m_.ple_model_proj, {}, x_, n, ple_.data());
  ple_h_.resize(ple_.size());
  kernels::embedding_ref({.table = m_.ple_embd.data,
                          .type = m_.ple_embd.type,
                          .n_embd = width,
                          .n_vocab = hp.n_vocab,
                          .ids = ids_.data(),
                          .n_tokens = n,
                          .out = ple_h_.data(),
                          .scale = float(std::sqrt(double(hp.ple_dim)))});
  kernels::per_layer_inputs_ref({.y = ple_.data(),
                                 .tok = ple_h_.data(),
                                 .norm = m_.ple_proj_norm.data(),
                                 .n_tokens = n,
                                 .n_layers = hp.n_layer,
                                 .dim = hp.ple_dim,
                                 .proj_scale = float(1.0 / std::sqrt(double(hp.n_embd))),
                                 .sum_scale = float(1.0 / std::sqrt(2.0)),
                                 .eps = hp.rms_eps});
}

// x += post_norm(proj(gelu_tanh(gate(x)) * the layer's per-layer inputs)).
void cpu_forward::per_layer_block(std::int64_t l) {
  const hparams& hp = m_.hp;
  const layer_weights& w = m_.layers[std::size_t(l)];
  const std::int64_t n = std::int64_t(ids_.size()), width = hp.n_layer * hp.ple_dim;
  ple_h_.resize(std::size_t(n * hp.ple_dim));
  matmul(w.ple_gate, {}, x_, n, ple_h_.data());
  kernels::swiglu_rows_ref({.gate = ple_h_.data(),
                            .up = ple_.data() + l * hp.ple_dim,
                            .out = ple_h_.data(),
                            .rows = n,
                            .cols = hp.ple_dim,
                            .gate_stride = hp.ple_dim,
                            .up_stride = width,
                            .out_stride = hp.ple_dim,
                            .act = kernels::glu_activation::gelu_tanh});
  matmul(w.ple_proj, {}, ple_h_, n, o_.data());
  add_block_output(w.ple_post_norm);
}

}  // namespace anvil::model

namespace anvil::model {

void cpu_forward::swiglu_ffn(const ffn& f, const std::pmr::vector<float>& x, std::int64_t n, float* y) {
  gate_.resize(std::size_t(n * f.gate.out));
  up_.resize(gate_.size());
  matmul(f.gate, f.gate_b, x, n, gate_.data());
  matmul(f.up, f.up_b, x, n, up_.data());
  kernels::swiglu_ref({.gate = gate_.data(),
                       .up = up_.data(),
                       .out = gate_.data(),
                       .n = std::int64_t(gate_.size()),
                       .limit = m_.hp.swiglu_limit,
                       .alpha = m_.hp.swiglu_alpha,
                       .act = m_.hp.ffn_act});
  matmul(f.down, f.down_b, gate_, n, y);
}

void cpu_forward::experts(const layer_weights& w) {
  route_experts(w);
  run_experts(w);
}

void cpu_forward::route_experts(const layer_weights& w) {
  const hparams& hp = m_.hp;
  const std::int64_t n = std::int64_t(ids_.size()), n_expert = hp.n_expert, k = hp.n_expert_used;
  router_.resize(std::size_t(n * n_expert));
  matmul(w.router, w.router_b, h_, n, router_.data());
  chosen_.resize(std::size_t(n * k));
  chosen_w_.resize(std::size_t(n * k));
  kernels::moe_route_ref({.logits = router_.data(),
                          .n_tokens = n,
                          .n_expert = n_expert,
                          .k = k,
                          .normalize = hp.expert_weights_norm,
                          .expert_scale = w.expert_scale.empty() ? nullptr : w.expert_scale.data(),
                          .ids = chosen_.data(),
                          .weights = chosen_w_.data()});
}

void cpu_forward::run_experts(const layer_weights& w) {
  const hparams& hp = m_.hp;
  const std::int64_t n = std::int64_t(ids_.size()), n_expert = hp.n_expert, k = hp.n_expert_used, d = hp.n_embd;
  // Expert by expert: its pairs' token rows gathered, its SwiGLU feed-forward, each result put in
  // its pair's row (pair t * k + j: token t's j-th choice), as the GPU's grouped matmul does.
  pair_out_.resize(std::size_t(n * k * d));
  for (std::int64_t e = 0; e < n_expert; ++e) {
    routed_.clear();
    for (std::int64_t i = 0; i < n * k; ++i) {
      if (chosen_[std::size_t(i)] == e) routed_.push_back(std::int32_t(i));
    }
    const std::int64_t cnt = std::int64_t(routed_.size());
    if (cnt == 0) continue;
    xe_.resize(std::size_t(cnt * d));
    for (std::int64_t r = 0; r < cnt; ++r) {
      std::copy_n(h_.data() + routed_[std::size_t(r)] / k * d, d, xe_.data() + r * d);
    }
    ye_.resize(xe_.size());
    swiglu_ffn({.gate = w.gate_exps.at(e),
                .up = w.up_exps.at(e),
                .down = w.down_exps.at(e),
                .gate_b = expert_bias(w.gate_exps_b, e, hp.n_ff_exp),
                .up_b = expert_bias(w.up_exps_b, e, hp.n_ff_exp),
                .down_b = expert_bias(w.down_exps_b, e, d)},
               xe_, cnt, ye_.data());
    for (std::int64_t r = 0; r < cnt; ++r) {
      std::copy_n(ye_.data() + r * d, d, pair_out_.data() + std::size_t(routed_[std::size_t(r)]) * std::size_t(d));
    }
  }
  // The shared expert (Qwen2-MoE): every token, scaled by its gate, added after the routed ones.
  const bool shared = w.gate_shexp.data != nullptr;
  if (shared) {
    ye_.resize(std::size_t(n * d));
    swiglu_ffn({.gate = w.gate_shexp, .up = w.up_shexp, .down = w.down_shexp}, h_, n, ye_.data());
  }
  o_.resize(std::size_t(n * d));
  kernels::moe_combine_ref({.y = pair_out_.data(),
                            .weights = chosen_w_.data(),
                            .n_tokens = n,
                            .k = k,
                            .cols = d,
                            .shared = shared ? ye_.data() : nullptr,
                            .shared_gate = shared && !w.shexp_gate.empty() ? w.shexp_gate.data() : nullptr,
                            .x = h_.data(),
                            .out = o_.data()});
}

// gemma4 with experts (26B-A4B): the dense feed-forward and the experts side by side, each normed,
// summed (layer_weights says which input each reads). h_ holds the pre-normed residual on entry.
void cpu_forward::dense_beside_experts(const layer_weights& w) {
  const hparams& hp = m_.hp;
  const std::int64_t n = std::int64_t(ids_.size()), d = hp.n_embd;
  dense_out_.resize(std::size_t(n * d));
  swiglu_ffn({.gate = w.gate, .up = w.up, .down = w.down}, h_, n, dense_out_.data());
  reduce(dense_out_);
  rms_norm(dense_out_.data(), w.post_ffn_norm_1, dense_out_.data(), n, d, hp.rms_eps);
  rms_norm(x_.data(), w.router_scale, h_.data(), n, d, hp.rms_eps);  // the router's input
  const float root = 1.f / std::sqrt(float(d));
  for (float& v : h_) v *= root;
  route_experts(w);  // each chosen weight times its expert's scale
  rms_norm(x_.data(), w.pre_ffn_norm_2, h_.data(), n, d, hp.rms_eps);  // the experts' input
  run_experts(w);
  reduce(o_);
  rms_norm(o_.data(), w.post_ffn_norm_2, o_.data(), n, d, hp.rms_eps);
  for (std::size_t i = 0; i < o_.size(); ++i) o_[i] += dense_out_[i];
}

}  // namespace anvil::model

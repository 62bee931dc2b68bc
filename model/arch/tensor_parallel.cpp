#include "model/arch/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "model/quant/quant.h"

namespace anvil::model {
namespace {

// Rows or columns [at, at + n) of a matrix.
struct range {
  std::int64_t at = 0, n = 0;
};
using ranges = std::vector<range>;

std::int64_t total(const ranges& r) {
  std::int64_t n = 0;
  for (const range& x : r) n += x.n;
  return n;
}

// A rank's heads of a layer: query heads [q0, q0 + nq), KV heads [kv0, kv0 + nkv).
struct heads {
  std::int64_t q0 = 0, nq = 0, kv0 = 0, nkv = 0;
};

std::string head_refusal(std::int64_t n_head, std::int64_t n_kv, int n) {
  if (n_head % n != 0) return "the " + std::to_string(n_head) + " attention heads do not divide over " + std::to_string(n) + " ranks";
  if (n <= n_kv ? n_kv % n != 0 : n % n_kv != 0) {
    return "the " + std::to_string(n_kv) + " KV heads do not divide over " + std::to_string(n) +
           " ranks, nor the ranks over them";
  }
  return {};
}

heads split_heads(std::int64_t n_head, std::int64_t n_kv, int rank, int n) {
  heads h{.q0 = n_head / n * rank, .nq = n_head / n};
  if (n <= n_kv) {
    h.nkv = n_kv / n;
    h.kv0 = h.nkv * rank;
  } else {  // more ranks than KV heads: each rank holds the one its query heads read
    h.nkv = 1;
    h.kv0 = rank / (n / n_kv);
  }
  return h;
}

// A gated DeltaNet layer's heads on a rank: key heads `keys` and the value heads that read them
// (value head j reads key head j % k_heads), in the order that keeps that rule on the rank: tile
// by tile. With more ranks than key heads, each rank holds one key head (a copy on the ranks that
// share it) and its part of that head's value heads.
struct ssm_heads {
  range keys;
  ranges values;
};

std::string ssm_head_refusal(const hparams& hp, int n) {
  const std::int64_t k = hp.ssm_k_heads, v = hp.ssm_v_heads;
  if (n <= k ? k % n == 0 : n % k == 0 && v % n == 0) return {};
  return "the " + std::to_string(k) + " DeltaNet key heads (" + std::to_string(v) + " value heads) do not divide over " +
         std::to_string(n) + " ranks";
}

ssm_heads split_ssm_heads(const hparams& hp, int rank, int n) {
  const std::int64_t k = hp.ssm_k_heads, tiles = hp.ssm_v_heads / k;
  ssm_heads s{.keys = {}, .values = {}};
  if (n <= k) {
    const std::int64_t nk = k / n;
    s.keys = {nk * rank, nk};
    for (std::int64_t t = 0; t < tiles; ++t) s.values.push_back({t * k + nk * rank, nk});
    return s;
  }
  const std::int64_t share = n / k, key = rank / share, part = rank % share, per = tiles / share;
  s.keys = {key, 1};
  for (std::int64_t t = part * per; t < (part + 1) * per; ++t) s.values.push_back({t * k + key, 1});
  return s;
}

ranges scaled(const ranges& r, std::int64_t by, std::int64_t offset = 0) {
  ranges out;
  for (const range& x : r) out.push_back({offset + x.at * by, x.n * by});
  return out;
}

std::string cols_refusal(const weight& w, std::int64_t width, const char* what, int n) {
  if (w.data == nullptr) return {};
  const std::int64_t block = info(w.type).block_elems;
  if (width % block == 0) return {};
  return std::string(what) + ": a rank's runs of " + std::to_string(width) + " columns (of " + std::to_string(n) +
         " ranks) are not whole " + std::string(info(w.type).name) + " blocks of " + std::to_string(block);
}

// The slicer: views into the mapped file for row slices, copies it owns for column slices.
struct slicer {
  std::vector<std::vector<std::byte>>& owned;

  static std::size_t row_size(ggml_type t, std::int64_t in) { return *row_bytes(t, in); }

  weight rows(const weight& w, const ranges& r) {
    if (w.data == nullptr) return w;
    const std::size_t rb = row_size(w.type, w.in);
    if (r.size() == 1) return {w.data + std::size_t(r[0].at) * rb, w.type, w.in, r[0].n};
    auto& buf = owned.emplace_back(std::size_t(total(r)) * rb);
    std::size_t at = 0;
    for (const range& x : r) {
      std::memcpy(buf.data() + at, w.data + std::size_t(x.at) * rb, std::size_t(x.n) * rb);
      at += std::size_t(x.n) * rb;
    }
    return {buf.data(), w.type, w.in, total(r)};
  }
  weight rows(const weight& w, range r) { return rows(w, ranges{r}); }

  // Columns `c` of every one of `n_rows` rows into `dst` (whole blocks: tp_refusal checked the
  // widths).
  static void copy_cols(const std::byte* data, ggml_type t, std::int64_t in, std::int64_t n_rows, const ranges& c,
                        std::byte* dst) {
    const std::size_t rb = row_size(t, in);
    for (std::int64_t row = 0; row < n_rows; ++row) {
      for (const range& x : c) {
        const std::size_t len = row_size(t, x.n);
        std::memcpy(dst, data + std::size_t(row) * rb + row_size(t, x.at), len);
        dst += len;
      }
    }
  }
  weight cols(const weight& w, const ranges& c) {
    if (w.data == nullptr || (c.size() == 1 && c[0].at == 0 && c[0].n == w.in)) return w;
    auto& buf = owned.emplace_back(row_size(w.type, total(c)) * std::size_t(w.out));
    copy_cols(w.data, w.type, w.in, w.out, c, buf.data());
    return {buf.data(), w.type, total(c), w.out};
  }
  weight cols(const weight& w, range c) { return cols(w, ranges{c}); }

  // Each expert's rows [r.at, r.at + r.n): views with the experts' stride.
  static stacked_weight rows(const stacked_weight& w, range r) {
    if (w.data == nullptr) return w;
    stacked_weight s = w;
    s.data = w.data + std::size_t(r.at) * row_size(w.type, w.in);
    s.out = r.n;
    return s;
  }
  // Each expert's columns [c.at, c.at + c.n), copied, the experts one after the other.
  stacked_weight cols(const stacked_weight& w, range c) {
    if (w.data == nullptr || (c.at == 0 && c.n == w.in)) return w;
    stacked_weight s = w;
    s.in = c.n;
    s.stride = row_size(w.type, c.n) * std::size_t(w.out);
    auto& buf = owned.emplace_back(s.stride * std::size_t(w.count));
    for (std::int64_t e = 0; e < w.count; ++e) {
      copy_cols(w.data + std::size_t(e) * w.stride, w.type, w.in, w.out, {c}, buf.data() + std::size_t(e) * s.stride);
    }
    s.data = buf.data();
    return s;
  }
};

std::vector<float> slice(const std::vector<float>& v, const ranges& r) {
  if (v.empty()) return v;
  std::vector<float> out;
  for (const range& x : r) out.insert(out.end(), v.begin() + x.at, v.begin() + x.at + x.n);
  return out;
}
std::vector<float> slice(const std::vector<float>& v, range r) { return slice(v, ranges{r}); }

// Of each of `count` vectors of `per` floats one after the other (a layer's experts' biases), the
// floats [r.at, r.at + r.n).
std::vector<float> slice_each(const std::vector<float>& v, std::int64_t count, std::int64_t per, range r) {
  if (v.empty()) return v;
  ranges all;
  for (std::int64_t e = 0; e < count; ++e) all.push_back({e * per + r.at, r.n});
  return slice(v, all);
}

std::size_t bytes_of(const weight& w) { return w.data ? *row_bytes(w.type, w.in) * std::size_t(w.out) : 0; }
std::size_t bytes_of(const stacked_weight& w) { return w.data ? *row_bytes(w.type, w.in) * std::size_t(w.out * w.count) : 0; }
std::size_t bytes_of(const std::vector<float>& v) { return v.size() * sizeof(float); }

std::size_t count_bytes(const llm& m) {
  std::size_t n = bytes_of(m.tok_embd) + (m.hp.tied_output ? 0 : bytes_of(m.output)) + bytes_of(m.output_norm);
  for (const layer_weights& l : m.layers) {
    for (const weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down, &l.router, &l.ssm_qkv, &l.ssm_z, &l.ssm_beta,
                            &l.ssm_alpha, &l.ssm_out, &l.gate_shexp, &l.up_shexp, &l.down_shexp}) {
      n += bytes_of(*w);
    }
    for (const stacked_weight* w : {&l.gate_exps, &l.up_exps, &l.down_exps}) n += bytes_of(*w);
    for (const std::vector<float>* v :
         {&l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_ffn_norm, &l.bq, &l.bk, &l.bv, &l.bo,
          &l.sinks, &l.router_b, &l.gate_exps_b, &l.up_exps_b, &l.down_exps_b, &l.ssm_conv, &l.ssm_a, &l.ssm_dt_bias,
          &l.ssm_norm, &l.shexp_gate, &l.router_scale, &l.expert_scale, &l.pre_ffn_norm_2, &l.post_ffn_norm_1,
          &l.post_ffn_norm_2}) {
      n += bytes_of(*v);
    }
  }
  return n;
}

}  // namespace

vocab_slice vocab_slice_of(std::int64_t n_vocab, int rank, int size) {
  const std::int64_t stride = (n_vocab + size - 1) / size;
  return {.begin = std::min(n_vocab, stride * rank), .end = std::min(n_vocab, stride * (rank + 1)), .stride = stride};
}

std::string tp_refusal(const llm& m, int n) {
  const hparams& hp = m.hp;
  if (n < 1) return "tensor parallelism needs at least one rank, not " + std::to_string(n);
  if (n == 1) return {};
  if (hp.ple_dim > 0) return "Gemma 4's per-layer token embeddings (E2B, E4B) are not split over ranks";
  if (vocab_slice_of(hp.n_vocab, n - 1, n).begin >= hp.n_vocab) {
    return "the vocabulary of " + std::to_string(hp.n_vocab) + " tokens leaves the last of " + std::to_string(n) +
           " ranks no slice";
  }
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    const layer_weights& w = m.layers[std::size_t(l)];
    const std::string at = "layer " + std::to_string(l) + ": ";
    if (w.recurrent()) {
      if (std::string why = ssm_head_refusal(hp, n); !why.empty()) return at + why;
      // ssm_out's columns go to the ranks in runs of a rank's value heads of one tile.
      const std::int64_t run = (n <= hp.ssm_k_heads ? hp.ssm_k_heads / n : 1) * hp.ssm_head_v;
      if (std::string why = cols_refusal(w.ssm_out, run, "ssm_out", n); !why.empty()) return at + why;
    } else {
      if (std::string why = head_refusal(hp.n_head, hp.layer_kv_heads(l), n); !why.empty()) return at + why;
      if (std::string why = cols_refusal(w.wo, hp.n_head / n * hp.layer_head_dim(l), "attn_output", n); !why.empty()) return at + why;
    }
    if (w.gate.data) {
      if (hp.n_ff % n != 0) return at + "the feed-forward width " + std::to_string(hp.n_ff) + " does not divide over " + std::to_string(n) + " ranks";
      if (std::string why = cols_refusal(w.down, hp.n_ff / n, "ffn_down", n); !why.empty()) return at + why;
    }
    if (w.moe()) {
      if (hp.n_ff_exp % n != 0) return at + "the experts' width " + std::to_string(hp.n_ff_exp) + " does not divide over " + std::to_string(n) + " ranks";
      if (std::string why = cols_refusal(w.down_exps.at(0), hp.n_ff_exp / n, "ffn_down_exps", n); !why.empty()) return at + why;
    }
    if (w.gate_shexp.data) {
      if (hp.n_ff_shexp % n != 0) return at + "the shared expert's width " + std::to_string(hp.n_ff_shexp) + " does not divide over " + std::to_string(n) + " ranks";
      if (std::string why = cols_refusal(w.down_shexp, hp.n_ff_shexp / n, "ffn_down_shexp", n); !why.empty()) return at + why;
    }
  }
  return {};
}

llm_shard::llm_shard(const llm& m, int rank, int n) : rank_(rank), size_(n) {
  if (std::string why = tp_refusal(m, n); !why.empty()) throw std::invalid_argument("tensor parallelism: " + why);
  if (rank < 0 || rank >= n) throw std::invalid_argument("tensor parallelism: rank " + std::to_string(rank) + " of " + std::to_string(n));
  const hparams& hp = m.hp;
  slicer s{owned_};
  m_.file = m.file;
  m_.hp = hp;
  m_.rope_freqs = m.rope_freqs;
  m_.output_norm = m.output_norm;
  vocab_ = vocab_slice_of(hp.n_vocab, rank, n);
  const range vocab{vocab_.begin, vocab_.end - vocab_.begin};
  m_.tok_embd = s.rows(m.tok_embd, vocab);
  m_.output = hp.tied_output ? m_.tok_embd : s.rows(m.output, vocab);

  hparams& h = m_.hp;
  h.n_head = hp.n_head / n;
  h.n_head_kv = split_heads(hp.n_head, hp.n_head_kv, rank, n).nkv;
  if (hp.n_head_kv_global > 0) h.n_head_kv_global = split_heads(hp.n_head, hp.n_head_kv_global, rank, n).nkv;
  h.n_ff = hp.n_ff / n;
  h.n_ff_exp = hp.n_ff_exp / n;
  h.n_ff_shexp = hp.n_ff_shexp / n;
  h.ssm_k_heads = hp.has_recurrent() ? split_ssm_heads(hp, rank, n).keys.n : 0;
  h.ssm_v_heads = hp.ssm_v_heads / n;

  const bool first = rank == 0;
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    const layer_weights& w = m.layers[std::size_t(l)];
    layer_weights o = w;  // the whole vectors (norms, router) and the fields sliced below
    if (w.recurrent()) {
      const ssm_heads sh = split_ssm_heads(hp, rank, n);
      const std::int64_t hk = hp.ssm_head_k, hv = hp.ssm_head_v, key_dim = hp.ssm_k_heads * hk;
      // The q/k/v projection's channels (and the convolution's): q of the rank's key heads, k of
      // them, then v of its value heads.
      ranges channels{{sh.keys.at * hk, sh.keys.n * hk}, {key_dim + sh.keys.at * hk, sh.keys.n * hk}};
      for (const range& v : scaled(sh.values, hv, 2 * key_dim)) channels.push_back(v);
      o.ssm_qkv = s.rows(w.ssm_qkv, channels);
      o.ssm_conv = slice(w.ssm_conv, scaled(channels, hp.ssm_conv_kernel));
      o.ssm_z = s.rows(w.ssm_z, scaled(sh.values, hv));
      o.ssm_beta = s.rows(w.ssm_beta, sh.values);
      o.ssm_alpha = s.rows(w.ssm_alpha, sh.values);
      o.ssm_a = slice(w.ssm_a, sh.values);
      o.ssm_dt_bias = slice(w.ssm_dt_bias, sh.values);
      o.ssm_out = s.cols(w.ssm_out, scaled(sh.values, hv));
    } else {
      const std::int64_t hd = hp.layer_head_dim(l);
      const heads hs = split_heads(hp.n_head, hp.layer_kv_heads(l), rank, n);
      const std::int64_t q_rows = hp.attn_out_gate ? 2 * hd : hd;  // a head's query rows, and its gate's
      o.wq = s.rows(w.wq, range{hs.q0 * q_rows, hs.nq * q_rows});
      o.bq = slice(w.bq, range{hs.q0 * hd, hs.nq * hd});
      o.wk = s.rows(w.wk, range{hs.kv0 * hd, hs.nkv * hd});
      o.wv = s.rows(w.wv, range{hs.kv0 * hd, hs.nkv * hd});
      o.bk = slice(w.bk, range{hs.kv0 * hd, hs.nkv * hd});
      o.bv = slice(w.bv, range{hs.kv0 * hd, hs.nkv * hd});
      o.sinks = slice(w.sinks, range{hs.q0, hs.nq});
      o.wo = s.cols(w.wo, range{hs.q0 * hd, hs.nq * hd});
      if (!first) o.bo.clear();
    }
    // A dense feed-forward's rank slice of its width: gate and up by rows, down by columns.
    const auto split_ffn = [&](const weight* from[3], weight* to[3], std::int64_t width) {
      const range ff{width / n * rank, width / n};
      *to[0] = s.rows(*from[0], ff);
      *to[1] = s.rows(*from[1], ff);
      *to[2] = s.cols(*from[2], ff);
    };
    if (w.gate.data) {
      const weight* from[3] = {&w.gate, &w.up, &w.down};
      weight* to[3] = {&o.gate, &o.up, &o.down};
      split_ffn(from, to, hp.n_ff);
    }
    if (w.moe()) {
      const range ff{hp.n_ff_exp / n * rank, hp.n_ff_exp / n};
      o.gate_exps = slicer::rows(w.gate_exps, ff);
      o.up_exps = slicer::rows(w.up_exps, ff);
      o.down_exps = s.cols(w.down_exps, ff);
      o.gate_exps_b = slice_each(w.gate_exps_b, hp.n_expert, hp.n_ff_exp, ff);
      o.up_exps_b = slice_each(w.up_exps_b, hp.n_expert, hp.n_ff_exp, ff);
      if (!first) o.down_exps_b.clear();
    }
    if (w.gate_shexp.data) {
      const weight* from[3] = {&w.gate_shexp, &w.up_shexp, &w.down_shexp};
      weight* to[3] = {&o.gate_shexp, &o.up_shexp, &o.down_shexp};
      split_ffn(from, to, hp.n_ff_shexp);
    }
    m_.layers.push_back(std::move(o));
  }
  weight_bytes_ = count_bytes(m_);
}

}  // namespace anvil::model

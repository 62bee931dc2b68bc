// The GPU device's step (gpu_device.h): the plan laid out into the upload buffer, copy-on-write,
// the forward pass (embedding, layers, attention), the head and the candidates reduction, and the
// score targets' log-probabilities. Only enqueues kernels into what the start-up
// (gpu_device_setup.cpp) allocated.
#include "gpu_worker/gpu_device.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "gpu_worker/communicator.h"
#include "kernels/attention_decode.h"
#include "kernels/candidates_merge.h"
#include "kernels/delta_net.h"
#include "kernels/embedding.h"
#include "kernels/feed_tokens.h"
#include "kernels/gemm_quant.h"
#include "kernels/moe.h"
#include "kernels/output_gate.h"
#include "kernels/per_layer_inputs.h"
#include "kernels/rms_norm.h"
#include "kernels/rms_norm_residual.h"
#include "kernels/rope_kv_write.h"
#include "kernels/softcap.h"
#include "kernels/swiglu.h"
#include "kernels/token_logprob.h"

namespace anvil::gpu_worker {

kernels::paged_kv_device gpu_device::kv_layer(std::int64_t l) const {
  const model::hparams& hp = m_.hp;
  const kv_pool& p = kv_layers_.windowed(l) ? window_kv_ : main_kv_;
  unsigned char* k = p.base + p.at[std::size_t(kv_layers_.index[std::size_t(l)])];
  const std::int64_t heads = hp.layer_kv_heads(l), dim = hp.layer_head_dim(l);
  const std::size_t rows = std::size_t(p.n_blocks * block_size_ * heads);
  const std::size_t data_bytes = rows * std::size_t(dim * kernels::kv_elem_bytes_device(kv_dtype_));
  float* scales = kernels::kv_is_8bit(kv_dtype_) ? reinterpret_cast<float*>(k + 2 * data_bytes) : nullptr;
  return {.k = k,
          .v = k + data_bytes,
          .n_blocks = p.n_blocks,
          .block_size = block_size_,
          .n_kv_heads = heads,
          .head_dim = dim,
          .dtype = kv_dtype_,
          .k_scales = scales,
          .v_scales = scales ? scales + rows : nullptr};
}

std::int64_t gpu_device::attn_split(std::int64_t head_dim) const {
  return head_dim > kernels::attention_tc_max_head_dim ? attn_split_wide_ : attn_split_;
}

void gpu_device::matmul(const matrix& w, const float* bias, const float* x, float* y, std::int64_t n_tokens, bool x8_ready,
                        void* x8_ws) {
  const projection p{&w, bias, y};
  project(std::span<const projection>(&p, 1), x, n_tokens, x8_ready, x8_ws);
}

bool gpu_device::fp8_step(std::int64_t n_tokens) const {
  return gemm_dtype_ == kernels::gemm_dtype::fp8 && n_tokens >= kernels::gemm_fp8_min_tokens;
}

kernels::gemm_fp8_context gpu_device::fp8_context() {
  return {.blas = &lt_gemm_,
          .workspace = gemm_.workspace,
          .workspace_bytes = gemm_.workspace_bytes,
          .blas_workspace = gemm_.blas_workspace,
          .blas_workspace_bytes = gemm_.blas_workspace_bytes};
}

kernels::matmul_params gpu_device::projection::params(const float* x, std::int64_t n_tokens) const {
  return {.w = w->w,
          .w_type = w->type,
          .in = w->in,
          .out = w->out,
          .bias = bias,
          .x = x,
          .y = y,
          .n_tokens = n_tokens,
          .w16 = w->w16};
}

void gpu_device::project(std::span<const projection> ps, const float* x, std::int64_t n_tokens, bool x8_ready,
                         void* x8_ws) {
  // GEMMs above gemv_max_tokens, and below it for the weights where the quantized GEMM beats the
  // GEMV (kernels/gemm_quant.h); GEMVs for the rest. The quantized GEMMs go first, on one
  // conversion of x for all of them (in the workspace the others' dequantization overwrites).
  const bool all_gemm = n_tokens > kernels::gemv_max_tokens;
  const bool quantized = gemm_.algo == kernels::gemm_algo::quantized;
  const bool fp8 = fp8_step(n_tokens);
  const auto by_fp8 = [&](const matrix& w) { return fp8 && w.fp8.codes != nullptr; };
  const auto by_gemm = [&](const matrix& w) { return takes_gemm(w, n_tokens); };
  const auto by_quant = [&](const matrix& w) {
    return quantized && !by_fp8(w) && by_gemm(w) && kernels::gemm_quant_preferred(w.type, n_tokens, w.in, w.out);
  };
  if (fp8) {
    // One quantization of x per group of up to gemv_max_group projections (q/k/v, gate/up).
    const kernels::gemm_fp8_context ctx = fp8_context();
    kernels::gemm_fp8_projection group[kernels::gemv_max_group];
    std::size_t n = 0;
    const auto flush = [&] {
      ok(kernels::launch_gemm_fp8_group(std::span<const kernels::gemm_fp8_projection>(group, n), x, n_tokens, ctx,
                                        stream_),
         "fp8 gemm");
      n = 0;
    };
    for (const projection& p : ps) {
      if (!by_fp8(*p.w)) continue;
      if (n == std::size(group)) flush();
      group[n++] = {.w = &p.w->fp8, .bias = p.bias, .y = p.y};
    }
    flush();
  }
  kernels::matmul_params quant[kernels::gemv_max_group];
  std::size_t n_quant = 0;
  for (const projection& p : ps) {
    if (!by_quant(*p.w)) continue;
    if (n_quant == std::size(quant)) {
      ok(kernels::launch_gemm_quant_group(std::span<const kernels::matmul_params>(quant, n_quant), gemm_.workspace,
                                          gemm_.workspace_bytes, stream_),
         "quantized gemm");
      n_quant = 0;
    }
    quant[n_quant++] = p.params(x, n_tokens);
  }
  ok(kernels::launch_gemm_quant_group(std::span<const kernels::matmul_params>(quant, n_quant), gemm_.workspace,
                                      gemm_.workspace_bytes, stream_),
     "quantized gemm");
  for (const projection& p : ps) {
    if (by_gemm(*p.w) && !by_quant(*p.w) && !by_fp8(*p.w)) ok(kernels::launch_gemm(p.params(x, n_tokens), gemm_, stream_), "gemm");
  }
  if (all_gemm) return;
  // Runs of one weight type share a launch; the first quantized launch rounds x (unless a
  // producer kernel did), the later ones read what it wrote.
  for (std::size_t i = 0; i < ps.size();) {
    if (by_gemm(*ps[i].w)) {
      ++i;
      continue;
    }
    kernels::matmul_params group[kernels::gemv_max_group];
    std::size_t n = 0;
    const model::ggml_type type = ps[i].w->type;
    for (; i < ps.size() && n < std::size(group) && ps[i].w->type == type && !by_gemm(*ps[i].w); ++i, ++n) {
      group[n] = ps[i].params(x, n_tokens);  // w16 unread by the GEMV
    }
    const auto source = x8_ready ? kernels::gemv_x8_source::workspace : kernels::gemv_x8_source::quantize;
    ok(kernels::launch_gemv_group(std::span<const kernels::matmul_params>(group, n), x8_ws ? x8_ws : gemv_ws_,
                                  x8_ws ? glu_ws_bytes_ : gemv_ws_bytes_, stream_, gemv_activations_, source),
       "gemv");
    x8_ready = x8_ready || (kernels::gemv_workspace_bytes(type, group[0].in, n_tokens) > 0 &&
                            gemv_activations_ == kernels::gemv_activations::int8);
  }
}

bool gpu_device::takes_gemm(const matrix& w, std::int64_t n_tokens) const {
  return n_tokens > kernels::gemv_max_tokens ||
         (gemm_.algo == kernels::gemm_algo::quantized && kernels::gemm_quant_beats_gemv(w.type, n_tokens, w.in, w.out));
}

bool gpu_device::glu_fused(const layer& w) const {
  const std::int64_t T = step_.tokens;
  return T <= kernels::gemv_glu_max_tokens && gemv_activations_ == kernels::gemv_activations::int8 &&
         gemv_ws_ != nullptr && w.gate.w != nullptr && w.up.w != nullptr && w.gate.type == w.up.type && w.gate.in == w.up.in &&
         w.gate.out == w.up.out && kernels::gemv_glu_supports(w.gate.type) && !takes_gemm(w.gate, T) &&
         !takes_gemm(w.up, T) && kernels::gemv_glu_preferred(w.gate.type, w.gate.out);
}

bool gpu_device::x8_fused(std::int64_t width) const {
  return step_.tokens <= kernels::gemv_max_tokens && gemv_activations_ == kernels::gemv_activations::int8 &&
         gemv_ws_ != nullptr && width % 32 == 0 && width <= kernels::rms_norm_residual_max_x8_cols;
}

kernels::rms_norm_residual_params gpu_device::norm_params(const float* delta, const float* weight) const {
  const model::hparams& hp = m_.hp;
  kernels::rms_norm_residual_params p{
      .h = res_, .delta = delta, .weight = weight, .y = h_, .rows = step_.tokens, .cols = hp.n_embd, .eps = hp.rms_eps};
  if (x8_fused(hp.n_embd)) {
    const kernels::gemv_x8_rows x8 = kernels::gemv_x8_view(gemv_ws_, hp.n_embd, step_.tokens);
    p.yq = x8.q;
    p.yq_scales = x8.ds;
  }
  return p;
}

// One token's q, k and v, all three there, each on the integer GEMV (8-bit x), none on a GEMM.
bool gpu_device::qkv_gemv8(std::int64_t l) const {
  const layer& w = layers_[std::size_t(l)];
  const std::int64_t T = step_.tokens;
  if (T != 1 || gemv_activations_ != kernels::gemv_activations::int8 || fp8_step(T) || w.wq.w == nullptr ||
      w.wk.w == nullptr || w.wv.w == nullptr) {
    return false;
  }
  const auto gemv8 = [&](const matrix& m) { return kernels::gemv_glu_supports(m.type) && !takes_gemm(m, T); };
  return gemv8(w.wq) && gemv8(w.wk) && gemv8(w.wv);
}

bool gpu_device::qkv_normed(std::int64_t l) const {
  const layer& w = layers_[std::size_t(l)];
  return plain_norms_ && qkv_gemv8(l) && w.wk.type == w.wq.type && w.wv.type == w.wq.type;
}

bool gpu_device::qkv_roped(std::int64_t l) const {
  const model::hparams& hp = m_.hp;
  return qkv_gemv8(l) && !hp.attn_out_gate && !hp.qk_norm && !hp.v_norm && q_temps_ == nullptr &&
         hp.kv_source(l) == l && kv_layer(l).dtype == kernels::kv_dtype::f16;
}

bool gpu_device::glu_normed(const layer& w) const {
  return plain_norms_ && glu_fused(w);  // glu_fused: one token, int8 activations
}

kernels::gemv_norm_input gpu_device::normed_input(const float* delta, const float* weight) const {
  return {.h = res_,
          .delta = delta,
          .weight = weight,
          .h_out = delta == nullptr ? nullptr : res_ == x_ ? x_alt_ : x_,
          .eps = m_.hp.rms_eps};
}

bool gpu_device::head_x8_from_norm() const {
  return step_.all_rows_logits && step_.n_scores == 0 && x8_fused(m_.hp.n_embd);
}

void gpu_device::swap_residual() { res_ = res_ == x_ ? x_alt_ : x_; }

void gpu_device::execute(const step_plan& plan, step_result& result) {
  begin(plan);
  collect(plan, result);
}

void gpu_device::begin(const step_plan& plan) {
  if (begun_not_collected() >= max_begun) throw std::logic_error("gpu_device::begin: max_begun steps are not collected");
  if (holding_) throw std::logic_error("gpu_device::begin: the step begun before waits for its masks");
  ok(hipSetDevice(device_), "select the device");  // per thread: steps run on the worker's own
  step_slot& slot = slots_[begun_ % n_slots];
  upload_host_ = slot.upload_host;
  records_host_ = slot.records_host;
  scores_host_ = slot.scores_host;
  slot.gap_measurable = std::exchange(last_begin_ok_, false);
  const std::size_t n = plan.seqs.size();
  const bool decode_only = std::all_of(plan.seqs.begin(), plan.seqs.end(), [](const seq_step& s) { return s.tokens.size() == 1; });
  const hipGraphExec_t graph = decode_only && n <= graphs_.size() && !prof_.on() ? graphs_[n - 1] : nullptr;
  lay_out(plan, graph != nullptr, slot.gap_measurable);
  // The begin event stamps when the device reaches this step: right after the step before ends
  // when this one was queued behind it, else when its first command arrives.
  ok(hipEventRecord(slot.begin, stream_), "time the step");
  prof_.start(begun_ % n_slots, step_.n_pre == 0, step_.tokens);
  prof_.mark("copy-on-write, upload, feed", stream_);
  copy_blocks(plan);
  copy_states(plan.state_copies);
  ok(hipMemcpyAsync(upload_dev_, upload_host_, up_off_.fixed_end, hipMemcpyHostToDevice, stream_), "upload the step");
  feed();
  if (graph) {
    ok(hipGraphLaunch(graph, stream_), "decode graph");
  } else {
    run_body();
  }
  copy_states(plan.state_snapshots);
  run_head();
  holding_ = true;
  if (std::none_of(plan.seqs.begin(), plan.seqs.end(), [](const seq_step& s) { return s.mask_deferred; })) {
    return finish_begin(plan);
  }
  prof_.mark("waiting for the masks", stream_);  // the device idles here when they come late
}

void gpu_device::finish_begin(const step_plan& plan) {
  if (!std::exchange(holding_, false)) throw std::logic_error("gpu_device::finish_begin: no step waits for its masks");
  step_slot& slot = slots_[begun_ % n_slots];
  run_candidates(plan);
  prof_.end(stream_);
  ok(hipEventRecord(slot.end, stream_), "time the step");
  slot.record_bytes = kernels::candidates_record_bytes(lp_max_k_);
  slot.seq_ids.assign(lp_seq_ids_.begin(), lp_seq_ids_.end());
  slot.positions.assign(lp_positions_.begin(), lp_positions_.end());
  ++begun_;
  last_begin_ok_ = true;
  last_outputs_ = lp_.size();
  last_record_bytes_ = slot.record_bytes;
}

bool gpu_device::oldest_ended() const {
  if (collected_ == begun_) return true;
  return hipEventQuery(slots_[collected_ % n_slots].end) != hipErrorNotReady;
}

void gpu_device::collect(const step_plan& plan, step_result& result) {
  if (collected_ == begun_) throw std::logic_error("gpu_device::collect: no step is begun");
  step_slot& slot = slots_[collected_ % n_slots];
  ++collected_;  // whatever follows: a step that fails here is not collected twice
  ok(hipEventSynchronize(slot.end), "finish the step");
  prof_.finish((collected_ - 1) % n_slots);
  float busy_ms = 0, idle_ms = 0;
  if (hipEventElapsedTime(&busy_ms, slot.begin, slot.end) == hipSuccess) result.device_busy_us = 1e3 * double(busy_ms);
  const step_slot& before = slots_[(collected_ + n_slots - 2) % n_slots];
  if (slot.gap_measurable && hipEventElapsedTime(&idle_ms, before.end, slot.begin) == hipSuccess) {
    result.device_idle_us = 1e3 * double(idle_ms);
  }
  collect_scores(plan, slot.scores_host, result);
  for (std::size_t i = 0; i < slot.seq_ids.size(); ++i) {
    const unsigned char* rec = slot.records_host + i * slot.record_bytes;
    kernels::candidates_record_header h;
    std::memcpy(&h, rec, sizeof h);
    if (h.flags != 0) {  // a NaN or +inf logit, or none finite: this sequence fails alone (step.h)
      seq_output none;
      none.seq_id = slot.seq_ids[i];
      result.outputs.push_back(std::move(none));
      continue;
    }
    seq_output out = kernels::unpack_candidates(rec);
    out.seq_id = slot.seq_ids[i];
    out.position = slot.positions[i];
    result.outputs.push_back(std::move(out));
  }
}

// The fed rows' tokens from the records of the step begun just before (still in records_dev_:
// this step's candidates op comes later on the stream).
void gpu_device::feed() {
  if (step_.n_feeds == 0) return;
  ok(kernels::launch_feed_tokens({.ids = dev_at<std::int32_t>(up_off_.ids),
                                  .rows = dev_at<std::int32_t>(up_off_.feed_rows),
                                  .from = dev_at<std::int32_t>(up_off_.feed_from),
                                  .records = records_dev_,
                                  .record_bytes = last_record_bytes_,
                                  .n = step_.n_feeds},
                                 stream_),
     "feed the drawn tokens");
}

void gpu_device::run_body() {
  const model::hparams& hp = m_.hp;
  const std::int64_t T = step_.tokens;
  prof_.mark("embedding", stream_);
  ok(kernels::launch_embedding({.table = tok_embd_,
                                .type = m_.tok_embd.type,
                                .n_embd = hp.n_embd,
                                .n_vocab = comm_ ? vocab_.end - vocab_.begin : hp.n_vocab,
                                .ids = dev_at<std::int32_t>(up_off_.ids),
                                .n_tokens = T,
                                .out = x_,
                                .scale = hp.embd_scale,
                                .vocab_begin = std::int32_t(vocab_.begin)},
                               stream_),
     "embedding");
  reduce(x_);  // tensor parallel: each rank looked up its slice of the vocabulary
  if (hp.ple_dim > 0) run_per_layer_inputs();
  prof_.mark("rope angles", stream_);
  // The step's angles once for every layer (and the queries' temperatures, mistral3); a model whose
  // sliding layers have their own RoPE (gemma3, gemma4) gets a second table for those, of their
  // own rotated dimensions and without the frequency factors (the main RoPE's: cpu_forward.cpp).
  const auto angles = [&](double* out, std::int64_t rot_dim, float base, float freq_scale, const float* factors,
                          float* q_temps) {
    ok(kernels::launch_rope_angles({.positions = dev_at<std::int32_t>(up_off_.positions),
                                    .n_tokens = T,
                                    .rot_dim = rot_dim,
                                    .freq_base = base,
                                    .freq_scale = freq_scale,
                                    .freq_factors = factors,
                                    .out = out,
                                    .q_scales = q_temps,
                                    .attn_temp_scale = hp.attn_temp_scale,
                                    .attn_temp_floor = hp.attn_temp_floor},
                                   stream_),
       "rope angles");
  };
  angles(rope_angles_, hp.rope_dim, hp.rope_base, hp.rope_freq_scale, rope_freqs_, q_temps_);
  if (rope_angles_swa_ != nullptr) {
    angles(rope_angles_swa_, hp.sliding_rope_dim(), hp.rope_base_swa, hp.rope_freq_scale_swa, nullptr, nullptr);
  }
  res_ = x_;
  pending_delta_ = pending_norm_ = nullptr;
  if (qkv_normed(0)) {
    pending_norm_ = layers_[0].attn_norm;  // the q/k/v launch norms x_ itself
  } else {
    prof_.mark("norm", stream_);
    ok(kernels::launch_rms_norm_residual(norm_params(nullptr, layers_[0].attn_norm), stream_), "attention norm");
  }
  for (std::int64_t l = 0; l < hp.n_layer; ++l) run_layer(l);
}

// Copy-on-write, before anything reads the cache: block src -> dst in every layer of its pool, K
// and V.
void gpu_device::copy_blocks(const step_plan& plan) {
  const auto copy = [&](void* base, std::size_t bytes, const block_copy& c) {
    auto* b = static_cast<unsigned char*>(base);
    ok(hipMemcpyAsync(b + std::size_t(c.dst) * bytes, b + std::size_t(c.src) * bytes, bytes, hipMemcpyDeviceToDevice,
                      stream_),
       "copy a KV block");
  };
  for (const block_copy& c : plan.copies) {
    for (std::int64_t l = 0; l < m_.hp.n_layer; ++l) {
      if (kv_layers_.stateful(l) || kv_layers_.windowed(l) != c.window) continue;  // a recurrent layer has no KV
      const kernels::paged_kv_device kv = kv_layer(l);
      const std::size_t block_rows = std::size_t(block_size_ * kv.n_kv_heads);
      const std::size_t data_bytes = block_rows * std::size_t(kv.head_dim * kernels::kv_elem_bytes_device(kv_dtype_));
      const std::size_t scale_bytes = block_rows * sizeof(float);
      copy(kv.k, data_bytes, c);
      copy(kv.v, data_bytes, c);
      if (kv.k_scales != nullptr) {
        copy(kv.k_scales, scale_bytes, c);
        copy(kv.v_scales, scale_bytes, c);
      }
    }
  }
}

// Recurrent states, slot src -> dst in every recurrent layer, the convolution's and the delta
// rule's: one strided copy each, since a layer's slots lie side by side and the layers n_state_slots_
// slots apart.
void gpu_device::copy_states(const std::vector<state_copy>& copies) {
  const auto copy = [&](float* base, std::int64_t per_slot, const state_copy& c) {
    const std::size_t width = std::size_t(per_slot) * sizeof(float), pitch = width * std::size_t(n_state_slots_);
    ok(hipMemcpy2DAsync(base + std::int64_t(c.dst) * per_slot, pitch, base + std::int64_t(c.src) * per_slot, pitch, width,
                        std::size_t(kv_layers_.state_layers), hipMemcpyDeviceToDevice, stream_),
       "copy a recurrent state");
  };
  for (const state_copy& c : copies) {
    copy(conv_state_, m_.hp.ssm_conv_state(), c);
    copy(matrix_state_, m_.hp.ssm_matrix_state(), c);
  }
}

// The step's rows: sequences feeding one token (decode) first, in plan order, then the chunks,
// so that decode queries are one contiguous [n_dec, heads, head_dim] block for the decode kernel.
void gpu_device::lay_out(const step_plan& plan, bool for_graph, bool can_feed) {
  const std::size_t n = plan.seqs.size();
  order_.clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (plan.seqs[i].tokens.size() == 1) order_.push_back(i);
  }
  step_ = {};
  step_.n_dec = std::int64_t(order_.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (plan.seqs[i].tokens.size() != 1) order_.push_back(i);
  }
  step_.n_pre = std::int64_t(n) - step_.n_dec;
  for (const seq_step& s : plan.seqs) {
    const std::int64_t end = s.start_pos + std::int64_t(s.tokens.size());
    step_.stride = std::max(step_.stride, (end + block_size_ - 1) / block_size_);
  }
  if (for_graph) step_.stride = max_blocks_per_seq_;  // the captured shape
  auto* ids = host_at<std::int32_t>(up_off_.ids);
  auto* positions = host_at<std::int32_t>(up_off_.positions);
  auto* slots = host_at<std::int64_t>(up_off_.slots);
  auto* tables = host_at<std::int32_t>(up_off_.tables);
  auto* window_slots = host_at<std::int64_t>(up_off_.window_slots);
  auto* window_tables = host_at<std::int32_t>(up_off_.window_tables);
  const bool window_pool = kv_layers_.window_layers > 0;
  auto* context_lens = host_at<std::int32_t>(up_off_.context_lens);
  auto* prefill = host_at<kernels::attention_prefill_seq>(up_off_.prefill_seqs);
  auto* rseqs = host_at<kernels::recurrent_seq>(up_off_.rseqs);
  first_token_.assign(n, 0);
  std::int64_t t = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const seq_step& s = plan.seqs[order_[r]];
    const std::int64_t len = std::int64_t(s.tokens.size()), end = s.start_pos + len;
    const std::int64_t need = (end + block_size_ - 1) / block_size_;
    first_token_[order_[r]] = t;
    std::int32_t* row = tables + std::size_t(std::int64_t(r) * step_.stride);
    std::copy_n(s.block_table.begin(), need, row);
    std::fill(row + need, row + step_.stride, 0);
    if (window_pool) {  // -1 before the window: the kernels read no position there
      if (std::int64_t(s.window_table.size()) < need) {
        throw std::invalid_argument("seq " + std::to_string(s.seq_id) + ": the window table covers " +
                                    std::to_string(s.window_table.size()) + " blocks, " + std::to_string(need) + " needed");
      }
      std::int32_t* wrow = window_tables + std::size_t(std::int64_t(r) * step_.stride);
      std::copy_n(s.window_table.begin(), need, wrow);
      std::fill(wrow + need, wrow + step_.stride, 0);
    }
    if (s.feed_from >= 0) {  // the token the step begun just before drew (feed())
      if (!can_feed || len != 1 || std::size_t(s.feed_from) >= last_outputs_) {
        throw std::invalid_argument("seq " + std::to_string(s.seq_id) +
                                    ": feeds from an output of a step that was not begun just before");
      }
      host_at<std::int32_t>(up_off_.feed_rows)[step_.n_feeds] = std::int32_t(t);
      host_at<std::int32_t>(up_off_.feed_from)[step_.n_feeds++] = s.feed_from;
    }
    for (std::int64_t j = 0; j < len; ++j, ++t) {
      const std::int64_t pos = s.start_pos + j;
      ids[t] = s.feed_from >= 0 ? 0 : s.tokens[std::size_t(j)];
      positions[t] = std::int32_t(pos);
      slots[t] = std::int64_t(s.block_table[std::size_t(pos / block_size_)]) * block_size_ + pos % block_size_;
      if (window_pool) {
        window_slots[t] = std::int64_t(s.window_table[std::size_t(pos / block_size_)]) * block_size_ + pos % block_size_;
      }
    }
    if (n_state_slots_ > 0) {
      if (s.state_slot < 0 || s.state_slot >= n_state_slots_) {
        throw std::invalid_argument("seq " + std::to_string(s.seq_id) + ": state slot " + std::to_string(s.state_slot) +
                                    " out of range");
      }
      rseqs[r] = {.first = first_token_[order_[r]], .n_tokens = len, .slot = s.state_slot, .fresh = s.start_pos == 0};
    }
    if (std::int64_t(r) < step_.n_dec) {
      context_lens[r] = std::int32_t(end);
      step_.max_dec_context = std::max(step_.max_dec_context, end);
    } else {
      prefill[r - std::size_t(step_.n_dec)] = {std::int32_t(first_token_[order_[r]]), std::int32_t(len),
                                               std::int32_t(s.start_pos), 0};
      step_.max_pre_tokens = std::max(step_.max_pre_tokens, len);
    }
  }
  step_.tokens = t;
  if (for_graph) step_.max_dec_context = max_context();
  // Rows of the final hidden state that need logits: each wanting sequence's last token, in plan order.
  auto* logit_rows = host_at<std::int32_t>(up_off_.logit_rows);
  for (std::size_t i = 0; i < n; ++i) {
    const seq_step& s = plan.seqs[i];
    if (s.want_candidates) logit_rows[step_.n_logit_rows++] = std::int32_t(first_token_[i] + std::int64_t(s.tokens.size()) - 1);
  }
  step_.all_rows_logits = step_.n_logit_rows == t;
  for (std::int64_t r = 0; r < step_.n_logit_rows && step_.all_rows_logits; ++r) {
    step_.all_rows_logits = logit_rows[r] == std::int32_t(r);
  }
  // Rows scored against a target token, in plan order.
  auto* score_rows = host_at<std::int32_t>(up_off_.score_rows);
  auto* score_targets = host_at<std::int32_t>(up_off_.score_targets);
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<std::int32_t>& targets = plan.seqs[i].score_targets;
    for (std::size_t j = 0; j < targets.size(); ++j) {
      if (targets[j] < 0) continue;
      score_rows[step_.n_scores] = std::int32_t(first_token_[i] + std::int64_t(j));
      score_targets[step_.n_scores++] = targets[j];
    }
  }
}

void gpu_device::run_layer(std::int64_t l) {
  const model::hparams& hp = m_.hp;
  const layer& w = layers_[std::size_t(l)];
  const std::int64_t T = step_.tokens;
  // The norm before each projection group wrote its 8-bit form too when x8_fused (norm_params).
  const bool x8_embd = x8_fused(hp.n_embd);
  if (w.ssm_qkv.w != nullptr) {
    run_delta_net(l, x8_embd);
  } else {
    run_attention_block(l, x8_embd);
  }
  if (!glu_normed(w)) {  // else the gate/up launch norms res_ + o_ itself
    prof_.mark("norm", stream_);
    kernels::rms_norm_residual_params ffn_norm = norm_params(o_, w.ffn_norm);
    ffn_norm.delta_weight = w.post_attn_norm;  // gemma3: the attention's output normed before the add
    ok(kernels::launch_rms_norm_residual(ffn_norm, stream_), "ffn norm");
  }
  bool summed = true;  // o_ holds the feed-forward's output; else the experts' pairs, summed below
  const float* ffn_out = o_;
  if (w.router_in_scale != nullptr) {
    run_dense_and_experts(w, x8_embd);
    ffn_out = dense_out_;
  } else if (w.router.w != nullptr) {
    summed = run_experts(w, x8_embd);
  } else {
    run_dense_ffn(w, x8_embd);
  }
  prof_.mark("norm", stream_);
  const float* post_norm = w.post_ffn_norm;  // gemma3: the block's output normed before the add
  if (hp.ple_dim > 0) {
    // gemma4 E2B / E4B: the feed-forward's output added (its norm's y unused), then the per-layer
    // input's block, whose output the fused norm below adds in its place.
    if (!summed) throw std::logic_error("gpu_device: per-layer inputs after experts whose sum the norm makes");
    kernels::rms_norm_residual_params add = norm_params(ffn_out, w.ffn_norm);
    add.delta_weight = post_norm;
    add.yq = nullptr, add.yq_scales = nullptr;
    ok(kernels::launch_rms_norm_residual(add, stream_), "feed-forward residual");
    run_per_layer_block(l);
    ffn_out = o_;
    post_norm = w.ple_post_norm;
  }
  // The residual add fused with the next norm: the next layer's attention norm (or its q/k/v
  // launch does both: qkv_normed), or the final one (whose output the head gathers and quantizes
  // itself).
  if (l + 1 < hp.n_layer && qkv_normed(l + 1)) {
    pending_delta_ = ffn_out;  // plain norms: summed, no post-norm or scale
    pending_norm_ = layers_[std::size_t(l + 1)].attn_norm;
    return;
  }
  kernels::rms_norm_residual_params p =
      l + 1 < hp.n_layer
          ? norm_params(ffn_out, layers_[std::size_t(l + 1)].attn_norm)
          : kernels::rms_norm_residual_params{.h = res_,
                                              .delta = ffn_out,
                                              .weight = output_norm_,
                                              .y = h_,
                                              .rows = T,
                                              .cols = hp.n_embd,
                                              .eps = hp.rms_eps};
  // The final norm's output in 8 bits too, for the head (head_x8_from_norm) — whatever this step's
  // logit rows, so that a decode graph holds it for every step it is replayed for.
  if (l + 1 == hp.n_layer && x8_fused(hp.n_embd)) {
    const kernels::gemv_x8_rows x8 = kernels::gemv_x8_view(gemv_ws_, hp.n_embd, T);
    p.yq = x8.q;
    p.yq_scales = x8.ds;
  }
  p.delta_weight = post_norm;
  p.h_scale = w.out_scale;  // gemma4: the residual stream scaled after the layer
  if (!summed) {
    if (p.delta_weight != nullptr) throw std::logic_error("gpu_device: a norm on the experts' output needs their sum first");
    p.delta = pair_out_;
    p.pair_weights = moe_weights_;
    p.k = hp.n_expert_used;
  }
  ok(kernels::launch_rms_norm_residual(p, stream_), l + 1 < hp.n_layer ? "residual norm" : "final norm");
}

void gpu_device::run_attention_block(std::int64_t l, bool x8_embd) {
  const model::hparams& hp = m_.hp;
  const layer& w = layers_[std::size_t(l)];
  const std::int64_t T = step_.tokens;
  // With a stacked FP8 copy, q, k and v come out of one GEMM as one row per token, which the
  // RoPE (with the Q/K norms) reads in place (strides); the rotated q goes to q_ as usual.
  const bool stacked = w.qkv_fp8.codes != nullptr && fp8_step(T);  // never with a gated q (make_fp8_copies)
  const bool gated = hp.attn_out_gate;
  // This layer's attention shape (gemma4's sliding and global layers differ).
  const std::int64_t hd = hp.layer_head_dim(l), q_w = hp.n_head * hd, kv_w = hp.layer_kv_heads(l) * hd;
  const std::int64_t stride = stacked ? q_w + 2 * kv_w : 0;
  float* q_in = stacked ? qkv_ : q_;
  float* k_in = stacked ? qkv_ + q_w : k_;
  float* v_in = stacked ? qkv_ + q_w + kv_w : v_;
  // The token's cache slots (a sliding layer's are its window's).
  const auto* slots = dev_at<std::int64_t>(kv_layers_.windowed(l) ? up_off_.window_slots : up_off_.slots);
  const double* angles = hp.own_rope(l) ? rope_angles_swa_ : rope_angles_;
  const bool normed = !stacked && qkv_normed(l), roped = !stacked && qkv_roped(l);
  prof_.mark(roped ? (normed ? "norm + q/k/v projection + rope + kv write" : "q/k/v projection + rope + kv write")
                   : "q/k/v projection",
             stream_);
  if (stacked) {
    const kernels::gemm_fp8_projection p{.w = &w.qkv_fp8, .bias = w.bqkv, .y = qkv_};
    ok(kernels::launch_gemm_fp8_group(std::span(&p, 1), h_, T, fp8_context(), stream_), "fp8 gemm");
  } else {
    // Qwen3.5: each head's query then its gate, read by the RoPE from qg_ (2 head_dim apart).
    // Without wv (gemma4's global layers) V is K's projection: the RoPE reads k_ for both.
    // A layer sharing another's KV (gemma4 E2B / E4B) has neither: q alone.
    const projection qkv[] = {{&w.wq, w.bq, gated ? qg_ : q_}, {&w.wk, w.bk, k_}, {&w.wv, w.bv, v_}};
    const kernels::gemv_rope_kv rope{.angles = angles,
                                     .head_dim = hd,
                                     .rot_dim = hp.layer_rope_dim(l),
                                     .style = hp.rope,
                                     .cache = kv_layer(l),
                                     .slot = slots};  // where roped
    if (normed) {
      // The attention norm (with the residual add of the layer before) in the same launch, and
      // where it can, the RoPE and the KV write too.
      const kernels::matmul_params group[] = {qkv[0].params(nullptr, T), qkv[1].params(nullptr, T),
                                              qkv[2].params(nullptr, T)};  // x: normed in the launch
      const kernels::gemv_norm_input norm = normed_input(pending_delta_, pending_norm_);
      if (roped) {
        ok(kernels::launch_gemv_qkv_rope(group, norm, rope, stream_), "norm + q/k/v gemv + rope + kv write");
      } else {
        ok(kernels::launch_gemv_group_norm(group, norm, stream_), "norm + q/k/v gemv");
      }
      if (pending_delta_ != nullptr) swap_residual();
      pending_delta_ = pending_norm_ = nullptr;
    } else if (roped) {
      // Each run of one weight type rotates and caches its parts; the first rounds h_ to 8 bits
      // unless the norm kernel did.
      bool x8_ready = x8_embd;
      for (int first = 0; first < 3;) {
        kernels::matmul_params run[3];
        int n = 0;
        for (; first + n < 3 && qkv[first + n].w->type == qkv[first].w->type; ++n) run[n] = qkv[first + n].params(h_, T);
        ok(kernels::launch_gemv_rope_run(std::span<const kernels::matmul_params>(run, std::size_t(n)), first, rope,
                                         gemv_ws_, gemv_ws_bytes_, stream_,
                                         x8_ready ? kernels::gemv_x8_source::workspace : kernels::gemv_x8_source::quantize),
           "q/k/v gemv + rope + kv write");
        x8_ready = true;
        first += n;
      }
    } else {
      project(std::span(qkv, w.wk.w == nullptr ? 1 : w.wv.w != nullptr ? 3 : 2), h_, T, x8_embd);
    }
    if (w.wv.w == nullptr) v_in = k_;
  }
  const bool own_kv = hp.kv_source(l) == l;
  kernels::rope_kv_write_params rp{.q = q_,
                                   .k = k_in,
                                   .v = v_in,
                                   .q_in = stacked ? q_in : gated ? qg_ : nullptr,
                                   .q_in_stride = gated ? 2 * q_w : stride,
                                   .k_stride = stride,
                                   .v_stride = stride,
                                   .q_in_head_stride = gated ? 2 * hd : 0,
                                   .cache = kv_layer(l),
                                   .n_tokens = T,
                                   .n_heads = hp.n_head,
                                   .rot_dim = hp.layer_rope_dim(l),
                                   .angles = angles,
                                   .slots = slots,
                                   .style = hp.rope,
                                   // Q/K norms (qwen3, gemma3): per head, before the rotation, in the same launch.
                                   .q_norm = hp.qk_norm ? w.q_norm : nullptr,
                                   .k_norm = hp.qk_norm ? w.k_norm : nullptr,
                                   .v_norm = hp.v_norm,  // gemma4
                                   .norm_eps = hp.rms_eps,
                                   .q_scales = q_temps_,
                                   // gemma4 E2B / E4B's shared layers: q alone, over the source's KV
                                   // (kv_layer(l) is the source's).
                                   .q_only = !own_kv};
  if (!own_kv) rp.k = rp.v = nullptr, rp.slots = nullptr, rp.k_norm = nullptr;
  if (!roped) {
    prof_.mark(hp.qk_norm ? "q/k norm + rope + kv write" : "rope + kv write", stream_);
    ok(kernels::launch_rope_kv_write(rp, stream_), "rope + kv write");
  }
  // Decode-only steps: attention writes the o projection's 8-bit input itself (not when the gate
  // comes between them).
  const bool x8_attn = !gated && step_.n_pre == 0 && x8_fused(q_w);
  run_attention(l, x8_attn);
  if (gated) {
    prof_.mark("output gate", stream_);
    ok(kernels::launch_output_gate({.x = attn_,
                                    .gate = qg_ + hd,
                                    .rows = T,
                                    .heads = hp.n_head,
                                    .head_dim = hd,
                                    .gate_row_stride = 2 * q_w,
                                    .gate_head_stride = 2 * hd},
                                   stream_),
       "output gate");
  }
  prof_.mark("o projection", stream_);
  matmul(w.wo, w.bo, attn_, o_, T, x8_attn);
  reduce(o_);
}

void gpu_device::run_delta_net(std::int64_t l, bool x8_embd) {
  const model::hparams& hp = m_.hp;
  const layer& w = layers_[std::size_t(l)];
  const std::int64_t T = step_.tokens;
  const projection in[] = {
      {&w.ssm_qkv, nullptr, mix_}, {&w.ssm_z, nullptr, z_}, {&w.ssm_beta, nullptr, beta_}, {&w.ssm_alpha, nullptr, alpha_}};
  prof_.mark("delta net projections", stream_);
  project(in, h_, T, x8_embd);
  // The state layer's slots: its convolution's, then (after every state layer's) its matrices.
  const std::int64_t i = kv_layers_.index[std::size_t(l)];
  const std::span<const kernels::recurrent_seq> seqs(dev_at<kernels::recurrent_seq>(up_off_.rseqs),
                                                     std::size_t(step_.n_dec + step_.n_pre));
  prof_.mark("conv1d + silu", stream_);
  ok(kernels::launch_conv1d_silu({.x = mix_,
                                  .channels = hp.ssm_conv_channels(),
                                  .kernel = hp.ssm_conv_kernel,
                                  .taps = w.ssm_conv,
                                  .state = conv_state_ + i * n_state_slots_ * hp.ssm_conv_state(),
                                  .n_slots = n_state_slots_,
                                  .seqs = seqs,
                                  // Prompt chunks (after the step's decode rows) spread over a block's threads.
                                  .chunked_from = std::size_t(step_.n_dec)},
                                 stream_),
     "conv1d");
  prof_.mark("delta rule", stream_);
  ok(kernels::launch_delta_rule({.qkv = mix_,
                                 .b = beta_,
                                 .alpha = alpha_,
                                 .a = w.ssm_a,
                                 .dt_bias = w.ssm_dt_bias,
                                 .z = z_,
                                 .norm = w.ssm_norm,
                                 .eps = hp.rms_eps,
                                 .y = attn_,
                                 .state = matrix_state_ + i * n_state_slots_ * hp.ssm_matrix_state(),
                                 .n_slots = n_state_slots_,
                                 .k_heads = hp.ssm_k_heads,
                                 .v_heads = hp.ssm_v_heads,
                                 .head_k = hp.ssm_head_k,
                                 .head_v = hp.ssm_head_v,
                                 .seqs = seqs,
                                 // Prompt chunks (after the step's decode rows) in the chunked form.
                                 .chunked_from = std::size_t(step_.n_dec)},
                                stream_),
     "delta rule");
  prof_.mark("ssm out projection", stream_);
  matmul(w.ssm_out, nullptr, attn_, o_, T);
  reduce(o_);
}

// gemma4 E2B / E4B (kernels/per_layer_inputs.h, model/arch/cpu_forward.cpp): the embedding's
// projection and the token's per-layer rows, combined.
void gpu_device::run_per_layer_inputs() {
  const model::hparams& hp = m_.hp;
  const std::int64_t T = step_.tokens, width = hp.n_layer * hp.ple_dim;
  prof_.mark("per-layer inputs", stream_);
  matmul(ple_model_proj_, nullptr, x_, ple_, T);
  ok(kernels::launch_embedding({.table = ple_embd_,
                                .type = m_.ple_embd.type,
                                .n_embd = width,
                                .n_vocab = hp.n_vocab,
                                .ids = dev_at<std::int32_t>(up_off_.ids),
                                .n_tokens = T,
                                .out = ple_tok_,
                                .scale = float(std::sqrt(double(hp.ple_dim)))},
                               stream_),
     "per-layer embedding");
  ok(kernels::launch_per_layer_inputs({.y = ple_,
                                       .tok = ple_tok_,
                                       .norm = ple_proj_norm_,
                                       .n_tokens = T,
                                       .n_layers = hp.n_layer,
                                       .dim = hp.ple_dim,
                                       .proj_scale = float(1.0 / std::sqrt(double(hp.n_embd))),
                                       .sum_scale = float(1.0 / std::sqrt(2.0)),
                                       .eps = hp.rms_eps},
                                      stream_),
     "per-layer inputs");
}

// proj(gelu_tanh(gate(x)) * the layer's per-layer input) into o_ (its norm is the residual add's).
void gpu_device::run_per_layer_block(std::int64_t l) {
  const model::hparams& hp = m_.hp;
  const layer& w = layers_[std::size_t(l)];
  const std::int64_t T = step_.tokens;
  prof_.mark("per-layer block", stream_);
  matmul(w.ple_gate, nullptr, x_, ple_h_, T);
  ok(kernels::launch_swiglu({.gate = ple_h_,
                             .up = ple_ + l * hp.ple_dim,
                             .out = ple_h_,
                             .rows = T,
                             .cols = hp.ple_dim,
                             .gate_stride = hp.ple_dim,
                             .up_stride = hp.n_layer * hp.ple_dim,
                             .out_stride = hp.ple_dim,
                             .act = kernels::glu_activation::gelu_tanh},
                            stream_),
     "per-layer gate");
  matmul(w.ple_proj, nullptr, ple_h_, o_, T);
}

void gpu_device::run_dense_ffn(const layer& w, bool x8_embd) {
  const model::hparams& hp = m_.hp;
  const std::int64_t T = step_.tokens;
  // This layer's width: gemma4 E2B / E4B's shared layers are double-wide (hp.n_ff is the widest).
  const std::int64_t ff = w.down.in;
  const bool x8_ff = x8_fused(ff);
  if (glu_fused(w)) {
    // Gate, up and their product in one launch; its 8-bit rows go to glu_ws_, apart from the 8-bit
    // h_ it reads from gemv_ws_, and the down projection's GEMV reads them there. glu_normed: the
    // launch norms res_ + o_ itself (the attention's output added).
    const bool normed = glu_normed(w);
    prof_.mark(normed ? "norm + gate/up projection + swiglu" : "gate/up projection + swiglu", stream_);
    ok(kernels::launch_gemv_glu({.gate = w.gate.w,
                                 .up = w.up.w,
                                 .w_type = w.gate.type,
                                 .in = w.gate.in,
                                 .out = ff,
                                 .x = h_,
                                 .y = gate_,
                                 .n_tokens = T,
                                 .limit = hp.swiglu_limit,
                                 .alpha = hp.swiglu_alpha,
                                 .act = hp.ffn_act,
                                 .yq = x8_ff ? kernels::gemv_x8_view(glu_ws_, ff, T) : kernels::gemv_x8_rows{},
                                 .norm = normed ? normed_input(o_, w.ffn_norm) : kernels::gemv_norm_input{}},
                                gemv_ws_, gemv_ws_bytes_, stream_,
                                x8_embd ? kernels::gemv_x8_source::workspace : kernels::gemv_x8_source::quantize),
       "gate/up + swiglu gemv");
    if (normed) swap_residual();
    prof_.mark("down projection", stream_);
    matmul(w.down, nullptr, gate_, o_, T, x8_ff, x8_ff ? glu_ws_ : nullptr);
    reduce(o_);
    return;
  }
  const projection gate_up[] = {{&w.gate, nullptr, gate_}, {&w.up, nullptr, up_}};
  prof_.mark("gate/up projection", stream_);
  project(gate_up, h_, T, x8_embd);
  kernels::swiglu_rows_params sw{.gate = gate_,
                                 .up = up_,
                                 .out = gate_,
                                 .rows = T,
                                 .cols = ff,
                                 .gate_stride = ff,
                                 .up_stride = ff,
                                 .out_stride = ff,
                                 .limit = hp.swiglu_limit,
                                 .alpha = hp.swiglu_alpha,
                                 .act = hp.ffn_act};
  if (x8_ff) {
    const kernels::gemv_x8_rows x8 = kernels::gemv_x8_view(gemv_ws_, ff, T);
    sw.yq = x8.q;
    sw.yq_scales = x8.ds;
  }
  prof_.mark("swiglu", stream_);
  ok(kernels::launch_swiglu(sw, stream_), "swiglu");
  prof_.mark("down projection", stream_);
  matmul(w.down, nullptr, gate_, o_, T, x8_ff);
  reduce(o_);
}

// Tensor parallelism: the first T rows of x (T x n_embd floats) summed over the ranks, in place.
void gpu_device::reduce(float* x) {
  if (comm_ == nullptr) return;
  prof_.mark("all-reduce", stream_);
  comm_->all_reduce_sum(x, std::size_t(step_.tokens * m_.hp.n_embd), stream_);
}

// The head's logits of `rows` rows of x (rows_ or h_) into `out` [rows, n_vocab]. Tensor parallel: each rank
// multiplies its slice of the vocabulary into tp_local_, the slices are gathered into tp_all_
// (rank after rank, each rows x stride floats), and laid out as whole rows.
void gpu_device::head_logits(const float* x, std::int64_t rows, float* out, bool x8_ready) {
  if (comm_ == nullptr) {
    matmul(output_, nullptr, x, out, rows, x8_ready);
    return;
  }
  const std::int64_t V = m_.hp.n_vocab, stride = vocab_.stride;
  matmul(output_, nullptr, x, tp_local_, rows, x8_ready);
  prof_.mark("all-gather", stream_);
  comm_->all_gather(tp_local_, std::size_t(rows * stride), tp_all_, stream_);
  for (int q = 0; q < comm_->size(); ++q) {
    const model::vocab_slice v = model::vocab_slice_of(V, q, comm_->size());
    const std::size_t width = std::size_t(v.end - v.begin) * sizeof(float);
    if (width == 0) continue;
    ok(hipMemcpy2DAsync(out + v.begin, std::size_t(V) * sizeof(float), tp_all_ + std::size_t(q * rows * stride), width, width,
                        std::size_t(rows), hipMemcpyDeviceToDevice, stream_),
       "lay out the gathered logits");
  }
}

void gpu_device::norm_rows(const float* x, const float* weight, float* y, const char* what) {
  const model::hparams& hp = m_.hp;
  ok(kernels::launch_rms_norm(
         {.x = x, .weight = weight, .y = y, .rows = step_.tokens, .cols = hp.n_embd, .eps = hp.rms_eps}, stream_),
     what);
}

void gpu_device::run_dense_and_experts(const layer& w, bool x8_embd) {
  const model::hparams& hp = m_.hp;
  const std::int64_t T = step_.tokens;
  run_dense_ffn(w, x8_embd);
  prof_.mark("norm", stream_);
  norm_rows(o_, w.post_ffn_norm_1, dense_out_, "dense feed-forward's norm");
  norm_rows(x_, w.router_in_scale, h_, "router's input norm");
  if (!run_experts(w, false, w.pre_ffn_norm_2)) {  // tensor parallel: summed (and over the ranks) already
    prof_.mark("experts sum", stream_);
    ok(kernels::launch_moe_combine({.y = pair_out_,
                                    .weights = moe_weights_,
                                    .n_tokens = T,
                                    .k = hp.n_expert_used,
                                    .cols = hp.n_embd,
                                    .out = o_},
                                   stream_),
       "experts sum");
  }
  // dense_out_ += the experts' sum normed by post_ffn_norm_2 (the norm's y, into h_, is not used:
  // the residual norm after the block rewrites h_).
  prof_.mark("norm", stream_);
  ok(kernels::launch_rms_norm_residual({.h = dense_out_,
                                        .delta = o_,
                                        .weight = w.post_ffn_norm_2,
                                        .y = h_,
                                        .rows = T,
                                        .cols = hp.n_embd,
                                        .eps = hp.rms_eps,
                                        .delta_weight = w.post_ffn_norm_2},
                                       stream_),
     "experts' norm and the dense output");
}

bool gpu_device::run_experts(const layer& w, bool x8_embd, const float* pre_norm) {
  const model::hparams& hp = m_.hp;
  const std::int64_t T = step_.tokens, k = hp.n_expert_used, pairs = T * k;
  prof_.mark("router", stream_);
  ok(kernels::launch_moe_router({.w = static_cast<const float*>(w.router.w),
                                 .x = h_,
                                 .logits = router_logits_,
                                 .in = w.router.in,
                                 .n_expert = hp.n_expert,
                                 .n_tokens = T,
                                 .bias = w.router_b},
                                stream_),
     "router");
  const bool x8_up = moe_x8_h_ != nullptr && kernels::moe_matmul_int8(w.gate_exps.type);
  const bool x8_down = moe_x8_pairs_ != nullptr && kernels::moe_matmul_int8(w.down_exps.type);
  // A step of one token on the integer path: each pair on its own, its expert read from the
  // route's ids (kernels/moe.h), so the route makes no grouping.
  const bool by_pair = T == 1 && x8_up && x8_down && kernels::moe_matmul_int8(w.up_exps.type);
  ok(kernels::launch_moe_route({.logits = router_logits_,
                                .n_tokens = T,
                                .n_expert = hp.n_expert,
                                .k = k,
                                .normalize = hp.expert_weights_norm,
                                .expert_scale = w.expert_scale,
                                .ids = moe_ids_,
                                .weights = moe_weights_,
                                .offsets = by_pair ? nullptr : moe_offsets_,
                                .sorted = by_pair ? nullptr : moe_sorted_,
                                .active = by_pair ? nullptr : moe_active_},
                               stream_),
     "expert routing");
  // gemma4: the experts read the residual normed apart from the router's input.
  if (pre_norm != nullptr) norm_rows(x_, pre_norm, h_, "experts' input norm");
  // Each pair's gate and up rows (gate_, up_: [pairs, n_ff_exp]), in one launch when the two
  // stacks share a type. Where the experts' type has the integer path they read 8-bit rows: h_'s
  // as the norm left them in the GEMV workspace (decode-sized steps) or rounded here, and the
  // pairs' as SwiGLU writes them.
  prof_.mark("experts gate/up", stream_);
  kernels::gemv_x8_rows x8_h;
  if (x8_up && x8_embd) {
    x8_h = kernels::gemv_x8_view(gemv_ws_, hp.n_embd, T);
  } else if (x8_up) {
    x8_h = kernels::gemv_x8_view(moe_x8_h_, hp.n_embd, T);
    ok(kernels::launch_gemv_quantize_x(h_, hp.n_embd, T, x8_h, stream_), "experts' input to 8 bits");
  }
  const kernels::gemv_x8_rows x8_pairs =
      x8_down ? kernels::gemv_x8_view(moe_x8_pairs_, hp.n_ff_exp, pairs) : kernels::gemv_x8_rows{};
  const auto experts = [&](const layer::stacked& s, const float* bias, float* y, const float* x, std::int64_t x_div,
                           const kernels::gemv_x8_rows& x8) {
    return kernels::moe_matmul_params{.w = {s.w},
                                      .y = {y},
                                      .bias = {bias},
                                      .n_mats = 1,
                                      .w_type = s.type,
                                      .in = s.in,
                                      .out = s.out,
                                      .stride = s.stride,
                                      .x = x,
                                      .x_div = x_div,
                                      .xq = kernels::moe_matmul_int8(s.type) ? x8.q : nullptr,
                                      .x_scales = x8.ds,
                                      .n_pairs = pairs,
                                      .n_expert = hp.n_expert,
                                      .max_expert_pairs = T,
                                      .offsets = moe_offsets_,
                                      .sorted = moe_sorted_,
                                      .active = moe_active_,
                                      .pair_experts = by_pair ? moe_ids_ : nullptr};
  };
  // Steps of 64 pairs and more take the tensor-core GEMM on the blocks (kernels/gemm_quant.h: each
  // expert's rows read once per tile of up to 64 pairs, not once per 8), where the type has it;
  // not with f32 activations (its operands are f16).
  const auto matmul_experts = [&](const kernels::moe_matmul_params& p, const char* what) {
    const bool by_gemm = !by_pair && moe_x8_h_ != nullptr && gemm_.algo == kernels::gemm_algo::quantized &&
                         kernels::gemm_quant_experts_supported(p.w_type, p.in, p.out, p.stride) &&
                         kernels::gemm_quant_experts_preferred(p.w_type, p.n_pairs, p.n_expert, p.in, p.out);
    ok(by_gemm ? kernels::launch_gemm_quant_experts(p, gemm_.workspace, gemm_.workspace_bytes, stream_)
               : kernels::launch_moe_matmul(p, stream_),
       what);
  };
  kernels::moe_matmul_params gu = experts(w.gate_exps, w.gate_exps_b, gate_, h_, k, x8_h);
  if (w.up_exps.type == w.gate_exps.type) {
    gu.w[1] = w.up_exps.w;
    gu.y[1] = up_;
    gu.bias[1] = w.up_exps_b;
    gu.n_mats = 2;
    matmul_experts(gu, "experts gate/up");
  } else {
    matmul_experts(gu, "experts gate");
    matmul_experts(experts(w.up_exps, w.up_exps_b, up_, h_, k, x8_h), "experts up");
  }
  // SwiGLU in place over gate_ and up_ rows of `cols`, packed (and to 8 bits where x8 says).
  const auto swiglu = [&](std::int64_t rows, std::int64_t cols, const char* what, const kernels::gemv_x8_rows& x8) {
    ok(kernels::launch_swiglu({.gate = gate_,
                               .up = up_,
                               .out = gate_,
                               .rows = rows,
                               .cols = cols,
                               .gate_stride = cols,
                               .up_stride = cols,
                               .out_stride = cols,
                               .limit = hp.swiglu_limit,
                               .alpha = hp.swiglu_alpha,
                               .act = hp.ffn_act,  // gemma4's experts: GeGLU
                               .yq = x8.q,
                               .yq_scales = x8.ds},
                              stream_),
       what);
  };
  prof_.mark("swiglu", stream_);
  swiglu(pairs, hp.n_ff_exp, "experts swiglu", x8_pairs);
  prof_.mark("experts down", stream_);
  matmul_experts(experts(w.down_exps, w.down_exps_b, pair_out_, gate_, 1, x8_pairs), "experts down");
  // The shared expert (Qwen2-MoE) as a dense feed-forward of its own width, into shared_out_.
  // Without one, the residual norm sums the pairs itself (run_layer).
  // Tensor parallel: each rank's pairs hold its slice of the experts' width, so the ranks sum the
  // combined rows (k times fewer floats than the pairs).
  const bool shared = w.gate_shexp.w != nullptr;
  if (!shared && comm_ == nullptr) return false;
  if (shared) {
    const projection gate_up[] = {{&w.gate_shexp, nullptr, gate_}, {&w.up_shexp, nullptr, up_}};
    prof_.mark("shared expert", stream_);
    project(gate_up, h_, T, x8_embd);
    swiglu(T, hp.n_ff_shexp, "shared expert swiglu", {});
    matmul(w.down_shexp, nullptr, gate_, shared_out_, T);
  }
  prof_.mark("experts sum", stream_);
  ok(kernels::launch_moe_combine({.y = pair_out_,
                                  .weights = moe_weights_,
                                  .n_tokens = T,
                                  .k = k,
                                  .cols = hp.n_embd,
                                  .shared = shared ? shared_out_ : nullptr,
                                  .shared_gate = shared ? w.shexp_gate : nullptr,
                                  .x = h_,
                                  .out = o_},
                                 stream_),
     "experts sum");
  reduce(o_);
  return true;
}

void gpu_device::run_attention(std::int64_t l, bool x8_out) {
  const model::hparams& hp = m_.hp;
  const float scale = hp.attention_scale();
  const std::int64_t window = hp.layer_window(l);
  const float* sinks = layers_[std::size_t(l)].sinks;
  const auto* tables = dev_at<std::int32_t>(kv_layers_.windowed(l) ? up_off_.window_tables : up_off_.tables);
  const kernels::paged_kv_device cache = kv_layer(l);
  if (step_.n_dec > 0) {
    kernels::attention_decode_params p{.q = q_,
                                       .out = attn_,
                                       .cache = cache,
                                       .n_heads = hp.n_head,
                                       .block_tables = tables,
                                       .block_table_stride = step_.stride,
                                       .context_lens = dev_at<std::int32_t>(up_off_.context_lens),
                                       .n_seqs = step_.n_dec,
                                       .max_context = step_.max_dec_context,
                                       .scale = scale,
                                       .window = window,
                                       .sinks = sinks,
                                       .split = attn_split(cache.head_dim),
                                       .workspace = attn_ws_,
                                       .workspace_bytes = attn_ws_bytes_};
    if (x8_out) {
      const kernels::gemv_x8_rows x8 = kernels::gemv_x8_view(gemv_ws_, hp.n_head * cache.head_dim, step_.tokens);
      p.yq = x8.q;
      p.yq_scales = x8.ds;
    }
    prof_.mark("decode attention", stream_);
    ok(kernels::launch_attention_decode(p, stream_), "decode attention");
  }
  if (step_.n_pre > 0) {
    const kernels::attention_prefill_params p{.q = q_,
                                              .out = attn_,
                                              .cache = cache,
                                              .n_heads = hp.n_head,
                                              .seqs = dev_at<kernels::attention_prefill_seq>(up_off_.prefill_seqs),
                                              .n_seqs = step_.n_pre,
                                              .max_seq_tokens = step_.max_pre_tokens,
                                              .block_tables = tables + step_.n_dec * step_.stride,
                                              .block_table_stride = step_.stride,
                                              .scale = scale,
                                              .window = window,
                                              .sinks = sinks};
    prof_.mark("prefill attention", stream_);
    ok(kernels::launch_attention_prefill(p, stream_), "prefill attention");
  }
}

// The scores, then the head only for the rows that need logits (gathered first).
void gpu_device::run_head() {
  const model::hparams& hp = m_.hp;
  const std::int64_t rows = step_.n_logit_rows;
  prof_.mark("scores", stream_);
  run_scores();
  if (step_.n_scores > 0) {
    ok(hipMemcpyAsync(scores_host_, scores_dev_, std::size_t(step_.n_scores) * sizeof(float), hipMemcpyDeviceToHost, stream_),
       "copy the scores back");
  }
  if (rows == 0) return;
  prof_.mark("head", stream_);
  // Every row needs logits, in order (decode steps): the head reads the final hidden state as it is,
  // in 8 bits where the final norm wrote them.
  const bool x8_ready = head_x8_from_norm();
  const float* x = step_.all_rows_logits ? h_ : rows_;
  // Else a row gather, the embedding op on an F32 table: the final hidden state [tokens, n_embd].
  if (!step_.all_rows_logits) {
    ok(kernels::launch_embedding({.table = h_,
                                  .type = model::ggml_type::F32,
                                  .n_embd = hp.n_embd,
                                  .n_vocab = step_.tokens,
                                  .ids = dev_at<std::int32_t>(up_off_.logit_rows),
                                  .n_tokens = rows,
                                  .out = rows_},
                                 stream_),
       "gather the logit rows");
  }
  if (split_vocab()) {
    matmul(output_, nullptr, x, logits_, rows, x8_ready);  // this rank's slice: the candidates op merges the ranks'
    softcap(rows, vocab_.end - vocab_.begin);
  } else {
    head_logits(x, rows, logits_, x8_ready);
    softcap(rows, hp.n_vocab);
  }
}

void gpu_device::softcap(std::int64_t rows, std::int64_t width) {
  const float cap = m_.hp.final_softcap;
  if (cap <= 0) return;
  prof_.mark("softcap", stream_);
  ok(kernels::launch_softcap({.x = logits_, .n = rows * width, .cap = cap}, stream_), "softcap");
}

// The candidates reduction of the logits run_head() left, in as many launches as the logit-bias /
// penalty pairs need (one, unless they overflow the upload buffer), and the compact records back.
// Vocabulary split over ranks: each rank reduces its slice (with its slice of each sequence's
// parameters), the records are gathered, and every rank merges them into the whole vocabulary's
// (kernels/candidates_merge.h), the draw included, so the fed tokens agree on every rank.
void gpu_device::run_candidates(const step_plan& plan) {
  const model::hparams& hp = m_.hp;
  const bool split = split_vocab();
  const std::int64_t vocab = split ? vocab_.end - vocab_.begin : hp.n_vocab;
  lp_.clear();
  lp_positions_.clear();
  lp_seq_ids_.clear();
  lp_max_k_ = 1;
  if (step_.n_logit_rows == 0) return;
  for (const seq_step& s : plan.seqs) {
    if (!s.want_candidates) continue;
    lp_.push_back(s.logits);
    lp_.back().top_k = std::min(s.logits.top_k, kernels::candidates_max_k);  // the tail keeps sampling exact
    lp_positions_.push_back(s.start_pos + std::int64_t(s.tokens.size()));
    lp_seq_ids_.push_back(s.seq_id);
  }
  std::int32_t max_k = 1;
  for (const auto& p : lp_) max_k = std::max(max_k, p.top_k);
  const std::vector<logit_params>* reduced = &lp_;
  if (split) {
    slice_lp_.clear();
    for (const logit_params& p : lp_) {
      slice_lp_.push_back(kernels::slice_logit_params(p, vocab_.begin, vocab_.end, comm_->rank()));
    }
    reduced = &slice_lp_;
  }
  lp_max_k_ = max_k;
  const std::size_t record_bytes = kernels::candidates_record_bytes(max_k);

  prof_.mark("candidates", stream_);
  std::size_t r0 = 0;
  while (r0 < lp_.size()) {
    // As many sequences as fit the pair buffers (at least one).
    std::size_t r1 = r0;
    std::int64_t bias = 0, counts = 0;
    while (r1 < lp_.size()) {
      const logit_params& p = (*reduced)[r1];
      const std::int64_t b = std::int64_t(p.logit_bias.size()), c = std::int64_t(p.token_counts.size());
      if (b > max_pairs_ || c > max_pairs_) throw std::invalid_argument("a sequence has more logit pairs than max_logit_pairs");
      if (r1 > r0 && (bias + b > max_pairs_ || counts + c > max_pairs_)) break;
      bias += b;
      counts += c;
      ++r1;
    }
    if (r0 > 0) ok(hipStreamSynchronize(stream_), "candidates upload");  // the pinned buffer is reused
    const kernels::candidates_batch batch = kernels::pack_candidates(
        std::span(*reduced).subspan(r0, r1 - r0), std::span(lp_positions_).subspan(r0, r1 - r0), vocab, max_k);
    const auto put = [&](std::size_t off, const void* src, std::size_t bytes) {
      if (bytes == 0) return;
      std::memcpy(upload_host_ + off, src, bytes);
      ok(hipMemcpyAsync(upload_dev_ + off, upload_host_ + off, bytes, hipMemcpyHostToDevice, stream_), "candidates upload");
    };
    put(up_off_.cand_seqs, batch.seqs.data(), batch.seqs.size() * sizeof(kernels::candidates_seq));
    put(up_off_.bias_ids, batch.bias_ids.data(), batch.bias_ids.size() * 4);
    put(up_off_.bias_values, batch.bias_values.data(), batch.bias_values.size() * 4);
    put(up_off_.count_ids, batch.count_ids.data(), batch.count_ids.size() * 4);
    put(up_off_.count_values, batch.count_values.data(), batch.count_values.size() * 4);
    put(up_off_.mask_words, batch.mask_words.data(), batch.mask_words.size() * 4);
    const kernels::candidates_params cp{.logits = logits_ + r0 * std::size_t(vocab),
                                        .vocab = vocab,
                                        .n_seqs = std::int64_t(r1 - r0),
                                        .seqs = dev_at<kernels::candidates_seq>(up_off_.cand_seqs),
                                        .bias_ids = dev_at<std::int32_t>(up_off_.bias_ids),
                                        .bias_values = dev_at<float>(up_off_.bias_values),
                                        .count_ids = dev_at<std::int32_t>(up_off_.count_ids),
                                        .count_values = dev_at<std::int32_t>(up_off_.count_values),
                                        .mask_words = dev_at<std::uint32_t>(up_off_.mask_words),
                                        .max_k = max_k,
                                        .out = static_cast<unsigned char*>(records_dev_) + r0 * record_bytes,
                                        .workspace = cand_ws_,
                                        .workspace_bytes = cand_ws_bytes_,
                                        .draw = std::any_of(reduced->begin() + std::ptrdiff_t(r0),
                                                            reduced->begin() + std::ptrdiff_t(r1),
                                                            [](const logit_params& l) { return l.draw.on; }),
                                        .pairs = !batch.bias_ids.empty() || !batch.count_ids.empty()};
    ok(kernels::launch_candidates(cp, stream_), "candidates");
    r0 = r1;
  }
  if (split) merge_candidates(record_bytes, max_k);
  ok(hipMemcpyAsync(records_host_, records_dev_, lp_.size() * record_bytes, hipMemcpyDeviceToHost, stream_),
     "copy the candidates back");
}

// Tensor parallel: every rank's records of this step gathered (rank after rank), and merged into
// records_dev_ with the whole vocabulary's parameters (top_k, the tail's uniform, the draw).
void gpu_device::merge_candidates(std::size_t record_bytes, std::int32_t max_k) {
  const std::size_t n = lp_.size();
  prof_.mark("candidates gather and merge", stream_);
  comm_->all_gather(reinterpret_cast<const float*>(records_dev_), n * record_bytes / sizeof(float),
                    reinterpret_cast<float*>(tp_records_), stream_);
  const kernels::candidates_batch whole = kernels::pack_candidates(lp_, lp_positions_, m_.hp.n_vocab, max_k);
  std::memcpy(upload_host_ + up_off_.merge_seqs, whole.seqs.data(), n * sizeof(kernels::candidates_seq));
  ok(hipMemcpyAsync(upload_dev_ + up_off_.merge_seqs, upload_host_ + up_off_.merge_seqs, n * sizeof(kernels::candidates_seq),
                    hipMemcpyHostToDevice, stream_),
     "candidates merge upload");
  kernels::candidates_merge_params mp{.parts = tp_records_,
                                      .n_ranks = comm_->size(),
                                      .n_seqs = std::int64_t(n),
                                      .record_bytes = record_bytes,
                                      .vocab = m_.hp.n_vocab,
                                      .seqs = dev_at<kernels::candidates_seq>(up_off_.merge_seqs),
                                      .out = records_dev_,
                                      .draw = std::any_of(lp_.begin(), lp_.end(), [](const logit_params& l) { return l.draw.on; })};
  for (int q = 0; q < comm_->size(); ++q) {
    mp.vocab_begin[q] = std::int32_t(model::vocab_slice_of(m_.hp.n_vocab, q, comm_->size()).begin);
  }
  ok(kernels::launch_candidates_merge(mp, stream_), "candidates merge");
}

// The score targets, max_seqs rows at a time through the logits buffer: gather the rows, the
// head, then each row's log-softmax at its target into scores_dev_.
void gpu_device::run_scores() {
  const model::hparams& hp = m_.hp;
  for (std::int64_t r0 = 0; r0 < step_.n_scores; r0 += max_seqs_) {
    const std::int64_t rows = std::min(max_seqs_, step_.n_scores - r0);
    ok(kernels::launch_embedding({.table = h_,
                                  .type = model::ggml_type::F32,
                                  .n_embd = hp.n_embd,
                                  .n_vocab = step_.tokens,
                                  .ids = dev_at<std::int32_t>(up_off_.score_rows) + r0,
                                  .n_tokens = rows,
                                  .out = rows_},
                                 stream_),
       "gather the scored rows");
    head_logits(rows_, rows, logits_);
    softcap(rows, hp.n_vocab);
    ok(kernels::launch_token_logprob({.logits = logits_,
                                      .vocab = hp.n_vocab,
                                      .rows = rows,
                                      .targets = dev_at<std::int32_t>(up_off_.score_targets) + r0,
                                      .out = scores_dev_ + r0},
                                     stream_),
       "score the targets");
  }
}

void gpu_device::collect_scores(const step_plan& plan, const float* scores, step_result& result) const {
  std::int64_t k = 0;
  for (const seq_step& s : plan.seqs) {
    if (s.score_targets.empty()) continue;
    seq_scores sc{s.seq_id, std::vector<float>(s.score_targets.size(), 0.f)};
    for (std::size_t j = 0; j < s.score_targets.size(); ++j) {
      if (s.score_targets[j] < 0) continue;
      const float v = scores[k++];
      if (!std::isfinite(v)) throw device_failure("scores: seq " + std::to_string(s.seq_id) + " has a NaN or infinite logit");
      sc.logprobs[j] = v;
    }
    result.scores.push_back(std::move(sc));
  }
}


}  // namespace anvil::gpu_worker

// The GPU device's start-up (gpu_device.h): device, stream and BLAS handle, the weight upload, the
// memory plan (scratch, workspaces, upload buffers, the KV pool), the warm-up step and the decode
// graphs' capture. Every allocation happens here, through alloc_*(); the step (gpu_device_step.cpp)
// only uses what this file carved.
#include "gpu_worker/gpu_device.h"

#include <algorithm>
#include <cstring>
#include <string>

#include <spdlog/logger.h>

#include "actors/log.h"
#include "gpu_worker/communicator.h"
#include "gpu_worker/kv_plan.h"
#include "kernels/attention_decode.h"
#include "kernels/candidates_merge.h"
#include "kernels/delta_net.h"
#include "kernels/gemm_quant.h"
#include "kernels/moe.h"
#include "kernels/rope_kv_write.h"
#include "model/arch/cpu_forward.h"

namespace anvil::gpu_worker {
namespace {

constexpr std::size_t staging_bytes = std::size_t(8) << 20;  // pinned buffer the weights pass through
constexpr std::size_t weight_align = 16;                     // the kernels' requirement for matrix bases
constexpr std::size_t scratch_align = 256;

constexpr std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// Hands out aligned offsets inside one allocation (sizes first, pointers once it exists).
class carver {
 public:
  std::size_t take(std::size_t bytes, std::size_t align = scratch_align) {
    off_ = align_up(off_, align);
    const std::size_t at = off_;
    off_ += bytes;
    return at;
  }
  std::size_t size() const { return off_; }

 private:
  std::size_t off_ = 0;
};

// gemma4's fused experts: gate and up the two halves of each expert's matrix in one tensor
// (model/arch/llm.cpp, stacked_halves).
bool halves(const model::layer_weights& l) {
  return l.up_exps.data == l.gate_exps.data + l.gate_exps.stride / 2 && l.up_exps.stride == l.gate_exps.stride;
}

std::size_t matrix_bytes(const model::weight& w) {
  const auto row = model::row_bytes(w.type, w.in);
  if (!row) throw std::runtime_error("gpu worker: a weight's rows do not divide into blocks of its type");
  return *row * std::size_t(w.out);
}

}  // namespace


void* gpu_device::alloc_device(std::size_t bytes, const char* what) {
  void* p = nullptr;
  if (const hipError_t e = hipMalloc(&p, std::max<std::size_t>(bytes, 256)); e != hipSuccess) {
    throw std::runtime_error(std::string("gpu worker: allocating ") + std::to_string(bytes >> 20) + " MiB for " + what +
                             ": " + hipGetErrorString(e));
  }
  device_allocs_.push_back(p);
  ++allocations_;
  return p;
}

void* gpu_device::alloc_pinned(std::size_t bytes, const char* what) {
  void* p = nullptr;
  if (const hipError_t e = hipHostMalloc(&p, std::max<std::size_t>(bytes, 256), hipHostMallocDefault); e != hipSuccess) {
    throw std::runtime_error(std::string("gpu worker: allocating pinned host memory for ") + what + ": " +
                             hipGetErrorString(e));
  }
  pinned_allocs_.push_back(p);
  ++allocations_;
  return p;
}

gpu_device::gpu_device(const model::llm& m, const gpu_worker_config& cfg, memory_plan& mem)
    : m_(m), device_(cfg.device), comm_(cfg.comm), vocab_(cfg.vocab), block_size_(cfg.block_size), max_tokens_(cfg.max_batch_tokens),
      max_seqs_(cfg.max_seqs), max_pairs_(std::max<std::int64_t>(cfg.max_logit_pairs, 2 * m.hp.n_vocab)),
      gemv_activations_(cfg.float_activations ? kernels::gemv_activations::f32 : kernels::gemv_activations::int8) {
  const model::hparams& hp = m.hp;
  if (cfg.block_size < 1 || cfg.max_batch_tokens < 1 || cfg.max_seqs < 1 || cfg.max_context < 1 ||
      cfg.memory_fraction <= 0 || cfg.memory_fraction > 1) {
    throw std::runtime_error("gpu worker: block size, step limits and context must be positive, memory_fraction in (0, 1]");
  }
  if (cfg.max_batch_tokens > 65535 || cfg.max_seqs > 65535) throw std::runtime_error("gpu worker: step limits above 65535");
  if (hp.has_recurrent() && (hp.ssm_head_v > 128 || (hp.ssm_head_k != 16 && hp.ssm_head_k != 32 && hp.ssm_head_k != 64 &&
                                                      hp.ssm_head_k != 128))) {
    throw std::runtime_error("gpu worker: gated DeltaNet heads of " + std::to_string(hp.ssm_head_k) + " x " +
                             std::to_string(hp.ssm_head_v) +
                             "; the kernels take key heads of 16, 32, 64 or 128 and value heads of up to 128");
  }
  if (const std::string why = gpu_unsupported(hp); !why.empty()) throw std::runtime_error("gpu worker: " + why);
  if (comm_ != nullptr && comm_->size() > kernels::candidates_merge_max_ranks) {
    throw std::runtime_error("gpu worker: tensor parallelism over " + std::to_string(comm_->size()) +
                             " GPUs; the candidates merge takes at most " +
                             std::to_string(kernels::candidates_merge_max_ranks));
  }
  if (hp.n_vocab > kernels::candidates_max_vocab) {
    throw std::runtime_error("gpu worker: the model's vocabulary has " + std::to_string(hp.n_vocab) +
                             " tokens; the candidates kernels take at most " +
                             std::to_string(kernels::candidates_max_vocab));
  }
  max_blocks_per_seq_ = (cfg.max_context + cfg.block_size - 1) / cfg.block_size;
  const bool window_pool = cfg.window_pool && window_pool_fits(hp);
  kv_layers_ = model::map_kv_layers(hp, window_pool);
  gpu::dependent_launch_enabled.store(cfg.overlap_kernels, std::memory_order_relaxed);
  try {
    int n_devices = 0;
    ok(hipGetDeviceCount(&n_devices), "count the devices");
    if (device_ < 0 || device_ >= n_devices) {
      throw std::runtime_error("gpu worker: there is no device " + std::to_string(device_) + "; this machine has " +
                               std::to_string(n_devices) + " (anvil info lists them)");
    }
    ok(hipSetDevice(device_), "select the device");
    attn_split_ = kernels::attention_decode_split_for(
        max_context(), kernels::attention_decode_tensor_cores(kernels::attention_tc_max_head_dim));
    attn_split_wide_ = kernels::attention_decode_split_for(max_context(), false);
    hipDeviceProp_t prop{};
    ok(hipGetDeviceProperties(&prop, device_), "read the device's properties");
    mem.device = prop.name;
    ok(hipStreamCreateWithFlags(&stream_, hipStreamNonBlocking), "create the stream");
    for (step_slot& sl : slots_) {
      ok(hipEventCreate(&sl.begin), "create the step timing events");
      ok(hipEventCreate(&sl.end), "create the step timing events");
    }
    gemm_.algo = kernels::default_gemm_algo();
    gemm_dtype_ = cfg.gemm_dtype;
    fp8_stack_qkv_ = cfg.fp8_stack_qkv;
    const bool fp8 = gemm_dtype_ == kernels::gemm_dtype::fp8;
    if (kernels::gemm_uses_blas(gemm_.algo) || fp8) {
      // cuBLASLt for every vendor GEMM: f16/bf16 products of prompt steps, and the FP8 ones.
      if ((fp8 && !kernels::gemm_fp8_supported(device_)) || lt_gemm_.create() != blas::ok) {
        if (!fp8) throw std::runtime_error("gpu worker: the cuBLASLt handle could not be created");
        throw std::runtime_error("gpu worker: --gemm-dtype fp8 needs FP8 tensor cores (NVIDIA compute capability 8.9+) "
                                 "and cuBLASLt; " + std::string(prop.name) + " has compute capability " +
                                 std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                                 (ANVIL_GPU_HAVE_BLAS ? "" : " and this build has no vendor BLAS"));
      }
      have_blas_ = true;
      gemm_.lt = &lt_gemm_;
      ++allocations_;  // the handle holds device memory of its own
    }
  } catch (const device_failure& e) {
    throw std::runtime_error(std::string("gpu worker: ") + e.what());
  }
  mem.block_size = cfg.block_size;
  mem.max_batch_tokens = cfg.max_batch_tokens;
  mem.max_seqs = cfg.max_seqs;
  mem.n_vocab = hp.n_vocab;
  if (cfg.f16_weight_copies && gemm_dtype_ == kernels::gemm_dtype::fp8) {
    throw std::invalid_argument("gpu worker: --f16-weight-copies and --gemm-dtype fp8 exclude each other "
                                "(the FP8 copies take the long steps)");
  }
  if (cfg.f16_weight_copies && !have_blas_) {
    throw std::invalid_argument("gpu worker: --f16-weight-copies needs a build with the vendor BLAS");
  }
  upload_weights(cfg, mem);
  if (cfg.f16_weight_copies) make_f16_copies(mem);
  plan_scratch(mem);
  if (gemm_dtype_ == kernels::gemm_dtype::fp8) make_fp8_copies(mem);
  mem.gemm_dtype = gemm_dtype_;
  plan_kv(cfg, mem);
  // Tensor parallel: no rank starts its warm-up's collectives before every rank has allocated
  // everything (with peer access on, an allocation may wait for the peers' devices, where a peer's
  // collective waits for this rank). Suspected for session 32's start-up hang, whose cause turned
  // out to be a per-process kernel limit (bench/GPU_NOTES.md, session 33); kept as the cheap rule.
  if (cfg.ranks_allocated) cfg.ranks_allocated();
  try {
    warm_up();
    capture_graphs(std::min(cfg.graph_max_batch, max_seqs_));
    last_begin_ok_ = false;  // no step feeds from the warm-up's
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("gpu worker: the warm-up step failed: ") + e.what());
  }
  mem.decode_graphs = graphs();
  if (op_profile::requested()) {
    prof_.create(n_slots, std::size_t(24 * hp.n_layer + 32));  // the marks of gpu_device_step.cpp (up to 17 a layer)
    log::get("gpu")->warn("ANVIL_OP_PROFILE: steps run eagerly, each op timed on its own (slower steps)");
  }
}

bool gpu_device::split_vocab() const { return comm_ != nullptr && comm_->size() > 1; }

gpu_device::~gpu_device() {
  (void)hipSetDevice(device_);  // a tensor-parallel rank's device may not be the thread's
  if (stream_) (void)hipStreamSynchronize(stream_);
  for (hipGraphExec_t g : graphs_) {
    if (g) (void)hipGraphExecDestroy(g);
  }
  for (const step_slot& sl : slots_) {
    if (sl.begin) (void)hipEventDestroy(sl.begin);
    if (sl.end) (void)hipEventDestroy(sl.end);
  }
  for (void* p : device_allocs_) (void)hipFree(p);
  for (void* p : pinned_allocs_) (void)hipHostFree(p);
  if (stream_) (void)hipStreamDestroy(stream_);
}

// Every tensor into ONE allocation at 16-byte aligned offsets: matrices as the GGUF bytes,
// norms / biases / rope factors as the f32 vectors the loader made. Through a pinned staging
// buffer, chunk by chunk; a tied head shares the embedding's bytes.
void gpu_device::upload_weights(const gpu_worker_config& cfg, memory_plan& mem) {
  const model::hparams& hp = m_.hp;
  struct piece {
    const void* host;
    std::size_t bytes;
    std::size_t offset;
  };
  std::vector<piece> pieces;
  std::unordered_map<const void*, std::size_t> index;
  carver c;
  const auto add = [&](const void* host, std::size_t bytes) {
    if (host == nullptr || bytes == 0 || index.count(host)) return;
    index[host] = pieces.size();
    pieces.push_back({host, bytes, c.take(bytes, weight_align)});
  };
  const auto check_matrix = [&](const model::weight& w) {
    if (!kernels::gemv_supports(w.type) || w.in % 8 != 0) {
      throw std::runtime_error("gpu worker: weight type " + std::string(model::info(w.type).name) +
                               " (rows of " + std::to_string(w.in) + ") is not supported by the GPU kernels" +
                               (model::info(w.type).supported ? "; --backend cpu runs it" : ""));
    }
  };
  const auto add_matrix = [&](const model::weight& w) {
    check_matrix(w);
    add(w.data, matrix_bytes(w));
  };
  const auto add_vec = [&](const std::vector<float>& v) { add(v.data(), v.size() * sizeof(float)); };
  add_matrix(m_.tok_embd);
  add_matrix(m_.output);
  if (m_.ple_embd.data) {  // gemma4 E2B / E4B
    add_matrix(m_.ple_embd);
    add_matrix(m_.ple_model_proj);
    add_vec(m_.ple_proj_norm);
  }
  add_vec(m_.output_norm);
  add_vec(m_.rope_freqs);
  derived_.assign(m_.layers.size(), {});  // sized once: add() keeps their addresses
  for (std::size_t li = 0; li < m_.layers.size(); ++li) {
    const model::layer_weights& l = m_.layers[li];
    for (const auto* v : {&l.attn_norm, &l.ffn_norm, &l.post_attn_norm, &l.post_ffn_norm, &l.q_norm, &l.k_norm, &l.bq,
                          &l.bk, &l.bv, &l.bo, &l.sinks, &l.router_b, &l.gate_exps_b, &l.up_exps_b, &l.down_exps_b}) {
      add_vec(*v);
    }
    for (const auto* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down}) add_matrix(*w);
    for (const auto* w : {&l.ssm_qkv, &l.ssm_z, &l.ssm_beta, &l.ssm_alpha, &l.ssm_out, &l.ple_gate, &l.ple_proj}) {
      add_matrix(*w);
    }
    add_vec(l.ple_post_norm);
    for (const auto* v : {&l.ssm_conv, &l.ssm_a, &l.ssm_dt_bias, &l.ssm_norm}) add_vec(*v);
    if (!l.moe()) continue;
    if (!l.router_scale.empty()) {  // gemma4: the router's input norm weight over sqrt(n_embd), in one vector
      const float root = 1.f / std::sqrt(float(hp.n_embd));
      for (const float s : l.router_scale) derived_[li].push_back(s * root);
      add_vec(derived_[li]);
    }
    for (const auto* v : {&l.expert_scale, &l.pre_ffn_norm_2, &l.post_ffn_norm_1, &l.post_ffn_norm_2}) add_vec(*v);
    if (l.router.type != model::ggml_type::F32 || l.router.in % 4 != 0) {
      throw std::runtime_error("gpu worker: the experts' router is " + std::string(model::info(l.router.type).name) +
                               " with rows of " + std::to_string(l.router.in) +
                               "; the GPU kernels take an F32 router with rows of a multiple of 4");
    }
    add_matrix(l.router);
    for (const auto* w : {&l.gate_exps, &l.up_exps, &l.down_exps}) {
      check_matrix(w->at(0));
      if (!kernels::moe_matmul_supports(w->type, w->in, w->stride)) {
        throw std::runtime_error("gpu worker: stacked experts of type " + std::string(model::info(w->type).name) + " (" +
                                 std::to_string(w->stride) + " bytes apart) are not supported by the GPU kernels");
      }
      // gemma4's gate and up are the halves of one tensor (each expert's gate rows, then its up
      // rows): gate's piece is the whole tensor, and up lies inside it (upload() maps it there).
      if (w == &l.up_exps && halves(l)) continue;
      add(w->data, w->stride * std::size_t(w->count));
    }
    for (const auto* w : {&l.gate_shexp, &l.up_shexp, &l.down_shexp}) add_matrix(*w);
    add_vec(l.shexp_gate);
  }
  // Rounded up to whole 16-byte words: the MXFP4 dot reads the aligned word holding a block's last
  // byte (gpu_quant_dot.h, dot_mxfp4).
  const std::size_t total = align_up(c.size(), weight_align);
  weights_ = static_cast<unsigned char*>(alloc_device(total, "the weights"));
  mem.weight_bytes = total;
  mem.token_weight_bytes = m_.token_weight_bytes();
  auto* staging = static_cast<unsigned char*>(alloc_pinned(staging_bytes, "the weight staging buffer"));
  std::size_t done = 0;
  try {
    for (const piece& p : pieces) {
      for (std::size_t at = 0; at < p.bytes; at += staging_bytes) {
        const std::size_t n = std::min(staging_bytes, p.bytes - at);
        std::memcpy(staging, static_cast<const unsigned char*>(p.host) + at, n);
        ok(hipMemcpyAsync(weights_ + p.offset + at, staging, n, hipMemcpyHostToDevice, stream_), "upload a weight");
        ok(hipStreamSynchronize(stream_), "upload a weight");
        done += n;
        if (cfg.progress) cfg.progress(done, total);
      }
      dev_of_[p.host] = weights_ + p.offset;
    }
    for (const model::layer_weights& l : m_.layers) {
      if (l.moe() && halves(l)) {
        const auto* gate = static_cast<const unsigned char*>(dev_of_.at(l.gate_exps.data));
        dev_of_[l.up_exps.data] = gate + (l.up_exps.data - l.gate_exps.data);
      }
    }
  } catch (const device_failure& e) {
    throw std::runtime_error(std::string("gpu worker: ") + e.what());
  }

  const auto dev_vec = [&](const std::vector<float>& v) -> const float* {
    return v.empty() ? nullptr : static_cast<const float*>(dev_of_.at(v.data()));
  };
  const auto dev_matrix = [&](const model::weight& w) {
    return w.data == nullptr ? matrix{} : matrix{dev_of_.at(w.data), w.type, w.in, w.out};
  };
  const auto dev_stacked = [&](const model::stacked_weight& w) {
    return layer::stacked{.w = dev_of_.at(w.data), .type = w.type, .in = w.in, .out = w.out, .stride = w.stride};
  };
  tok_embd_ = dev_of_.at(m_.tok_embd.data);
  output_ = dev_matrix(m_.output);
  output_norm_ = dev_vec(m_.output_norm);
  rope_freqs_ = dev_vec(m_.rope_freqs);
  if (m_.ple_embd.data) {
    ple_embd_ = dev_of_.at(m_.ple_embd.data);
    ple_model_proj_ = dev_matrix(m_.ple_model_proj);
    ple_proj_norm_ = dev_vec(m_.ple_proj_norm);
  }
  for (const model::layer_weights& l : m_.layers) {
    layer d;
    d.attn_norm = dev_vec(l.attn_norm);
    d.ffn_norm = dev_vec(l.ffn_norm);
    d.post_attn_norm = dev_vec(l.post_attn_norm);
    d.post_ffn_norm = dev_vec(l.post_ffn_norm);
    d.out_scale = l.out_scale;
    d.q_norm = hp.qk_norm ? dev_vec(l.q_norm) : nullptr;
    d.k_norm = hp.qk_norm ? dev_vec(l.k_norm) : nullptr;
    d.bq = dev_vec(l.bq);
    d.bk = dev_vec(l.bk);
    d.bv = dev_vec(l.bv);
    d.bo = dev_vec(l.bo);
    d.sinks = dev_vec(l.sinks);
    d.wq = dev_matrix(l.wq);
    d.wk = dev_matrix(l.wk);
    d.wv = dev_matrix(l.wv);
    d.wo = dev_matrix(l.wo);
    d.gate = dev_matrix(l.gate);
    d.up = dev_matrix(l.up);
    d.down = dev_matrix(l.down);
    d.ssm_qkv = dev_matrix(l.ssm_qkv);
    d.ssm_z = dev_matrix(l.ssm_z);
    d.ssm_beta = dev_matrix(l.ssm_beta);
    d.ssm_alpha = dev_matrix(l.ssm_alpha);
    d.ssm_out = dev_matrix(l.ssm_out);
    d.ssm_conv = dev_vec(l.ssm_conv);
    d.ssm_a = dev_vec(l.ssm_a);
    d.ssm_dt_bias = dev_vec(l.ssm_dt_bias);
    d.ssm_norm = dev_vec(l.ssm_norm);
    d.ple_gate = dev_matrix(l.ple_gate);
    d.ple_proj = dev_matrix(l.ple_proj);
    d.ple_post_norm = dev_vec(l.ple_post_norm);
    if (l.moe()) {
      d.router = dev_matrix(l.router);
      d.gate_exps = dev_stacked(l.gate_exps);
      d.up_exps = dev_stacked(l.up_exps);
      d.down_exps = dev_stacked(l.down_exps);
      d.router_b = dev_vec(l.router_b);
      d.gate_exps_b = dev_vec(l.gate_exps_b);
      d.up_exps_b = dev_vec(l.up_exps_b);
      d.down_exps_b = dev_vec(l.down_exps_b);
      d.gate_shexp = dev_matrix(l.gate_shexp);
      d.up_shexp = dev_matrix(l.up_shexp);
      d.down_shexp = dev_matrix(l.down_shexp);
      d.shexp_gate = dev_vec(l.shexp_gate);
      d.router_in_scale = derived_[layers_.size()].empty() ? nullptr : dev_vec(derived_[layers_.size()]);
      d.expert_scale = dev_vec(l.expert_scale);
      d.pre_ffn_norm_2 = dev_vec(l.pre_ffn_norm_2);
      d.post_ffn_norm_1 = dev_vec(l.post_ffn_norm_1);
      d.post_ffn_norm_2 = dev_vec(l.post_ffn_norm_2);
    }
    layers_.push_back(d);
  }
}

// Scratch for the step limits, GEMM / BLAS / attention workspaces and the upload mirror: one
// device allocation; the pinned upload and record buffers: two host ones.
void gpu_device::plan_scratch(memory_plan& mem) {
  const model::hparams& hp = m_.hp;
  const auto T = std::size_t(max_tokens_), S = std::size_t(max_seqs_), P = std::size_t(max_pairs_);
  const std::size_t f = sizeof(float);
  // The widest layer's q and k/v rows (gemma4's sliding and global layers differ).
  std::size_t q_w = 0, kv_w = 0;
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    q_w = std::max(q_w, std::size_t(hp.n_head * hp.layer_head_dim(l)));
    kv_w = std::max(kv_w, std::size_t(hp.layer_kv_heads(l) * hp.layer_head_dim(l)));
  }

  carver u;  // the upload sections
  up_off_.ids = u.take(T * 4, 16);
  up_off_.positions = u.take(T * 4, 16);
  up_off_.slots = u.take(T * 8, 16);
  up_off_.tables = u.take(S * std::size_t(max_blocks_per_seq_) * 4, 16);
  const std::size_t window_parts = kv_layers_.window_layers > 0 ? 1 : 0;  // the window pool's slots and tables
  up_off_.window_slots = u.take(window_parts * T * 8, 16);
  up_off_.window_tables = u.take(window_parts * S * std::size_t(max_blocks_per_seq_) * 4, 16);
  up_off_.context_lens = u.take(S * 4, 16);
  up_off_.prefill_seqs = u.take(S * sizeof(kernels::attention_prefill_seq), 16);
  up_off_.logit_rows = u.take(S * 4, 16);
  up_off_.cand_seqs = u.take(S * sizeof(kernels::candidates_seq), 16);
  up_off_.score_rows = u.take(T * 4, 16);
  up_off_.score_targets = u.take(T * 4, 16);
  up_off_.feed_rows = u.take(S * 4, 16);
  up_off_.feed_from = u.take(S * 4, 16);
  up_off_.rseqs = u.take(hp.has_recurrent() ? S * sizeof(kernels::recurrent_seq) : 0, 16);
  up_off_.fixed_end = u.size();
  up_off_.bias_ids = u.take(P * 4, 16);
  up_off_.bias_values = u.take(P * 4, 16);
  up_off_.count_ids = u.take(P * 4, 16);
  up_off_.count_values = u.take(P * 4, 16);
  up_off_.mask_words = u.take(S * std::size_t((hp.n_vocab + 31) / 32) * 4, 16);  // constrained decoding
  up_off_.merge_seqs = u.take(split_vocab() ? S * sizeof(kernels::candidates_seq) : 0, 16);
  up_off_.total = u.size();

  std::size_t gemm_ws = 0, gemv_ws = 0;
  const auto fit = [&](const matrix& w, std::int64_t tokens) {
    gemm_ws = std::max(gemm_ws, kernels::gemm_workspace_bytes(gemm_.algo, w.type, w.in, w.out, tokens, w.w16 != nullptr));
    gemv_ws = std::max(gemv_ws, kernels::gemv_workspace_bytes(w.type, w.in, std::min(tokens, kernels::gemv_max_tokens)));
  };
  fit(output_, max_seqs_);
  if (gemm_dtype_ == kernels::gemm_dtype::fp8) {
    gemm_ws = std::max(gemm_ws, kernels::gemm_fp8_workspace_bytes(output_.in, max_seqs_));
  }
  if (ple_model_proj_.w != nullptr) fit(ple_model_proj_, max_tokens_);
  for (const layer& l : layers_) {
    for (const matrix* w : l.projected()) {
      if (w->w == nullptr) continue;
      fit(*w, max_tokens_);
      // The FP8 path's x codes share the region (project() runs one path after the other).
      if (gemm_dtype_ == kernels::gemm_dtype::fp8) {
        gemm_ws = std::max(gemm_ws, kernels::gemm_fp8_workspace_bytes(w->in, max_tokens_));
      }
    }
  }
  // The experts' tensor-core GEMM (run_experts) converts the step's rows of x in the same region:
  // the tokens' rows for gate/up, the pairs' for down.
  if (gemm_.algo == kernels::gemm_algo::quantized && gemv_activations_ == kernels::gemv_activations::int8) {
    const std::int64_t pairs = max_tokens_ * std::max<std::int64_t>(hp.n_expert_used, 1);
    for (const layer& l : layers_) {
      for (const auto& [s, rows] : {std::pair{&l.gate_exps, max_tokens_}, std::pair{&l.up_exps, max_tokens_},
                                    std::pair{&l.down_exps, pairs}}) {
        if (s->w != nullptr && kernels::gemm_quant_experts_supported(s->type, s->in, s->out, s->stride)) {
          gemm_ws = std::max(gemm_ws, kernels::gemm_quant_experts_workspace_bytes(s->in, rows));
        }
      }
    }
  }
  // When the norms, SwiGLU and decode attention write the 8-bit activations (x8_fused), they
  // write them for every layer input, whatever its weight's type: room for the three widths.
  if (gemv_ws > 0) {
    const std::int64_t t8 = std::min(max_tokens_, kernels::gemv_max_tokens);
    for (const std::int64_t in : {hp.n_embd, hp.n_ff, std::int64_t(q_w)}) {
      gemv_ws = std::max(gemv_ws, kernels::gemv_workspace_bytes(model::ggml_type::Q8_0, in, t8));
    }
  }
  const std::size_t blas_ws = have_blas_ ? blas::recommended_workspace_bytes : 0;
  attn_ws_bytes_ = 0;  // the largest layer's (heads of their own size: their own split length)
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    const std::int64_t hd = hp.layer_head_dim(l);
    attn_ws_bytes_ = std::max(attn_ws_bytes_, kernels::attention_decode_workspace_bytes(max_seqs_, hp.n_head, hd,
                                                                                        max_context(), attn_split(hd)));
  }
  const std::size_t record_bytes = kernels::candidates_record_bytes(kernels::candidates_max_k);
  cand_ws_bytes_ = kernels::candidates_workspace(max_seqs_, hp.n_vocab, kernels::candidates_max_k).bytes;

  // A plain pre-norm model's one-token steps norm inside the GEMVs (qkv_normed, glu_normed), which
  // move the residual stream between x_ and x_alt_.
  plain_norms_ = !m_.has_experts() && !hp.has_recurrent() && hp.ple_dim == 0 && hp.n_embd % 32 == 0 &&
                 hp.n_embd <= kernels::gemv_norm_max_cols &&
                 std::all_of(layers_.begin(), layers_.end(), [](const layer& l) {
                   return l.post_attn_norm == nullptr && l.post_ffn_norm == nullptr && l.out_scale == 1.f &&
                          l.router.w == nullptr && l.ssm_qkv.w == nullptr && l.router_in_scale == nullptr;
                 });
  carver c;
  const std::size_t x = c.take(T * std::size_t(hp.n_embd) * f), h = c.take(T * std::size_t(hp.n_embd) * f);
  const std::size_t x_alt = c.take(plain_norms_ ? std::size_t(hp.n_embd) * f : 0);
  const std::size_t q = c.take(T * q_w * f), k = c.take(T * kv_w * f), v = c.take(T * kv_w * f);
  // attn_ also holds a gated DeltaNet layer's output, the ssm_out projection's input.
  const std::size_t ssm_v_w = std::size_t(hp.ssm_v_heads * hp.ssm_head_v);
  const std::size_t attn = c.take(T * std::max(q_w, ssm_v_w) * f), o = c.take(T * std::size_t(hp.n_embd) * f);
  const std::size_t qg = c.take(hp.attn_out_gate ? T * 2 * q_w * f : 0);
  const std::size_t mix = c.take(T * std::size_t(hp.ssm_conv_channels()) * f), z = c.take(T * ssm_v_w * f);
  const std::size_t beta = c.take(T * std::size_t(hp.ssm_v_heads) * f), alpha = c.take(T * std::size_t(hp.ssm_v_heads) * f);
  // gate_/up_: a dense layer's rows, the experts' pair rows, or the shared expert's.
  const std::size_t k_used = std::size_t(std::max<std::int64_t>(hp.n_expert_used, 1));
  const std::size_t ff_w = std::max({std::size_t(hp.n_ff), k_used * std::size_t(hp.n_ff_exp), std::size_t(hp.n_ff_shexp)});
  const std::size_t gate = c.take(T * ff_w * f), up = c.take(T * ff_w * f);
  const bool moe = m_.has_experts();
  const std::size_t pairs = moe ? T * k_used : 0, experts = moe ? std::size_t(hp.n_expert) : 0;
  const std::size_t router = c.take(T * experts * f), moe_ids = c.take(pairs * 4), moe_weights = c.take(pairs * f);
  const std::size_t moe_offsets = c.take((experts + 1) * 4), moe_sorted = c.take(pairs * 4);
  const std::size_t moe_active = c.take((experts + 1) * 4);
  const std::size_t pair_out = c.take(pairs * std::size_t(hp.n_embd) * f);
  const std::size_t shared_out = c.take(hp.n_ff_shexp > 0 ? T * std::size_t(hp.n_embd) * f : 0);
  const bool dense_beside = std::any_of(m_.layers.begin(), m_.layers.end(), [](const model::layer_weights& l) {
    return l.moe() && l.gate.data != nullptr;
  });
  const std::size_t dense_out = c.take(dense_beside ? T * std::size_t(hp.n_embd) * f : 0);
  // The experts on 8-bit activations (kernels/moe.h, every step size): the layer input's rows
  // and each pair's SwiGLU rows. Not with f32 activations (conformance runs).
  const bool moe_x8 = moe && gemv_activations_ == kernels::gemv_activations::int8 && hp.n_embd % 32 == 0 &&
                      hp.n_ff_exp % 32 == 0;
  const std::size_t moe_x8_h = c.take(moe_x8 ? kernels::gemv_x8_bytes(hp.n_embd, max_tokens_) : 0);
  const std::size_t moe_x8_pairs = c.take(moe_x8 ? kernels::gemv_x8_bytes(hp.n_ff_exp, std::int64_t(pairs)) : 0);
  const std::size_t rows = c.take(S * std::size_t(hp.n_embd) * f), logits = c.take(S * std::size_t(hp.n_vocab) * f);
  // Tensor parallel: the head's slice of max_seqs rows, and every rank's gathered.
  const std::size_t tp_slice = comm_ ? S * std::size_t(vocab_.stride) : 0;
  const std::size_t tp_local = c.take(tp_slice * f), tp_all = c.take(tp_slice * std::size_t(comm_ ? comm_->size() : 0) * f);
  const std::size_t records = c.take(S * record_bytes), attn_ws = c.take(attn_ws_bytes_);
  const std::size_t tp_records = c.take(split_vocab() ? std::size_t(comm_->size()) * S * record_bytes : 0);
  const std::size_t gemm_at = c.take(gemm_ws), blas_at = c.take(blas_ws), upload = c.take(up_off_.total);
  // The fused gate/up's 8-bit output (one token: gemv_glu_max_tokens rows of the widest layer).
  const std::size_t glu_ws =
      gemv_ws > 0 ? kernels::gemv_workspace_bytes(model::ggml_type::Q8_0, hp.n_ff, kernels::gemv_glu_max_tokens) : 0;
  const std::size_t glu_at = c.take(glu_ws);
  const std::size_t gemv_at = c.take(gemv_ws), scores = c.take(T * f), cand_ws = c.take(cand_ws_bytes_);
  const std::size_t angles = c.take(kernels::rope_angles_bytes(max_tokens_, hp.rope_dim));
  const std::size_t angles_swa =
      c.take(hp.split_rope() ? kernels::rope_angles_bytes(max_tokens_, hp.sliding_rope_dim()) : 0);
  const std::size_t q_temps = c.take(hp.attn_temp_scale > 0 ? T * f : 0);
  const std::size_t ple_w = std::size_t(hp.n_layer * hp.ple_dim);  // gemma4 E2B / E4B (0 elsewhere)
  const std::size_t ple = c.take(T * ple_w * f), ple_tok = c.take(T * ple_w * f);
  const std::size_t ple_h = c.take(T * std::size_t(hp.ple_dim) * f);
  const std::size_t qkv_w = q_w + 2 * kv_w;
  const bool own_qkv = gemm_dtype_ == kernels::gemm_dtype::fp8 && qkv_w > ff_w;
  const std::size_t qkv = own_qkv ? c.take(T * qkv_w * f) : 0;
  auto* base = static_cast<unsigned char*>(alloc_device(c.size(), "activation scratch and workspaces"));
  mem.scratch_bytes = c.size();
  const auto fp = [base](std::size_t off) { return reinterpret_cast<float*>(base + off); };
  x_ = fp(x), h_ = fp(h), q_ = fp(q), k_ = fp(k), v_ = fp(v), attn_ = fp(attn), o_ = fp(o);
  x_alt_ = plain_norms_ ? fp(x_alt) : nullptr;
  res_ = x_;
  gate_ = fp(gate), up_ = fp(up), rows_ = fp(rows), logits_ = fp(logits);
  if (comm_) tp_local_ = fp(tp_local), tp_all_ = fp(tp_all);
  if (hp.attn_out_gate) qg_ = fp(qg);
  if (hp.has_recurrent()) mix_ = fp(mix), z_ = fp(z), beta_ = fp(beta), alpha_ = fp(alpha);
  if (moe) {
    const auto ip = [base](std::size_t off) { return reinterpret_cast<std::int32_t*>(base + off); };
    router_logits_ = fp(router), moe_weights_ = fp(moe_weights), pair_out_ = fp(pair_out);
    shared_out_ = hp.n_ff_shexp > 0 ? fp(shared_out) : nullptr;
    dense_out_ = dense_beside ? fp(dense_out) : nullptr;
    moe_ids_ = ip(moe_ids), moe_offsets_ = ip(moe_offsets), moe_sorted_ = ip(moe_sorted), moe_active_ = ip(moe_active);
    moe_x8_h_ = moe_x8 ? base + moe_x8_h : nullptr;
    moe_x8_pairs_ = moe_x8 ? base + moe_x8_pairs : nullptr;
  }
  records_dev_ = base + records;
  if (split_vocab()) tp_records_ = base + tp_records;
  attn_ws_ = attn_ws_bytes_ ? base + attn_ws : nullptr;
  gemm_.workspace = gemm_ws ? base + gemm_at : nullptr;
  gemm_.workspace_bytes = gemm_ws;
  gemm_.blas_workspace = blas_ws ? base + blas_at : nullptr;
  gemm_.blas_workspace_bytes = blas_ws;
  gemv_ws_ = gemv_ws ? base + gemv_at : nullptr;
  gemv_ws_bytes_ = gemv_ws;
  glu_ws_ = glu_ws ? base + glu_at : nullptr;
  glu_ws_bytes_ = glu_ws;
  upload_dev_ = base + upload;
  scores_dev_ = fp(scores);
  cand_ws_ = base + cand_ws;
  rope_angles_ = reinterpret_cast<double*>(base + angles);
  rope_angles_swa_ = hp.split_rope() ? reinterpret_cast<double*>(base + angles_swa) : nullptr;
  q_temps_ = hp.attn_temp_scale > 0 ? fp(q_temps) : nullptr;
  if (hp.ple_dim > 0) ple_ = fp(ple), ple_tok_ = fp(ple_tok), ple_h_ = fp(ple_h);
  if (gemm_dtype_ == kernels::gemm_dtype::fp8) qkv_ = own_qkv ? fp(qkv) : gate_;

  // Per step slot: the upload, then the records and scores coming back (one pinned allocation).
  const std::size_t records_at = align_up(up_off_.total, 16), scores_at = records_at + align_up(S * record_bytes, 16);
  for (step_slot& sl : slots_) {
    auto* p = static_cast<unsigned char*>(alloc_pinned(scores_at + T * f, "a step's upload, records and scores"));
    sl.upload_host = p;
    sl.records_host = p + records_at;
    sl.scores_host = reinterpret_cast<float*>(p + scores_at);
    sl.seq_ids.reserve(S);
    sl.positions.reserve(S);
  }
  upload_host_ = slots_[0].upload_host;
  records_host_ = slots_[0].records_host;
  scores_host_ = slots_[0].scores_host;
  first_token_.reserve(S);
  order_.reserve(S);
  lp_.reserve(S);
  lp_positions_.reserve(S);
  lp_seq_ids_.reserve(S);
}

// gemm_dtype fp8: an E4M3 copy of every layer weight and of the output head (steps with 32+
// logit or score rows) whose shape the path takes, in one allocation, each made on the device
// from the uploaded weight (dequantized through the GEMM workspace, then quantized with one scale
// per matrix). A layer's q, k and v make one stacked copy (one scale for the three), with their
// biases in one vector after it. (gate and up stacked too measured no faster: bench/GPU_NOTES.md,
// session 17.)
void gpu_device::make_fp8_copies(memory_plan& mem) {
  std::vector<matrix*> todo;
  carver c;
  std::vector<std::size_t> at;
  const auto add = [&](matrix* w) {
    if (w->w == nullptr || !kernels::gemm_fp8_shape_ok(w->in, w->out)) return;
    todo.push_back(w);
    at.push_back(c.take(kernels::fp8_matrix_bytes(w->in, w->out)));
  };
  struct stacked {
    layer* l;
    std::size_t codes, bias;  // offsets; bias: only for a layer with biases
  };
  std::vector<stacked> stacks;
  for (layer& l : layers_) {
    const std::int64_t in = l.wq.in, out = l.wq.out + l.wk.out + l.wv.out;
    // Not with Qwen3.5's gated q (its rows hold each head's gate too): run_attention_block reads q per head.
    const bool stack = fp8_stack_qkv_ && !m_.hp.attn_out_gate && l.wq.w != nullptr && l.wv.w != nullptr &&
                       l.wk.in == in && l.wv.in == in && kernels::gemm_fp8_shape_ok(in, out);
    if (stack) {
      const std::size_t codes = c.take(kernels::fp8_matrix_bytes(in, out));
      const bool biased = l.bq || l.bk || l.bv;
      stacks.push_back({.l = &l, .codes = codes, .bias = biased ? c.take(std::size_t(out) * sizeof(float)) : 0});
    } else {
      for (matrix* w : {&l.wq, &l.wk, &l.wv}) add(w);
    }
    for (matrix* w : {&l.wo, &l.gate, &l.up, &l.down, &l.gate_shexp, &l.up_shexp, &l.down_shexp}) add(w);
  }
  add(&output_);
  if (todo.empty() && stacks.empty()) return;
  auto* base = static_cast<unsigned char*>(alloc_device(c.size(), "the FP8 weight copies"));
  mem.fp8_weight_bytes = c.size();
  mem.fp8_stacked_layers = std::int64_t(stacks.size());
  try {
    for (std::size_t i = 0; i < todo.size(); ++i) {
      matrix& w = *todo[i];
      ok(kernels::launch_make_fp8_matrix(w.type, w.w, w.in, w.out, gemm_.workspace, gemm_.workspace_bytes, base + at[i],
                                         stream_),
         "make a weight's FP8 copy");
      w.fp8 = kernels::fp8_matrix_at(base + at[i], w.in, w.out);
    }
    for (const stacked& s : stacks) {
      layer& l = *s.l;
      const kernels::fp8_stack_part parts[] = {{.type = l.wq.type, .w = l.wq.w, .out = l.wq.out},
                                               {.type = l.wk.type, .w = l.wk.w, .out = l.wk.out},
                                               {.type = l.wv.type, .w = l.wv.w, .out = l.wv.out}};
      const std::int64_t out = l.wq.out + l.wk.out + l.wv.out;
      ok(kernels::launch_make_fp8_stacked(parts, l.wq.in, gemm_.workspace, gemm_.workspace_bytes, base + s.codes, stream_),
         "make a layer's stacked q/k/v FP8 copy");
      l.qkv_fp8 = kernels::fp8_matrix_at(base + s.codes, l.wq.in, out);
      if (!(l.bq || l.bk || l.bv)) continue;
      auto* bias = reinterpret_cast<float*>(base + s.bias);
      std::int64_t row = 0;
      for (const auto& [b, n] : {std::pair{l.bq, l.wq.out}, std::pair{l.bk, l.wk.out}, std::pair{l.bv, l.wv.out}}) {
        ok(b ? hipMemcpyAsync(bias + row, b, std::size_t(n) * sizeof(float), hipMemcpyDeviceToDevice, stream_)
             : hipMemsetAsync(bias + row, 0, std::size_t(n) * sizeof(float), stream_),
           "stack the q/k/v biases");
        row += n;
      }
      l.bqkv = bias;
    }
    ok(hipStreamSynchronize(stream_), "make the FP8 weight copies");
  } catch (const device_failure& e) {
    throw std::runtime_error(std::string("gpu worker: ") + e.what());
  }
}

// f16_weight_copies: an f16 copy of every layer weight the vendor GEMM would otherwise dequantize on
// each long step (quantized and f32 ones; F16 and BF16 are multiplied as they are) and of the output
// head, in one allocation, each written by launch_dequantize (the values the per-step path
// multiplies). The experts' stacks keep their own paths (kernels/moe.h).
void gpu_device::make_f16_copies(memory_plan& mem) {
  std::vector<matrix*> todo;
  carver c;
  std::vector<std::size_t> at;
  const auto add = [&](matrix* w) {
    if (w->w == nullptr || !kernels::gemm_dequantizes(w->type)) return;
    todo.push_back(w);
    at.push_back(c.take(std::size_t(w->in) * std::size_t(w->out) * 2));
  };
  add(&output_);
  add(&ple_model_proj_);
  for (layer& l : layers_) {
    for (matrix* w : l.projected()) add(w);
  }
  if (todo.empty()) return;
  auto* base = static_cast<unsigned char*>(alloc_device(c.size(), "the f16 weight copies"));
  mem.f16_weight_bytes = c.size();
  try {
    for (std::size_t i = 0; i < todo.size(); ++i) {
      matrix& w = *todo[i];
      auto* dst = reinterpret_cast<std::uint16_t*>(base + at[i]);
      ok(kernels::launch_dequantize(w.type, w.w, dst, w.out, w.in, stream_), "make a weight's f16 copy");
      w.w16 = dst;
    }
    ok(hipStreamSynchronize(stream_), "make the f16 weight copies");
  } catch (const device_failure& e) {
    throw std::runtime_error(std::string("gpu worker: ") + e.what());
  }
}

// The KV pools: memory_fraction of what is free now (capped by kv_budget_bytes), in whole blocks,
// split between the main pool and the window pool as kv_plan.h says.
void gpu_device::plan_kv(const gpu_worker_config& cfg, memory_plan& mem) {
  const model::hparams& hp = m_.hp;
  std::size_t free_b = 0, total_b = 0;
  ok(hipMemGetInfo(&free_b, &total_b), "read free device memory");
  std::size_t budget = std::size_t(double(free_b) * cfg.memory_fraction);
  if (cfg.kv_budget_bytes > 0) budget = std::min(budget, cfg.kv_budget_bytes);
  if (cfg.agree_kv_budget) budget = cfg.agree_kv_budget(budget);  // tensor parallel: every rank the same blocks
  kv_dtype_ = cfg.kv_cache_dtype;
  // The recurrent layers' state slots first (kv_plan.h): one per sequence a step may hold, and
  // spares for the prefix cache's snapshots.
  const std::size_t per_slot = model::kv_cache_storage::bytes_per_state_slot(hp);
  n_state_slots_ = plan_state_slots(budget, per_slot, max_seqs_);
  if (hp.has_recurrent() && n_state_slots_ < 1) {
    throw std::runtime_error("gpu worker: no room for one recurrent-state slot of " + std::to_string(per_slot >> 20) +
                             " MiB (" + std::to_string(free_b >> 20) + " MiB free after weights and scratch)");
  }
  const std::size_t state_bytes = std::size_t(n_state_slots_) * per_slot;
  budget -= state_bytes;
  // One block of layer l: its rows (KV heads) of K and V, each row its head's elements (and, in 8
  // bits, its scale).
  const auto layer_block_bytes = [&](std::int64_t l) {
    return std::size_t(block_size_ * hp.layer_kv_heads(l)) *
           std::size_t(kernels::kv_row_bytes_device(kv_dtype_, hp.layer_head_dim(l))) * 2;
  };
  std::size_t per_block = 0, per_window_block = 0;
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    if (kv_layers_.stateful(l) || hp.kv_source(l) != l) continue;  // a shared layer's KV is its source's
    (kv_layers_.windowed(l) ? per_window_block : per_block) += layer_block_bytes(l);
  }
  const kv_pools pools = plan_kv_pools(budget, per_block, per_window_block,
                                       kv_layers_.window_layers > 0 ? hp.sliding_window : 0, block_size_, max_seqs_, max_tokens_);
  if (pools.n_blocks < 1 || (kv_layers_.window_layers > 0 && pools.n_window_blocks < 1)) {
    throw std::runtime_error("gpu worker: no room for one KV block (" + std::to_string(free_b >> 20) +
                             " MiB free after weights and scratch)");
  }
  // Each pool's layers one after the other, at 16-byte aligned offsets (the kernels' loads).
  main_kv_.n_blocks = pools.n_blocks;
  window_kv_.n_blocks = pools.n_window_blocks;
  main_kv_.at.assign(std::size_t(kv_layers_.main_layers), 0);
  window_kv_.at.assign(std::size_t(kv_layers_.window_layers), 0);
  std::size_t main_bytes = 0, window_bytes = 0;
  for (std::int64_t l = 0; l < hp.n_layer; ++l) {
    if (kv_layers_.stateful(l) || hp.kv_source(l) != l) continue;
    const bool windowed = kv_layers_.windowed(l);
    kv_pool& p = windowed ? window_kv_ : main_kv_;
    std::size_t& end = windowed ? window_bytes : main_bytes;
    p.at[std::size_t(kv_layers_.index[std::size_t(l)])] = end;
    end = align_up(end + layer_block_bytes(l) * std::size_t(p.n_blocks), 16);
  }
  const std::size_t bytes = main_bytes + window_bytes;
  kv_ = static_cast<unsigned char*>(alloc_device(bytes + state_bytes, "the KV pool"));
  main_kv_.base = kv_;
  window_kv_.base = kv_ + main_bytes;
  if (state_bytes > 0) {
    conv_state_ = reinterpret_cast<float*>(kv_ + bytes);
    matrix_state_ = conv_state_ + kv_layers_.state_layers * n_state_slots_ * hp.ssm_conv_state();
    mem.n_state_slots = n_state_slots_;
    mem.state_bytes = state_bytes;
    mem.max_seqs = std::min(mem.max_seqs, n_state_slots_);
  }
  mem.n_blocks = pools.n_blocks;
  mem.n_window_blocks = pools.n_window_blocks;
  mem.window = pools.window;
  mem.kv_bytes = bytes;
  mem.kv_cache_dtype = kv_dtype_;
}

// One step through every path (decode attention, prefill attention, GEMV, GEMM when the limits
// allow one, candidates) before ready: kernels load now, and a broken device fails start-up. It
// writes only into block 0 (of each pool), which nobody reads before writing it.
void gpu_device::warm_up() {
  step_plan plan;
  seq_step dec;
  dec.tokens = {0};
  dec.block_table = {0};
  dec.want_candidates = true;
  dec.logits.top_k = 4;
  plan.seqs.push_back(dec);
  const std::int64_t chunk = std::min<std::int64_t>(max_tokens_ - 1, std::min<std::int64_t>(block_size_ * max_blocks_per_seq_, 16));
  if (chunk >= 1 && max_seqs_ >= 2) {
    seq_step pre;
    pre.tokens.assign(std::size_t(chunk), 0);
    pre.block_table.assign(std::size_t((chunk + block_size_ - 1) / block_size_), 0);
    pre.want_candidates = true;
    plan.seqs.push_back(pre);
  }
  if (kv_layers_.window_layers > 0) {
    for (seq_step& s : plan.seqs) s.window_table = s.block_table;  // block 0 of the window pool too
  }
  for (std::size_t i = 0; i < plan.seqs.size() && n_state_slots_ > 0; ++i) {
    plan.seqs[i].state_slot = std::int32_t(std::min<std::int64_t>(std::int64_t(i), n_state_slots_ - 1));
  }
  if (plan.seqs.size() == 2 && n_state_slots_ == 1) plan.seqs.pop_back();  // one slot: the decode sequence alone
  step_result r;
  execute(plan, r);
  // A prompt step of each size class the vendor GEMMs keep a plan for (blas::plan_bucket), so
  // that no request pays for choosing an algorithm and loading its kernels (cuBLAS's first call
  // of a shape took 4-57 ms of the host's time: bench/GPU_NOTES.md, session 34).
  if (gemm_.lt == nullptr) return;
  const std::int64_t longest = std::min<std::int64_t>(max_tokens_, block_size_ * max_blocks_per_seq_);
  std::int64_t done = 0;
  for (std::int64_t n = kernels::gemv_max_tokens + 1; done < longest; n = done + 1) {
    const std::int64_t len = std::min<std::int64_t>(blas::plan_bucket(int(n)), longest);
    step_plan pre_plan;
    seq_step pre;
    pre.tokens.assign(std::size_t(len), 0);
    pre.block_table.assign(std::size_t((len + block_size_ - 1) / block_size_), 0);
    if (kv_layers_.window_layers > 0) pre.window_table = pre.block_table;
    pre.want_candidates = true;
    pre.logits.top_k = 4;
    pre.state_slot = n_state_slots_ > 0 ? 0 : -1;
    pre_plan.seqs.push_back(pre);
    execute(pre_plan, r);
    done = len;
  }
}

// One graph per decode batch size b in [1, max_batch]: run_body() for b sequences of one token,
// captured with the shape every replay has — block tables of the full stride, decode attention
// sized for the full context (splits past a sequence's length do nothing) — and reading its
// inputs (ids, positions, slots, tables, context lengths) from the upload mirror, which each
// step fills before the replay. Captured here, at start-up, so that no step instantiates one.
// A batch size whose capture the runtime refuses runs eagerly.
void gpu_device::capture_graphs(std::int64_t max_batch) {
  graphs_.assign(std::size_t(std::max<std::int64_t>(max_batch, 0)), nullptr);
  for (std::int64_t b = 1; b <= max_batch; ++b) {
    step_ = {};
    step_.tokens = step_.n_dec = b;
    step_.stride = max_blocks_per_seq_;
    step_.max_dec_context = max_context();
    hipGraph_t graph = nullptr;
    ok(hipStreamBeginCapture(stream_, hipStreamCaptureModeThreadLocal), "begin a graph capture");
    try {
      run_body();
    } catch (const device_failure&) {
      (void)hipStreamEndCapture(stream_, &graph);
      if (graph) (void)hipGraphDestroy(graph);
      (void)hipGetLastError();
      continue;
    }
    ok(hipStreamEndCapture(stream_, &graph), "end a graph capture");
    hipGraphExec_t exec = nullptr;
    const hipError_t e = hipGraphInstantiateWithFlags(&exec, graph, 0);
    (void)hipGraphDestroy(graph);
    if (e != hipSuccess) {
      (void)hipGetLastError();
      continue;
    }
    graphs_[std::size_t(b - 1)] = exec;
  }
  // One replay of each, so that the first real steps do not pay for uploading the graphs. Their
  // inputs first: every row token 0 at position 0, written to slot 0 of block 0 (where the
  // warm-up wrote), block tables all block 0, contexts of one position — nothing out of range.
  std::memset(upload_host_, 0, up_off_.fixed_end);
  std::fill_n(host_at<std::int32_t>(up_off_.context_lens), max_seqs_, 1);
  ok(hipMemcpyAsync(upload_dev_, upload_host_, up_off_.fixed_end, hipMemcpyHostToDevice, stream_), "upload the step");
  for (hipGraphExec_t g : graphs_) {
    if (g) ok(hipGraphLaunch(g, stream_), "decode graph");
  }
  ok(hipStreamSynchronize(stream_), "decode graphs");
}

std::int64_t gpu_device::graphs() const {
  return std::int64_t(std::count_if(graphs_.begin(), graphs_.end(), [](hipGraphExec_t g) { return g != nullptr; }));
}


}  // namespace anvil::gpu_worker

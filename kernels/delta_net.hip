// Gated DeltaNet on the GPU (kernels/delta_net.h).
//
// conv1d_silu: for decode rows a thread per channel of a sequence, its last inputs in registers,
// the inputs of conv_ahead tokens loaded before any is used (a sequence's tokens are a chain through
// the window, so the loads, not the arithmetic, set the pace); for prompt chunks a block per 32
// channels, its warps on consecutive runs of tokens (conv1d_silu_runs_kernel).
//
// The delta rule, two forms:
// - recurrent (decode): a block per (value head, sequence), each thread one column of the head's
//   head_k x head_v state in registers for the whole step (read from its slot once, written back
//   once), q and k of the key head in shared memory, the gated norm's mean by a block reduction.
// - chunked (prompt chunks): a block per (value head, 32 of its columns, sequence) keeps those
//   columns of the state in shared memory and takes the sequence's tokens 32 at a time
//   (delta_net.h's rearrangement): the chunk's q . k and k . k products, S0's products with q and k,
//   the forward substitution for u (one thread per column, u in registers), then the outputs and
//   the new state as sums over the chunk. The columns of a head are split over blocks, so the
//   gated norm (a mean over all of them) is a second kernel over the outputs. On NVIDIA devices of
//   compute capability 8.0 and up the chunk's products run on tensor cores (TF32 pairs, near f32:
//   delta_chunk_tc_kernel), elsewhere on CUDA cores (delta_chunk_kernel).
#include "kernels/delta_net.h"

#include <algorithm>

#if defined(ANVIL_GPU_CUDA)
#include "kernels/tensor_core.h"
#endif

namespace anvil::kernels {
namespace {

constexpr int conv_block = 128;
constexpr int max_taps = int(conv1d_max_taps);
constexpr int conv_ahead = 16;   // conv1d_silu: tokens whose inputs a thread loads before using any
constexpr int rule_block = 128;  // delta_rule: one thread per value dimension, head_v <= 128

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// A token's gates for value head j (delta_net.h), as both forms take them: beta = sigmoid(b) and
// the decay's logarithm g = a * softplus(alpha + dt_bias).
__device__ __forceinline__ float gate_beta(float b) { return 1.f / (1.f + expf(-b)); }
__device__ __forceinline__ float decay_log(float a, float alpha, float dt_bias) {
  const float x = alpha + dt_bias;
  return a * (x > 20.f ? x : log1pf(expf(x)));
}

// One token of the convolution: the sum over the taps of the window (win: the hist inputs before
// `cur`, oldest first; taps past hist + 1 are zero), after which the window moves on by cur.
template <int T>
__device__ __forceinline__ float conv_token(const float (&taps)[T], float (&win)[T], float cur, int hist) {
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < T; ++j) acc += taps[j] * (j < hist ? win[j] : j == hist ? cur : 0.f);
#pragma unroll
  for (int j = 0; j + 1 < T; ++j) win[j] = j + 1 < hist ? win[j + 1] : j + 1 == hist ? cur : win[j];
  return acc;
}

// Both convolution kernels take KW = the taps per channel where it is known at compile time (4,
// Qwen3.5's), so that the window's loops have no run-time conditions, and KW = 0 for any other
// (p.kernel taps, the loops over max_taps with the unused taps zero).
template <int KW>
__global__ void __launch_bounds__(conv_block) conv1d_silu_kernel(conv1d_silu_params p, const recurrent_seq* seqs) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const recurrent_seq s = seqs[blockIdx.y];
  const std::int64_t c = std::int64_t(blockIdx.x) * conv_block + threadIdx.x;
  if (c >= p.channels) return;
  constexpr int T = KW > 0 ? KW : max_taps;  // the taps the loops run over
  const int kw = KW > 0 ? KW : int(p.kernel), hist = kw - 1;
  float* st = p.state + std::int64_t(s.slot) * hist * p.channels + c;
  // win[0, hist): the inputs before the current token, oldest first; taps past kw are 0.
  float win[T], taps[T];
#pragma unroll
  for (int j = 0; j < T; ++j) {
    win[j] = j < hist && !s.fresh ? st[j * p.channels] : 0.f;
    taps[j] = j < kw ? p.taps[c * kw + j] : 0.f;
  }
  float* x0 = p.x + s.first * p.channels + c;
  for (std::int64_t t0 = 0; t0 < s.n_tokens; t0 += conv_ahead) {
    float in[conv_ahead];
#pragma unroll
    for (int u = 0; u < conv_ahead; ++u) in[u] = t0 + u < s.n_tokens ? x0[(t0 + u) * p.channels] : 0.f;
#pragma unroll
    for (int u = 0; u < conv_ahead; ++u) {
      if (t0 + u >= s.n_tokens) break;
      x0[(t0 + u) * p.channels] = silu(conv_token(taps, win, in[u], hist));
    }
  }
#pragma unroll
  for (int j = 0; j < T; ++j) {
    if (j < hist) st[j * p.channels] = win[j];
  }
}

// The convolution over a prompt chunk: a block per (32 channels, sequence), its 8 warps taking
// runs of conv_ahead consecutive tokens (warp w the w-th run of each 8 x conv_ahead tokens), every
// input loaded before any output is written in place. A run's first outputs need the inputs before
// it: the run before's last kernel - 1 inputs, which each warp leaves in shared memory (two buffers
// by the parity of the pass, so that one barrier a pass keeps them), or for the first run the
// slot's state. The sums are the per-channel kernel's, term for term.
constexpr int conv_runs = 8, conv_run_threads = 32 * conv_runs, conv_pass = conv_runs * conv_ahead;
static_assert(conv_ahead >= max_taps - 1, "a run's inputs must cover the window the next run needs");

template <int KW>
__global__ void __launch_bounds__(conv_run_threads) conv1d_silu_runs_kernel(conv1d_silu_params p, const recurrent_seq* seqs) {
  // halo[b][w][j][lane]: run w's last inputs (oldest first) in the pass of parity b; old: the slot's
  // state as the step found it; tail: the sequence's last inputs, for the slot.
  __shared__ float halo[2][conv_runs][max_taps - 1][32], old[max_taps - 1][32], tail[max_taps - 1][32];
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const recurrent_seq s = seqs[std::size_t(p.chunked_from) + blockIdx.y];
  const int lane = int(threadIdx.x) % 32, w = int(threadIdx.x) / 32;
  const std::int64_t c = std::int64_t(blockIdx.x) * 32 + lane;
  const bool valid = c < p.channels;
  constexpr int T = KW > 0 ? KW : max_taps;  // the taps the loops run over
  const int kw = KW > 0 ? KW : int(p.kernel), hist = kw - 1;
  const std::int64_t n = s.n_tokens;
  float* st = p.state + std::int64_t(s.slot) * hist * p.channels + c;
  if (w == 0) {
    for (int j = 0; j < hist; ++j) old[j][lane] = valid && !s.fresh ? st[j * p.channels] : 0.f;
  }
  float taps[T];
#pragma unroll
  for (int j = 0; j < T; ++j) taps[j] = valid && j < kw ? p.taps[c * kw + j] : 0.f;
  float* x0 = p.x + s.first * p.channels + c;
  for (std::int64_t base = 0, pass = 0; base < n; base += conv_pass, ++pass) {
    const std::int64_t t0 = base + std::int64_t(w) * conv_ahead;
    float in[conv_ahead];
#pragma unroll
    for (int u = 0; u < conv_ahead; ++u) in[u] = valid && t0 + u < n ? x0[(t0 + u) * p.channels] : 0.f;
    float (*const mine)[32] = halo[pass & 1][w];
#pragma unroll
    for (int u = 0; u < conv_ahead; ++u) {  // in[] by constant indices only: it stays in registers
      const int j = u - (conv_ahead - hist);
      if (j >= 0) mine[j][lane] = in[u];
    }
    __syncthreads();  // the halos (and, in the first pass, old) are written
    // win[0, hist): the inputs before the run's first token, oldest first.
    const float(*const before)[32] = w > 0 ? halo[pass & 1][w - 1] : pass > 0 ? halo[(pass - 1) & 1][conv_runs - 1] : old;
    float win[T];
#pragma unroll
    for (int j = 0; j < T; ++j) win[j] = j < hist ? before[j][lane] : 0.f;
#pragma unroll
    for (int u = 0; u < conv_ahead; ++u) {
      const std::int64_t t = t0 + u;
      if (t >= n) break;
      const float y = silu(conv_token(taps, win, in[u], hist));
      if (valid) x0[t * p.channels] = y;
      if (t >= n - hist) tail[t - (n - hist)][lane] = in[u];
    }
  }
  __syncthreads();  // tail is written
  if (w == 0 && valid) {
    // The slot keeps the last hist inputs: the sequence's, and where it has fewer, the state's before them.
    for (int j = 0; j < hist; ++j) st[j * p.channels] = n - hist + j >= 0 ? tail[j][lane] : old[n + j][lane];
  }
}

template <int DK>
__global__ void __launch_bounds__(rule_block) delta_rule_kernel(delta_rule_params p, const recurrent_seq* seqs) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  __shared__ float qs[DK], ks[DK];
  const recurrent_seq s = seqs[blockIdx.y];
  const int j = int(blockIdx.x), c = int(threadIdx.x);
  const int dv = int(p.head_v), hv = int(p.v_heads), hk = int(p.k_heads), kh = j % hk;
  const bool active = c < dv;
  const std::int64_t width = 2 * std::int64_t(hk) * DK + std::int64_t(hv) * dv;
  float* S = p.state + (std::int64_t(s.slot) * hv + j) * DK * dv + c;  // column c of the head's state
  float st[DK];
#pragma unroll
  for (int a = 0; a < DK; ++a) st[a] = active && !s.fresh ? S[a * dv] : 0.f;
  const float decay_rate = p.a[j], dt_bias = p.dt_bias[j], q_scale = rsqrtf(float(DK));
  const float norm_w = active ? p.norm[c] : 0.f;
  for (std::int64_t t = 0; t < s.n_tokens; ++t) {
    const std::int64_t row = s.first + t;
    const float* r = p.qkv + row * width;
    __syncthreads();  // the token before is done with qs and ks
    float qq = 0.f, kk = 0.f;
    for (int i = c; i < DK; i += rule_block) {
      const float qv = r[kh * DK + i], kv = r[(hk + kh) * DK + i];
      qs[i] = qv;
      ks[i] = kv;
      qq += qv * qv;
      kk += kv * kv;
    }
    qq = gpu::block_reduce_sum<rule_block>(qq);  // its barriers publish qs and ks
    kk = gpu::block_reduce_sum<rule_block>(kk);
    const float qn = q_scale * rsqrtf(qq + 1e-6f), kn = rsqrtf(kk + 1e-6f);
    const float beta = gate_beta(p.b[row * hv + j]);
    const float decay = expf(decay_log(decay_rate, p.alpha[row * hv + j], dt_bias));
    float pred = 0.f;
#pragma unroll
    for (int a = 0; a < DK; ++a) {
      st[a] *= decay;
      pred += st[a] * ks[a];
    }
    const float v = active ? r[2 * std::int64_t(hk) * DK + j * dv + c] : 0.f;
    const float d = beta * (v - pred * kn) * kn;  // k's normalisation folded into the update
    float o = 0.f;
#pragma unroll
    for (int a = 0; a < DK; ++a) {
      st[a] += ks[a] * d;
      o += st[a] * qs[a];
    }
    o *= qn;
    const float ms = gpu::block_reduce_sum<rule_block>(active ? o * o : 0.f) / float(dv);
    if (active) {
      const std::int64_t at = (row * hv + j) * dv + c;
      p.y[at] = o * rsqrtf(ms + p.eps) * norm_w * silu(p.z[at]);
    }
  }
  if (active) {
#pragma unroll
    for (int a = 0; a < DK; ++a) S[a * dv] = st[a];
  }
}

// ---- the chunked form --------------------------------------------------------------------------------
constexpr int chunk = 32;          // tokens per chunk
constexpr int chunk_cols = 32;     // value columns per block
constexpr int chunk_threads = 256;
constexpr int chunk_groups = chunk_threads / 32;  // groups of 32 threads (a warp, or half of a 64-wide one)

// (I + A) u = x in place for one column (x[t * x_pitch], t < chunk), A strictly lower triangular
// (row t at a + t * a_pitch), by forward substitution with u in registers. Each u_i, once known, is
// taken off every later row at once: the rows' updates are independent of one another, so the
// chain of dependent instructions is one per row, and each row still subtracts its terms in the
// order i = 0, 1, ... (the same floats as taking row t's sum whole).
__device__ __forceinline__ void solve_unit_lower(const float* a, int a_pitch, float* x, int x_pitch) {
  float u[chunk];
#pragma unroll
  for (int t = 0; t < chunk; ++t) u[t] = x[t * x_pitch];
#pragma unroll
  for (int i = 0; i < chunk; ++i) {
#pragma unroll
    for (int t = i + 1; t < chunk; ++t) u[t] -= a[t * a_pitch + i] * u[i];
  }
#pragma unroll
  for (int t = 0; t < chunk; ++t) x[t * x_pitch] = u[t];
}

// Sum over an aligned group of 32 lanes (xor masks below 32 stay inside it for warps of 32 and 64).
__device__ __forceinline__ float sum32(float v) {
#pragma unroll
  for (int m = 16; m > 0; m /= 2) v += gpu::shfl_xor(v, m);
  return v;
}

// The block's columns [0, cols) of a head's DK x dv state between its slot (rows dv apart) and
// shared memory (rows `pitch` apart, chunk_cols wide): zeros for a fresh sequence and past cols.
template <int DK>
__device__ __forceinline__ void state_to_smem(float* S, int pitch, const float* slot, int dv, int cols, bool fresh) {
  for (int e = int(threadIdx.x); e < DK * chunk_cols; e += chunk_threads) {
    const int a = e / chunk_cols, c = e % chunk_cols;
    S[a * pitch + c] = !fresh && c < cols ? slot[a * dv + c] : 0.f;
  }
}
template <int DK>
__device__ __forceinline__ void state_to_slot(float* slot, const float* S, int pitch, int dv, int cols) {
  for (int e = int(threadIdx.x); e < DK * chunk_cols; e += chunk_threads) {
    const int a = e / chunk_cols, c = e % chunk_cols;
    if (c < cols) slot[a * dv + c] = S[a * pitch + c];
  }
}

// Step 1's rows, in both chunked kernels: each group of 32 threads takes tokens grp, grp +
// chunk_groups, ... of the chunk (`rows` its first token's row, n of them real, zeros past): q and
// k of key head kh normalised (q also by q_scale) into qs and ks (rows qk_pitch apart), and v of the
// block's columns (v0: the first one's offset in a row; zeros past cols) into us (rows u_pitch apart).
template <int DK>
__device__ __forceinline__ void load_chunk_rows(const float* rows, std::int64_t width, int n, int kh, int hk,
                                                std::int64_t v0, int cols, float q_scale, float* qs, float* ks,
                                                int qk_pitch, float* us, int u_pitch) {
  const int lane = int(threadIdx.x) % 32, grp = int(threadIdx.x) / 32;
#pragma unroll
  for (int m = 0; m < chunk / chunk_groups; ++m) {
    const int t = grp + chunk_groups * m;
    const float* r = rows + t * width;
    float qv[DK / 32 > 0 ? DK / 32 : 1], kv[DK / 32 > 0 ? DK / 32 : 1];
    float qq = 0.f, kk = 0.f;
#pragma unroll
    for (int i = 0; i * 32 < DK; ++i) {
      const int a = lane + 32 * i;
      const bool in = t < n && a < DK;
      qv[i] = in ? r[kh * DK + a] : 0.f;
      kv[i] = in ? r[(hk + kh) * DK + a] : 0.f;
      qq += qv[i] * qv[i];
      kk += kv[i] * kv[i];
    }
    const float v = t < n && lane < cols ? r[v0 + lane] : 0.f;
    qq = sum32(qq);
    kk = sum32(kk);
    const float qn = q_scale * rsqrtf(qq + 1e-6f), kn = rsqrtf(kk + 1e-6f);
#pragma unroll
    for (int i = 0; i * 32 < DK; ++i) {
      const int a = lane + 32 * i;
      if (a < DK) {
        qs[t * qk_pitch + a] = qv[i] * qn;
        ks[t * qk_pitch + a] = kv[i] * kn;
      }
    }
    us[t * u_pitch + lane] = v;
  }
}

// The block's shared memory, in floats: q and k of the chunk's tokens (rows padded to keep float4
// loads of 8 consecutive rows on distinct banks), the state's columns, the chunk's two triangular
// matrices, u (v, then the right-hand side, then the solution), and per token G and beta.
template <int DK>
struct chunk_layout {
  static constexpr int pitch = DK + 4;
  static constexpr int q = 0, k = q + chunk * pitch, s = k + chunk * pitch, akk = s + DK * chunk_cols,
                       aqk = akk + chunk * (chunk + 1), u = aqk + chunk * (chunk + 1), g = u + chunk * chunk_cols,
                       beta = g + chunk, floats = beta + chunk;
  static constexpr int bytes = floats * int(sizeof(float));
};

template <int DK>
__global__ void __launch_bounds__(chunk_threads) delta_chunk_kernel(delta_rule_params p, const recurrent_seq* seqs) {
  using L = chunk_layout<DK>;
  extern __shared__ float4 smem4[];
  float* const sm = reinterpret_cast<float*>(smem4);
  float *const qs = sm + L::q, *const ks = sm + L::k, *const S = sm + L::s, *const akk = sm + L::akk,
               *const aqk = sm + L::aqk, *const us = sm + L::u, *const G = sm + L::g, *const betas = sm + L::beta;
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const int dv = int(p.head_v), hv = int(p.v_heads), hk = int(p.k_heads);
  const int groups_per_head = (dv + chunk_cols - 1) / chunk_cols;
  const int j = int(blockIdx.x) / groups_per_head, col0 = (int(blockIdx.x) % groups_per_head) * chunk_cols;
  const int kh = j % hk, tid = int(threadIdx.x), lane = tid % 32, grp = tid / 32;
  const int cols = min(chunk_cols, dv - col0);
  const bool col_ok = lane < cols;
  const recurrent_seq sq = seqs[std::size_t(p.chunked_from) + blockIdx.y];
  const std::int64_t width = 2 * std::int64_t(hk) * DK + std::int64_t(hv) * dv;
  float* const S_slot = p.state + (std::int64_t(sq.slot) * hv + j) * DK * dv + col0;
  state_to_smem<DK>(S, chunk_cols, S_slot, dv, cols, sq.fresh);
  const float decay_rate = p.a[j], dt_bias = p.dt_bias[j], q_scale = rsqrtf(float(DK));

  for (std::int64_t t0 = 0; t0 < sq.n_tokens; t0 += chunk) {
    const int n = sq.n_tokens - t0 < chunk ? int(sq.n_tokens - t0) : chunk;
    const std::int64_t row0 = sq.first + t0;
    __syncthreads();  // the chunk before is done with every array but S (and S's own barrier came before)
    // 1. q and k of the key head, normalised (q also by 1 / sqrt(DK)); v of the block's columns;
    //    beta, the decay's logarithm g and its running sum G (zeros past the chunk's tokens).
    load_chunk_rows<DK>(p.qkv + row0 * width, width, n, kh, hk, 2 * std::int64_t(hk) * DK + j * dv + col0, cols, q_scale,
                        qs, ks, L::pitch, us, chunk_cols);
    if (tid < chunk) {
      float g = 0.f, beta = 0.f;
      if (tid < n) {
        const std::int64_t at = (row0 + tid) * hv + j;
        beta = gate_beta(p.b[at]);
        g = decay_log(decay_rate, p.alpha[at], dt_bias);
      }
      G[tid] = g;
      betas[tid] = beta;
    }
    __syncthreads();
    if (tid == 0) {
      for (int t = 1; t < chunk; ++t) G[t] += G[t - 1];
    }
    __syncthreads();

    // 2. akk[t][i] = beta_t e^{G_t - G_i} k_t . k_i (i < t), aqk[t][i] = e^{G_t - G_i} q_t . k_i (i <= t).
    {
      const int t = tid / 8, i_lo = tid % 8;  // rows i_lo + 8m: eight consecutive rows per float4 quarter
      float dkk[4] = {}, dqk[4] = {};
      for (int a = 0; a < DK; a += 4) {
        const float4 kt = *reinterpret_cast<const float4*>(ks + t * L::pitch + a);
        const float4 qt = *reinterpret_cast<const float4*>(qs + t * L::pitch + a);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float4 ki = *reinterpret_cast<const float4*>(ks + (i_lo + 8 * m) * L::pitch + a);
          dkk[m] += kt.x * ki.x + kt.y * ki.y + kt.z * ki.z + kt.w * ki.w;
          dqk[m] += qt.x * ki.x + qt.y * ki.y + qt.z * ki.z + qt.w * ki.w;
        }
      }
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int i = i_lo + 8 * m;
        const float decay = i <= t ? expf(G[t] - G[i]) : 0.f;
        akk[t * (chunk + 1) + i] = i < t ? betas[t] * decay * dkk[m] : 0.f;
        aqk[t * (chunk + 1) + i] = decay * dqk[m];
      }
    }
    // 3. S0's products: the right-hand side beta_t (v_t - e^{G_t} S0^T k_t) into us, and the
    //    outputs' first term e^{G_t} S0^T q_t kept in registers (step 5 has the same threads).
    float o[chunk / chunk_groups];
    {
      float ks0[chunk / chunk_groups] = {}, qs0[chunk / chunk_groups] = {};
      for (int a = 0; a < DK; ++a) {
        const float s = S[a * chunk_cols + lane];
#pragma unroll
        for (int m = 0; m < chunk / chunk_groups; ++m) {
          const int t = grp * (chunk / chunk_groups) + m;
          ks0[m] += ks[t * L::pitch + a] * s;
          qs0[m] += qs[t * L::pitch + a] * s;
        }
      }
#pragma unroll
      for (int m = 0; m < chunk / chunk_groups; ++m) {
        const int t = grp * (chunk / chunk_groups) + m;
        float& v = us[t * chunk_cols + lane];
        const float e = expf(G[t]);
        v = betas[t] * (v - e * ks0[m]);
        o[m] = e * qs0[m];
      }
    }
    __syncthreads();
    // 4. (I + akk) u = rhs, by forward substitution: a thread per column, u in registers.
    if (tid < chunk_cols) solve_unit_lower(akk, chunk + 1, us + tid, chunk_cols);
    __syncthreads();
    // 5. The outputs: o_t += sum_{i <= t} aqk[t][i] u_i (their gated norm is the next kernel's).
#pragma unroll
    for (int m = 0; m < chunk / chunk_groups; ++m) {
      const int t = grp * (chunk / chunk_groups) + m;
      float acc = o[m];
      for (int i = 0; i <= t; ++i) acc += aqk[t * (chunk + 1) + i] * us[i * chunk_cols + lane];
      if (t < n && col_ok) p.y[((row0 + t) * hv + j) * dv + col0 + lane] = acc;
    }
    // 6. The state: S = e^{G_end} S0 + sum_i e^{G_end - G_i} k_i u_i^T (rows a of this group).
    {
      constexpr int rows = DK / chunk_groups;
      const float keep = expf(G[n - 1]);
      float acc[rows];
#pragma unroll
      for (int m = 0; m < rows; ++m) acc[m] = keep * S[(grp * rows + m) * chunk_cols + lane];
      for (int i = 0; i < n; ++i) {
        const float ui = expf(G[n - 1] - G[i]) * us[i * chunk_cols + lane];
#pragma unroll
        for (int m = 0; m < rows; ++m) acc[m] += ks[i * L::pitch + grp * rows + m] * ui;
      }
#pragma unroll
      for (int m = 0; m < rows; ++m) S[(grp * rows + m) * chunk_cols + lane] = acc[m];
    }
  }
  __syncthreads();
  state_to_slot<DK>(S_slot, S, chunk_cols, dv, cols);
}

// The gated norm of the chunked form's outputs, in place: y = o / sqrt(mean(o^2) + eps) * norm *
// silu(z) over each (token, value head), a group of 32 threads per pair.
constexpr int norm_threads = 256, norm_token_blocks = 16;
__global__ void __launch_bounds__(norm_threads) gated_norm_kernel(delta_rule_params p, const recurrent_seq* seqs) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const recurrent_seq sq = seqs[std::size_t(p.chunked_from) + blockIdx.y];
  const int j = int(blockIdx.x), dv = int(p.head_v), hv = int(p.v_heads);
  const int lane = int(threadIdx.x) % 32, grp = int(threadIdx.x) / 32;
  constexpr int per_lane = 128 / 32;  // head_v <= 128
  for (std::int64_t t = std::int64_t(blockIdx.z) * (norm_threads / 32) + grp; t < sq.n_tokens;
       t += std::int64_t(gridDim.z) * (norm_threads / 32)) {
    const std::int64_t base = ((sq.first + t) * hv + j) * dv;
    float o[per_lane];
    float ss = 0.f;
#pragma unroll
    for (int m = 0; m < per_lane; ++m) {
      const int c = lane + 32 * m;
      o[m] = c < dv ? p.y[base + c] : 0.f;
      ss += o[m] * o[m];
    }
    const float inv = rsqrtf(sum32(ss) / float(dv) + p.eps);
#pragma unroll
    for (int m = 0; m < per_lane; ++m) {
      const int c = lane + 32 * m;
      if (c < dv) p.y[base + c] = o[m] * inv * p.norm[c] * silu(p.z[base + c]);
    }
  }
}

#if defined(ANVIL_GPU_CUDA)
// ---- the chunked form on tensor cores (NVIDIA sm_80+) ------------------------------------------------
// The same block, chunk and steps as delta_chunk_kernel, with the chunk's products on m16n8k8 TF32
// tensor-core instructions, each operand split into a TF32 pair (tc::split_tf32: within a few f32
// roundings of the CUDA-core kernel). Each of the 8 warps owns a 16 x 8 tile: (tokens 16 mt.., 8 nt..)
// of k.k and q.k in step 2, of S0's products and the outputs in steps 3 and 5 (so the outputs'
// first term stays in the accumulators), and tiles of the new state in step 6. The forward
// substitution stays on one warp. Rows are padded so that the fragments' reads hit distinct banks
// (q and k rows by 4 floats, the state, u and the triangular matrices by 8 or 4).
namespace chunk_tc {
constexpr int s_pitch = chunk_cols + 8, a_pitch = chunk + 4, u_pitch = chunk_cols + 8;

template <int DK>
struct layout {
  static constexpr int qk_pitch = DK + 4;
  static constexpr int q = 0, k = q + chunk * qk_pitch, s = k + chunk * qk_pitch, akk = s + DK * s_pitch,
                       aqk = akk + chunk * a_pitch, u = aqk + chunk * a_pitch, g = u + chunk * u_pitch,
                       beta = g + chunk, floats = beta + chunk;
  static constexpr int bytes = floats * int(sizeof(float));
};

// One k-step of 8 of a 3xTF32 product: the operands' fragments as TF32 pairs, hi*hi into `big`, the
// two correction terms into `small` (two accumulators, so two chains of dependent instructions).
struct a_frag {
  unsigned hi[4], lo[4];
};
template <class FA>
__device__ __forceinline__ a_frag load_a(FA a, int g, int q, int k0) {
  const float v[4] = {a(g, k0 + q), a(g + 8, k0 + q), a(g, k0 + q + 4), a(g + 8, k0 + q + 4)};
  a_frag f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const tc::tf32_pair x = tc::split_tf32(v[e]);
    f.hi[e] = x.hi;
    f.lo[e] = x.lo;
  }
  return f;
}
__device__ __forceinline__ void mma3(float (&big)[4], float (&small)[4], const a_frag& a, tc::tf32_pair b0, tc::tf32_pair b1) {
  tc::mma_1688_tf32(small, a.lo, b0.hi, b1.hi);
  tc::mma_1688_tf32(small, a.hi, b0.lo, b1.lo);
  tc::mma_1688_tf32(big, a.hi, b0.hi, b1.hi);
}

// c1 += A1 B and c2 += A2 B (a 16 x 8 tile each, in the C layout) over k in [0, k_end) (a multiple
// of 8, at most K): A(r, k) for rows r < 16 and B(k, n) for columns n < 8, read through the
// callables; B's fragments serve both products.
template <int K, class FA1, class FA2, class FB>
__device__ __forceinline__ void tile_mma2(float (&c1)[4], float (&c2)[4], FA1 a1, FA2 a2, FB b, int g, int q,
                                          int k_end = K) {
  float big1[4] = {}, small1[4] = {}, big2[4] = {}, small2[4] = {};
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 8) {
    if (k0 >= k_end) break;
    const tc::tf32_pair b0 = tc::split_tf32(b(k0 + q, g)), b1 = tc::split_tf32(b(k0 + q + 4, g));
    mma3(big1, small1, load_a(a1, g, q, k0), b0, b1);
    mma3(big2, small2, load_a(a2, g, q, k0), b0, b1);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    c1[e] += big1[e] + small1[e];
    c2[e] += big2[e] + small2[e];
  }
}

// c += A B, as tile_mma2 for one product.
template <int K, class FA, class FB>
__device__ __forceinline__ void tile_mma(float (&c)[4], FA a, FB b, int g, int q, int k_end = K) {
  float big[4] = {}, small[4] = {};
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 8) {
    if (k0 >= k_end) break;
    mma3(big, small, load_a(a, g, q, k0), tc::split_tf32(b(k0 + q, g)), tc::split_tf32(b(k0 + q + 4, g)));
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) c[e] += big[e] + small[e];
}
}  // namespace chunk_tc

// MinBlocks 1 for grids of at most one block a multiprocessor (one prompt: the kernel takes the
// registers it wants, 177 at DK 128), 2 for larger ones (capped at 128 registers, so that two blocks
// share a multiprocessor and hide each other's latencies; a few bytes spill). Measured on the H200
// (bench/GPU_NOTES.md, session 36): one 512-token prompt 192 against 262 µs, four 767 against 617.
template <int DK, int MinBlocks>
__global__ void __launch_bounds__(chunk_threads, MinBlocks) delta_chunk_tc_kernel(delta_rule_params p,
                                                                                 const recurrent_seq* seqs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = chunk_tc::layout<DK>;
  constexpr int P = L::qk_pitch, SP = chunk_tc::s_pitch, AP = chunk_tc::a_pitch, UP = chunk_tc::u_pitch;
  static_assert(chunk == 32 && chunk_cols == 32 && chunk_groups == 8, "the warps' tiles below assume these");
  extern __shared__ float4 smem4[];
  float* const sm = reinterpret_cast<float*>(smem4);
  float *const qs = sm + L::q, *const ks = sm + L::k, *const S = sm + L::s, *const akk = sm + L::akk,
               *const aqk = sm + L::aqk, *const us = sm + L::u, *const G = sm + L::g, *const betas = sm + L::beta;
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const int dv = int(p.head_v), hv = int(p.v_heads), hk = int(p.k_heads);
  const int groups_per_head = (dv + chunk_cols - 1) / chunk_cols;
  const int j = int(blockIdx.x) / groups_per_head, col0 = (int(blockIdx.x) % groups_per_head) * chunk_cols;
  const int kh = j % hk, tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, q = lane % 4;  // the fragments' row (and row + 8) and column
  const int mt = warp / 4, nt = warp % 4;  // the warp's tile in steps 2, 3 and 5: tokens 16 mt.., columns 8 nt..
  const int cols = min(chunk_cols, dv - col0);
  const recurrent_seq sq = seqs[std::size_t(p.chunked_from) + blockIdx.y];
  const std::int64_t width = 2 * std::int64_t(hk) * DK + std::int64_t(hv) * dv;
  float* const S_slot = p.state + (std::int64_t(sq.slot) * hv + j) * DK * dv + col0;
  state_to_smem<DK>(S, SP, S_slot, dv, cols, sq.fresh);
  const float decay_rate = p.a[j], dt_bias = p.dt_bias[j], q_scale = rsqrtf(float(DK));
  // The row and column of accumulator e of a tile whose first row is r0 and first column c0.
  const auto row_of = [&](int r0, int e) { return r0 + g + (e >= 2 ? 8 : 0); };
  const auto col_of = [&](int c0, int e) { return c0 + 2 * q + (e & 1); };

  for (std::int64_t t0 = 0; t0 < sq.n_tokens; t0 += chunk) {
    const int n = sq.n_tokens - t0 < chunk ? int(sq.n_tokens - t0) : chunk;
    const std::int64_t row0 = sq.first + t0;
    __syncthreads();  // the chunk before is done with every array but S (and S's own barrier came before)
    // 1. q, k and v (load_chunk_rows, as delta_chunk_kernel); beta and G (the running sum by a scan
    //    over warp 0's lanes, whose gate loads go first).
    float b_raw = 0.f, alpha_raw = 0.f;
    if (warp == 0 && lane < n) {
      b_raw = p.b[(row0 + lane) * hv + j];
      alpha_raw = p.alpha[(row0 + lane) * hv + j];
    }
    load_chunk_rows<DK>(p.qkv + row0 * width, width, n, kh, hk, 2 * std::int64_t(hk) * DK + j * dv + col0, cols, q_scale,
                        qs, ks, P, us, UP);
    if (warp == 0) {
      const float beta = lane < n ? gate_beta(b_raw) : 0.f;
      float gl = lane < n ? decay_log(decay_rate, alpha_raw, dt_bias) : 0.f;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const float up = __shfl_up_sync(0xffffffffu, gl, d);
        if (lane >= d) gl += up;
      }
      G[lane] = gl;
      betas[lane] = beta;
    }
    __syncthreads();

    // 2. akk and aqk (as delta_chunk_kernel), the warp's tile of each; tiles wholly above the
    //    diagonal are zeros.
    {
      float ckk[4] = {}, cqk[4] = {};
      if (nt * 8 <= mt * 16 + 15) {
        chunk_tc::tile_mma2<DK>(ckk, cqk, [&](int r, int k) { return ks[(mt * 16 + r) * P + k]; },
                                [&](int r, int k) { return qs[(mt * 16 + r) * P + k]; },
                                [&](int k, int c) { return ks[(nt * 8 + c) * P + k]; }, g, q);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = row_of(mt * 16, e), i = col_of(nt * 8, e);
        const float decay = i <= t ? expf(G[t] - G[i]) : 0.f;
        akk[t * AP + i] = i < t ? betas[t] * decay * ckk[e] : 0.f;
        aqk[t * AP + i] = decay * cqk[e];
      }
    }
    // 3. S0's products: the right-hand side into us, the outputs' first term kept in o (step 5's
    //    accumulators, the same tile).
    float o[4] = {};
    {
      float ck[4] = {};
      chunk_tc::tile_mma2<DK>(ck, o, [&](int r, int k) { return ks[(mt * 16 + r) * P + k]; },
                              [&](int r, int k) { return qs[(mt * 16 + r) * P + k]; },
                              [&](int k, int c) { return S[k * SP + nt * 8 + c]; }, g, q);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = row_of(mt * 16, e), c = col_of(nt * 8, e);
        float& v = us[t * UP + c];
        const float ex = expf(G[t]);
        v = betas[t] * (v - ex * ck[e]);
        o[e] *= ex;
      }
    }
    __syncthreads();
    // 4. (I + akk) u = rhs, by forward substitution: a thread per column, u in registers.
    if (tid < chunk_cols) solve_unit_lower(akk, AP, us + tid, UP);
    __syncthreads();
    // 5. The outputs: o += aqk u over i <= t (aqk is zero past the tile's last token).
    {
      chunk_tc::tile_mma<chunk>(o, [&](int r, int k) { return aqk[(mt * 16 + r) * AP + k]; },
                                [&](int k, int c) { return us[k * UP + nt * 8 + c]; }, g, q, mt * 16 + 16);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = row_of(mt * 16, e), c = col_of(nt * 8, e);
        if (t < n && c < cols) p.y[((row0 + t) * hv + j) * dv + col0 + c] = o[e];
      }
    }
    // 6. The state: S = e^{G_end} S0 + K^T (e^{G_end - G_i} u_i), tiles of (16 rows a, 8 columns)
    //    dealt to the warps; u is zero past the chunk's tokens.
    {
      const float g_end = G[n - 1], keep = expf(g_end);
      const int k_end = (n + 7) / 8 * 8;
      for (int x = warp; x < DK / 16 * 4; x += chunk_groups) {
        const int am = (x / 4) * 16, c0 = (x % 4) * 8;
        float c[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) c[e] = keep * S[row_of(am, e) * SP + col_of(c0, e)];
        chunk_tc::tile_mma<chunk>(c, [&](int r, int k) { return ks[k * P + am + r]; },
                                  [&](int k, int cc) { return expf(g_end - G[k]) * us[k * UP + c0 + cc]; }, g, q, k_end);
#pragma unroll
        for (int e = 0; e < 4; ++e) S[row_of(am, e) * SP + col_of(c0, e)] = c[e];
      }
    }
  }
  __syncthreads();
  state_to_slot<DK>(S_slot, S, SP, dv, cols);
#else
  __trap();  // launched only on devices of compute capability 8.0 and up
#endif
}
#endif

#if defined(ANVIL_GPU_CUDA)
template <int DK, int MinBlocks>
void launch_chunk_tc(const delta_rule_params& p, dim3 grid, hipStream_t stream) {
  constexpr int smem = chunk_tc::layout<DK>::bytes;
  gpu::allow_dynamic_smem<delta_chunk_tc_kernel<DK, MinBlocks>>(smem);
  gpu::launch_dependent_smem(delta_chunk_tc_kernel<DK, MinBlocks>, grid, dim3(chunk_threads), smem, stream, p,
                             p.seqs.data());
}
#endif

template <int DK>
void launch_chunked(const delta_rule_params& p, unsigned n_seqs, hipStream_t stream) {
  const dim3 grid(unsigned(p.v_heads) * unsigned((p.head_v + chunk_cols - 1) / chunk_cols), n_seqs);
#if defined(ANVIL_GPU_CUDA)
  if (!p.cuda_cores_only && tc::device_has_mma()) {
    if (std::int64_t(grid.x) * grid.y > gpu::multiprocessors()) {
      launch_chunk_tc<DK, 2>(p, grid, stream);
    } else {
      launch_chunk_tc<DK, 1>(p, grid, stream);
    }
  } else
#endif
  {
    constexpr int smem = chunk_layout<DK>::bytes;
    gpu::allow_dynamic_smem<delta_chunk_kernel<DK>>(smem);
    gpu::launch_dependent_smem(delta_chunk_kernel<DK>, grid, dim3(chunk_threads), smem, stream, p, p.seqs.data());
  }
  gpu::launch_dependent(gated_norm_kernel, dim3(unsigned(p.v_heads), n_seqs, norm_token_blocks), dim3(norm_threads),
                        stream, p, p.seqs.data());
}

}  // namespace

hipError_t launch_conv1d_silu(const conv1d_silu_params& p, hipStream_t stream) {
  if (p.seqs.empty()) return hipSuccess;
  if (p.channels < 1 || p.kernel < 2 || p.kernel > max_taps || p.seqs.size() > 65535 || p.n_slots < 1 ||
      (p.chunked_from != SIZE_MAX && p.chunked_from > p.seqs.size())) {
    return hipErrorInvalidValue;
  }
  const std::size_t n_single = std::min(p.chunked_from, p.seqs.size());
  const auto n_runs = static_cast<unsigned>(p.seqs.size() - n_single);
  if (n_single > 0) {
    const dim3 grid(static_cast<unsigned>((p.channels + conv_block - 1) / conv_block), static_cast<unsigned>(n_single));
    gpu::launch_dependent(p.kernel == 4 ? conv1d_silu_kernel<4> : conv1d_silu_kernel<0>, grid, dim3(conv_block), stream,
                          p, p.seqs.data());
  }
  if (n_runs > 0) {
    const dim3 grid(static_cast<unsigned>((p.channels + 31) / 32), n_runs);
    gpu::launch_dependent(p.kernel == 4 ? conv1d_silu_runs_kernel<4> : conv1d_silu_runs_kernel<0>, grid,
                          dim3(conv_run_threads), stream, p, p.seqs.data());
  }
  return hipGetLastError();
}

hipError_t launch_delta_rule(const delta_rule_params& p, hipStream_t stream) {
  if (p.seqs.empty()) return hipSuccess;
  if (p.k_heads < 1 || p.v_heads < 1 || p.v_heads % p.k_heads != 0 || p.head_v < 1 || p.head_v > rule_block ||
      p.v_heads > 65535 || p.seqs.size() > 65535 || p.n_slots < 1 ||
      (p.chunked_from != SIZE_MAX && p.chunked_from > p.seqs.size())) {
    return hipErrorInvalidValue;
  }
  const std::size_t n_rec = std::min(p.chunked_from, p.seqs.size());
  const auto n_chunked = static_cast<unsigned>(p.seqs.size() - n_rec);
  const dim3 grid(static_cast<unsigned>(p.v_heads), static_cast<unsigned>(n_rec));
  const auto run = [&]<int DK>() {
    if (n_rec > 0) gpu::launch_dependent(delta_rule_kernel<DK>, grid, dim3(rule_block), stream, p, p.seqs.data());
    if (n_chunked > 0) launch_chunked<DK>(p, n_chunked, stream);
  };
  switch (p.head_k) {
    case 16: run.template operator()<16>(); break;
    case 32: run.template operator()<32>(); break;
    case 64: run.template operator()<64>(); break;
    case 128: run.template operator()<128>(); break;
    default: return hipErrorInvalidValue;
  }
  return hipGetLastError();
}

}  // namespace anvil::kernels

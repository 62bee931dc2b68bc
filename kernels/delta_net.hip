// Gated DeltaNet on the GPU (kernels/delta_net.h): the causal convolution with SiLU, a thread per
// channel of a sequence, its last inputs in registers; and the delta rule in its recurrent form, a
// block per (value head, sequence), each thread one column of the head's head_k x head_v state in
// registers for the whole step (the state is read from its slot once and written back once), q and
// k of the key head in shared memory, the gated norm's mean by a block reduction.
//
// The recurrent form takes a sequence's tokens one after another: what a decode step needs, and
// correct (not fast) for prefill chunks; the chunked form is the prefill kernel's to come.
#include "kernels/delta_net.h"

#include <algorithm>

namespace anvil::kernels {
namespace {

constexpr int conv_block = 128;
constexpr int max_taps = int(conv1d_max_taps);
constexpr int rule_block = 128;  // delta_rule: one thread per value dimension, head_v <= 128

__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

__global__ void __launch_bounds__(conv_block) conv1d_silu_kernel(conv1d_silu_params p, const recurrent_seq* seqs) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const recurrent_seq s = seqs[blockIdx.y];
  const std::int64_t c = std::int64_t(blockIdx.x) * conv_block + threadIdx.x;
  if (c >= p.channels) return;
  const int kw = int(p.kernel), hist = kw - 1;
  float* st = p.state + std::int64_t(s.slot) * hist * p.channels + c;
  // win[0, hist): the inputs before the current token, oldest first; taps past kw are 0.
  float win[max_taps], taps[max_taps];
#pragma unroll
  for (int j = 0; j < max_taps; ++j) {
    win[j] = j < hist && !s.fresh ? st[j * p.channels] : 0.f;
    taps[j] = j < kw ? p.taps[c * kw + j] : 0.f;
  }
  for (std::int64_t t = 0; t < s.n_tokens; ++t) {
    float* x = p.x + (s.first + t) * p.channels + c;
    const float cur = *x;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < max_taps; ++j) acc += taps[j] * (j < hist ? win[j] : j == hist ? cur : 0.f);
    *x = silu(acc);
#pragma unroll
    for (int j = 0; j + 1 < max_taps; ++j) win[j] = j + 1 < hist ? win[j + 1] : j + 1 == hist ? cur : win[j];
  }
#pragma unroll
  for (int j = 0; j < max_taps; ++j) {
    if (j < hist) st[j * p.channels] = win[j];
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
    const float beta = 1.f / (1.f + expf(-p.b[row * hv + j]));
    const float x = p.alpha[row * hv + j] + dt_bias;
    const float decay = expf(decay_rate * (x > 20.f ? x : log1pf(expf(x))));
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

}  // namespace

hipError_t launch_conv1d_silu(const conv1d_silu_params& p, hipStream_t stream) {
  if (p.seqs.empty()) return hipSuccess;
  if (p.channels < 1 || p.kernel < 2 || p.kernel > max_taps || p.seqs.size() > 65535 || p.n_slots < 1) {
    return hipErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((p.channels + conv_block - 1) / conv_block), static_cast<unsigned>(p.seqs.size()));
  gpu::launch_dependent(conv1d_silu_kernel, grid, dim3(conv_block), stream, p, p.seqs.data());
  return hipGetLastError();
}

hipError_t launch_delta_rule(const delta_rule_params& p, hipStream_t stream) {
  if (p.seqs.empty()) return hipSuccess;
  if (p.k_heads < 1 || p.v_heads < 1 || p.v_heads % p.k_heads != 0 || p.head_v < 1 || p.head_v > rule_block ||
      p.v_heads > 65535 || p.seqs.size() > 65535 || p.n_slots < 1) {
    return hipErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(p.v_heads), static_cast<unsigned>(p.seqs.size()));
  switch (p.head_k) {
    case 16: gpu::launch_dependent(delta_rule_kernel<16>, grid, dim3(rule_block), stream, p, p.seqs.data()); break;
    case 32: gpu::launch_dependent(delta_rule_kernel<32>, grid, dim3(rule_block), stream, p, p.seqs.data()); break;
    case 64: gpu::launch_dependent(delta_rule_kernel<64>, grid, dim3(rule_block), stream, p, p.seqs.data()); break;
    case 128: gpu::launch_dependent(delta_rule_kernel<128>, grid, dim3(rule_block), stream, p, p.seqs.data()); break;
    default: return hipErrorInvalidValue;
  }
  return hipGetLastError();
}

}  // namespace anvil::kernels

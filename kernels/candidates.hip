// Logits → candidates, one block of 1024 threads per sequence (kernels/candidates.h). Passes over
// the sequence's row of logits (a row of 152k floats is 600 KB: it stays in L2 between passes):
//   1. bias (one thread, in list order: repeated ids add up exactly as the reference adds them),
//      then penalties (one thread per distinct id), both with unfused float arithmetic;
//   2. temperature, written back, fused with the first radix-select histogram;
//   3. radix select on the order-preserving 32-bit key of the logit: 4 histogram passes of 8
//      bits find the K-th largest value T and how many tokens equal to T belong in the top;
//   4. collect the tokens above T (order-free), then the ties at T in ascending id order (a block
//      scan per chunk; skipped when every tie is taken, as when one token holds T), then
//      rank-sort the K candidates (logit descending, id ascending);
//   5. total and tail weights exp(l - max) in double (the reference's arithmetic): each warp sums
//      one contiguous segment of the vocabulary, and the segments add up in a fixed order;
//   6. the tail draw: the segment sums in id order find the segment that crosses u * tail; the
//      block scans it in chunks with block prefix sums, and the one thread whose range crosses
//      scans its own tokens.
// Only integer atomics are used (histograms, the unordered collection sorted afterwards), so the
// result is deterministic. Histogram counts are added per run of equal bins in a thread's tokens.
#include "kernels/candidates.h"

namespace anvil::kernels {
namespace {

constexpr int threads = 1024;
constexpr int draw_items = 4;  // consecutive tokens per thread in the tail draw

// Order-preserving key: a > b as floats (with -0 == +0) iff key(a) > key(b) as unsigned.
__device__ __forceinline__ unsigned order_key(float x) {
  unsigned b = __float_as_uint(x);
  if ((b & 0x7fffffffu) == 0) b = 0;  // -0 ties with +0, as in the reference's comparison
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Inclusive prefix sum over the block (threads in id order); `total` gets the block's sum.
// `warp_sums` is shared scratch of at least threads / 32 elements.
template <class T>
__device__ T block_inclusive_scan(T v, T* warp_sums, T& total) {
  constexpr int ws = gpu::warp_size, warps = threads / ws;
  const int lane = threadIdx.x % ws, warp = threadIdx.x / ws;
#pragma unroll
  for (int o = 1; o < ws; o <<= 1) {
    const T n = gpu::shfl_up(v, unsigned(o));
    if (lane >= o) v += n;
  }
  if (lane == ws - 1) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T s = lane < warps ? warp_sums[lane] : T(0);
#pragma unroll
    for (int o = 1; o < ws; o <<= 1) {
      const T n = gpu::shfl_up(s, unsigned(o));
      if (lane >= o) s += n;
    }
    if (lane < warps) warp_sums[lane] = s;
  }
  __syncthreads();
  if (warp > 0) v += warp_sums[warp - 1];
  total = warp_sums[warps - 1];
  __syncthreads();  // warp_sums may be reused by the next call
  return v;
}

// Calls fn(i, l[i]) for i = first, first + stride, ... below end, loading `batch` logits before
// handling any. One block walks a whole row several times, so a pass is bound by the latency of
// its loads, not by bandwidth: a thread waits for one L2 round trip per batch instead of one per
// token.
constexpr int batch = 16;
template <class Fn>
__device__ __forceinline__ void for_logits(const float* l, int first, int end, int stride, Fn&& fn) {
  for (int base = first; base < end; base += stride * batch) {
    float v[batch];
#pragma unroll
    for (int j = 0; j < batch; ++j) {
      const int i = base + j * stride;
      v[j] = i < end ? l[i] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < batch; ++j) {
      const int i = base + j * stride;
      if (i < end) fn(i, v[j]);
    }
  }
}

// A candidate in shared memory (the record's entry type has default member initialisers, which
// __shared__ variables cannot have).
struct entry {
  int token;
  float logit;
};

__device__ __forceinline__ bool better(const entry& a, const entry& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

__global__ void __launch_bounds__(threads) candidates_kernel(candidates_params p) {
  __shared__ unsigned hist[256];
  __shared__ entry sel[candidates_max_k];
  __shared__ int n_sel, tie_cut_s, last_tail_s, flags_s;
  __shared__ unsigned prefix_s, k_rem_s, ties_s;
  __shared__ float max_s;
  __shared__ int int_sums[32];
  __shared__ double dbl_sums[32], seg_total_s[32], seg_tail_s[32];

  const int tid = threadIdx.x, vocab = int(p.vocab);
  const candidates_seq sp = p.seqs[blockIdx.x];
  float* l = p.logits + std::int64_t(blockIdx.x) * p.vocab;
  unsigned char* rec = static_cast<unsigned char*>(p.out) +
                       std::size_t(blockIdx.x) * (sizeof(candidates_record_header) +
                                                  std::size_t(p.max_k) * sizeof(candidates_record_entry));
  auto* hdr = reinterpret_cast<candidates_record_header*>(rec);
  auto* top = reinterpret_cast<candidates_record_entry*>(rec + sizeof(candidates_record_header));
  const int k = min(min(sp.top_k, p.max_k), vocab);

  // 1. Bias, then penalties.
  if (tid == 0) {
    for (int i = 0; i < sp.bias_count; ++i) {
      float& x = l[p.bias_ids[sp.bias_begin + i]];
      x = gpu::add_rn(x, p.bias_values[sp.bias_begin + i]);
    }
    n_sel = 0;
    tie_cut_s = -1;
    last_tail_s = -1;
    flags_s = 0;
  }
  __syncthreads();
  for (int i = tid; i < sp.counts_count; i += threads) {
    const int n = p.count_values[sp.counts_begin + i];
    if (n == 0) continue;
    float& x = l[p.count_ids[sp.counts_begin + i]];
    float y = x > 0 ? x / sp.repetition_penalty : gpu::mul_rn(x, sp.repetition_penalty);
    y = gpu::add_rn(y, -gpu::add_rn(sp.presence_penalty, gpu::mul_rn(sp.frequency_penalty, float(n))));
    x = y;
  }
  __syncthreads();

  // 2-3. Temperature (first pass), radix select of the K-th largest key.
  unsigned prefix = 0, mask = 0, k_rem = unsigned(k);
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int b = tid; b < 256; b += threads) hist[b] = 0;
    __syncthreads();
    bool bad = false;
    // Counts are added per run of equal bins: real logits share their top bits, so one bin
    // takes nearly every token in the first passes, and an atomic per token would serialise
    // the whole vocabulary on one shared-memory address.
    unsigned run_bin = 0, run_n = 0;
    for_logits(l, tid, vocab, threads, [&](int i, float x) {
      if (pass == 0) {
        if (sp.temperature > 0.f) {
          x = x / sp.temperature;
          l[i] = x;
        }
        bad |= isnan(x) || x == INFINITY;
      }
      const unsigned key = order_key(x);
      if ((key & mask) == prefix) {
        const unsigned bin = (key >> shift) & 255u;
        if (bin != run_bin && run_n > 0) {
          atomicAdd(&hist[run_bin], run_n);
          run_n = 0;
        }
        run_bin = bin;
        ++run_n;
      }
    });
    if (run_n > 0) atomicAdd(&hist[run_bin], run_n);
    if (bad) atomicOr(&flags_s, candidates_flag_bad_logit);
    __syncthreads();
    if (tid == 0) {
      unsigned above = 0;
      for (int b = 255; b >= 0; --b) {
        if (above + hist[b] >= k_rem) {
          prefix_s = prefix | (unsigned(b) << shift);
          k_rem_s = k_rem - above;
          ties_s = hist[b];  // after the last pass: the tokens whose key equals the threshold
          break;
        }
        above += hist[b];
      }
    }
    __syncthreads();
    prefix = prefix_s;
    k_rem = k_rem_s;
    mask |= 255u << shift;
  }
  const unsigned threshold = prefix;
  const int need = int(k_rem), n_above = k - need;  // ties at the threshold to take, by lowest id

  // 4. Collect: above the threshold in any order, then the ties in id order. When every tie
  // belongs in the top (the usual case: one token holds the threshold value), they are collected
  // with the rest, with no scan in id order.
  const bool all_ties = ties_s == unsigned(need);
  for_logits(l, tid, vocab, threads, [&](int i, float x) {
    const unsigned key = order_key(x);
    if (key > threshold || (all_ties && key == threshold)) sel[atomicAdd(&n_sel, 1)] = {i, x};
  });
  if (all_ties && tid == 0) tie_cut_s = vocab;
  int taken = all_ties ? need : 0;
  for (int base = 0; base < vocab && taken < need; base += threads) {
    const int i = base + tid;
    const bool tie = i < vocab && order_key(l[i]) == threshold;
    int chunk_total;
    const int rank = block_inclusive_scan(int(tie), int_sums, chunk_total) - int(tie);
    if (tie && taken + rank < need) {
      sel[n_above + taken + rank] = {i, l[i]};
      if (taken + rank == need - 1) tie_cut_s = i;
    }
    taken += chunk_total;  // uniform: the loop condition stays uniform
  }
  __syncthreads();
  if (tid < k) {
    const entry e = sel[tid];
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += better(sel[j], e);
    top[rank].token = e.token;
    top[rank].logit = e.logit;
    if (rank == 0) max_s = e.logit;
  }
  __syncthreads();
  const float max = max_s;
  const int tie_cut = tie_cut_s;
  auto in_top = [&](int i, float x) {
    const unsigned key = order_key(x);
    return key > threshold || (key == threshold && i <= tie_cut);
  };

  // 5. Weights relative to the maximum, in double as the reference computes them. Warp w sums
  // the contiguous segment w of the vocabulary (lanes strided inside it), so that the tail draw
  // below can find the crossing segment from the segment sums and scan only that segment.
  constexpr int warps = threads / gpu::warp_size;
  const int lane = tid % gpu::warp_size, warp = tid / gpu::warp_size;
  const int seg_len = (vocab + warps - 1) / warps;
  const int seg0 = min(vocab, warp * seg_len), seg1 = min(vocab, seg0 + seg_len);
  double total = 0, tail = 0;
  int last_tail = -1;
  for_logits(l, seg0 + lane, seg1, gpu::warp_size, [&](int i, float x) {
    const double w = exp(double(x) - double(max));
    total += w;
    if (!in_top(i, x)) {
      tail += w;
      if (w != 0) last_tail = i;  // ascending within a thread
    }
  });
  total = gpu::warp_reduce_sum(total);
  tail = gpu::warp_reduce_sum(tail);
  if (lane == 0) {
    seg_total_s[warp] = total;
    seg_tail_s[warp] = tail;
  }
  if (last_tail >= 0) atomicMax(&last_tail_s, last_tail);
  __syncthreads();
  total = 0;
  tail = 0;
  for (int w = 0; w < warps; ++w) {  // a fixed order: every thread gets the same sums
    total += seg_total_s[w];
    tail += seg_tail_s[w];
  }

  const bool finite = isfinite(max);
  const float tail_mass = finite ? float(fmin(fmax(tail / total, 0.0), 1.0)) : 0.f;
  if (tid == 0) {
    hdr->log_normalizer = float(double(max) + log(total));
    hdr->tail_mass = tail_mass;
    if (tail_mass == 0.f) {  // else the draw below writes them (no barrier orders two writers)
      hdr->tail_token = -1;
      hdr->tail_logit = 0.f;
    }
    hdr->n_top = k;
    hdr->flags = flags_s | (finite ? 0 : candidates_flag_no_finite);
    hdr->reserved[0] = hdr->reserved[1] = 0;
  }
  if (tail_mass == 0.f) return;  // uniform

  // 6. The tail draw: the first id whose cumulative tail weight exceeds u * tail. The segments'
  // sums in order find the segment where the running sum crosses; the block then scans that
  // segment in chunks of threads * draw_items tokens in id order with block prefix sums.
  const double target = sp.tail_u * tail;
  double running = 0;
  int crossing = -1;
  for (int w = 0; w < warps; ++w) {
    if (seg_tail_s[w] > 0 && running + seg_tail_s[w] > target) {
      crossing = w;
      break;
    }
    running += seg_tail_s[w];
  }
  // Rounding left the target beyond the last segment (crossing < 0), or beyond the last token of
  // the crossing one (the loop ends without a pick): the last tail token with weight.
  const int c0 = crossing < 0 ? vocab : crossing * seg_len, c1 = crossing < 0 ? vocab : min(vocab, c0 + seg_len);
  for (int base = c0; base < c1; base += threads * draw_items) {
    const int first = base + tid * draw_items;
    double local = 0;
#pragma unroll
    for (int j = 0; j < draw_items; ++j) {
      const int i = first + j;
      if (i < c1 && !in_top(i, l[i])) local += exp(double(l[i]) - double(max));
    }
    double chunk_total;
    const double incl = block_inclusive_scan(local, dbl_sums, chunk_total);
    const double before = running + (incl - local), after = running + incl;
    // `before` of thread t+1 is not bit-equal to `after` of thread t in general, so crossing
    // is decided on `after` alone: the running sums are nondecreasing in thread order, so the
    // threads from the first crossing one on see after > target; the first has a count of 1.
    const bool crosses = after > target && local > 0;
    int n_crossing;
    const int n_cross = block_inclusive_scan(int(crosses), int_sums, n_crossing);
    if (crosses && n_cross == 1) {  // the first crossing thread in id order
      double r = target - before;
      int pick = -1;
      for (int j = 0; j < draw_items; ++j) {
        const int i = first + j;
        if (i >= c1 || in_top(i, l[i])) continue;
        const double w = exp(double(l[i]) - double(max));
        if (w == 0) continue;
        pick = i;
        r -= w;
        if (r < 0) break;
      }
      hdr->tail_token = pick;
      hdr->tail_logit = l[pick];
    }
    if (n_crossing > 0) return;  // uniform: the block's count
    running += chunk_total;
  }
  if (tid == 0) {
    hdr->tail_token = last_tail_s;
    hdr->tail_logit = l[last_tail_s];
  }
}

}  // namespace

hipError_t launch_candidates(const candidates_params& p, hipStream_t stream) {
  if (p.n_seqs == 0) return hipSuccess;
  if (p.n_seqs < 0 || p.n_seqs > 0x7fffffff || p.vocab < 1 || p.vocab > 0x7fffffff - threads * batch ||
      p.max_k < 1 || p.max_k > candidates_max_k || reinterpret_cast<std::uintptr_t>(p.out) % 8 != 0) {
    return hipErrorInvalidValue;
  }
  candidates_kernel<<<dim3(static_cast<unsigned>(p.n_seqs)), threads, 0, stream>>>(p);
  return hipGetLastError();
}

}  // namespace anvil::kernels

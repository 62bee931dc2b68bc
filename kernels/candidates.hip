// Logits → candidates (kernels/candidates.h) in four or five short kernels over slices of
// candidates_slice_len tokens, so that one sequence's 128k-256k logits keep many multiprocessors
// busy instead of one block walking the whole row several times:
//   1. prep, a block per sequence, only when some sequence has bias or penalty pairs: bias (one
//      thread, in list order: repeated ids add up exactly as the reference adds them), then
//      penalties (one thread per distinct id), both with unfused float arithmetic;
//   2. slice, a block per (sequence, slice): the mask (-inf outside it) and temperature, written back; the slice's top k in the
//      op's order (logit descending, id ascending) by a radix select on the order-preserving
//      32-bit key of the logit, in shared memory (4 histogram passes of 8 bits); its members
//      written in id order. The sequence's top k lies inside the union of its slices' top k;
//   3. merge, a block per sequence: the same radix select over that union; the tokens above the
//      threshold, then the ties at it by lowest id (the union is in id order), rank-sorted into
//      the record; threshold, last tie taken and maximum kept for the next two kernels;
//   4. weights, a block per (sequence, slice): total and tail weights exp(l - max) in double (the
//      reference's arithmetic), each slice's sums in a fixed order;
//   5. finish, a block per sequence: the slice sums added in id order give the log-normaliser and
//      the tail mass; the tail draw finds the slice where the running tail sum crosses u * tail
//      and scans it with block prefix sums, and the one thread whose range crosses scans its own
//      tokens; then, when the launch draws, the draw (kernels/draw.h) from the finished record.
// Only integer atomics are used (histograms, the unordered collection sorted afterwards, a maximum
// id) and every floating-point sum has a fixed order, so the result is deterministic.
#include <cfloat>

#include "kernels/candidates.h"
#include "kernels/draw.h"

namespace anvil::kernels {
namespace {

constexpr int threads = 1024;                               // per-sequence kernels
constexpr int slice_threads = 256;                          // per-slice kernels
constexpr int slice_len = int(candidates_slice_len);
constexpr int per_thread = slice_len / slice_threads;       // tokens per thread in a slice
constexpr int draw_items = slice_len / threads;             // consecutive tokens per thread in the tail draw
static_assert(per_thread == 16 && draw_items * threads == slice_len, "a slice is one chunk of the draw");
static_assert(candidates_max_slices <= threads, "the per-sequence kernels read a slice's sums a thread each");

// Order-preserving key: a > b as floats (with -0 == +0) iff key(a) > key(b) as unsigned.
__device__ __forceinline__ unsigned order_key(float x) {
  unsigned b = __float_as_uint(x);
  if ((b & 0x7fffffffu) == 0) b = 0;  // -0 ties with +0, as in the reference's comparison
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Inclusive prefix sum over a block of Threads threads (in id order); `total` gets the block's
// sum. `warp_sums` is shared scratch of at least Threads / 32 elements.
template <int Threads, class T>
__device__ T block_inclusive_scan(T v, T* warp_sums, T& total) {
  constexpr int ws = gpu::warp_size, warps = Threads / ws;
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


// A candidate (the record's entry type has default member initialisers, which __shared__
// variables cannot have).
struct entry {
  int token;
  float logit;
};
static_assert(sizeof(entry) == 8, "the workspace holds max_k entries of 8 bytes per slice");

__device__ __forceinline__ bool better(const entry& a, const entry& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

// The workspace (candidates_workspace): per (sequence, slice) its top entries and its sums, per
// sequence the selection the merge made.
struct slice_sums {
  double total;    // sum of exp(l - max) over the slice
  double tail;     // the same over the slice's tokens outside the top
  int last_tail;   // the slice's highest tail id with a nonzero weight, or -1
  int flags;       // candidates_flag_bad_logit when the slice holds a NaN or +inf
  int reserved[2];
};
static_assert(sizeof(slice_sums) == 32, "candidates_workspace reserves 32 bytes per slice");
struct selection_state {
  unsigned threshold;  // key of the K-th largest logit
  int tie_cut;         // the last token at the threshold that is in the top (tokens at it with ids <= this are)
  float max;           // the largest logit
  int flags;           // candidates_flag_* of the sequence's logits
};
static_assert(sizeof(selection_state) == 16, "candidates_workspace reserves 16 bytes per sequence");

// The workspace's sections and the record size, computed by the launcher.
struct workspace_view {
  entry* entries;
  slice_sums* sums;
  selection_state* states;
  int slices;
  std::size_t record_bytes;
};
workspace_view view(const candidates_params& p) {
  const candidates_workspace_layout w = candidates_workspace(p.n_seqs, p.vocab, p.max_k);
  auto* base = static_cast<unsigned char*>(p.workspace);
  return {reinterpret_cast<entry*>(base), reinterpret_cast<slice_sums*>(base + w.slices_at),
          reinterpret_cast<selection_state*>(base + w.states_at), int(candidates_slices(p.vocab)),
          candidates_record_bytes(p.max_k)};
}

__device__ __forceinline__ int seq_k(const candidates_seq& sp, const candidates_params& p) {
  return min(min(sp.top_k, p.max_k), int(p.vocab));
}

// Radix select over the block's items: thread t holds Per of them, key(j, out) giving the j-th
// one's order key (false: no item there). Finds the k-th largest key (1 <= k <= the number of
// items): `threshold`, and `need`, how many items equal to it belong in the top k; `ties` counts
// the items equal to it. Counts are added per run of equal bins: real logits share their top
// bits, so one bin takes nearly every item in the first passes, and an atomic per item would
// serialise on one shared-memory address.
struct radix_result {
  unsigned threshold;
  int need;
  unsigned ties;
};
template <int Threads, int Per, class Key>
__device__ radix_result radix_select(int k, Key&& key, unsigned* hist, unsigned* found) {
  unsigned prefix = 0, mask = 0, k_rem = unsigned(k), ties = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const int shift = 24 - 8 * pass;
    for (int b = int(threadIdx.x); b < 256; b += Threads) hist[b] = 0;
    __syncthreads();
    unsigned run_bin = 0, run_n = 0;
#pragma unroll
    for (int j = 0; j < Per; ++j) {
      unsigned kk;
      if (!key(j, kk) || (kk & mask) != prefix) continue;
      const unsigned bin = (kk >> shift) & 255u;
      if (bin != run_bin && run_n > 0) {
        atomicAdd(&hist[run_bin], run_n);
        run_n = 0;
      }
      run_bin = bin;
      ++run_n;
    }
    if (run_n > 0) atomicAdd(&hist[run_bin], run_n);
    __syncthreads();
    // The bin where the count from the top reaches k_rem, found by the first warp: lane l sums
    // its run of bins (highest first), a prefix sum over the lanes finds the lane where the count
    // crosses, and that lane walks its own bins.
    if (int(threadIdx.x) < gpu::warp_size) {
      constexpr int per_lane = 256 / gpu::warp_size;
      const int lane = int(threadIdx.x), hi = 255 - lane * per_lane;
      unsigned c[per_lane], own = 0;
#pragma unroll
      for (int i = 0; i < per_lane; ++i) {
        c[i] = hist[hi - i];
        own += c[i];
      }
      unsigned incl = own;
#pragma unroll
      for (int o = 1; o < gpu::warp_size; o <<= 1) {
        const unsigned n = gpu::shfl_up(incl, unsigned(o));
        if (lane >= o) incl += n;
      }
      if (incl - own < k_rem && k_rem <= incl) {  // exactly one lane: the counts are nondecreasing
        unsigned above = incl - own;
#pragma unroll
        for (int i = 0; i < per_lane; ++i) {
          if (above + c[i] >= k_rem) {
            found[0] = prefix | (unsigned(hi - i) << shift);
            found[1] = k_rem - above;
            found[2] = c[i];  // after the last pass: the items whose key equals the threshold
            break;
          }
          above += c[i];
        }
      }
    }
    __syncthreads();
    prefix = found[0];
    k_rem = found[1];
    ties = found[2];
    mask |= 255u << shift;
  }
  __syncthreads();  // `found` and `hist` may be reused
  return {prefix, int(k_rem), ties};
}
// gpu_worker::keep_finite on the device: a finite logit saturates at +-FLT_MAX instead of
// overflowing; -inf (and a NaN, which the slice kernel flags) pass through.
__device__ __forceinline__ float keep_finite(float before, float after) {
  return isfinite(before) ? fminf(fmaxf(after, -FLT_MAX), FLT_MAX) : after;
}

// 1. Bias, then penalties (one block per sequence).
__global__ void __launch_bounds__(threads) prep_kernel(candidates_params p) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  const candidates_seq sp = p.seqs[blockIdx.x];
  float* l = p.logits + std::int64_t(blockIdx.x) * p.vocab;
  if (threadIdx.x == 0) {
    for (int i = 0; i < sp.bias_count; ++i) {
      float& x = l[p.bias_ids[sp.bias_begin + i]];
      x = keep_finite(x, gpu::add_rn(x, p.bias_values[sp.bias_begin + i]));
    }
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < sp.counts_count; i += threads) {
    const int n = p.count_values[sp.counts_begin + i];
    if (n == 0) continue;
    float& x = l[p.count_ids[sp.counts_begin + i]];
    float y = x > 0 ? x / sp.repetition_penalty : gpu::mul_rn(x, sp.repetition_penalty);
    y = gpu::add_rn(y, -gpu::add_rn(sp.presence_penalty, gpu::mul_rn(sp.frequency_penalty, float(n))));
    x = keep_finite(x, y);
  }
}

// 2. Temperature and the slice's top k, written in id order (block (sequence, slice)).
__global__ void __launch_bounds__(slice_threads) slice_kernel(candidates_params p, workspace_view ws) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  __shared__ float v[slice_len];
  __shared__ unsigned hist[256], found[3];
  __shared__ int int_sums[32];
  __shared__ int flags_s;
  const int seq = int(blockIdx.x), slice = int(blockIdx.y), tid = int(threadIdx.x);
  const candidates_seq sp = p.seqs[seq];
  float* l = p.logits + std::int64_t(seq) * p.vocab;
  const int s0 = slice * slice_len, n = min(slice_len, int(p.vocab) - s0);
  const int k = min(seq_k(sp, p), n);
  if (tid == 0) flags_s = 0;

  float x[per_thread];
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    const int i = j * slice_threads + tid;
    x[j] = i < n ? l[s0 + i] : 0.f;
    // Constrained decoding: a token outside the mask is -inf from here on (every later kernel
    // reads the processed logits back from l).
    if (i < n && sp.mask_begin >= 0) {
      const int t = s0 + i;
      if (!((p.mask_words[sp.mask_begin + (t >> 5)] >> (t & 31)) & 1u)) {
        x[j] = -INFINITY;
        l[t] = x[j];
      }
    }
  }
  bool bad = false;
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    const int i = j * slice_threads + tid;
    if (i >= n) continue;
    if (sp.temperature >= gpu_worker::min_temperature) {
      x[j] = keep_finite(x[j], x[j] / sp.temperature);
      l[s0 + i] = x[j];
    }
    bad |= isnan(x[j]) || x[j] == INFINITY;
    v[i] = x[j];
  }
  __syncthreads();
  if (bad) atomicOr(&flags_s, candidates_flag_bad_logit);

  // Thread t owns the tokens [16 t, 16 t + 16) of the slice; the histogram passes visit them in a
  // rotated order, so that the 32 lanes of a warp read 32 different banks.
  const int own = tid * per_thread;
  const radix_result r = radix_select<slice_threads, per_thread>(
      k,
      [&](int j, unsigned& key) {
        const int i = own + ((j + (tid >> 1)) & (per_thread - 1));
        if (i >= n) return false;
        key = order_key(v[i]);
        return true;
      },
      hist, found);

  // The members in id order: above the threshold, and the first `need` ties.
  int my_ties = 0, my_above = 0;
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    const int i = own + j;
    if (i >= n) continue;
    const unsigned key = order_key(v[i]);
    my_ties += key == r.threshold;
    my_above += key > r.threshold;
  }
  int total;
  const int ties_before = block_inclusive_scan<slice_threads>(my_ties, int_sums, total) - my_ties;
  const int my_taken = min(my_ties, max(0, r.need - ties_before));
  const int my_members = my_above + my_taken;
  const int out_before = block_inclusive_scan<slice_threads>(my_members, int_sums, total) - my_members;
  entry* out = ws.entries + (std::int64_t(seq) * ws.slices + slice) * p.max_k;
  int at = out_before, tie_rank = ties_before;
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    const int i = own + j;
    if (i >= n) continue;
    const unsigned key = order_key(v[i]);
    const bool take = key > r.threshold || (key == r.threshold && tie_rank++ < r.need);
    if (take) out[at++] = {s0 + i, v[i]};
  }
  if (tid == 0) ws.sums[std::int64_t(seq) * ws.slices + slice].flags = flags_s;
}

// 3. The sequence's top k from its slices' (block per sequence).
constexpr int merge_per_thread = int(candidates_max_slices) * candidates_max_k / threads;

__global__ void __launch_bounds__(threads) merge_kernel(candidates_params p, workspace_view ws) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  __shared__ unsigned hist[256], found[3];
  __shared__ entry sel[candidates_max_k];
  __shared__ int int_sums[32];
  __shared__ int n_sel, tie_cut_s, flags_s;
  __shared__ float max_s;
  const int seq = int(blockIdx.x), tid = int(threadIdx.x);
  const candidates_seq sp = p.seqs[seq];
  const int k = seq_k(sp, p);
  // The slices' flags, a thread each, read while the selection runs (not one thread waiting on
  // each load in turn).
  const int slice_flags = tid < ws.slices ? ws.sums[std::int64_t(seq) * ws.slices + tid].flags : 0;
  // The union: slot m = (slice m / k, rank m % k); every slice but the last holds k members.
  const int slots = ws.slices * k;
  const entry* in = ws.entries + std::int64_t(seq) * ws.slices * p.max_k;
  const auto slot_entry = [&](int m, entry& e) {
    if (m >= slots) return false;
    const int s = m / k, r = m % k;
    if (r >= min(k, int(p.vocab) - s * slice_len)) return false;
    e = in[std::int64_t(s) * p.max_k + r];
    return true;
  };
  if (tid == 0) {
    n_sel = 0;
    tie_cut_s = -1;
    flags_s = 0;
  }
  // Thread t owns the slots [t * per, t * per + per): their keys stay in registers.
  const int per = (slots + threads - 1) / threads;
  unsigned keys[merge_per_thread];
  std::uint32_t valid = 0;
#pragma unroll
  for (int j = 0; j < merge_per_thread; ++j) {
    entry e;
    keys[j] = 0;
    if (j < per && slot_entry(tid * per + j, e)) {
      keys[j] = order_key(e.logit);
      valid |= 1u << j;
    }
  }
  const radix_result r = radix_select<threads, merge_per_thread>(
      k,
      [&](int j, unsigned& key) {
        key = keys[j];
        return ((valid >> j) & 1u) != 0;
      },
      hist, found);
  const int n_above = k - r.need;

  // Collect: above the threshold in any order. When the union holds exactly the ties needed, they
  // are all taken and collected with the rest; the last tie taken is then the one with the highest
  // id (a slice that left ties out holds all the ties needed, so none of the union's is later).
  // Otherwise the ties are taken by lowest id, scanning the union in id order.
  const bool all_ties = r.ties == unsigned(r.need);
#pragma unroll
  for (int j = 0; j < merge_per_thread; ++j) {
    if (((valid >> j) & 1u) == 0) continue;
    const bool tie = keys[j] == r.threshold;
    if (keys[j] > r.threshold || (all_ties && tie)) {
      entry e;
      slot_entry(tid * per + j, e);
      sel[atomicAdd(&n_sel, 1)] = e;
      if (tie) atomicMax(&tie_cut_s, e.token);
    }
  }
  int taken = all_ties ? r.need : 0;
  for (int base = 0; base < slots && taken < r.need; base += threads) {
    entry e{};
    const bool tie = slot_entry(base + tid, e) && order_key(e.logit) == r.threshold;
    int chunk_total;
    const int rank = block_inclusive_scan<threads>(int(tie), int_sums, chunk_total) - int(tie);
    if (tie && taken + rank < r.need) {
      sel[n_above + taken + rank] = e;
      if (taken + rank == r.need - 1) tie_cut_s = e.token;
    }
    taken += chunk_total;  // uniform: the loop condition stays uniform
  }
  if (slice_flags != 0) atomicOr(&flags_s, slice_flags);  // after the selection's barriers: flags_s is 0
  __syncthreads();

  unsigned char* rec = static_cast<unsigned char*>(p.out) + std::size_t(seq) * ws.record_bytes;
  auto* top = reinterpret_cast<candidates_record_entry*>(rec + sizeof(candidates_record_header));
  if (tid < k) {
    const entry e = sel[tid];
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += better(sel[j], e);
    top[rank].token = e.token;
    top[rank].logit = e.logit;
    if (rank == 0) max_s = e.logit;
  }
  __syncthreads();
  if (tid == 0) ws.states[seq] = {r.threshold, tie_cut_s, max_s, flags_s};
}

__device__ __forceinline__ bool in_top(const selection_state& st, int i, float x) {
  const unsigned key = order_key(x);
  return key > st.threshold || (key == st.threshold && i <= st.tie_cut);
}

// 4. Total and tail weights of a slice (block (sequence, slice)).
__global__ void __launch_bounds__(slice_threads) weights_kernel(candidates_params p, workspace_view ws) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  __shared__ double totals[slice_threads / 32], tails[slice_threads / 32];
  __shared__ int last_s;
  const int seq = int(blockIdx.x), slice = int(blockIdx.y), tid = int(threadIdx.x);
  const selection_state st = ws.states[seq];
  const float* l = p.logits + std::int64_t(seq) * p.vocab;
  const int s0 = slice * slice_len, n = min(slice_len, int(p.vocab) - s0);
  if (tid == 0) last_s = -1;
  float x[per_thread];
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    const int i = j * slice_threads + tid;
    x[j] = i < n ? l[s0 + i] : 0.f;
  }
  double total = 0, tail = 0;
  int last = -1;
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    const int i = j * slice_threads + tid;
    if (i >= n) continue;
    const double w = exp(double(x[j]) - double(st.max));
    total += w;
    if (!in_top(st, s0 + i, x[j])) {
      tail += w;
      if (w != 0) last = s0 + i;  // ascending within a thread
    }
  }
  constexpr int warps = slice_threads / gpu::warp_size;
  const int lane = tid % gpu::warp_size, warp = tid / gpu::warp_size;
  total = gpu::warp_reduce_sum(total);
  tail = gpu::warp_reduce_sum(tail);
  if (lane == 0) {
    totals[warp] = total;
    tails[warp] = tail;
  }
  __syncthreads();  // also orders last_s's initialisation before the atomics
  if (last >= 0) atomicMax(&last_s, last);
  __syncthreads();
  if (tid == 0) {
    double t = 0, u = 0;
    for (int w = 0; w < warps; ++w) {  // a fixed order
      t += totals[w];
      u += tails[w];
    }
    slice_sums& out = ws.sums[std::int64_t(seq) * ws.slices + slice];
    out.total = t;
    out.tail = u;
    out.last_tail = last_s;
  }
}

// 5. The record's header and the tail draw (block per sequence); finish_kernel runs it, then the
// draw (6).
__device__ void finish_record(const candidates_params& p, const workspace_view& ws) {
  __shared__ int int_sums[32];
  __shared__ double dbl_sums[32];
  __shared__ double total_s, tail_s, running_s;
  __shared__ int crossing_s, last_tail_s;
  // The slices' sums, loaded by a thread each, then read in id order by one thread from shared
  // memory (not waiting on each global load in turn).
  __shared__ slice_sums sums[candidates_max_slices];
  const int seq = int(blockIdx.x), tid = int(threadIdx.x), vocab = int(p.vocab);
  const selection_state st = ws.states[seq];
  const candidates_seq sp = p.seqs[seq];
  if (tid < ws.slices) sums[tid] = ws.sums[std::int64_t(seq) * ws.slices + tid];
  __syncthreads();
  const float* l = p.logits + std::int64_t(seq) * p.vocab;
  auto* hdr = reinterpret_cast<candidates_record_header*>(static_cast<unsigned char*>(p.out) +
                                                          std::size_t(seq) * ws.record_bytes);
  if (tid == 0) {
    double total = 0, tail = 0;
    int last = -1;
    for (int s = 0; s < ws.slices; ++s) {  // id order
      total += sums[s].total;
      tail += sums[s].tail;
      last = max(last, sums[s].last_tail);
    }
    total_s = total;
    tail_s = tail;
    last_tail_s = last;
  }
  __syncthreads();
  const double total = total_s, tail = tail_s;
  const float max = st.max;
  const bool finite = isfinite(max);
  const float tail_mass = finite ? float(fmin(fmax(tail / total, 0.0), 1.0)) : 0.f;
  if (tid == 0) {
    hdr->log_normalizer = float(fmin(double(max) + log(total), double(FLT_MAX)));  // as the reference rounds it
    hdr->tail_mass = tail_mass;
    if (tail_mass == 0.f) {  // else the draw below writes them (no barrier orders two writers)
      hdr->tail_token = -1;
      hdr->tail_logit = 0.f;
    }
    hdr->n_top = seq_k(sp, p);
    hdr->flags = st.flags | (finite ? 0 : candidates_flag_no_finite);
    hdr->drawn = -1;  // the draw kernel's, when it runs
    hdr->reserved = 0;
  }
  if (tail_mass == 0.f) return;  // uniform

  // The first id whose cumulative tail weight exceeds u * tail: the slices' sums in id order
  // find the slice where the running sum crosses; the block scans that slice in chunks of
  // threads * draw_items tokens in id order with block prefix sums.
  const double target = sp.tail_u * tail;
  if (tid == 0) {
    double running = 0;
    int crossing = -1;
    for (int s = 0; s < ws.slices; ++s) {
      if (sums[s].tail > 0 && running + sums[s].tail > target) {
        crossing = s;
        break;
      }
      running += sums[s].tail;
    }
    running_s = running;
    crossing_s = crossing;
  }
  __syncthreads();
  double running = running_s;
  const int crossing = crossing_s;
  // Rounding left the target beyond the last slice (crossing < 0), or beyond the last token of
  // the crossing one (the loop ends without a pick): the last tail token with weight.
  const int c0 = crossing < 0 ? vocab : crossing * slice_len, c1 = crossing < 0 ? vocab : min(vocab, c0 + slice_len);
  for (int base = c0; base < c1; base += threads * draw_items) {
    const int first = base + tid * draw_items;
    double local = 0;
#pragma unroll
    for (int j = 0; j < draw_items; ++j) {
      const int i = first + j;
      if (i < c1 && !in_top(st, i, l[i])) local += exp(double(l[i]) - double(max));
    }
    double chunk_total;
    const double incl = block_inclusive_scan<threads>(local, dbl_sums, chunk_total);
    const double before = running + (incl - local), after = running + incl;
    // `before` of thread t+1 is not bit-equal to `after` of thread t in general, so crossing
    // is decided on `after` alone: the running sums are nondecreasing in thread order, so the
    // threads from the first crossing one on see after > target; the first has a count of 1.
    const bool crosses = after > target && local > 0;
    int n_crossing;
    const int n_cross = block_inclusive_scan<threads>(int(crosses), int_sums, n_crossing);
    if (crosses && n_cross == 1) {  // the first crossing thread in id order
      double rem = target - before;
      int pick = -1;
      for (int j = 0; j < draw_items; ++j) {
        const int i = first + j;
        if (i >= c1 || in_top(st, i, l[i])) continue;
        const double w = exp(double(l[i]) - double(max));
        if (w == 0) continue;
        pick = i;
        rem -= w;
        if (rem < 0) break;
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

// 6. The draw (kernels/draw.h), in the finish kernel's block: the candidates' probabilities in
// parallel, then the cut and the pick on one thread, summing in index order as the host does.
__device__ void draw_record(const candidates_params& p, std::size_t record_bytes) {
  __shared__ double prob[candidates_max_k];
  const int seq = int(blockIdx.x), tid = int(threadIdx.x);
  const candidates_seq sp = p.seqs[seq];
  unsigned char* rec = static_cast<unsigned char*>(p.out) + std::size_t(seq) * record_bytes;
  auto* hdr = reinterpret_cast<candidates_record_header*>(rec);
  const auto* top = reinterpret_cast<const candidates_record_entry*>(rec + sizeof(candidates_record_header));
  const int k = hdr->n_top;
  if (sp.draw == 0 || hdr->flags != 0 || k < 1) return;  // drawn stays -1
  const double lse = double(hdr->log_normalizer);
  for (int i = tid; i < k; i += threads) prob[i] = exp(double(top[i].logit) - lse);
  __syncthreads();
  if (tid != 0) return;
  const double tail = hdr->tail_token >= 0 ? double(hdr->tail_mass) : 0.0;
  const draw_cut cut{.greedy = sp.draw == 1, .top_k = sp.draw_top_k, .top_p = sp.draw_top_p, .min_p = sp.draw_min_p};
  const int i = draw_pick(prob, k, tail, cut, sp.draw_u);
  hdr->drawn = i < k ? top[i].token : hdr->tail_token;
}

// The finish kernel: 5, then 6 when the launch draws.
__global__ void __launch_bounds__(threads) finish_kernel(candidates_params p, workspace_view ws) {
  gpu::dependency_wait();  // launched with gpu::launch_dependent
  gpu::allow_dependents();
  finish_record(p, ws);
  if (!p.draw) return;  // uniform
  __syncthreads();  // the header's writers (thread 0, the tail's crossing thread) before its reader
  draw_record(p, ws.record_bytes);
}

using gpu::aligned16;

}  // namespace

hipError_t launch_candidates(const candidates_params& p, hipStream_t stream) {
  if (p.n_seqs == 0) return hipSuccess;
  if (p.n_seqs < 0 || p.n_seqs > 0x7fffffff || p.vocab < 1 || p.vocab > candidates_max_vocab || p.max_k < 1 ||
      p.max_k > candidates_max_k || reinterpret_cast<std::uintptr_t>(p.out) % 8 != 0) {
    return hipErrorInvalidValue;
  }
  if (p.workspace == nullptr || !aligned16(p.workspace) ||
      p.workspace_bytes < candidates_workspace(p.n_seqs, p.vocab, p.max_k).bytes) {
    return hipErrorInvalidValue;
  }
  const unsigned seqs = static_cast<unsigned>(p.n_seqs), slices = static_cast<unsigned>(candidates_slices(p.vocab));
  const workspace_view ws = view(p);
  if (p.pairs) gpu::launch_dependent(prep_kernel, dim3(seqs), dim3(threads), stream, p);
  gpu::launch_dependent(slice_kernel, dim3(seqs, slices), dim3(slice_threads), stream, p, ws);
  gpu::launch_dependent(merge_kernel, dim3(seqs), dim3(threads), stream, p, ws);
  gpu::launch_dependent(weights_kernel, dim3(seqs, slices), dim3(slice_threads), stream, p, ws);
  gpu::launch_dependent(finish_kernel, dim3(seqs), dim3(threads), stream, p, ws);
  return hipGetLastError();
}

}  // namespace anvil::kernels

// GPU roofline benchmark: the matmul kernels against the limits of the device they run on, all
// measured in one run (DESIGN.md: performance is measured against physics).
//   limits:  device copy bandwidth (1 GiB device-to-device copy, bytes read + written / time)
//            dense f16 GEMM rate (vendor BLAS, 8192^3, f32 accumulate; none without a BLAS)
//   GEMV:    every weight type at batch 1 and 8 on 4096x4096, 14336x4096, 4096x14336 and
//            128256x4096 (out x in): weight bytes / time, and % of the copy bandwidth. The time
//            is launch_gemv's, the activation quantization kernel of the quantized types included.
//   dequantization to f16 (the GEMM path's first pass) on 4096x4096 and 14336x4096: bytes read
//            and written / time, and % of the copy bandwidth.
//   GEMM:    32 and 512 tokens on 4096x4096 and 14336x4096, dequantization included: TFLOP/s, and % of
//            the dense f16 rate.
//   quantized GEMM (tensor cores on the Q4_K / Q5_K / Q6_K blocks) against dequantize + vendor GEMM, and the
//            GEMV, at 1-128 tokens
//            on the 8B shapes: µs, each beside max(weight bytes at the copy bandwidth, products at
//            the f16 GEMM rate).
//   vendor GEMM int8 against f16 at 64-2048 tokens on the 8B shapes: the 8-bit tensor-core rate an
//            int8 weight path could reach, beside the f16 GEMM the path above feeds.
//   FP8 GEMM (kernels/gemm_fp8.h) at 64-2048 tokens on the 8B shapes: the path launch_gemm takes
//            from a Q4_K weight today, the f16 vendor GEMM alone (weights already f16), the FP8
//            vendor GEMM alone in each scaling and accumulation mode, and the FP8 path with x's
//            quantization; its error against the f16 GEMM (normalized mean square).
//   decode attention, one llama3-8b layer (32 query heads over 8 KV heads of 128), for each KV
//            cache element type (f16, int8, fp8: kernels/kv_quant.h) at the batch and context
//            sizes serving reaches, the tensor-core kernel (where there is one) beside the
//            CUDA-core kernel, each at the split a worker gives it: µs, KV bytes read / time, and
//            % of the copy bandwidth.
//   prefill attention, the same layer shape, chunks of 512-2048 tokens at the start of a prompt
//            and deep into one: µs, TFLOP/s (QK^T and PV of the causal mask), % of the f16 GEMM rate.
//   experts (--moe only): one layer's experts for a step of 1 to 512 tokens, GEMV and tensor-core GEMM (gpt-oss-20b:
//            MXFP4 2880 x 2880, 4 of 32 per token; qwen3-30b-a3b: Q4_K gate/up 768 x 2048 and Q6_K
//            down 2048 x 768, 8 of 128), on 8-bit activations as the worker runs them: µs, the
//            chosen experts' bytes / time, and % of the copy bandwidth.
//   delta rule (--delta-rule only): one Qwen3.5-9B DeltaNet layer's delta rule (16 key heads and 32
//            value heads of 128) over prompt chunks of 1-16 sequences, the chunked form on tensor
//            cores (where the device has them) beside the CUDA-core kernel, and the recurrent form
//            for decode steps; the convolution before it, token-parallel and a thread a channel:
//            µs, and tokens per µs.
//   gate/up + SwiGLU (--glu only): a dense feed-forward's gate and up GEMVs with the SwiGLU after
//            them (two launches) against the fused launch_gemv_glu, one token, on the widths of
//            0.5B-8B models: µs in graphs, the weights' time at the copy rate, and which the worker
//            takes.
//   small GEMV tiles (--small-gemv only): the batch-1 tile table on qwen2.5-0.5b's matrices (Q8_0,
//            Q4_0), rows of 896 and 4864.
//   8B GEMV tiles (--gemv-tiles-8b only): the same table on llama3-8b's matrices as a Q4_K_M file
//            holds them (Q4_K, Q6_K): the head, q or o, k or v, gate or up, down.
//   candidates (--candidates only): the logits -> candidates op of a decode step (greedy, 64
//            candidates) over 128k-262k vocabularies for 1-64 sequences: µs in graphs, beside one
//            read of the logits at the copy rate.
//   small attention (--small-attention only): decode attention for one sequence at contexts of
//            64-1024 on qwen2.5-0.5b's and llama3-8b's layers, f16 cache, each kernel at each split
//            length it takes: µs in graphs, beside the K and V rows' time at the copy rate.
//   layer chain (--layer-chain only): one llama3-8b Q4_K_M layer of a one-token step after its
//            q/k/v (decode attention, o, gate/up, SwiGLU, down, the next q/k/v) in graphs, with and
//            without the attention: µs, beside the layer's weights at the copy rate.
//   phase chain (--phase-chain only): a micro-benchmark (kernels/bench/phase_chain.h): qwen2.5-0.5b's
//            four projections a layer, 24 layers, int8 weights, as a launch per projection in a graph
//            against one persistent launch with a grid-wide barrier between projections (and without
//            it: the work alone), the launches with each warp's weights requested before the wait,
//            and the launches with no work: µs a token, beside the weights at the copy rate.
// Timing: device events around back-to-back launches, after warm-up, median of repetitions. The
// GEMV cycles through enough copies of the weight to exceed the L2 cache several times, as a
// model's layers do, so no figure comes from L2. Weights are random bytes (the kernels' speed
// does not depend on the values). A plain main: the GPU machine has none of the Debian libraries.
// Usage: gpu_roofline [--quick] [--quant-gemm] [--fp8-gemm] [--decode-attention] [--prefill-attention] [--moe]
//                     [--delta-rule] [--glu] [--small-gemv] [--gemv-tiles-8b] [--candidates] [--small-attention]
//                     [--layer-chain] [--phase-chain]
//                     [--attention-head-dim 128|256]
// (--quick: fewer repetitions, skips the 128256-row shape; --quant-gemm / --fp8-gemm: the limits
// and that GEMM table only; --decode-attention: the limits and the decode attention table only, at
// the loads of 256-sequence serving, the tensor-core kernel at each split length it takes;
// --prefill-attention: the limits and the prefill attention table only; --moe: the copy bandwidth and
// the experts table only; --attention-head-dim 256: the attention tables on gemma3-12b's layer,
// 16 heads over 8 KV heads of 256, instead of llama3-8b's)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/attention_decode.h"
#include "kernels/attention_prefill.h"
#include "kernels/bench/phase_chain.h"
#include "kernels/blas_runtime.h"
#include "kernels/candidates.h"
#include "kernels/delta_net.h"
#include "kernels/gemm.h"
#include "kernels/gemm_fp8.h"
#include "kernels/gemm_quant.h"
#include "kernels/gemv.h"
#include "kernels/gpu_runtime.h"
#include "kernels/moe.h"
#include "kernels/swiglu.h"
#include "model/quant/quant.h"

namespace {

using namespace anvil;
using model::ggml_type;

#define CHECK(expr)                                                                                    \
  do {                                                                                                 \
    const hipError_t e_ = (expr);                                                                      \
    if (e_ != hipSuccess) {                                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, hipGetErrorString(e_));       \
      std::exit(1);                                                                                    \
    }                                                                                                  \
  } while (0)

struct device_mem {
  void* p = nullptr;
  std::size_t n = 0;
  explicit device_mem(std::size_t bytes) : n(bytes) { CHECK(hipMalloc(&p, bytes)); }
  ~device_mem() { (void)hipFree(p); }
  device_mem(const device_mem&) = delete;
  device_mem& operator=(const device_mem&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Copies of one weight of `bytes` laid out through `pool`: enough of them to exceed L2 four times
// (as many as fit), call i reading copy i % count, as a model's layers do, so no figure comes from
// L2. batch() is the number of back-to-back calls to time.
struct weight_copies {
  const char* base;
  std::size_t bytes, stride;
  int count;
  weight_copies(const device_mem& pool, std::size_t l2, std::size_t weight_bytes)
      : base(pool.as<char>()),
        bytes(weight_bytes),
        stride((weight_bytes + 255) / 256 * 256),
        count(int(std::max<std::size_t>(1, std::min(pool.n / stride, (4 * l2 + bytes - 1) / bytes)))) {}
  const void* at(int i) const { return base + std::size_t(i % count) * stride; }
  int batch() const { return std::max(count, 8); }
};

// Random bytes (xorshift), uploaded in 64 MiB pieces.
void fill_random(void* dst, std::size_t bytes, std::uint64_t seed) {
  std::vector<std::uint64_t> host(std::size_t(8) << 20);
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t off = 0; off < bytes; off += host.size() * 8) {
    for (auto& v : host) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      v = s;
    }
    const std::size_t n = std::min(bytes - off, host.size() * 8);
    CHECK(hipMemcpy(static_cast<char*>(dst) + off, host.data(), n, hipMemcpyHostToDevice));
  }
}

// f16 values uniform in [-1, 1] (for the matrix-rate limit: real numbers, not NaN patterns).
void fill_f16(void* dst, std::size_t elems, unsigned seed) {
  std::vector<std::uint16_t> host(elems);
  std::uint32_t s = seed * 2654435761u + 1;
  for (auto& v : host) {
    s = s * 1664525u + 1013904223u;
    v = model::f32_to_f16(float(s >> 8) / float(1u << 23) - 1.f);
  }
  CHECK(hipMemcpy(dst, host.data(), elems * 2, hipMemcpyHostToDevice));
}

// Median over `reps` runs of `run` (which enqueues `batch` calls on `st`) of its device time, per
// call, in ms.
double median_ms(const std::function<void()>& run, hipStream_t st, int batch, int reps) {
  hipEvent_t a, b;
  CHECK(hipEventCreate(&a));
  CHECK(hipEventCreate(&b));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CHECK(hipEventRecord(a, st));
    run();
    CHECK(hipEventRecord(b, st));
    CHECK(hipEventSynchronize(b));
    float ms = 0;
    CHECK(hipEventElapsedTime(&ms, a, b));
    t.push_back(double(ms) / batch);
  }
  CHECK(hipEventDestroy(a));
  CHECK(hipEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median time of one call, in ms: `reps` repetitions of `batch` back-to-back calls.
double time_ms(const std::function<void(int)>& call, int batch, int reps) {
  const auto run = [&] {
    for (int i = 0; i < batch; ++i) call(i);
  };
  run();  // warm-up
  CHECK(hipDeviceSynchronize());
  return median_ms(run, nullptr, batch, reps);
}

// As time_ms, with the `batch` calls captured once into a graph on a stream of its own and the
// graph replayed: device time without the host's launch cost, as the worker's decode graphs run.
double time_graph_ms(const std::function<void(int, hipStream_t)>& call, int batch, int reps) {
  hipStream_t st = nullptr;
  CHECK(hipStreamCreateWithFlags(&st, hipStreamNonBlocking));
  call(0, st);  // first calls (one-time kernel attributes) outside the capture
  CHECK(hipStreamSynchronize(st));
  hipGraph_t graph = nullptr;
  hipGraphExec_t exec = nullptr;
  CHECK(hipStreamBeginCapture(st, hipStreamCaptureModeThreadLocal));
  for (int i = 0; i < batch; ++i) call(i, st);
  CHECK(hipStreamEndCapture(st, &graph));
  CHECK(hipGraphInstantiateWithFlags(&exec, graph, 0));
  const auto run = [&] { CHECK(hipGraphLaunch(exec, st)); };
  run();  // warm-up
  const double ms = median_ms(run, st, batch, reps);
  CHECK(hipGraphExecDestroy(exec));
  CHECK(hipGraphDestroy(graph));
  CHECK(hipStreamDestroy(st));
  return ms;
}

struct shape {
  std::int64_t out, in;
};

// The vendor GEMM on the default stream, column-major C[m, n] = A^T B (A [k, m], B [k, n]): f16
// in, f32 out (int8 in, int32 out with `int8`). A failure ends the benchmark.
void vendor_gemm(blas::handle_t h, const device_mem& ws, bool int8, int m, int n, int k, const void* a, const void* b,
                 void* c) {
  const blas::status_t s =
      blas::bind(h, nullptr, ws.p, ws.n) != blas::ok ? blas::not_supported
      : int8 ? blas::gemm_i8(h, m, n, k, a, k, b, k, c, m)
             : blas::gemm(h, true, false, m, n, k, 1.f, a, blas::dtype::f16, k, b, blas::dtype::f16, k, 0.f, c,
                          blas::dtype::f32, m);
  if (s != blas::ok) {
    std::fprintf(stderr, "cuBLAS %s GEMM %dx%dx%d failed\n", int8 ? "int8" : "f16", m, n, k);
    std::exit(1);
  }
}

// The attention tables' layer: llama3-8b's 32 heads over 8 KV heads of 128 in blocks of 16, or
// with --attention-head-dim 256 gemma3-12b's 16 over 8 of 256.
struct attention_layer {
  std::int64_t kv_heads = 8, head_dim = 128, heads = 32, block = 16;
};
attention_layer att;

// Block tables for n_blocks blocks, spread over the pool in a shuffled order as the KV manager
// leaves them (a permutation: 7919 is a prime), on the device.
struct bench_tables {
  device_mem d;
  explicit bench_tables(std::int64_t n_blocks) : d(std::size_t(n_blocks) * 4) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(n_blocks));
    for (std::int64_t i = 0; i < n_blocks; ++i) t[std::size_t(i)] = std::int32_t((i * 7919) % n_blocks);
    CHECK(hipMemcpy(d.p, t.data(), d.n, hipMemcpyHostToDevice));
  }
};

// A KV cache of one layer in element type t: small finite values in every type, zero scales.
struct bench_cache {
  device_mem k, v, ks, vs;
  kernels::paged_kv_device view;
  bench_cache(kernels::kv_dtype t, std::int64_t n_blocks)
      : k(std::size_t(n_blocks * att.block * att.kv_heads * att.head_dim * kernels::kv_elem_bytes_device(t))),
        v(k.n),
        ks(std::size_t(n_blocks * att.block * att.kv_heads) * 4),
        vs(ks.n) {
    CHECK(hipMemset(k.p, 0x11, k.n));
    CHECK(hipMemset(v.p, 0x11, v.n));
    CHECK(hipMemset(ks.p, 0, ks.n));
    CHECK(hipMemset(vs.p, 0, vs.n));
    view = {.k = k.p,
            .v = v.p,
            .n_blocks = n_blocks,
            .block_size = att.block,
            .n_kv_heads = att.kv_heads,
            .head_dim = att.head_dim,
            .dtype = t,
            .k_scales = ks.as<float>(),
            .v_scales = vs.as<float>()};
  }
};

// One sequence of `ctx` positions in an f16 cache of the layer `att` describes (its query zero),
// and decode attention over it at a split length, with a workspace of its own.
struct one_sequence {
  std::int64_t ctx, per_seq;
  bench_tables tables;
  device_mem len, q, out;
  bench_cache cache;
  explicit one_sequence(std::int64_t context)
      : ctx(context),
        per_seq((context + att.block - 1) / att.block),
        tables(per_seq),
        len(4),
        q(std::size_t(att.heads * att.head_dim) * 4),
        out(q.n),
        cache(kernels::kv_dtype::f16, per_seq) {
    const std::int32_t n = std::int32_t(ctx);
    CHECK(hipMemcpy(len.p, &n, 4, hipMemcpyHostToDevice));
    CHECK(hipMemset(q.p, 0, q.n));
  }
  std::size_t workspace_bytes(std::int64_t split) const {
    return std::max<std::size_t>(kernels::attention_decode_workspace_bytes(1, att.heads, att.head_dim, ctx, split), 16);
  }
  kernels::attention_decode_params params(std::int64_t split, float scale, bool cuda_cores, const device_mem& ws) const {
    return {.q = q.as<float>(),
            .out = out.as<float>(),
            .cache = cache.view,
            .n_heads = att.heads,
            .block_tables = tables.d.as<std::int32_t>(),
            .block_table_stride = per_seq,
            .context_lens = len.as<std::int32_t>(),
            .n_seqs = 1,
            .max_context = ctx,
            .scale = scale,
            .split = split,
            .workspace = ws.p,
            .workspace_bytes = ws.n,
            .cuda_cores_only = cuda_cores};
  }
};

// ---- the FP8 GEMM (kernels/gemm_fp8.h) at the step sizes of prefill and heavy decode ----
struct fp8_table_args {
  double copy_gbs, gemm_tflops;
  std::size_t l2;
  int reps;
  blas::handle_t handle;
  const device_mem* blas_ws;
  const device_mem* pool;  // random bytes: the Q4_K weights of today's path
  const float* x;          // >= 2048 x 14336 activations
  float* y;                // >= 2048 x 14336 outputs
};

// Normalized mean square difference of b against a (n floats on the device).
double nmse(const float* a, const float* b, std::size_t n) {
  std::vector<float> ha(n), hb(n);
  CHECK(hipMemcpy(ha.data(), a, n * 4, hipMemcpyDeviceToHost));
  CHECK(hipMemcpy(hb.data(), b, n * 4, hipMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    num += (double(ha[i]) - hb[i]) * (double(ha[i]) - hb[i]);
    den += double(ha[i]) * ha[i];
  }
  return den > 0 ? num / den : 0;
}

void fp8_gemm_table(const fp8_table_args& a) {
  std::printf("\nFP8 GEMM (cuBLASLt, E4M3, one scale per matrix) against the f16 GEMM and today's Q4_K path, us; limit: "
              "products at the f16 rate %.0f TFLOP/s (FP8's ideal: half that time)\n",
              a.gemm_tflops);
  std::printf("(6144x4096 and 28672x4096: q/k/v and gate/up as one matrix each; x quant: both quantization kernels,\n"
              " x encode: the second alone, as when a producer writes the row maxima)\n");
  std::printf("%-13s %6s | %8s | %9s | %9s %7s | %9s %9s | %9s %7s | %8s %8s | %7s %8s\n", "out x in", "tokens", "f16 lim",
              "q4k path", "f16 blas", "TFLOP/s", "fp8 blas", "fast acc", "fp8 path", "TFLOP/s", "nmse", "fast",
              "x quant", "x encode");
  blas::lt_gemm lt;
  if (lt.create() != blas::ok) {
    std::printf("cuBLASLt handle could not be created\n");
    return;
  }
  constexpr std::int64_t max_tokens = 2048;
  device_mem ws(kernels::gemm_fp8_workspace_bytes(14336, max_tokens));
  device_mem y16(std::size_t(max_tokens) * 28672 * 4);  // the widest shape's f16 reference
  const kernels::gemm_fp8_context ctx{.blas = &lt,
                                      .workspace = ws.p,
                                      .workspace_bytes = ws.n,
                                      .blas_workspace = a.blas_ws->p,
                                      .blas_workspace_bytes = a.blas_ws->n};
  for (shape s : {shape{4096, 4096}, shape{1024, 4096}, shape{6144, 4096}, shape{14336, 4096}, shape{28672, 4096},
                  shape{4096, 14336}}) {
    const int m = int(s.out), k = int(s.in);
    const std::size_t elems = std::size_t(m) * std::size_t(k);
    // Copies of the f16 weight and of its 8-bit copy, enough to exceed L2 four times, as for the GEMV.
    const std::size_t f16_bytes = elems * 2, fp8_bytes = (kernels::fp8_matrix_bytes(k, m) + 255) / 256 * 256;
    const int n16 = int(std::max<std::size_t>(1, (4 * a.l2 + f16_bytes - 1) / f16_bytes));
    const int n8 = int(std::max<std::size_t>(1, (4 * a.l2 + fp8_bytes - 1) / fp8_bytes));
    device_mem w16(f16_bytes * std::size_t(n16)), w8(fp8_bytes * std::size_t(n8)), scratch(256);
    fill_f16(w16.p, elems, 11);
    CHECK(kernels::launch_make_fp8_matrix(ggml_type::F16, w16.p, k, m, scratch.p, 0, w8.p, nullptr));
    for (int i = 1; i < n16; ++i) CHECK(hipMemcpy(w16.as<char>() + i * f16_bytes, w16.p, f16_bytes, hipMemcpyDeviceToDevice));
    for (int i = 1; i < n8; ++i) CHECK(hipMemcpy(w8.as<char>() + i * fp8_bytes, w8.p, fp8_bytes, hipMemcpyDeviceToDevice));
    const auto fp8_at = [&](int i) { return kernels::fp8_matrix_at(w8.as<char>() + std::size_t(i % n8) * fp8_bytes, k, m); };
    const std::size_t q4_bytes = *model::row_bytes(ggml_type::Q4_K, k) * std::size_t(m);
    const weight_copies q4(*a.pool, a.l2, q4_bytes);
    for (const std::int64_t nt : {8, 16, 32, 64, 128, 256, 512, 1024, 2048}) {
      const int n = int(nt);
      device_mem gws(std::max<std::size_t>(kernels::gemm_workspace_bytes(kernels::gemm_algo::quantized, ggml_type::Q4_K, k, m, nt), 256));
      const kernels::gemm_context gctx{kernels::gemm_algo::quantized, gws.p, gws.n, a.handle, a.blas_ws->p, a.blas_ws->n};
      const double q4_us = 1e3 * time_graph_ms(
                                     [&](int i, hipStream_t st) {
                                       CHECK(kernels::launch_gemm({.w = q4.at(i),
                                                                   .w_type = ggml_type::Q4_K,
                                                                   .in = k,
                                                                   .out = m,
                                                                   .bias = nullptr,
                                                                   .x = a.x,
                                                                   .y = a.y,
                                                                   .n_tokens = nt},
                                                                  gctx, st));
                                     },
                                     q4.batch(), a.reps);
      // f16 vendor GEMM alone: x as f16 (the first n x k halves of the weight copies serve).
      const void* x16 = w16.as<char>();
      const double f16_us = 1e3 * time_graph_ms(
                                      [&](int i, hipStream_t st) {
                                        const void* w = w16.as<char>() + std::size_t(i % n16) * f16_bytes;
                                        if (blas::bind(a.handle, st, a.blas_ws->p, a.blas_ws->n) != blas::ok ||
                                            blas::gemm(a.handle, true, false, m, n, k, 1.f, w, blas::dtype::f16, k, x16,
                                                       blas::dtype::f16, k, 0.f, a.y, blas::dtype::f32, m) != blas::ok) {
                                          std::fprintf(stderr, "f16 GEMM failed\n");
                                          std::exit(1);
                                        }
                                      },
                                      std::max(n16, 8), a.reps);
      // The FP8 GEMM alone, on x's codes as the path leaves them in its workspace.
      const auto* xc = ws.as<std::uint8_t>();
      auto* xs = reinterpret_cast<float*>(ws.as<char>() + (std::size_t(k) * std::size_t(n) + 255) / 256 * 256);
      CHECK(kernels::launch_quantize_fp8(a.x, nt, k, ws.as<std::uint8_t>(), xs, xs + 64, nullptr));
      const auto lt_us = [&](bool fast) {
        const auto call = [&](int i, hipStream_t st) {
          const kernels::fp8_matrix w = fp8_at(i);
          return lt.run(m, n, k, w.codes, w.scale, xc, xs, a.y, fast, a.blas_ws->p,
                        a.blas_ws->n, st);
        };
        if (call(0, nullptr) != blas::ok) return -1.0;  // refused: printed as a negative time
        return 1e3 * time_graph_ms([&](int i, hipStream_t st) { CHECK(call(i, st) == blas::ok ? hipSuccess : hipErrorNotSupported); },
                                   std::max(n8, 8), a.reps);
      };
      const double lt_plain_us = lt_us(false), lt_fast_us = lt_us(true);
      double path_us = -1, err = -1, err_fast = -1;
      if (lt_plain_us > 0) {
        path_us = 1e3 * time_graph_ms(
                            [&](int i, hipStream_t st) {
                              const kernels::fp8_matrix w = fp8_at(i);
                              const kernels::gemm_fp8_projection pr{.w = &w, .bias = nullptr, .y = a.y};
                              CHECK(kernels::launch_gemm_fp8_group(std::span(&pr, 1), a.x, nt, ctx, st));
                            },
                            std::max(n8, 8), a.reps);
        // Error against the f16 GEMM of the same weight and x (both given x16's values).
        device_mem xf(std::size_t(n) * k * 4);
        {
          std::vector<std::uint16_t> h16(std::size_t(n) * k);
          CHECK(hipMemcpy(h16.data(), x16, h16.size() * 2, hipMemcpyDeviceToHost));
          std::vector<float> hf(h16.size());
          for (std::size_t i = 0; i < hf.size(); ++i) hf[i] = model::f16_to_f32(h16[i]);
          CHECK(hipMemcpy(xf.p, hf.data(), hf.size() * 4, hipMemcpyHostToDevice));
        }
        if (blas::bind(a.handle, nullptr, a.blas_ws->p, a.blas_ws->n) != blas::ok ||
            blas::gemm(a.handle, true, false, m, n, k, 1.f, w16.p, blas::dtype::f16, k, x16, blas::dtype::f16, k, 0.f,
                       y16.p, blas::dtype::f32, m) != blas::ok) {
          std::exit(1);
        }
        CHECK(kernels::launch_quantize_fp8(xf.as<float>(), nt, k, ws.as<std::uint8_t>(), xs, xs + 64, nullptr));
        const kernels::fp8_matrix w0 = fp8_at(0);
        for (const bool fast : {false, true}) {
          if (lt.run(m, n, k, w0.codes, w0.scale, xc, xs, a.y, fast, a.blas_ws->p,
                     a.blas_ws->n, nullptr) != blas::ok) {
            continue;
          }
          CHECK(hipDeviceSynchronize());
          (fast ? err_fast : err) = nmse(y16.as<float>(), a.y, std::size_t(n) * std::size_t(m));
        }
      }
      // x's quantization alone: both kernels, and the encoding from row maxima already written.
      const double quant_us = 1e3 * time_graph_ms(
                                        [&](int, hipStream_t st) {
                                          CHECK(kernels::launch_quantize_fp8(a.x, nt, k, ws.as<std::uint8_t>(), xs,
                                                                             xs + 64, st));
                                        },
                                        8, a.reps);
      const double encode_us = 1e3 * time_graph_ms(
                                         [&](int, hipStream_t st) {
                                           CHECK(kernels::launch_encode_fp8(a.x, nt, k, xs + 64, ws.as<std::uint8_t>(),
                                                                            xs, st));
                                         },
                                         8, a.reps);
      const double flop = 2.0 * double(nt) * double(m) * double(k);
      const double lim_us = a.gemm_tflops > 0 ? flop / (a.gemm_tflops * 1e12) * 1e6 : 0.0;
      char dims[32];
      std::snprintf(dims, sizeof dims, "%dx%d", m, k);
      std::printf("%-13s %6d | %8.1f | %9.1f | %9.1f %7.1f | %9.1f %9.1f | %9.1f %7.1f | %8.1e %8.1e | %7.1f %8.1f\n", dims,
                  n, lim_us, q4_us, f16_us, flop / (f16_us * 1e-6) / 1e12, lt_plain_us, lt_fast_us, path_us,
                  path_us > 0 ? flop / (path_us * 1e-6) / 1e12 : 0.0, err, err_fast, quant_us, encode_us);
    }
  }
}

// One layer's experts at decode: tokens x k pairs, pair p routed to expert p % n_expert (every
// pair its own expert while there are enough: the most bytes a step of that size reads), grouped
// as launch_moe_route groups them; gate and up as one launch, then down, on 8-bit rows. The stacked
// weights cycle through copies so the chosen experts come from memory, not L2.
void moe_table(double copy_gbs, std::size_t l2, int reps) {
  struct moe_shape {
    const char* name;
    ggml_type gate_type, down_type;
    std::int64_t n_expert, k, embd, ff;
  };
  const moe_shape shapes[] = {{"gpt-oss-20b", ggml_type::MXFP4, ggml_type::MXFP4, 32, 4, 2880, 2880},
                              {"qwen3-30b-a3b", ggml_type::Q4_K, ggml_type::Q6_K, 128, 8, 2048, 768}};
  std::printf("\nExperts of one layer, a step of `tokens`; limit: copy bandwidth %.0f GB/s. gemv: launch_moe_matmul on\n"
              "8-bit rows; gemm: launch_gemm_quant_experts (tensor cores, f32 rows converted in the launch; the types it\n"
              "takes); * the path run_experts takes\n",
              copy_gbs);
  std::printf("%-14s %-7s %6s %5s | %9s %9s %6s | %9s %9s %6s\n", "model", "type", "tokens", "proj", "gemv us", "GB/s", "%copy",
              "gemm us", "GB/s", "%copy");
  for (const moe_shape& sh : shapes) {
    for (const std::int64_t tokens : {std::int64_t(1), std::int64_t(4), std::int64_t(8), std::int64_t(16), std::int64_t(64),
                                      std::int64_t(512)}) {
      const std::int64_t pairs = tokens * sh.k;
      std::vector<std::int32_t> expert_of(static_cast<std::size_t>(pairs)), offsets(static_cast<std::size_t>(sh.n_expert + 1), 0),
          sorted, active = {0};
      for (std::int64_t p = 0; p < pairs; ++p) expert_of[std::size_t(p)] = std::int32_t(p % sh.n_expert);
      for (std::int64_t e = 0; e < sh.n_expert; ++e) {
        offsets[std::size_t(e)] = std::int32_t(sorted.size());
        for (std::int64_t p = 0; p < pairs; ++p) {
          if (expert_of[std::size_t(p)] == e) sorted.push_back(std::int32_t(p));
        }
        if (std::int64_t(sorted.size()) > offsets[std::size_t(e)]) active.push_back(std::int32_t(e));
      }
      offsets[std::size_t(sh.n_expert)] = std::int32_t(sorted.size());
      active[0] = std::int32_t(active.size() - 1);
      const std::int64_t used = active[0];
      device_mem d_off(offsets.size() * 4), d_sorted(sorted.size() * 4), d_active(active.size() * 4);
      CHECK(hipMemcpy(d_off.p, offsets.data(), offsets.size() * 4, hipMemcpyHostToDevice));
      CHECK(hipMemcpy(d_sorted.p, sorted.data(), sorted.size() * 4, hipMemcpyHostToDevice));
      CHECK(hipMemcpy(d_active.p, active.data(), active.size() * 4, hipMemcpyHostToDevice));
      for (const bool down : {false, true}) {
        const ggml_type t = down ? sh.down_type : sh.gate_type;
        const std::int64_t in = down ? sh.ff : sh.embd, out = down ? sh.embd : sh.ff, rows = down ? pairs : tokens;
        const std::size_t stride = *model::row_bytes(t, in) * std::size_t(out);
        const int mats = down ? 1 : 2;
        // The experts a step reads sit in the first `used` slots of each stack: only those are copied.
        const std::size_t touched = stride * std::size_t(used) * std::size_t(mats);
        device_mem pool(std::max<std::size_t>(4 * l2, 2 * touched) + 4096);
        fill_random(pool.p, pool.n, 11);
        const weight_copies copies(pool, l2, touched);
        device_mem xq(std::size_t(rows * in)), ds(std::size_t(rows * in / 16) * 8), y(std::size_t(pairs * out) * 8);
        CHECK(hipMemset(xq.p, 1, xq.n));
        {
          std::vector<float> h(std::size_t(rows * in / 8), 0.01f);
          CHECK(hipMemcpy(ds.p, h.data(), h.size() * 4, hipMemcpyHostToDevice));
        }
        // Both paths take the same parameters but for x: 8-bit rows for the GEMV, f32 rows for the GEMM.
        const auto params = [&](int i) {
          const char* w = static_cast<const char*>(copies.at(i));
          return kernels::moe_matmul_params{.w = {w, w + stride * std::size_t(used)},
                                            .y = {y.as<float>(), y.as<float>() + pairs * out},
                                            .n_mats = mats,
                                            .w_type = t,
                                            .in = in,
                                            .out = out,
                                            .stride = stride,
                                            .x = reinterpret_cast<const float*>(xq.p),
                                            .x_div = down ? 1 : sh.k,
                                            .xq = xq.as<std::int8_t>(),
                                            .x_scales = ds.as<float>(),
                                            .n_pairs = pairs,
                                            .n_expert = sh.n_expert,
                                            .max_expert_pairs = tokens,  // as the worker says
                                            .offsets = d_off.as<std::int32_t>(),
                                            .sorted = d_sorted.as<std::int32_t>(),
                                            .active = d_active.as<std::int32_t>()};
        };
        const double ms =
            time_ms([&](int i) { CHECK(kernels::launch_moe_matmul(params(i), nullptr)); }, copies.batch(), reps);
        const double gbs = double(touched) / (ms * 1e-3) / 1e9;
        double gemm_ms = 0;
        const bool gemm = kernels::gemm_quant_experts_supported(t, in, out, stride);
        if (gemm) {
          device_mem xf(std::size_t(rows * in) * 4), ws(kernels::gemm_quant_experts_workspace_bytes(in, rows));
          CHECK(hipMemset(xf.p, 0, xf.n));
          gemm_ms = time_ms(
              [&](int i) {
                kernels::moe_matmul_params p = params(i);
                p.x = xf.as<float>();
                p.xq = nullptr;
                p.x_scales = nullptr;
                CHECK(kernels::launch_gemm_quant_experts(p, ws.p, ws.n, nullptr));
              },
              copies.batch(), reps);
        }
        const double gemm_gbs = gemm ? double(touched) / (gemm_ms * 1e-3) / 1e9 : 0;
        const bool by_gemm = gemm && kernels::gemm_quant_experts_preferred(t, pairs, sh.n_expert, in, out);
        std::printf("%-14s %-7s %6lld %5s | %8.1f%s %9.0f %5.1f%% | %8.1f%s %9.0f %5.1f%%\n", sh.name,
                    std::string(model::info(t).name).c_str(), static_cast<long long>(tokens), down ? "down" : "g+u",
                    ms * 1e3, by_gemm ? " " : "*", gbs, 100 * gbs / copy_gbs, gemm_ms * 1e3, by_gemm ? "*" : " ", gemm_gbs,
                    100 * gemm_gbs / copy_gbs);
      }
    }
  }
}

// GEMV batch-1 tiles: rows per warp x slices in flight per lane, the activations already in 8 bits
// in the workspace (as the worker's fused norms leave them), against the tile the table picks.
void gemv_tile_table(double copy_gbs, std::size_t l2, int reps, const std::vector<shape>& shapes,
                     const std::vector<ggml_type>& types) {
  std::size_t max_bytes = 0, gemv_ws_bytes = 256;
  std::int64_t max_in = 0, max_out = 0;
  for (ggml_type t : types) {
    for (shape s : shapes) {
      if (s.in % model::info(t).block_elems != 0) continue;
      max_bytes = std::max(max_bytes, *model::row_bytes(t, s.in) * std::size_t(s.out));
      gemv_ws_bytes = std::max(gemv_ws_bytes, kernels::gemv_workspace_bytes(t, s.in, 1));
      max_in = std::max(max_in, s.in), max_out = std::max(max_out, s.out);
    }
  }
  device_mem pool(std::max(max_bytes, 4 * l2) + 4096);
  fill_random(pool.p, pool.n, 7);
  device_mem x(std::size_t(max_in) * 4), y(std::size_t(max_out) * 4), gemv_ws(gemv_ws_bytes);
  CHECK(hipMemset(x.p, 0, x.n));
  std::printf("\nGEMV batch 1, 8-bit activations prepared, by tile (rows/warp x slices/lane): %% of copy\n");
  const int tiles[][2] = {{1, 1}, {1, 2}, {1, 4}, {2, 1}, {2, 2}, {2, 4}, {4, 1}, {4, 2}};
  std::printf("%-6s %-13s", "type", "out x in");
  for (const auto& tile : tiles) std::printf("   %dx%d", tile[0], tile[1]);
  std::printf("  | table\n");
  for (ggml_type t : types) {
    for (shape s : shapes) {
      if (s.in % model::info(t).block_elems != 0) continue;
      const std::size_t bytes = *model::row_bytes(t, s.in) * std::size_t(s.out);
      const weight_copies copies(pool, l2, bytes);
      const auto params = [&](const void* w) {
        return kernels::matmul_params{
            .w = w, .w_type = t, .in = s.in, .out = s.out, .x = x.as<float>(), .y = y.as<float>(), .n_tokens = 1};
      };
      // Leaves x in 8 bits in the workspace for the timed launches.
      CHECK(kernels::launch_gemv(params(pool.p), gemv_ws.p, gemv_ws.n, nullptr));
      auto rate = [&](const std::function<void(const void*)>& launch) {
        const double ms = time_ms([&](int i) { launch(copies.at(i)); },
                                  copies.batch(), reps);
        return 100 * double(bytes) / (ms * 1e-3) / 1e9 / copy_gbs;
      };
      std::printf("%-6s %5lldx%-7lld", std::string(model::info(t).name).c_str(), static_cast<long long>(s.out),
                  static_cast<long long>(s.in));
      for (const auto& tile : tiles) {
        std::printf(" %5.1f", rate([&](const void* w) {
                      CHECK(kernels::launch_gemv_b1_tile(params(w), gemv_ws.p, gemv_ws.n, nullptr, tile[0], tile[1],
                                                         kernels::gemv_x8_source::workspace));
                    }));
      }
      std::printf("  | %5.1f\n", rate([&](const void* w) {
                    CHECK(kernels::launch_gemv(params(w), gemv_ws.p, gemv_ws.n, nullptr, kernels::gemv_activations::int8,
                                               kernels::gemv_x8_source::workspace));
                  }));
    }
  }
}

// A dense feed-forward's gate and up projections with their SwiGLU for one token: the group
// GEMV on 8-bit x already in the workspace then the SwiGLU writing the down projection's 8-bit
// rows (two launches), against launch_gemv_glu doing both (one). Graphs of back-to-back calls, the
// weights cycling through copies so that they come from memory; limit: gate + up bytes at the
// copy rate.
void glu_table(double copy_gbs, std::size_t l2, int reps) {
  std::printf("\nGate/up + SwiGLU for one token, 8-bit x prepared; limit: both weights at %.0f GB/s\n", copy_gbs);
  std::printf("%-6s %-12s | %9s %9s %8s | %8s | %s\n", "type", "ff x embd", "pair us", "fused us", "speedup",
              "limit us", "worker");
  // qwen2.5-0.5b, qwen3-0.6b (3072 x 1024), gemma3-1b (6912 x 1152), qwen2.5-1.5b, llama3-8b.
  const shape shapes[] = {{4864, 896}, {3072, 1024}, {6912, 1152}, {8960, 1536}, {14336, 4096}};
  const ggml_type types[] = {ggml_type::Q8_0, ggml_type::Q4_K, ggml_type::Q6_K, ggml_type::Q4_0};
  constexpr std::int64_t max_in = 4096, max_ff = 14336, nt = 1;
  std::size_t max_bytes = 0;
  for (const ggml_type t : types) {
    for (const shape s : shapes) {
      if (s.in % model::info(t).block_elems == 0) {
        max_bytes = std::max(max_bytes, 2 * *model::row_bytes(t, s.in) * std::size_t(s.out));
      }
    }
  }
  device_mem pool(std::max(max_bytes, 4 * l2) + 4096);
  fill_random(pool.p, pool.n, 11);
  device_mem x(std::size_t(max_in) * 4), g(std::size_t(max_ff) * 4), u(g.n);
  CHECK(hipMemset(x.p, 0, x.n));
  device_mem ws(kernels::gemv_x8_bytes(max_in, nt)), out8(kernels::gemv_x8_bytes(max_ff, nt));
  for (const ggml_type t : types) {
    for (const shape s : shapes) {
      if (s.in % model::info(t).block_elems != 0) continue;  // qwen2.5's widths and the K-quants
      const std::size_t one = *model::row_bytes(t, s.in) * std::size_t(s.out), one_at = (one + 255) / 256 * 256;
      const weight_copies copies(pool, l2, one_at + one);
      const kernels::gemv_x8_rows y8 = kernels::gemv_x8_view(out8.p, s.out, nt);
      // x in 8 bits in the workspace, as the norm before the projections leaves it.
      const kernels::matmul_params warm{.w = pool.p, .w_type = t, .in = s.in, .out = 1, .x = x.as<float>(),
                                        .y = g.as<float>(), .n_tokens = nt};
      CHECK(kernels::launch_gemv(warm, ws.p, ws.n, nullptr));
      const double pair_us = 1e3 * time_graph_ms(
          [&](int i, hipStream_t st) {
            const char* w = static_cast<const char*>(copies.at(i));
            const kernels::matmul_params ps[2] = {
                {.w = w, .w_type = t, .in = s.in, .out = s.out, .x = x.as<float>(), .y = g.as<float>(), .n_tokens = nt},
                {.w = w + one_at, .w_type = t, .in = s.in, .out = s.out, .x = x.as<float>(), .y = u.as<float>(),
                 .n_tokens = nt}};
            CHECK(kernels::launch_gemv_group(ps, ws.p, ws.n, st, kernels::gemv_activations::int8,
                                             kernels::gemv_x8_source::workspace));
            CHECK(kernels::launch_swiglu({.gate = g.as<float>(),
                                          .up = u.as<float>(),
                                          .out = g.as<float>(),
                                          .rows = nt,
                                          .cols = s.out,
                                          .gate_stride = s.out,
                                          .up_stride = s.out,
                                          .out_stride = s.out,
                                          .yq = y8.q,
                                          .yq_scales = y8.ds},
                                         st));
          },
          copies.batch(), reps);
      const double fused_us = 1e3 * time_graph_ms(
          [&](int i, hipStream_t st) {
            const char* w = static_cast<const char*>(copies.at(i));
            CHECK(kernels::launch_gemv_glu({.gate = w,
                                            .up = w + one_at,
                                            .w_type = t,
                                            .in = s.in,
                                            .out = s.out,
                                            .x = x.as<float>(),
                                            .y = g.as<float>(),
                                            .n_tokens = nt,
                                            .yq = y8},
                                           ws.p, ws.n, st, kernels::gemv_x8_source::workspace));
          },
          copies.batch(), reps);
      std::printf("%-6s %5lldx%-6lld | %9.2f %9.2f %7.2fx | %8.2f | %s\n", std::string(model::info(t).name).c_str(),
                  static_cast<long long>(s.out), static_cast<long long>(s.in), pair_us,
                  fused_us, pair_us / fused_us, 2 * double(one) / (copy_gbs * 1e9) * 1e6,
                  kernels::gemv_glu_preferred(t, s.out) ? "fused" : "pair");
    }
  }
}

// One DeltaNet layer's delta rule (Qwen3.5-9B: 16 key heads, 32 value heads, both of 128) over a
// step of `seqs` sequences of `tokens` each, each continuing a state (not fresh): the chunked form
// on each kernel, and the recurrent form.
void delta_table(int reps) {
  constexpr std::int64_t hk = 16, hv = 32, dk = 128, dv = 128;
  const std::int64_t width = 2 * hk * dk + hv * dv;
  std::printf("\nDelta rule, one Qwen3.5-9B layer (%lld key heads, %lld value heads of %lld), states continued\n",
              static_cast<long long>(hk), static_cast<long long>(hv), static_cast<long long>(dk));
  std::printf("%-24s %6s %7s | %9s %10s\n", "form", "seqs", "tokens", "us", "tokens/us");
  struct load {
    std::int64_t seqs, tokens;
  };
  for (const load ld : {load{1, 512}, load{1, 2048}, load{4, 512}, load{16, 128}, load{64, 1}, load{256, 1}}) {
    const std::int64_t rows = ld.seqs * ld.tokens;
    device_mem qkv(std::size_t(rows * width) * 4), b(std::size_t(rows * hv) * 4), alpha(b.n), z(std::size_t(rows * hv * dv) * 4),
        y(z.n), a(std::size_t(hv) * 4), dt(a.n), norm(std::size_t(dv) * 4), state(std::size_t(ld.seqs * hv * dk * dv) * 4),
        d_seqs(std::size_t(ld.seqs) * sizeof(kernels::recurrent_seq));
    {
      // Values in the ranges a layer sees: q/k/v after the convolution's SiLU, gates around 0.
      std::vector<float> h(std::size_t(rows * width));
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = float(int(i * 7 % 23) - 11) / 11.f;
      CHECK(hipMemcpy(qkv.p, h.data(), qkv.n, hipMemcpyHostToDevice));
      h.assign(std::size_t(rows * hv), 0.1f);
      CHECK(hipMemcpy(b.p, h.data(), b.n, hipMemcpyHostToDevice));
      CHECK(hipMemcpy(alpha.p, h.data(), alpha.n, hipMemcpyHostToDevice));
      h.assign(std::size_t(hv), -0.5f);
      CHECK(hipMemcpy(a.p, h.data(), a.n, hipMemcpyHostToDevice));
      CHECK(hipMemcpy(dt.p, h.data(), dt.n, hipMemcpyHostToDevice));
      h.assign(std::size_t(dv), 1.f);
      CHECK(hipMemcpy(norm.p, h.data(), norm.n, hipMemcpyHostToDevice));
      CHECK(hipMemset(z.p, 0, z.n));
      CHECK(hipMemset(state.p, 0, state.n));
      std::vector<kernels::recurrent_seq> sq;
      for (std::int64_t i = 0; i < ld.seqs; ++i) {
        sq.push_back({.first = i * ld.tokens, .n_tokens = ld.tokens, .slot = std::int32_t(i), .fresh = false});
      }
      CHECK(hipMemcpy(d_seqs.p, sq.data(), d_seqs.n, hipMemcpyHostToDevice));
    }
    const kernels::delta_rule_params base{.qkv = qkv.as<float>(), .b = b.as<float>(), .alpha = alpha.as<float>(),
                                          .a = a.as<float>(), .dt_bias = dt.as<float>(), .z = z.as<float>(),
                                          .norm = norm.as<float>(), .y = y.as<float>(), .state = state.as<float>(),
                                          .n_slots = ld.seqs, .k_heads = hk, .v_heads = hv, .head_k = dk, .head_v = dv,
                                          .seqs = {d_seqs.as<kernels::recurrent_seq>(), std::size_t(ld.seqs)}};
    struct form {
      const char* name;
      bool chunked, cuda_cores;
    };
    for (const form f : {form{"chunked, tensor cores", true, false}, form{"chunked, CUDA cores", true, true},
                         form{"recurrent", false, false}}) {
      if (f.chunked && ld.tokens == 1) continue;  // decode steps take the recurrent form
      if (!f.chunked && ld.tokens > 512) continue;
      kernels::delta_rule_params p = base;
      p.chunked_from = f.chunked ? 0 : SIZE_MAX;
      p.cuda_cores_only = f.cuda_cores;
      const double ms = time_ms([&](int) { CHECK(kernels::launch_delta_rule(p, nullptr)); }, 3, reps);
      std::printf("%-24s %6lld %7lld | %9.1f %10.2f\n", f.name, static_cast<long long>(ld.seqs),
                  static_cast<long long>(ld.tokens), ms * 1e3, double(rows) / (ms * 1e3));
    }
    // The convolution before it, on the same rows (4 taps over the q/k/v channels), in place.
    device_mem taps(std::size_t(width * 4) * 4), conv_state(std::size_t(ld.seqs * 3 * width) * 4);
    CHECK(hipMemset(taps.p, 0, taps.n));
    CHECK(hipMemset(conv_state.p, 0, conv_state.n));
    for (const bool runs : {true, false}) {
      const kernels::conv1d_silu_params p{.x = qkv.as<float>(), .channels = width, .kernel = 4, .taps = taps.as<float>(),
                                          .state = conv_state.as<float>(), .n_slots = ld.seqs, .seqs = base.seqs,
                                          .chunked_from = runs ? 0 : SIZE_MAX};
      const double ms = time_ms([&](int) { CHECK(kernels::launch_conv1d_silu(p, nullptr)); }, 3, reps);
      std::printf("%-24s %6lld %7lld | %9.1f %10.2f\n", runs ? "conv1d, token runs" : "conv1d, thread a channel",
                  static_cast<long long>(ld.seqs), static_cast<long long>(ld.tokens), ms * 1e3, double(rows) / (ms * 1e3));
    }
  }
}

// The logits -> candidates op (kernels/candidates.h) as a decode step runs it: greedy draws, the
// request's default 64 candidates, no penalties or bias, over the vocabularies of the models served;
// µs in graphs beside one read of the logits at the copy rate.
void candidates_table(double copy_gbs, int reps) {
  std::printf("\nCandidates (top 64, the log-normaliser, the tail draw, a greedy draw); limit: one read of the logits at %.0f GB/s\n",
              copy_gbs);
  std::printf("%-8s %6s | %9s %9s\n", "vocab", "seqs", "us", "limit us");
  for (const std::int64_t vocab : {std::int64_t(151936), std::int64_t(128256), std::int64_t(262144)}) {
    for (const std::int64_t seqs : {std::int64_t(1), std::int64_t(8), std::int64_t(64)}) {
      std::vector<float> host(std::size_t(vocab * seqs));
      std::uint64_t state = 0x9E3779B97F4A7C15ull * std::uint64_t(vocab + seqs);
      for (float& v : host) {  // roughly what a head gives: a few units around zero
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        v = float(double(state >> 11) / double(1ull << 53) * 12.0 - 8.0);
      }
      device_mem logits(host.size() * 4);
      CHECK(hipMemcpy(logits.p, host.data(), logits.n, hipMemcpyHostToDevice));
      std::vector<gpu_worker::logit_params> lp(static_cast<std::size_t>(seqs));
      for (auto& p : lp) p.draw.on = true;  // greedy (temperature 0), 64 candidates
      const std::vector<std::int64_t> positions(static_cast<std::size_t>(seqs), 100);
      const kernels::candidates_batch batch = kernels::pack_candidates(lp, positions, vocab, 64);
      device_mem dseqs(batch.seqs.size() * sizeof(kernels::candidates_seq));
      CHECK(hipMemcpy(dseqs.p, batch.seqs.data(), dseqs.n, hipMemcpyHostToDevice));
      device_mem out(std::size_t(seqs) * kernels::candidates_record_bytes(64));
      device_mem ws(kernels::candidates_workspace(seqs, vocab, 64).bytes);
      const kernels::candidates_params p{.logits = logits.as<float>(),
                                         .vocab = vocab,
                                         .n_seqs = seqs,
                                         .seqs = static_cast<const kernels::candidates_seq*>(dseqs.p),
                                         .max_k = 64,
                                         .out = out.p,
                                         .workspace = ws.p,
                                         .workspace_bytes = ws.n,
                                         .draw = true};
      const double us = 1e3 * time_graph_ms([&](int, hipStream_t st) { CHECK(kernels::launch_candidates(p, st)); }, 20, reps);
      std::printf("%-8lld %6lld | %9.2f %9.2f\n", static_cast<long long>(vocab), static_cast<long long>(seqs), us,
                  double(logits.n) / (copy_gbs * 1e9) * 1e6);
    }
  }
}

// Decode attention for one sequence at the short contexts of a batch-1 decode (--small-attention):
// qwen2.5-0.5b's layer (14 heads over 2 KV heads of 64) and llama3-8b's, f16 cache, in graphs, at
// each split length the kernels take (the merge kernel runs where a context has several splits):
// few splits leave most multiprocessors idle, many add the merge.
void small_attention_table(double copy_gbs, int reps) {
  std::printf("\nDecode attention, one sequence, f16 cache, in graphs; limit: the K and V rows at %.0f GB/s\n", copy_gbs);
  std::printf("%-6s %6s %6s %6s %-7s | %9s %9s\n", "layer", "ctx", "split", "splits", "kernel", "us", "limit us");
  const attention_layer saved = att;
  for (const attention_layer layer : {attention_layer{.kv_heads = 2, .head_dim = 64, .heads = 14},
                                      attention_layer{.kv_heads = 8, .head_dim = 128, .heads = 32}}) {
    att = layer;
    for (const std::int64_t ctx : {std::int64_t(64), std::int64_t(128), std::int64_t(264), std::int64_t(512),
                                   std::int64_t(1024)}) {
      const one_sequence seq(ctx);
      for (const bool cuda_cores : {false, true}) {
        if (!cuda_cores && !kernels::attention_decode_tensor_cores(att.head_dim)) continue;
        std::vector<std::int64_t> splits{kernels::attention_decode_short_split, kernels::attention_decode_split};
        if (!cuda_cores) splits.push_back(kernels::attention_decode_longest_split);
        for (const std::int64_t split : splits) {
          device_mem ws(seq.workspace_bytes(split));
          const kernels::attention_decode_params p = seq.params(split, 0.125f, cuda_cores, ws);
          const double us =
              1e3 * time_graph_ms([&](int, hipStream_t st) { CHECK(kernels::launch_attention_decode(p, st)); }, 20, reps);
          const double bytes =
              double(ctx * att.kv_heads) * 2 * double(kernels::kv_row_bytes_device(kernels::kv_dtype::f16, att.head_dim));
          std::printf("%-6s %6lld %6lld %6lld %-7s | %9.2f %9.3f\n", att.head_dim == 64 ? "0.5b" : "8b",
                      static_cast<long long>(ctx), static_cast<long long>(split),
                      static_cast<long long>(kernels::attention_decode_splits(ctx, split)), cuda_cores ? "cuda" : "tensor",
                      us, bytes / (copy_gbs * 1e9) * 1e6);
        }
      }
    }
  }
  att = saved;
}

// One llama3-8b layer of a one-token step as the worker runs Q4_K_M's (Q4_K q/k/v, o, gate and up;
// Q6_K down: the recipe gives v and down Q6_K in about half the layers, Q4_K in the rest) after its
// q/k/v: decode attention at a context of 264 (f16 cache, the worker's split),
// o, gate and up as one launch, the SwiGLU writing down's 8-bit rows, down, then the next layer's
// q/k/v; the projections on 8-bit x already in their workspaces. In graphs; the layer's weights
// cycle through copies past L2, as a model's layers do. Also without the attention (o first).
// Limit: the layer's weight bytes at the copy rate.
void layer_chain_table(double copy_gbs, std::size_t l2, int reps) {
  const attention_layer saved = att;
  att = {.kv_heads = 8, .head_dim = 128, .heads = 32};
  constexpr std::int64_t embd = 4096, ff = 14336, kv = 1024, ctx = 264;
  const auto bytes_of = [](ggml_type t, std::int64_t out, std::int64_t in) {
    return (*model::row_bytes(t, in) * std::size_t(out) + 255) / 256 * 256;
  };
  struct part {
    ggml_type t;
    std::int64_t out, in;
    std::size_t at = 0;
  };
  part parts[] = {{ggml_type::Q4_K, embd, embd},  // o
                  {ggml_type::Q4_K, ff, embd},    // gate
                  {ggml_type::Q4_K, ff, embd},    // up
                  {ggml_type::Q6_K, embd, ff},    // down
                  {ggml_type::Q4_K, embd, embd},  // q
                  {ggml_type::Q4_K, kv, embd},    // k
                  {ggml_type::Q4_K, kv, embd}};   // v
  std::size_t layer = 0;
  for (part& pt : parts) {
    pt.at = layer;
    layer += bytes_of(pt.t, pt.out, pt.in);
  }
  device_mem pool(std::max<std::size_t>(3 * layer, 4 * l2 + layer));
  fill_random(pool.p, pool.n, 17);
  const weight_copies copies(pool, l2, layer);
  device_mem x(std::size_t(ff) * 4), y(std::size_t(ff) * 4), g(y.n), u(y.n);
  CHECK(hipMemset(x.p, 0, x.n));
  device_mem ws(kernels::gemv_x8_bytes(embd, 1)), ws_down(kernels::gemv_x8_bytes(ff, 1));
  const kernels::gemv_x8_rows down8 = kernels::gemv_x8_view(ws_down.p, ff, 1);
  // x in 8 bits in both workspaces (zeros), as the producers before each projection leave it.
  CHECK(kernels::launch_gemv({.w = pool.p, .w_type = ggml_type::Q4_K, .in = embd, .out = 1, .x = x.as<float>(),
                              .y = y.as<float>(), .n_tokens = 1},
                             ws.p, ws.n, nullptr));
  CHECK(kernels::launch_gemv({.w = pool.p, .w_type = ggml_type::Q6_K, .in = ff, .out = 1, .x = x.as<float>(),
                              .y = y.as<float>(), .n_tokens = 1},
                             ws_down.p, ws_down.n, nullptr));

  const one_sequence seq(ctx);
  const std::int64_t split = kernels::attention_decode_split_for(ctx, kernels::attention_decode_tensor_cores(att.head_dim));
  const device_mem att_ws(seq.workspace_bytes(split));
  const kernels::attention_decode_params ap = seq.params(split, 0.088f, false, att_ws);
  const auto mp = [&](const char* base, const part& pt, float* dst) {
    return kernels::matmul_params{.w = base + pt.at, .w_type = pt.t, .in = pt.in, .out = pt.out, .x = x.as<float>(),
                                  .y = dst, .n_tokens = 1};
  };
  const auto chain = [&](int i, hipStream_t st, bool attention) {
    const char* w = static_cast<const char*>(copies.at(i));
    constexpr auto ready = kernels::gemv_x8_source::workspace;
    constexpr auto int8 = kernels::gemv_activations::int8;
    if (attention) CHECK(kernels::launch_attention_decode(ap, st));
    CHECK(kernels::launch_gemv(mp(w, parts[0], y.as<float>()), ws.p, ws.n, st, int8, ready));
    const kernels::matmul_params gate_up[2] = {mp(w, parts[1], g.as<float>()), mp(w, parts[2], u.as<float>())};
    CHECK(kernels::launch_gemv_group(gate_up, ws.p, ws.n, st, int8, ready));
    CHECK(kernels::launch_swiglu({.gate = g.as<float>(),
                                  .up = u.as<float>(),
                                  .out = g.as<float>(),
                                  .rows = 1,
                                  .cols = ff,
                                  .gate_stride = ff,
                                  .up_stride = ff,
                                  .out_stride = ff,
                                  .yq = down8.q,
                                  .yq_scales = down8.ds},
                                 st));
    CHECK(kernels::launch_gemv(mp(w, parts[3], y.as<float>()), ws_down.p, ws_down.n, st, int8, ready));
    const kernels::matmul_params qkv[3] = {mp(w, parts[4], y.as<float>()), mp(w, parts[5], g.as<float>()),
                                           mp(w, parts[6], u.as<float>())};
    CHECK(kernels::launch_gemv_group(qkv, ws.p, ws.n, st, int8, ready));
  };
  const double limit_us = double(layer) / (copy_gbs * 1e9) * 1e6;
  std::printf("\nOne llama3-8b Q4_K_M layer, one token, in graphs (weights %.1f MB, %d copies; limit %.2f us at %.0f GB/s)\n",
              double(layer) / 1e6, copies.count, limit_us, copy_gbs);
  for (const bool attention : {true, false}) {
    const double us = 1e3 * time_graph_ms([&](int i, hipStream_t st) { chain(i, st, attention); },
                                          std::max(copies.batch(), 16), reps);
    std::printf("%-44s | %8.2f us  %5.1f%% of the limit\n",
                attention ? "attention, o, gate/up, swiglu, down, q/k/v" : "o, gate/up, swiglu, down, q/k/v", us,
                100 * limit_us / us);
  }
  att = saved;
}

void phase_chain_table(double copy_gbs, int reps) {
  using bench::phase_mode;
  constexpr int layers = 24;
  const std::size_t bytes = bench::phase_chain_layer_bytes() * layers;
  device_mem w(bytes), buf(2 * std::size_t(bench::phase_chain_max_width) * 4), sync(256);
  fill_random(w.p, w.n, 23);
  CHECK(hipMemset(sync.p, 0, sync.n));
  // x: small values, so that one layer's outputs stay finite for the check below.
  std::vector<float> x(std::size_t(bench::phase_chain_max_width), 1.f / 1024);
  const auto reset = [&] { CHECK(hipMemcpy(buf.p, x.data(), x.size() * 4, hipMemcpyHostToDevice)); };
  const int sms = gpu::multiprocessors();
  const auto params = [&](int blocks_per_sm, int n_layers) {
    return bench::phase_chain_params{.w = static_cast<const std::int8_t*>(w.p),
                                     .buf = buf.as<float>(),
                                     .sync = sync.as<unsigned>(),
                                     .layers = n_layers,
                                     .blocks = blocks_per_sm * sms};
  };
  // One layer from the same x: the barrier's outputs are the launches' bit for bit (the same rows
  // in the same order), or the barrier is wrong.
  std::vector<float> by_launches(x.size()), by_barrier(x.size()), by_prefetch(x.size());
  for (const phase_mode m : {phase_mode::launches, phase_mode::persistent, phase_mode::launches_prefetched}) {
    reset();
    CHECK(bench::launch_phase_chain(params(2, 1), m, nullptr));
    CHECK(hipDeviceSynchronize());
    // Four phases from buf[0]: the last output is back in buf[0].
    std::vector<float>& out = m == phase_mode::launches ? by_launches : m == phase_mode::persistent ? by_barrier : by_prefetch;
    CHECK(hipMemcpy(out.data(), buf.p, x.size() * 4, hipMemcpyDeviceToHost));
  }
  constexpr std::size_t down_rows = 896;  // the layer's last projection's outputs
  const bool same = std::memcmp(by_launches.data(), by_barrier.data(), down_rows * 4) == 0;
  const bool same_prefetched = std::memcmp(by_launches.data(), by_prefetch.data(), down_rows * 4) == 0;
  const double limit_us = double(bytes) / (copy_gbs * 1e9) * 1e6;
  std::printf("\nqwen2.5-0.5b's projections, int8, %d layers x %d, one token, in graphs (weights %.1f MB; limit %.1f us at %.0f GB/s)\n",
              layers, bench::phase_chain_phases, double(bytes) / 1e6, limit_us, copy_gbs);
  std::printf("one layer through the barrier equals the launches' result: %s\n", same ? "yes" : "NO");
  std::printf("one layer with the weights requested before the wait equals it: %s\n", same_prefetched ? "yes" : "NO");
  reset();
  for (const phase_mode m : {phase_mode::launches, phase_mode::persistent, phase_mode::persistent_unsynced,
                             phase_mode::launches_prefetched, phase_mode::launches_empty}) {
    for (const int per_sm : {1, 2}) {
      const bench::phase_chain_params p = params(per_sm, layers);
      const double us = 1e3 * time_graph_ms([&](int, hipStream_t st) { CHECK(bench::launch_phase_chain(p, m, st)); }, 8, reps);
      const char* name = m == phase_mode::launches              ? "a launch per projection"
                         : m == phase_mode::persistent          ? "one launch, grid barriers"
                         : m == phase_mode::persistent_unsynced ? "one launch, no barrier (work alone)"
                         : m == phase_mode::launches_prefetched ? "a launch each, weights before the wait"
                                                                : "a launch each, no work (the chain)";
      std::printf("%-40s %d block(s)/SM | %8.1f us a token  %6.2f us a projection  %5.1f%% of the limit\n", name, per_sm,
                  us, us / (layers * bench::phase_chain_phases), 100 * limit_us / us);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, quant_only = false, fp8_only = false, decode_only = false, prefill_only = false;
  // The tables that run alone, after the copy bandwidth: the first of this list asked for runs.
  struct solo_table {
    const char* flag;
    void (*run)(double copy_gbs, std::size_t l2, int reps);
  };
  static constexpr solo_table solo_tables[] = {
      {"--moe", [](double c, std::size_t l2, int r) { moe_table(c, l2, r); }},
      {"--delta-rule", [](double, std::size_t, int r) { delta_table(r); }},
      {"--glu", [](double c, std::size_t l2, int r) { glu_table(c, l2, r); }},
      {"--candidates", [](double c, std::size_t, int r) { candidates_table(c, r); }},
      {"--small-attention", [](double c, std::size_t, int r) { small_attention_table(c, r); }},
      {"--layer-chain", [](double c, std::size_t l2, int r) { layer_chain_table(c, l2, r); }},
      {"--phase-chain", [](double c, std::size_t, int r) { phase_chain_table(c, r); }},
      {"--small-gemv",
       [](double c, std::size_t l2, int r) {
         // qwen2.5-0.5b's matrices: the head, q/k/v stacked, o, gate (or up), down.
         gemv_tile_table(c, l2, r, {{151936, 896}, {1152, 896}, {896, 896}, {4864, 896}, {896, 4864}},
                         {ggml_type::Q8_0, ggml_type::Q4_0});
       }},
      {"--gemv-tiles-8b",
       [](double c, std::size_t l2, int r) {
         // llama3-8b's matrices: the head, q (and o), k (and v), gate (and up), down.
         gemv_tile_table(c, l2, r, {{128256, 4096}, {4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}},
                         {ggml_type::Q4_K, ggml_type::Q6_K});
       }},
  };
  const solo_table* solo = nullptr;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    for (const solo_table& t : solo_tables) {
      if (std::strcmp(argv[i], t.flag) == 0 && (solo == nullptr || &t < solo)) solo = &t;
    }
    decode_only = decode_only || std::strcmp(argv[i], "--decode-attention") == 0;
    prefill_only = prefill_only || std::strcmp(argv[i], "--prefill-attention") == 0;
    quant_only = quant_only || std::strcmp(argv[i], "--quant-gemm") == 0;
    fp8_only = fp8_only || std::strcmp(argv[i], "--fp8-gemm") == 0;
    if (std::strcmp(argv[i], "--attention-head-dim") == 0 && i + 1 < argc) {
      const long hd = std::strtol(argv[++i], nullptr, 10);
      if (hd == 256) {
        att = {.kv_heads = 8, .head_dim = 256, .heads = 16};
      } else if (hd != 128) {
        std::fprintf(stderr, "gpu_roofline: --attention-head-dim takes 128 (llama3-8b's layer) or 256 (gemma3-12b's)\n");
        return 2;
      }
    }
  }
  quant_only = quant_only || fp8_only;  // both skip the attention tables and what follows theirs
  const int reps = quick ? 5 : 15;

  int dev = 0;
  hipDeviceProp_t prop{};
  CHECK(hipGetDevice(&dev));
  CHECK(hipGetDeviceProperties(&prop, dev));
  const std::size_t l2 = std::size_t(prop.l2CacheSize);
  std::printf("device: %s, %d multiprocessors, L2 %.1f MiB, %.1f GiB\n", prop.name, prop.multiProcessorCount,
              double(l2) / (1 << 20), double(prop.totalGlobalMem) / (1u << 30));

  // ---- limits ----
  double copy_gbs = 0;
  {
    const std::size_t bytes = std::size_t(1) << 30;
    device_mem a(bytes), b(bytes);
    CHECK(hipMemset(a.p, 1, bytes));
    const double ms = time_ms([&](int) { CHECK(hipMemcpyAsync(b.p, a.p, bytes, hipMemcpyDeviceToDevice, nullptr)); }, 2, reps);
    copy_gbs = 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
    std::printf("limit: device copy bandwidth %.0f GB/s (1 GiB D2D, read + written)\n", copy_gbs);
  }
  if (solo != nullptr) {
    solo->run(copy_gbs, l2, reps);
    return 0;
  }

  blas::handle_t handle = nullptr;
  const bool have_blas = ANVIL_GPU_HAVE_BLAS && blas::create(&handle) == blas::ok;
  device_mem blas_ws(std::max<std::size_t>(blas::recommended_workspace_bytes, 1));
  double gemm_tflops = 0;
  if (have_blas) {
    const int n = 8192;
    device_mem a(std::size_t(n) * n * 2), b(std::size_t(n) * n * 2), c(std::size_t(n) * n * 4);
    fill_f16(a.p, std::size_t(n) * n, 1);
    fill_f16(b.p, std::size_t(n) * n, 2);
    const double ms = time_ms([&](int) { vendor_gemm(handle, blas_ws, false, n, n, n, a.p, b.p, c.p); }, 2, reps);
    gemm_tflops = 2.0 * n * double(n) * n / (ms * 1e-3) / 1e12;
    std::printf("limit: dense f16 GEMM %.0f TFLOP/s (vendor BLAS, %d^3, f32 accumulate and output)\n", gemm_tflops, n);
  } else {
    std::printf("limit: dense f16 GEMM: no vendor BLAS in this build\n");
  }

  // ---- decode attention over each KV cache element type ----
  // One layer of llama3-8b; every sequence has the same context, its blocks spread over the pool
  // in a shuffled order as the KV manager leaves them; the pool is larger than L2 many times.
  if (!quant_only && !prefill_only) {
    std::printf("\nDecode attention, one layer of %lld heads over %lld KV heads of %lld, blocks of %lld; limit: copy bandwidth %.0f GB/s\n",
                static_cast<long long>(att.heads), static_cast<long long>(att.kv_heads),
                static_cast<long long>(att.head_dim), static_cast<long long>(att.block), copy_gbs);
    std::printf("%-6s %-7s %8s %8s %6s | %9s %9s %7s\n", "cache", "kernel", "seqs", "context", "split", "us", "KV GB/s",
                "% copy");
    const std::int64_t n_kv = att.kv_heads, hd = att.head_dim, n_heads = att.heads, bs = att.block;
    struct load {
      std::int64_t seqs, ctx;
    };
    // Each load's cache is 160 MB or more in f16, so it does not sit in L2 between repetitions.
    const std::vector<load> loads = decode_only ? std::vector<load>{{256, 1000}, {256, 1500}, {256, 2000}, {64, 1500}, {16, 8192}}
                                                : std::vector<load>{{16, 8192}, {64, 640}, {256, 640}, {256, 2000}};
    for (const load ld : loads) {
      const std::int64_t per_seq = (ld.ctx + bs - 1) / bs, n_blocks = ld.seqs * per_seq;
      const bench_tables tables(n_blocks);
      const std::vector<std::int32_t> lens(std::size_t(ld.seqs), std::int32_t(ld.ctx));
      device_mem d_lens(lens.size() * 4);
      CHECK(hipMemcpy(d_lens.p, lens.data(), lens.size() * 4, hipMemcpyHostToDevice));
      device_mem q(std::size_t(ld.seqs * n_heads * hd) * 4), out(q.n);
      CHECK(hipMemset(q.p, 0, q.n));  // zeros: finite scores whatever the cache holds
      for (const kernels::kv_dtype t : {kernels::kv_dtype::f16, kernels::kv_dtype::int8, kernels::kv_dtype::fp8}) {
        const bench_cache cache(t, n_blocks);
        // The tensor-core kernel where the device has one, and the portable CUDA-core kernel beside
        // it, each at the split length a worker gives it.
        for (const bool cuda_cores : {false, true}) {
          if (cuda_cores && !kernels::attention_decode_tensor_cores(hd)) continue;
          const bool tensor_cores = !cuda_cores && kernels::attention_decode_tensor_cores(hd);
          const std::int64_t given = kernels::attention_decode_split_for(ld.ctx, tensor_cores);
          std::vector<std::int64_t> splits{given};
          if (decode_only && tensor_cores) {
            splits = {kernels::attention_decode_short_split, kernels::attention_decode_split, kernels::attention_decode_long_split,
                      kernels::attention_decode_longest_split};
          }
          for (const std::int64_t split : splits) {
            device_mem ws(std::max<std::size_t>(kernels::attention_decode_workspace_bytes(ld.seqs, n_heads, hd, ld.ctx, split), 16));
            const kernels::attention_decode_params p{.q = q.as<float>(),
                                                     .out = out.as<float>(),
                                                     .cache = cache.view,
                                                     .n_heads = n_heads,
                                                     .block_tables = tables.d.as<std::int32_t>(),
                                                     .block_table_stride = per_seq,
                                                     .context_lens = d_lens.as<std::int32_t>(),
                                                     .n_seqs = ld.seqs,
                                                     .max_context = ld.ctx,
                                                     .scale = 0.088f,
                                                     .split = split,
                                                     .workspace = ws.p,
                                                     .workspace_bytes = ws.n,
                                                     .cuda_cores_only = cuda_cores};
            const double ms = time_ms([&](int) { CHECK(kernels::launch_attention_decode(p, nullptr)); }, 10, reps);
            // Bytes a step must read: every position's K and V row of the layer (and their scales).
            const double bytes = double(ld.seqs * ld.ctx * n_kv) * 2 * double(kernels::kv_row_bytes_device(t, hd));
            const double gbs = bytes / (ms * 1e-3) / 1e9;
            std::printf("%-6s %-7s %8lld %8lld %6lld | %9.1f %9.0f %6.1f%%\n", std::string(kernels::kv_dtype_name(t)).c_str(),
                        tensor_cores ? "tensor" : "cuda", static_cast<long long>(ld.seqs), static_cast<long long>(ld.ctx),
                        static_cast<long long>(split), ms * 1e3, gbs, 100 * gbs / copy_gbs);
          }
        }
      }
    }
  }
  if (decode_only) return 0;

  // ---- prefill attention ----
  if (!quant_only) {
    std::printf("\nPrefill attention, one layer of %lld heads over %lld KV heads of %lld; limit: dense f16 GEMM %.0f TFLOP/s\n",
                static_cast<long long>(att.heads), static_cast<long long>(att.kv_heads),
                static_cast<long long>(att.head_dim), gemm_tflops);
    std::printf("%-6s %8s %8s %6s | %9s %9s %7s\n", "cache", "tokens", "from", "seqs", "us", "TFLOP/s", "% GEMM");
    const std::int64_t hd = att.head_dim, n_heads = att.heads, bs = att.block;
    struct chunk {
      std::int64_t tokens, start, seqs;
    };
    for (const chunk ch : {chunk{512, 0, 1}, chunk{512, 0, 4}, chunk{2048, 0, 1}, chunk{2048, 6000, 1}}) {
      const std::int64_t end = ch.start + ch.tokens, per_seq = (end + bs - 1) / bs, n_blocks = ch.seqs * per_seq;
      const bench_tables tables(n_blocks);
      std::vector<kernels::attention_prefill_seq> seqs;
      for (std::int64_t i = 0; i < ch.seqs; ++i) {
        seqs.push_back({.first_token = std::int32_t(i * ch.tokens), .n_tokens = std::int32_t(ch.tokens),
                        .start_pos = std::int32_t(ch.start)});
      }
      device_mem d_seqs(seqs.size() * sizeof(kernels::attention_prefill_seq));
      CHECK(hipMemcpy(d_seqs.p, seqs.data(), d_seqs.n, hipMemcpyHostToDevice));
      device_mem q(std::size_t(ch.seqs * ch.tokens * n_heads * hd) * 4), out(q.n);
      CHECK(hipMemset(q.p, 0, q.n));
      for (const kernels::kv_dtype t : {kernels::kv_dtype::f16, kernels::kv_dtype::int8, kernels::kv_dtype::fp8}) {
        const bench_cache cache(t, n_blocks);
        const kernels::attention_prefill_params p{.q = q.as<float>(),
                                                  .out = out.as<float>(),
                                                  .cache = cache.view,
                                                  .n_heads = n_heads,
                                                  .seqs = static_cast<const kernels::attention_prefill_seq*>(d_seqs.p),
                                                  .n_seqs = ch.seqs,
                                                  .max_seq_tokens = ch.tokens,
                                                  .block_tables = tables.d.as<std::int32_t>(),
                                                  .block_table_stride = per_seq,
                                                  .scale = 0.088f};
        const double ms = time_ms([&](int) { CHECK(kernels::launch_attention_prefill(p, nullptr)); }, 3, reps);
        // Each token attends to its position + 1 keys: 4 flops per key and dim (QK^T and PV).
        const double keys = double(ch.tokens) * double(ch.start) + double(ch.tokens) * double(ch.tokens + 1) / 2;
        const double tflops = 4.0 * keys * double(n_heads * hd) * double(ch.seqs) / (ms * 1e-3) / 1e12;
        std::printf("%-6s %8lld %8lld %6lld | %9.1f %9.1f %6.1f%%\n", std::string(kernels::kv_dtype_name(t)).c_str(),
                    static_cast<long long>(ch.tokens), static_cast<long long>(ch.start), static_cast<long long>(ch.seqs),
                    ms * 1e3, tflops, gemm_tflops > 0 ? 100 * tflops / gemm_tflops : 0.0);
      }
    }
  }

  if (prefill_only) {
    if (handle) blas::destroy(handle);
    return 0;
  }

  const std::vector<ggml_type> types = {ggml_type::F32,  ggml_type::F16,  ggml_type::BF16, ggml_type::Q8_0,
                                        ggml_type::Q4_0, ggml_type::Q4_K, ggml_type::Q5_K, ggml_type::Q6_K};
  std::vector<shape> shapes = {{4096, 4096}, {14336, 4096}, {4096, 14336}, {128256, 4096}};
  if (quick) shapes.pop_back();

  // One weight buffer for everything: the largest matrix several times over, or 4x L2 at least.
  std::size_t max_bytes = 0;
  for (ggml_type t : types) {
    for (shape s : shapes) max_bytes = std::max(max_bytes, *model::row_bytes(t, s.in) * std::size_t(s.out));
  }
  const std::size_t pool_bytes = std::max(max_bytes, 4 * l2) + 4096;
  device_mem pool(pool_bytes);
  fill_random(pool.p, pool_bytes, 7);
  const std::int64_t max_in = 14336;
  device_mem x(std::size_t(2048) * max_in * 4), y(std::size_t(512) * 128256 * 4);
  std::size_t gemv_ws_bytes = 256;
  for (ggml_type t : types) gemv_ws_bytes = std::max(gemv_ws_bytes, kernels::gemv_workspace_bytes(t, max_in, 8));
  device_mem gemv_ws(gemv_ws_bytes);
  {
    std::vector<float> hx(std::size_t(2048) * max_in);
    for (std::size_t i = 0; i < hx.size(); ++i) hx[i] = float(int(i % 17) - 8) / 8.f;
    CHECK(hipMemcpy(x.p, hx.data(), hx.size() * 4, hipMemcpyHostToDevice));
  }

  // ---- the quantized GEMM (tensor cores on the blocks) against dequantize + vendor GEMM ----
  // Steps of 8-128 tokens, the sizes of batched decode, timed in a graph as the worker's decode
  // steps run. The weight cycles through copies (as in the GEMV table), so the blocks come from
  // memory, not L2. Limit: the longer of reading the weight at the copy bandwidth and the products
  // at the dense f16 GEMM rate. "pick" marks the path launch_gemm takes (gemm_quant_preferred).
  if (have_blas && kernels::gemm_fp8_supported(dev) && (fp8_only || !quant_only)) {
    fp8_gemm_table({.copy_gbs = copy_gbs,
                    .gemm_tflops = gemm_tflops,
                    .l2 = l2,
                    .reps = reps,
                    .handle = handle,
                    .blas_ws = &blas_ws,
                    .pool = &pool,
                    .x = x.as<float>(),
                    .y = y.as<float>()});
  }
  if (fp8_only) {
    if (handle) blas::destroy(handle);
    return 0;
  }

  if (have_blas && kernels::gemm_quant_supported(ggml_type::Q4_K, 1)) {
    std::printf("\nQuantized GEMM on the blocks (tensor cores) against dequantize + vendor GEMM; limit: max(weight at %.0f GB/s, "
                "products at %.0f TFLOP/s)\n",
                copy_gbs, gemm_tflops);
    std::printf("%-5s %-13s %6s | %9s %9s %7s | %9s %7s | %7s %5s | %8s\n", "type", "out x in", "tokens", "limit us",
                "quant us", "% limit", "deq+blas", "% limit", "speedup", "pick", "gemv us");
    struct row {
      ggml_type t;
      shape s;
    };
    for (const auto& [t, s] : {row{ggml_type::Q4_K, {4096, 4096}}, row{ggml_type::Q4_K, {1024, 4096}},
                               row{ggml_type::Q4_K, {14336, 4096}}, row{ggml_type::Q4_K, {4096, 14336}},
                               row{ggml_type::Q5_K, {4096, 4096}}, row{ggml_type::Q5_K, {14336, 4096}},
                               row{ggml_type::Q6_K, {1024, 4096}}, row{ggml_type::Q6_K, {4096, 14336}}}) {
      const std::size_t bytes = *model::row_bytes(t, s.in) * std::size_t(s.out);
      const weight_copies copies(pool, l2, bytes);
      for (const std::int64_t nt : {1, 2, 4, 8, 16, 32, 64, 128}) {
        const kernels::matmul_params p{.w = nullptr,
                                       .w_type = t,
                                       .in = s.in,
                                       .out = s.out,
                                       .bias = nullptr,
                                       .x = x.as<float>(),
                                       .y = y.as<float>(),
                                       .n_tokens = nt};
        device_mem qws(std::max<std::size_t>(kernels::gemm_quant_workspace_bytes(t, s.in, s.out, nt), 256));
        const double quant_us = 1e3 * time_graph_ms(
                                          [&](int i, hipStream_t st) {
                                            kernels::matmul_params q = p;
                                            q.w = copies.at(i);
                                            CHECK(kernels::launch_gemm_quant(q, qws.p, qws.n, st));
                                          },
                                          copies.batch(), reps);
        device_mem ws(std::max<std::size_t>(kernels::gemm_workspace_bytes(kernels::gemm_algo::vendor_blas, t, s.in, s.out, nt), 256));
        const kernels::gemm_context ctx{kernels::gemm_algo::vendor_blas, ws.p, ws.n, handle, blas_ws.p, blas_ws.n};
        const double blas_us = 1e3 * time_graph_ms(
                                         [&](int i, hipStream_t st) {
                                           kernels::matmul_params q = p;
                                           q.w = copies.at(i);
                                           CHECK(kernels::launch_gemm(q, ctx, st));
                                         },
                                         copies.batch(), reps);
        // The GEMV where a step that small takes it: 8-bit activations already in its workspace, as
        // the worker's norms leave them.
        double gemv_us = 0;
        if (nt <= kernels::gemv_max_tokens) {
          gemv_us = 1e3 * time_graph_ms(
                              [&](int i, hipStream_t st) {
                                kernels::matmul_params q = p;
                                q.w = copies.at(i);
                                CHECK(kernels::launch_gemv(q, gemv_ws.p, gemv_ws.n, st, kernels::gemv_activations::int8,
                                                           kernels::gemv_x8_source::workspace));
                              },
                              copies.batch(), reps);
        }
        const double flop = 2.0 * double(nt) * double(s.out) * double(s.in);
        const double limit_us = std::max(double(bytes) / (copy_gbs * 1e9), gemm_tflops > 0 ? flop / (gemm_tflops * 1e12) : 0.0) * 1e6;
        char dims[32];
        std::snprintf(dims, sizeof dims, "%lldx%lld", static_cast<long long>(s.out), static_cast<long long>(s.in));
        std::printf("%-5s %-13s %6lld | %9.1f %9.1f %6.1f%% | %9.1f %6.1f%% | %6.2fx %5s | %8.1f\n",
                    std::string(model::info(t).name).c_str(), dims,
                    static_cast<long long>(nt), limit_us, quant_us, 100 * limit_us / quant_us, blas_us,
                    100 * limit_us / blas_us, blas_us / quant_us,
                    kernels::gemm_quant_preferred(t, nt, s.in, s.out) ? "quant" : "blas", gemv_us);
      }
    }
  }

  if (quant_only) {
    if (handle) blas::destroy(handle);
    return 0;
  }

  // ---- GEMV ----
  std::printf("\nGEMV, weight bytes / time; limit: copy bandwidth %.0f GB/s\n", copy_gbs);
  std::printf("%-9s %-13s %9s | %9s %8s %6s | %9s %8s %6s\n", "type", "out x in", "MB", "b1 us", "GB/s", "%copy",
              "b8 us", "GB/s", "%copy");
  // Quantized types twice: 8-bit activations (the default) and f32 activations (label "/f32").
  for (ggml_type t : types) {
    for (const kernels::gemv_activations act : {kernels::gemv_activations::int8, kernels::gemv_activations::f32}) {
      const bool quantized = kernels::gemv_workspace_bytes(t, 256, 1) > 0;
      if (act == kernels::gemv_activations::f32 && !quantized) continue;
      const std::string label = std::string(model::info(t).name) + (act == kernels::gemv_activations::f32 ? "/f32" : "");
      for (shape s : shapes) {
        const std::size_t bytes = *model::row_bytes(t, s.in) * std::size_t(s.out);
        const weight_copies copies(pool, l2, bytes);
        double us[2] = {}, gbs[2] = {};
        for (int k = 0; k < 2; ++k) {
          const std::int64_t nt = k == 0 ? 1 : 8;
          const double ms = time_ms(
              [&](int i) {
                const void* w = copies.at(i);
                CHECK(kernels::launch_gemv({.w = w,
                                            .w_type = t,
                                            .in = s.in,
                                            .out = s.out,
                                            .bias = nullptr,
                                            .x = x.as<float>(),
                                            .y = y.as<float>(),
                                            .n_tokens = nt},
                                           gemv_ws.p, gemv_ws.n, nullptr, act));
              },
              copies.batch(), reps);
          us[k] = ms * 1e3;
          gbs[k] = double(bytes) / (ms * 1e-3) / 1e9;
        }
        char dims[32];
        std::snprintf(dims, sizeof dims, "%lldx%lld", static_cast<long long>(s.out), static_cast<long long>(s.in));
        std::printf("%-9s %-13s %9.1f | %9.1f %8.0f %5.1f%% | %9.1f %8.0f %5.1f%%\n", label.c_str(),
                    dims, double(bytes) / 1e6, us[0], gbs[0], 100 * gbs[0] / copy_gbs, us[1], gbs[1],
                    100 * gbs[1] / copy_gbs);
      }
    }
  }

  // ---- GEMV batch-1 tiles ----
  gemv_tile_table(copy_gbs, l2, reps, shapes, {ggml_type::Q4_K, ggml_type::Q6_K, ggml_type::Q8_0, ggml_type::Q5_K});

  // ---- dequantization (what the GEMM path pays per weight and step) ----
  std::printf("\nDequantize to f16, bytes read + written / time; limit: copy bandwidth %.0f GB/s\n", copy_gbs);
  std::printf("%-5s %-13s | %9s %8s %6s\n", "type", "out x in", "us", "GB/s", "%copy");
  {
    const std::size_t max_elems = std::size_t(14336) * 4096;
    device_mem f16(max_elems * 2);
    for (ggml_type t : types) {
      if (t == ggml_type::F16) continue;
      for (shape s : {shape{4096, 4096}, shape{14336, 4096}}) {
        const std::size_t elems = std::size_t(s.out) * std::size_t(s.in);
        const double ms = time_ms(
            [&](int) { CHECK(kernels::launch_dequantize(t, pool.p, f16.as<std::uint16_t>(), s.out, s.in, nullptr)); }, 3,
            reps);
        const double bytes = double(*model::row_bytes(t, s.in) * std::size_t(s.out) + elems * 2);
        char dims[32];
        std::snprintf(dims, sizeof dims, "%lldx%lld", static_cast<long long>(s.out), static_cast<long long>(s.in));
        std::printf("%-5s %-13s | %9.1f %8.0f %5.1f%%\n", std::string(model::info(t).name).c_str(), dims, ms * 1e3,
                    bytes / (ms * 1e-3) / 1e9, 100 * bytes / (ms * 1e-3) / 1e9 / copy_gbs);
      }
    }
  }

  // ---- GEMM ----
  std::printf("\nGEMM, 32 and 512 tokens, dequantization included; limit: dense f16 GEMM %.0f TFLOP/s\n", gemm_tflops);
  std::printf("%-5s %-13s %6s %-11s | %9s %9s %7s\n", "type", "out x in", "tokens", "algo", "ms", "TFLOP/s", "%gemm");
  std::vector<kernels::gemm_algo> algos = {kernels::gemm_algo::tiled_f16};
  if (have_blas) algos.insert(algos.begin(), kernels::gemm_algo::vendor_blas);
  for (ggml_type t : types) {
    for (shape s : {shape{4096, 4096}, shape{14336, 4096}}) {
      for (const std::int64_t nt : {std::int64_t(32), std::int64_t(512)}) {
        for (kernels::gemm_algo algo : algos) {
          device_mem ws(std::max<std::size_t>(kernels::gemm_workspace_bytes(algo, t, s.in, s.out, nt), 256));
          const kernels::gemm_context ctx{algo, ws.p, ws.n, handle, blas_ws.p, blas_ws.n};
          const double ms = time_ms(
              [&](int) {
                CHECK(kernels::launch_gemm({.w = pool.p,
                                            .w_type = t,
                                            .in = s.in,
                                            .out = s.out,
                                            .bias = nullptr,
                                            .x = x.as<float>(),
                                            .y = y.as<float>(),
                                            .n_tokens = nt},
                                           ctx, nullptr));
              },
              3, reps);
          const double tflops = 2.0 * double(nt) * double(s.out) * double(s.in) / (ms * 1e-3) / 1e12;
          char dims[32];
          std::snprintf(dims, sizeof dims, "%lldx%lld", static_cast<long long>(s.out), static_cast<long long>(s.in));
          std::printf("%-5s %-13s %6lld %-11s | %9.3f %9.1f %6.1f%%\n", std::string(model::info(t).name).c_str(), dims,
                      static_cast<long long>(nt), algo == kernels::gemm_algo::vendor_blas ? "vendor_blas" : "tiled_f16",
                      ms, tflops, gemm_tflops > 0 ? 100 * tflops / gemm_tflops : 0.0);
        }
      }
    }
  }
  // ---- the 8-bit tensor-core rate, beside f16, at the shapes a serving step multiplies ----
  // Vendor BLAS only, no dequantization: what an int8-weight, int8-activation GEMM path could
  // reach at most, against the f16 GEMM the path above feeds (issue 17's prefill question).
  if (have_blas) {
    std::printf("\nVendor GEMM, int8 x int8 -> int32 against f16 x f16 -> f32 (no dequantization); limit: dense f16 GEMM %.0f TFLOP/s\n",
                gemm_tflops);
    std::printf("%-13s %6s | %9s %9s | %9s %9s | %6s\n", "out x in", "tokens", "f16 ms", "TFLOP/s", "int8 ms", "TOP/s", "ratio");
    for (shape s : {shape{4096, 4096}, shape{14336, 4096}, shape{4096, 14336}, shape{8192, 8192}}) {
      for (const std::int64_t nt : {std::int64_t(64), std::int64_t(256), std::int64_t(512), std::int64_t(2048)}) {
        const int m = int(s.out), n = int(nt), k = int(s.in);
        device_mem w16(std::size_t(m) * k * 2), x16(std::size_t(k) * n * 2), y32(std::size_t(m) * n * 4);
        device_mem w8(std::size_t(m) * k), x8(std::size_t(k) * n);
        fill_f16(w16.p, std::size_t(m) * k, 3);
        fill_f16(x16.p, std::size_t(k) * n, 4);
        CHECK(hipMemset(w8.p, 3, w8.n));
        CHECK(hipMemset(x8.p, 5, x8.n));
        const double ms16 = time_ms([&](int) { vendor_gemm(handle, blas_ws, false, m, n, k, w16.p, x16.p, y32.p); }, 3, reps);
        const double ms8 = time_ms([&](int) { vendor_gemm(handle, blas_ws, true, m, n, k, w8.p, x8.p, y32.p); }, 3, reps);
        const double flop = 2.0 * double(m) * double(n) * double(k);
        char dims[32];
        std::snprintf(dims, sizeof dims, "%dx%d", m, k);
        std::printf("%-13s %6d | %9.3f %9.1f | %9.3f %9.1f | %5.2fx\n", dims, n, ms16, flop / (ms16 * 1e-3) / 1e12, ms8,
                    flop / (ms8 * 1e-3) / 1e12, ms16 / ms8);
      }
    }
  }
  if (handle) blas::destroy(handle);
  return 0;
}

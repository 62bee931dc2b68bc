#!/usr/bin/env bash
# The GPU worker's figures in one run, on the GPU machine, each beside its physical limit:
#   1. the device's limits (gpu_roofline --quick): copy bandwidth, dense f16 GEMM rate;
#   2. batch-1 decode (`anvil generate`, 256 tokens, two runs) in tok/s and as a % of
#      copy bandwidth ÷ weight bytes (the weights of the memory plan: what one token streams; for
#      a mixture of experts the plan's "MB per token", the experts a token is routed to), and
#      each run's host CPU per token and device busy / idle time per step;
#   3. prefill of 512 tokens (a warmed `anvil serve` without prefix caching; mean TTFT of 16
#      requests of 512 random token ids) in tok/s and as a % of the GEMM rate at 2 × the layers'
#      matrix parameters per token (the head runs for the last token only);
#   4. serving (`anvil-bench` against the same server, 512-token prompts, 128 output tokens) at
#      concurrency 1, 8, 32, 64, 128 and 256: throughput, mean and p99 TTFT, mean TPOT, p99 ITL;
#      then the step loop over the whole run from the server's /metrics: steps planned ahead, the
#      device's busy time per step and its idle time between steps.
# Usage: bench/gpu-figures.sh [BUNDLE_DIR] [MODEL_DIR]
#   BUNDLE_DIR: anvil, anvil-bench, gpu_roofline and lib/ (scripts/gpu-bundle.sh; default
#               .device/bundle); MODEL_DIR: where `anvil synth` writes the models (default
#               /tmp/anvil-figures; existing files are reused).
#   FIGURES_MODELS: the models, "shape:type ..." (default: the four below);
#   FIGURES_SERVE:  those that also get prefill and serving figures (default: llama3-8b:Q4_K_M);
#   FIGURES_SERVE_ARGS: more `anvil serve` options (step limits, say), appended to the ones below.
#   FIGURES_DECODE_ARGS: more `anvil generate` options for the decode figures (--tensor-parallel 2,
#               say: the limit is then the GPUs' copy bandwidth together over the weights).
#   FIGURES_CONCURRENCY: the serving concurrencies (default "1 8 32 64 128 256").
#   COPY_GBS, GEMM_TFLOPS: the limits, measured before on this kind of device (both set: no
#               gpu_roofline run, and none needed in the bundle).
set -uo pipefail
dir=${1:-.device/bundle}
models_dir=${2:-/tmp/anvil-figures}
models=${FIGURES_MODELS:-llama3-8b:Q4_K_M llama3-8b:Q8_0 llama3-8b:F16 qwen2.5-0.5b:Q8_0}
serve_models=${FIGURES_SERVE:-llama3-8b:Q4_K_M}
read -r -a serve_args <<<"${FIGURES_SERVE_ARGS:-}"
read -r -a decode_args <<<"${FIGURES_DECODE_ARGS:-}"
concurrencies=${FIGURES_CONCURRENCY:-1 8 32 64 128 256}
export LD_LIBRARY_PATH="$dir/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$models_dir"
status=0

# 2 × the parameters of the layers' matrices (q, k, v, o, gate, up, down) of each shape.
gflop_per_token() {
  case $1 in
    llama3-8b) echo 13.96 ;;     # 32 × (4096 × 6144 + 4096 × 4096 + 3 × 4096 × 14336) × 2
    qwen2.5-0.5b) echo 0.716 ;;  # 24 × (896 × 1152 + 896 × 896 + 3 × 896 × 4864) × 2
    qwen3-30b-a3b) echo 5.46 ;;  # 48 × (2048 × 5120 + 4096 × 2048 + 2048 × 128 + 8 × 3 × 2048 × 768) × 2
    gpt-oss-20b) echo 6.06 ;;    # 24 × (2880 × 5120 + 4096 × 2880 + 2880 × 32 + 4 × 3 × 2880 × 2880) × 2
    gemma3-12b) echo 21.52 ;;    # 48 × (3840 × 8192 + 4096 × 3840 + 3 × 3840 × 15360) × 2
    gemma3-27b) echo 51.20 ;;    # 62 × (5376 × 8192 + 4096 × 5376 + 3 × 5376 × 21504) × 2
    # Gemma 4: 50 sliding layers (q 8192, k/v 4096 wide) and 10 global ones (q 16384, k 2048, no v).
    gemma4-31b) echo 58.57 ;;    # (50 × 5376 × 89088 + 10 × 5376 × 99328) × 2
    # 25 sliding (q 4096, k/v 2048), 5 global (q 8192, k 1024); a dense 2112 beside 8 experts of 704,
    # the router: (25 × 2816 × 12288 + 5 × 2816 × 17408 + 30 × (3 × 2816 × 2112 + 24 × 2816 × 704 + 2816 × 128)) × 2
    gemma4-26b-a4b) echo 6.17 ;;
    # Qwen3.5: 24 DeltaNet layers (q/k/v 8192, z 4096, beta and alpha 32, out 4096) and 8 gated
    # attention ones (q 8192 with its gate, k/v 1024, o 4096), the feed-forward of 12288 on all 32.
    qwen3.5-9b) echo 13.84 ;;
    # Gemma 4 E4B: 24 layers with K/V of their own (20 sliding: q 2048, k/v 512; 4 global: q 4096,
    # k/v 1024), 18 on an earlier layer's (15 sliding, 3 global: q and o alone), the feed-forward of
    # 10240 and the per-layer block (2560 x 256 twice) on all 42, the per-layer inputs' projection:
    # (20 × 2560 × 5120 + 4 × 2560 × 10240 + 15 × 2560 × 4096 + 3 × 2560 × 8192
    #  + 42 × (3 × 2560 × 10240 + 2 × 2560 × 256) + 2560 × 10752) × 2
    gemma4-e4b) echo 7.95 ;;    # (24 × 4096 × 16448 + 8 × 4096 × 14336 + 32 × 3 × 4096 × 12288) × 2
    *) echo 0 ;;
  esac
}

echo "== limits"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader || true
if [ -n "${COPY_GBS:-}" ] && [ -n "${GEMM_TFLOPS:-}" ]; then  # limits measured before, on this kind of device
  copy_gbs=$COPY_GBS gemm_tflops=$GEMM_TFLOPS
else
  roofline=$("$dir/gpu_roofline" --quick) || status=1
  copy_gbs=$(sed -n 's/^limit: device copy bandwidth \([0-9.]*\) GB\/s.*/\1/p' <<<"$roofline")
  gemm_tflops=$(sed -n 's/^limit: dense f16 GEMM \([0-9.]*\) TFLOP\/s.*/\1/p' <<<"$roofline")
fi
echo "copy bandwidth ${copy_gbs:-?} GB/s, dense f16 GEMM ${gemm_tflops:-?} TFLOP/s"
[ -n "$copy_gbs" ] && [ -n "$gemm_tflops" ] || { echo "gpu_roofline gave no limits"; exit 1; }

# The models, written in parallel.
for m in $models; do
  f="$models_dir/${m/:/-}.gguf"
  [ -s "$f" ] || "$dir/anvil" synth --shape "${m%%:*}" --type "${m##*:}" -o "$f" > "$f.log" 2>&1 &
done
wait

echo
echo "== decode, batch 1: anvil generate -n 256 --ignore-eos ${decode_args[*]} (two runs); limit = copy bandwidth (x GPUs) / weight bytes"
printf '%-22s %12s %10s %10s %8s\n' model "weights MB" "limit t/s" "tok/s" "% limit"
loop_lines=()  # each run's host CPU per token and device busy / idle per step (anvil generate)
for m in $models; do
  f="$models_dir/${m/:/-}.gguf"
  best=0 weights=""
  for run in 1 2; do
    out=$("$dir/anvil" --log-level info generate -m "$f" -p "hello world, this is a test" -n 256 --ignore-eos \
          --backend gpu "${decode_args[@]}" 2>&1 >/dev/null) || status=1
    gpus=$(grep -oE 'split over [0-9]+ GPUs' <<<"$out" | awk '{print $3}' | head -1)
    tok=$(grep -oE '\(([0-9.]+) tok/s\)' <<<"$out" | tr -d '()' | awk '{print $1}' | tail -1)
    [ -z "$weights" ] && weights=$(grep -oE '\([0-9.]+ MB per token\)' <<<"$out" | tr -d '(' | awk '{print $1}' | head -1)
    [ -z "$weights" ] && weights=$(grep -oE 'weights [0-9.]+ MB' <<<"$out" | awk '{print $2}' | head -1)
    best=$(awk -v a="$best" -v b="${tok:-0}" 'BEGIN { print (b > a ? b : a) }')
    loop_lines+=("$m run $run: $(grep -E '^(host|device):' <<<"$out" | tr '\n' ' ')")
  done
  awk -v m="$m" -v w="${weights:-0}" -v c="$copy_gbs" -v t="$best" -v g="${gpus:-1}" 'BEGIN {
    lim = w > 0 ? g * c * 1000 / w : 0
    printf "%-22s %12.1f %10.0f %10.1f %7.1f%%\n", m, w, lim, t, (lim > 0 ? 100 * t / lim : 0) }'
done

printf '%s\n' "${loop_lines[@]}"

for m in $serve_models; do
  f="$models_dir/${m/:/-}.gguf"
  echo
  echo "== $m: anvil serve --ctx 1024 --gpu-memory-fraction 0.5 --no-prefix-caching ${serve_args[*]}"
  "$dir/anvil" serve -m "$f" --port 18080 --line-port 18081 --ctx 1024 --gpu-memory-fraction 0.5 \
    --no-prefix-caching --status-interval 0 "${serve_args[@]}" > "$models_dir/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 1 300); do grep -q "serve: ready" "$models_dir/serve.log" && break; sleep 1; done
  grep -q "serve: ready" "$models_dir/serve.log" || { echo "the server did not start"; cat "$models_dir/serve.log"; status=1; kill $server; continue; }
  bench() { "$dir/anvil-bench" --url tcp://127.0.0.1:18081 --random-token-ids --input-len 512 --no-progress "$@" 2>&1; }
  bench --concurrency 1 --num-prompts 4 --output-len 8 --seed 1 > /dev/null  # warm-up
  ttft=$(bench --concurrency 1 --num-prompts 16 --output-len 8 --seed 2 | sed -n 's/^Mean TTFT (ms): *\([0-9.]*\)/\1/p')
  awk -v m="$m" -v t="${ttft:-0}" -v g="$(gflop_per_token "${m%%:*}")" -v peak="$gemm_tflops" 'BEGIN {
    r = t > 0 ? 512 * 1000 / t : 0
    printf "prefill 512: mean TTFT %.2f ms = %.0f tok/s = %.1f TFLOP/s, %.1f%% of the GEMM rate\n", t, r, r * g / 1000,
           (peak > 0 ? 100 * r * g / 1000 / peak : 0) }'
  grep -m1 "memory plan" "$models_dir/serve.log"
  printf '%-11s %10s %14s %13s %10s %10s %10s %10s\n' concurrency requests "output tok/s" "total tok/s" "TTFT ms" \
    "p99 TTFT" "TPOT ms" "p99 ITL"
  for c in $concurrencies; do
    n=$((c < 8 ? 8 : 2 * c))
    r=$(bench --concurrency $c --num-prompts $n --output-len 128 --seed $((c + 200)) --percentiles 99)
    get() { sed -n "s/^$1 *\([0-9.]*\)/\1/p" <<<"$r" | head -1; }
    failed=$(get 'Failed requests:')
    [ "${failed:-1}" = 0 ] || status=1
    printf '%-11s %10s %14s %13s %10s %10s %10s %10s\n' "$c" "$n${failed:+ ($failed failed)}" \
      "$(get 'Output token throughput (tok\/s):')" "$(get 'Total Token throughput (tok\/s):')" "$(get 'Mean TTFT (ms):')" \
      "$(get 'P99 TTFT (ms):')" "$(get 'Mean TPOT (ms):')" "$(get 'P99 ITL (ms):')"
  done
  # The step loop over the whole run, from the server's own counters (its device clock).
  python3 - <<'PY' || true
import urllib.request
m = {}
for line in urllib.request.urlopen("http://127.0.0.1:18080/metrics", timeout=10).read().decode().splitlines():
    if line.startswith("anvil_") and " " in line:
        k, v = line.rsplit(" ", 1)
        m[k] = float(v)
gaps, steps = m.get("anvil_device_idle_gaps_total", 0), m.get("anvil_steps_total", 0)
if gaps > 0 and steps > 0:
    print("step loop: %d steps (%d planned ahead); device busy %.1f us per step, idle %.1f us between steps"
          % (steps, m["anvil_steps_ahead_total"], 1e6 * m["anvil_device_busy_seconds_total"] / steps,
             1e6 * m["anvil_device_idle_seconds_total"] / gaps))
PY
  kill -TERM $server 2>/dev/null
  wait $server 2>/dev/null
done
echo
echo "gpu-figures: exit $status"
exit $status

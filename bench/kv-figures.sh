#!/usr/bin/env bash
# The KV cache's element types side by side (`anvil serve --kv-cache-dtype`), on the GPU machine:
# llama3-8b Q4_K_M from `anvil synth`, one server per (workload, type), each figure beside its
# decode limit — the bytes one decode step must read (the weights, and every running sequence's
# K and V rows at its mean context) at the device's copy bandwidth:
#   limit tok/s = concurrency / ((weight bytes + concurrency x mean context x KV bytes per
#   position) / copy bandwidth)
# Workloads (input / output tokens at a concurrency): 512 / 128 at 64 and 256; 1,000 / 1,000 at
# 256; 8,000 / 256 at 16. Each server's memory plan also gives the number of 8k-token sequences
# its KV pool holds at once.
# Usage: bench/kv-figures.sh [BUNDLE_DIR] [MODEL_DIR]
#   KV_FIGURES_DTYPES: the types compared (default "f16 fp8 int8");
#   KV_FIGURES_MODEL:  the model, shape:type (default llama3-8b:Q4_K_M);
#   KV_FIGURES_WORKLOADS: a subset of "short long 8k" (default all three);
#   COPY_GBS: the copy bandwidth in GB/s (default: measured by gpu_roofline --quick);
#   KV_FIGURES_SERVE_ARGS: more `anvil serve` options (`--gemm-dtype fp8`, say). The limit counts
#   the GGUF weights' bytes; with FP8 copies a decode step of 32+ sequences reads those instead.
set -uo pipefail
dir=${1:-.device/bundle}
models_dir=${2:-/tmp/anvil-figures}
dtypes=${KV_FIGURES_DTYPES:-f16 fp8 int8}
model=${KV_FIGURES_MODEL:-llama3-8b:Q4_K_M}
workloads=${KV_FIGURES_WORKLOADS:-short long 8k}
read -r -a serve_args <<<"${KV_FIGURES_SERVE_ARGS:-}"
export LD_LIBRARY_PATH="$dir/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$models_dir"
status=0

copy_gbs=${COPY_GBS:-$("$dir/gpu_roofline" --quick | sed -n 's/^limit: device copy bandwidth \([0-9.]*\) GB\/s.*/\1/p')}
[ -n "$copy_gbs" ] || { echo "no copy bandwidth"; exit 1; }
f="$models_dir/${model/:/-}.gguf"
[ -s "$f" ] || "$dir/anvil" synth --shape "${model%%:*}" --type "${model##*:}" -o "$f" > "$f.log" 2>&1 || { cat "$f.log"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader || true
echo "model $model, copy bandwidth $copy_gbs GB/s"

# K and V bytes per position over all layers, from the model's shape.
kv_bytes_per_pos() {  # dtype
  local layers=32 kv_heads=8 head_dim=128
  case ${model%%:*} in qwen2.5-0.5b) layers=24 kv_heads=2 head_dim=64 ;; esac
  case $1 in f16) echo $((layers * kv_heads * head_dim * 2 * 2)) ;; *) echo $((layers * kv_heads * (head_dim + 4) * 2)) ;; esac
}

# serve_and_bench NAME CTX FRACTION "c:n:in:out ..." DTYPE
serve_and_bench() {
  local name=$1 ctx=$2 fraction=$3 loads=$4 t=$5 log="$models_dir/serve-kv.log"
  "$dir/anvil" serve -m "$f" --port 18090 --line-port 18091 --ctx "$ctx" --gpu-memory-fraction "$fraction" \
    --no-prefix-caching --status-interval 0 --kv-cache-dtype "$t" "${serve_args[@]}" > "$log" 2>&1 &
  local server=$!
  for _ in $(seq 1 300); do grep -q "serve: ready" "$log" && break; sleep 1; done
  if ! grep -q "serve: ready" "$log"; then echo "the server did not start"; cat "$log"; status=1; kill $server; return; fi
  local plan blocks weights
  plan=$(grep -m1 "memory plan" "$log")
  blocks=$(sed -n 's/.*: \([0-9]*\) KV blocks of \([0-9]*\) tokens.*/\1/p' <<<"$plan")
  weights=$(sed -n 's/.*weights \([0-9.]*\) MB.*/\1/p' <<<"$plan")
  echo "-- $name, --kv-cache-dtype $t ${serve_args[*]}: ${plan#*memory plan on }"
  echo "   holds $((blocks * 16 / 8256)) sequences of 8,000 + 256 tokens at once (--gpu-memory-fraction $fraction)"
  "$dir/anvil-bench" --url tcp://127.0.0.1:18091 --random-token-ids --input-len 64 --output-len 8 --concurrency 4 \
    --num-prompts 8 --no-progress > /dev/null 2>&1  # warm-up
  local kvb; kvb=$(kv_bytes_per_pos "$t")
  for l in $loads; do
    IFS=: read -r c n in out <<<"$l"
    local r
    r=$("$dir/anvil-bench" --url tcp://127.0.0.1:18091 --random-token-ids --input-len "$in" --output-len "$out" \
        --concurrency "$c" --num-prompts "$n" --seed $((c + in)) --percentiles 99 --no-progress 2>&1)
    get() { sed -n "s/^$1 *\([0-9.]*\)/\1/p" <<<"$r" | head -1; }
    local failed; failed=$(get 'Failed requests:')
    [ "${failed:-1}" = 0 ] || { status=1; echo "$r" | tail -20; }
    awk -v t="$t" -v c="$c" -v n="$n" -v in_="$in" -v out="$out" -v f="${failed:-?}" -v w="${weights:-0}" -v kvb="$kvb" \
        -v bw="$copy_gbs" -v o="$(get 'Output token throughput (tok\/s):')" -v ttft="$(get 'Mean TTFT (ms):')" \
        -v p99="$(get 'P99 TTFT (ms):')" -v tpot="$(get 'Mean TPOT (ms):')" -v itl="$(get 'P99 ITL (ms):')" 'BEGIN {
      step = (w * 1e6 + c * (in_ + out / 2) * kvb) / (bw * 1e9)  # seconds per decode step at the limit
      lim = c / step
      printf "   %-5s %4d x %5d/%-5d %4s failed | out %8.0f tok/s, limit %8.0f (%5.1f%%) | TTFT %8.1f ms, p99 %8.1f | TPOT %6.2f ms (limit %5.2f), p99 ITL %6.1f\n",
             t, c, in_, out, f, o, lim, (lim > 0 ? 100 * o / lim : 0), ttft, p99, tpot, 1000 * step, itl }'
  done
  kill -TERM $server 2>/dev/null
  wait $server 2>/dev/null
}

for w in $workloads; do
  echo
  for t in $dtypes; do
    case $w in
      short) serve_and_bench "512 / 128" 1024 0.5 "64:128:512:128 256:512:512:128" "$t" ;;
      long) serve_and_bench "1,000 / 1,000" 2048 0.9 "256:256:1000:1000" "$t" ;;
      8k) serve_and_bench "8,000 / 256" 8448 0.9 "16:32:8000:256" "$t" ;;
    esac
  done
done
echo
echo "kv-figures: exit $status"
exit $status

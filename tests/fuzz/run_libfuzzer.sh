#!/usr/bin/env bash
# Runs every libFuzzer target of a -DANVIL_FUZZ=ON build for a bounded time, as many at once as
# there are cores, each on a scratch copy of its seed corpus (the committed corpus is never
# written). Fails when any target finds a crash, a leak, a timeout, a single allocation over
# 64 MB (the inputs are a few KB) or runs out of memory; the input that did it is left in the
# artifacts folder and printed, to fix and add to the corpus.
#   usage: tests/fuzz/run_libfuzzer.sh BUILD_DIR [SECONDS_PER_TARGET, default 60]
set -euo pipefail
build=$(cd "$1" && pwd)
seconds=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/anvil-fuzz.XXXXXX)
targets=(gguf tokenizer request_json chat_template structured line_session http_session)

run_one() {
  local t=$1
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  cp "$here/corpus/$t/"* "$work/$t/corpus/"
  # One thread for the CPU kernels' OpenMP: the targets run side by side on few cores.
  if OMP_NUM_THREADS=1 "$build/tests/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=64 -timeout=10 \
       -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" "$work/$t/corpus" > "$work/$t/log" 2>&1; then
    echo "ok"
  else
    echo "FAILED"
  fi > "$work/$t/result"
}
export -f run_one
export build seconds here work

printf '%s\n' "${targets[@]}" | xargs -P "$(nproc)" -I{} bash -c 'run_one {}'

status=0
for t in "${targets[@]}"; do
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t/log" | grep -o '[0-9]*$' || echo "?")
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$work/$t/log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$work/$t/log" | tail -1 || true)
  printf 'fuzz_%-14s %-6s %10s runs  %6s/s  %s\n' "$t" "$(cat "$work/$t/result")" "$execs" "$rate" "$cov"
  if [[ $(cat "$work/$t/result") != ok ]]; then
    status=1
    tail -n 60 "$work/$t/log"
    ls -l "$work/$t/artifacts/"
  fi
done
if [[ $status == 0 ]]; then rm -rf "$work"; else echo "fuzz artifacts kept in $work"; fi
exit $status

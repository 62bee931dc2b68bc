#!/usr/bin/env bash
# Runs on the GPU machine: the gpu-labelled tests from a bundle made by scripts/gpu-bundle.sh,
# plainly and under compute-sanitizer (memcheck) when it is there.
set -uo pipefail
dir=${1:-.device/bundle}
export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv || true
"$dir/anvil" info || status=1
suites=(kernels_gpu_test kernels_gpu_ops_test)
for t in "${suites[@]}"; do
  "$dir/$t" --gtest_color=no || status=1
done
if command -v compute-sanitizer >/dev/null; then
  for t in "${suites[@]}"; do
    compute-sanitizer --tool memcheck --error-exitcode 3 "$dir/$t" --gtest_color=no --gtest_brief=1 \
      | tail -n 5 || status=1
  done
fi
echo "run-gpu-tests: exit $status"
exit $status

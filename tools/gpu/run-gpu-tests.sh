#!/usr/bin/env bash
# Runs on the GPU machine: the gpu-labelled tests from a bundle made by scripts/gpu-bundle.sh,
# plainly and under compute-sanitizer (memcheck) when it is there, then the roofline benchmark.
#   tools/gpu/run-gpu-tests.sh [DIR] [--no-bench]
# cuBLAS comes from the machine's CUDA install (/usr/local/cuda/lib64), not from the bundle.
set -uo pipefail
dir=${1:-.device/bundle}
bench=1
[ "${2:-}" = "--no-bench" ] && bench=0
export LD_LIBRARY_PATH="$dir/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv || true
"$dir/anvil" info || status=1
"$dir/kernels_gpu_test" --gtest_color=no || status=1
"$dir/kernels_gpu_matmul_test" --gtest_color=no || status=1
"$dir/kernels_gpu_ops_test" --gtest_color=no || status=1
[ -x "$dir/gpu_worker_test" ] && { "$dir/gpu_worker_test" --gtest_color=no || status=1; }
if command -v compute-sanitizer >/dev/null; then
  for t in kernels_gpu_test kernels_gpu_ops_test; do
    compute-sanitizer --tool memcheck --error-exitcode 3 "$dir/$t" --gtest_color=no --gtest_brief=1 | tail -n 5 || status=1
  done
  # The matmul suite under memcheck is slow (hundreds of launches): its GEMV and embedding cases,
  # which cover every decode path, plus the GEMM cases of one quantized type.
  compute-sanitizer --tool memcheck --error-exitcode 3 "$dir/kernels_gpu_matmul_test" --gtest_color=no --gtest_brief=1 \
    --gtest_filter='*Gemv*:*Embedding*:*Dequantize*:*GemmGpu*Q6_K*:*GemmGpuLaunch*' | tail -n 5 || status=1
fi
if [ $bench -eq 1 ] && [ -x "$dir/gpu_roofline" ]; then
  "$dir/gpu_roofline" || status=1
fi
echo "run-gpu-tests: exit $status"
exit $status

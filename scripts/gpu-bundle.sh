#!/usr/bin/env bash
# Builds the CUDA configuration on this (GPU-less) machine and packs what the GPU machine needs
# to run it into DIR (default .device/bundle): the binaries and the few Debian shared libraries
# they load (spdlog, fmt). The CUDA runtime is linked statically; cuBLAS is not (this toolkit has
# no static cuBLAS, and libcublasLt alone is 540 MB): the binaries load the GPU machine's own
# /usr/local/cuda/lib64/libcublas*.so.13 (same CUDA 13.0). Run there with
# tools/gpu/run-gpu-tests.sh DIR (the tests) and bench/gpu-figures.sh DIR (the figures).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.device/bundle}
targets=(anvil anvil-bench kernels_gpu_test kernels_gpu_matmul_test kernels_gpu_ops_test gpu_worker_test gpu_roofline)

cmake -S . -B build-cuda -G Ninja -DANVIL_GPU=cuda -DANVIL_BUILD_BENCH=ON >/dev/null
cmake --build build-cuda -j2 --target "${targets[@]}"

rm -rf "$out"
mkdir -p "$out/lib"
cp build-cuda/anvil build-cuda/anvil-bench build-cuda/tests/kernels_gpu_test build-cuda/tests/kernels_gpu_matmul_test build-cuda/tests/kernels_gpu_ops_test \
   build-cuda/tests/gpu_worker_test build-cuda/bench/gpu_roofline "$out/"
for bin in "$out"/anvil "$out"/anvil-bench "$out"/kernels_gpu_test "$out"/kernels_gpu_matmul_test "$out"/kernels_gpu_ops_test "$out"/gpu_worker_test "$out"/gpu_roofline; do
  ldd "$bin" | awk '/=> \// && /lib(spdlog|fmt|boost|gomp)/ {print $3}' | xargs -r cp -n -t "$out/lib"
done
# Debug info is not needed there and the device machine takes at most 64 MiB per call.
strip --strip-debug "$out"/anvil "$out"/anvil-bench "$out"/kernels_gpu_test "$out"/kernels_gpu_matmul_test "$out"/kernels_gpu_ops_test "$out"/gpu_worker_test "$out"/gpu_roofline
du -sh "$out"

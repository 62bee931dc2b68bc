#!/usr/bin/env bash
# Builds the CUDA configuration on this (GPU-less) machine and packs what the GPU machine needs
# to run it into DIR (default .device/bundle): the binaries and the few Debian shared libraries
# they load (spdlog, fmt). The CUDA runtime is linked statically. Run there with
# tools/gpu/run-gpu-tests.sh DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.device/bundle}
targets=(anvil kernels_gpu_test kernels_gpu_ops_test)

cmake -S . -B build-cuda -G Ninja -DANVIL_GPU=cuda -DANVIL_BUILD_BENCH=OFF >/dev/null
cmake --build build-cuda -j2 --target "${targets[@]}"

rm -rf "$out"
mkdir -p "$out/lib"
cp build-cuda/anvil build-cuda/tests/kernels_gpu_test build-cuda/tests/kernels_gpu_ops_test "$out/"
for bin in "$out"/anvil "$out"/kernels_gpu_test "$out"/kernels_gpu_ops_test; do
  ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'lib(spdlog|fmt|boost|gomp)' | xargs -r cp -n -t "$out/lib"
done
du -sh "$out"

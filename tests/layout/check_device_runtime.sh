#!/usr/bin/env bash
# The one rule (DESIGN.md), checked on the source tree: only gpu_worker/ and kernels/ (and the
# tests that exercise them) may include the device runtime or call its allocators, and only
# their CMake targets may link it.
set -euo pipefail
root=${1:?usage: check_device_runtime.sh SOURCE_ROOT}
cd "$root"
status=0

src_dirs=(actors engine messages sched kv sampler model proto cli bench)
existing=()
for d in "${src_dirs[@]}"; do [ -d "$d" ] && existing+=("$d"); done

if [ ${#existing[@]} -gt 0 ]; then
  hits=$(grep -rnE '#include *[<"](hip/|cuda|cublas|kernels/gpu_runtime\.h)|\b(hip|cuda)(Malloc|MallocAsync|MallocManaged|MallocHost|HostAlloc|HostMalloc|MallocPitch|MemPoolCreate)\b' \
           --include='*.h' --include='*.hpp' --include='*.cpp' --include='*.cc' --include='*.hip' --include='*.cu' \
           "${existing[@]}" || true)
  if [ -n "$hits" ]; then
    echo "device runtime used outside gpu_worker/ and kernels/:"
    echo "$hits"
    status=1
  fi
  links=$(grep -rnE 'anvil_gpu_runtime|anvil_kernels_gpu|CUDA::|amdhip64' --include='CMakeLists.txt' --include='*.cmake' \
            "${existing[@]}" || true)
  if [ -n "$links" ]; then
    echo "device runtime linked outside gpu_worker/ and kernels/:"
    echo "$links"
    status=1
  fi
fi

[ $status -eq 0 ] && echo "ok: the device runtime appears only in gpu_worker/ and kernels/"
exit $status

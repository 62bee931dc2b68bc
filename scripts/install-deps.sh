#!/usr/bin/env bash
# Installs anvil's build dependencies from Debian 12 packages (run as root, or it uses sudo).
#   --gpu   also the AMD HIP compiler (hipcc) for -DANVIL_GPU=hip. NVIDIA builds use the CUDA
#           toolkit at /usr/local/cuda, which does not come from Debian.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config git
  libboost1.81-dev libboost-json1.81-dev   # Asio (actors), Beast (HTTP), JSON
  libspdlog-dev                            # logging (brings fmt)
  libcli11-dev                             # command line
  libpcre2-dev                             # tokenizer pre-tokenizer regexes
  libgtest-dev libgmock-dev                # tests
  libbenchmark-dev                         # micro benchmarks
)
if [[ "${1:-}" == "--gpu" ]]; then
  packages+=(hipcc libamdhip64-dev)
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q "${packages[@]}"

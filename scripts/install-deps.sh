#!/usr/bin/env bash
# Installs anvil's build and test dependencies on Debian 12: packages with apt (as root, or
# through sudo), then the test data that comes from the npm registry (as the current user).
#   --gpu   also the AMD HIP compiler (hipcc) for -DANVIL_GPU=hip. NVIDIA builds use the CUDA
#           toolkit at /usr/local/cuda, which does not come from Debian.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  cmake ninja-build g++ pkg-config git
  ccache                                   # compiler cache: rebuilds and CI's several build folders
  libboost1.81-dev libboost-json1.81-dev   # Asio (actors), Beast (HTTP), JSON
  libspdlog-dev                            # logging (brings fmt)
  libcli11-dev                             # command line
  libpcre2-dev                             # tokenizer pre-tokenizer regexes
  libgtest-dev libgmock-dev                # tests
  libbenchmark-dev                         # micro benchmarks
  clang libclang-rt-14-dev libomp-14-dev   # libFuzzer builds of tests/fuzz (clang 14, its OpenMP)
)
if [[ "${1:-}" == "--gpu" ]]; then
  packages+=(hipcc libamdhip64-dev)
fi
if ! command -v npm >/dev/null; then
  packages+=(nodejs npm)                   # test data, the independent GGUF reader, the OpenAI client
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q "${packages[@]}"

# Hugging Face's GGUF parser, which the gguf tests read anvil's files with.
npm ci --prefix tools/gguf-check --no-audit --no-fund --loglevel=error
# The OpenAI Node client, whose examples the HTTP API tests run (tests/proto/openai_client_test.cpp).
npm ci --prefix tests/proto/openai-js --no-audit --no-fund --loglevel=error
# Real tokenizers (Qwen3, Llama 3) for the tokenizer tests.
scripts/fetch-tokenizers.sh

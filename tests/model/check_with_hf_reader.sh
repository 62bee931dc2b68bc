#!/usr/bin/env bash
# Files `anvil synth` writes must load in other GGUF readers: each is read by Hugging Face's GGUF
# parser (tools/gguf-check, installed with `npm ci --prefix tools/gguf-check`) and compared
# key by key and tensor by tensor with anvil's own reading.
set -euo pipefail
anvil=${1:?usage: check_with_hf_reader.sh ANVIL SOURCE_DIR}
src=${2:?usage: check_with_hf_reader.sh ANVIL SOURCE_DIR}
if [ ! -d "$src/tools/gguf-check/node_modules/@huggingface/gguf" ]; then
  echo "the HF GGUF parser is not installed: run 'npm ci --prefix tools/gguf-check' (scripts/install-deps.sh does)"
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for spec in tiny:Q4_K_M tiny-qwen2:F16 tiny-qwen3:Q8_0 tiny:BF16 tiny-qwen3:Q6_K; do
  shape=${spec%%:*} type=${spec##*:}
  "$anvil" synth --shape "$shape" --type "$type" -o "$work/m.gguf" 2>/dev/null
  "$anvil" inspect "$work/m.gguf" --json "$work/m.json"
  node "$src/tools/gguf-check/check.mjs" "$work/m.gguf" "$work/m.json"
done
# --layers keeps the first N layers of a shape; the file says so and still reads everywhere.
"$anvil" synth --shape tiny-qwen3moe --type Q8_0 --layers 1 -o "$work/m.gguf" 2>/dev/null
"$anvil" inspect "$work/m.gguf" --json "$work/m.json"
node "$src/tools/gguf-check/check.mjs" "$work/m.gguf" "$work/m.json"
"$anvil" inspect "$work/m.gguf" | grep -Eq 'qwen3moe\.block_count +u32 +1$' || { echo "--layers 1 did not write one layer"; exit 1; }
for bad in 0 3; do
  if "$anvil" synth --shape tiny-qwen3moe --layers "$bad" -o "$work/bad.gguf" 2>"$work/err"; then
    echo "--layers $bad was accepted"; exit 1
  fi
  grep -q "outside 1..2" "$work/err" || { echo "--layers $bad: unclear error: $(cat "$work/err")"; exit 1; }
done

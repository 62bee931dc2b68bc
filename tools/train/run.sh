#!/usr/bin/env bash
# The default model's whole pipeline on the GPU machine: tokenizer -> training -> GGUF export ->
# goldens. The corpus comes from make_corpus.py, run beforehand on a Debian machine (it needs apt).
#
#   tools/train/run.sh CORPUS_DIR OUT_DIR [train.py options, e.g. --minutes 6]
#
# OUT_DIR gets tokenizer.json, model.pt, train.json, train.log, anvil-kjv-f16.gguf,
# anvil-kjv-q8_0.gguf and anvil-kjv-q8_0.json (the goldens). See tools/train/README.md.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,8p' "$0"
  exit 2
fi
corpus=$1 out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
for f in train.txt heldout.txt heldout-small.txt; do
  [[ -s $corpus/$f ]] || { echo "run.sh: $corpus/$f is missing: run tools/train/make_corpus.py $corpus first" >&2; exit 1; }
done
committed=$here/../../tests/data/default-model/heldout-small.txt
if [[ -f $committed ]] && ! cmp -s "$committed" "$corpus/heldout-small.txt"; then
  echo "run.sh: $corpus/heldout-small.txt differs from tests/data/default-model/heldout-small.txt" >&2
  exit 1
fi
mkdir -p "$out"
start=$(date +%s)
step() { echo "== $1 ($(($(date +%s) - start))s)"; }

step "tokenizer"
python3 "$here/train_tokenizer.py" "$corpus" "$out"
step "training"
python3 "$here/train.py" "$corpus" "$out/tokenizer.json" "$out" "$@" 2>&1 | tee "$out/train.log"
step "export"
python3 "$here/export_gguf.py" "$out/model.pt" "$out/tokenizer.json" "$out"
step "goldens"
python3 "$here/make_goldens.py" "$out/anvil-kjv-q8_0.gguf" "$out/model.pt" "$out/tokenizer.json" \
  "$corpus/heldout-small.txt" "$out/anvil-kjv-q8_0.json"
step "done"
ls -l "$out"

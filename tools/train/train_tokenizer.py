#!/usr/bin/env python3
"""Trains the default model's tokenizer: byte-level BPE with the `tokenizers` library, built the
way Llama 3's is, so that anvil runs it as GGUF `tokenizer.ggml.model = "gpt2"`,
`tokenizer.ggml.pre = "llama-bpe"`:
  - pre-tokenizer: Split on Llama 3's regex (Isolated), then ByteLevel without its own regex;
  - model: BPE with ignore_merges (a piece that is itself a token is emitted whole: anvil does
    this for "llama-bpe", as llama.cpp and Llama 3's tokenizer.json do);
  - no normalizer; ByteLevel decoder; BOS added in front by the post-processor.
Ids: 0 <|begin_of_text|> (BOS), 1 <|end_of_text|> (EOS), then the 256 byte tokens, then merges.

Usage: python3 train_tokenizer.py CORPUS_DIR OUT_DIR [--vocab 4096]
Reads CORPUS_DIR/train.txt (documents separated by blank lines); writes OUT_DIR/tokenizer.json.
"""
import argparse
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# Llama 3's pre-tokenizer regex, exactly as its tokenizer.json has it (anvil: model/tokenizer/pretokenize.cpp).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in f.read().split("\n\n") if d.strip()]


def with_ignore_merges(tok):
    """The trained tokenizer with model.ignore_merges = true, checked (needs tokenizers >= 0.19)."""
    js = json.loads(tok.to_str())
    js["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(js))
    if json.loads(tok.to_str())["model"].get("ignore_merges") is not True:
        raise SystemExit("train_tokenizer: this tokenizers version has no BPE ignore_merges (need >= 0.19)")
    return tok


def train(docs, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    tok = with_ignore_merges(tok)
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1, "special tokens must be ids 0 and 1"
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, 0)])
    return tok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=4096)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    docs = read_docs(os.path.join(a.corpus, "train.txt"))
    tok = train(docs, a.vocab)
    path = os.path.join(a.out, "tokenizer.json")
    tok.save(path)

    sample = read_docs(os.path.join(a.corpus, "heldout.txt"))
    n_bytes = sum(len(d.encode("utf-8")) for d in sample)
    n_tokens = sum(len(e.ids) for e in tok.encode_batch(sample, add_special_tokens=False))
    print(f"tokenizer: {tok.get_vocab_size()} tokens, {n_bytes / n_tokens:.2f} bytes/token on heldout.txt -> {path}")
    print("example:", tok.encode("And God said, Let there be light.").tokens)


if __name__ == "__main__":
    main()

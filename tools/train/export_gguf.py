#!/usr/bin/env python3
"""Writes the trained default model as GGUF for anvil (architecture `llama`), in F16 and Q8_0.

Usage: python3 export_gguf.py MODEL_PT TOKENIZER_JSON OUT_DIR [--name anvil-kjv]
Writes OUT_DIR/NAME-f16.gguf and OUT_DIR/NAME-q8_0.gguf (Q8_0 is the one anvil ships).

  - metadata: the keys anvil's loader reads for `llama` (model/arch/llm.cpp) as llama.cpp's converter
    writes them; tokenizer.ggml.* from tokenizer.json: model "gpt2", pre "llama-bpe", tokens by
    id, token types (3 control for the two special tokens, 1 normal otherwise), merges as "left
    right", BOS/EOS ids, add_bos_token true. No chat template: the model was not trained on chat.
  - weights: q_proj and k_proj rows permuted (rotate_half pairs -> adjacent pairs), as
    convert_hf_to_gguf.py does for llama, so anvil's normal-mode RoPE equals the training code's;
    matrices in F16 or Q8_0 (token embedding and output head included), norms in F32.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from gguf_writer import GGUFWriter  # noqa: E402

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
FILE_TYPE = {"F16": 1, "Q8_0": 7}  # general.file_type: llama.cpp's LLAMA_FTYPE_MOSTLY_*


def permute_for_llama(w, n_head):
    # convert_hf_to_gguf.py's LlamaModel.permute: rotate_half pairs -> adjacent pairs.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_for_llama(w, n_head):
    # The inverse of permute_for_llama (make_goldens.py rebuilds the training layout with it).
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tokenizer_metadata(path):
    """(tokens by id, token types, merges as "left right") from a tokenizer.json."""
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    model = tj["model"]
    if model["type"] != "BPE" or not model.get("ignore_merges"):
        raise SystemExit("export_gguf: expected a byte-level BPE tokenizer.json with ignore_merges (train_tokenizer.py)")
    vocab = dict(model["vocab"])
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    n = max(vocab.values()) + 1
    tokens = [None] * n
    for text, i in vocab.items():
        tokens[i] = text
    if any(t is None for t in tokens):
        raise SystemExit("export_gguf: the vocabulary has holes")
    special = {t["content"] for t in tj.get("added_tokens", []) if t.get("special")}
    if special != {BOS, EOS}:
        raise SystemExit(f"export_gguf: expected special tokens {BOS}, {EOS}; got {sorted(special)}")
    types = [3 if t in special else 1 for t in tokens]
    # tokenizers < 0.20 writes merges as "a b", later versions as ["a", "b"].
    merges = [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in model["merges"]]
    return tokens, types, merges


def write(cfg, sd, tokenizer_path, qtype, name, path):
    hd = cfg["dim"] // cfg["n_heads"]
    w = GGUFWriter()
    w.string("general.architecture", "llama")
    w.string("general.name", name)
    w.string("general.description", "anvil's default model: a small Llama trained on the King James Bible and fortunes")
    w.u32("general.file_type", FILE_TYPE[qtype])
    if qtype == "Q8_0":
        w.u32("general.quantization_version", 2)
    w.u32("llama.vocab_size", cfg["vocab_size"])
    w.u32("llama.context_length", cfg["context_length"])
    w.u32("llama.embedding_length", cfg["dim"])
    w.u32("llama.block_count", cfg["n_layers"])
    w.u32("llama.feed_forward_length", cfg["ffn_dim"])
    w.u32("llama.attention.head_count", cfg["n_heads"])
    w.u32("llama.attention.head_count_kv", cfg["n_kv_heads"])
    w.u32("llama.rope.dimension_count", hd)
    w.f32("llama.rope.freq_base", cfg["rope_theta"])
    w.f32("llama.attention.layer_norm_rms_epsilon", cfg["norm_eps"])

    tokens, types, merges = tokenizer_metadata(tokenizer_path)
    if len(tokens) != cfg["vocab_size"]:
        raise SystemExit(f"export_gguf: tokenizer has {len(tokens)} tokens, the model {cfg['vocab_size']}")
    w.string("tokenizer.ggml.model", "gpt2")
    w.string("tokenizer.ggml.pre", "llama-bpe")
    w.strings("tokenizer.ggml.tokens", tokens)
    w.i32s("tokenizer.ggml.token_type", types)
    w.strings("tokenizer.ggml.merges", merges)
    w.u32("tokenizer.ggml.bos_token_id", tokens.index(BOS))
    w.u32("tokenizer.ggml.eos_token_id", tokens.index(EOS))
    w.bool("tokenizer.ggml.add_bos_token", True)
    w.bool("tokenizer.ggml.add_eos_token", False)

    mat = lambda n, a: w.tensor(n, a, qtype)
    vec = lambda n, a: w.tensor(n, a, "F32")
    mat("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg["n_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        vec(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        mat(b + "attn_q.weight", permute_for_llama(sd[p + "self_attn.q_proj.weight"], cfg["n_heads"]))
        mat(b + "attn_k.weight", permute_for_llama(sd[p + "self_attn.k_proj.weight"], cfg["n_kv_heads"]))
        mat(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        mat(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        vec(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        mat(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        mat(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        mat(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    vec("output_norm.weight", sd["model.norm.weight"])
    mat("output.weight", sd["lm_head.weight"])
    w.write(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_pt")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--name", default="anvil-kjv")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ck = torch.load(a.model_pt, map_location="cpu")
    sd = {k: v.float().numpy() for k, v in ck["state_dict"].items()}
    for qtype in ("F16", "Q8_0"):
        path = os.path.join(a.out, f"{a.name}-{qtype.lower()}.gguf")
        write(ck["config"], sd, a.tokenizer, qtype, a.name, path)
        print(f"{path}: {os.path.getsize(path) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Goldens for the shipped default model: what anvil must reproduce from the GGUF file.

Usage: python3 make_goldens.py MODEL_GGUF MODEL_PT TOKENIZER_JSON HELDOUT_SMALL_TXT OUT_JSON

The reference model is built from the GGUF file's own weights (dequantized exactly as anvil
dequantizes them, q/k rows un-permuted back to the training layout) and run with PyTorch in
float32 on the CPU, so anvil and PyTorch compute the same function and differ only in rounding.
Before that, three cross-checks (printed, and stored under "checks"):
  - the GGUF weights against the checkpoint's (within the quantization error);
  - the logits of the GGUF model against the checkpoint model's (F16/Q8_0 vs float32);
  - the plain model (llama_model.py) against transformers' LlamaForCausalLM on the checkpoint
    (skipped when transformers is not installed): the architecture is what anvil runs.

It writes:
  greedy:     for each prompt, BOS + its tokens, then 64 argmax tokens (EOS does not stop it;
              full recompute per step), with the top-1 minus top-2 logit margin of every step.
  perplexity: over HELDOUT_SMALL_TXT tokenised as BOS + tokens (the model adds BOS), by sliding
              windows -- the algorithm anvil implements in model/arch/perplexity.h:
                windows start at 0, stride, 2*stride, ...; window [b, e) with e = min(b + ctx, n);
                each window is run from position 0 on its own (no cache carried over);
                it scores the tokens i in [max(prev_e, b + 1), e), prev_e being the end of the
                previous window (0 before the first), by -log softmax(logits[i - 1])[ids[i]]
                (log-softmax in float64); the last window is the first that reaches e = n.
              So with stride < ctx every token but the first is scored exactly once, each with at
              least ctx - stride tokens of context (all it has, within the first window).
              ctx = the model's context length, stride = ctx / 2. Perplexity = exp(NLL sum / scored).
  tokenize:   `tokenizers` ids (no BOS) for every non-empty line of HELDOUT_SMALL_TXT and a few
              harder strings.
"""
import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
from export_gguf import tokenizer_metadata, unpermute_for_llama  # noqa: E402
from gguf_reader import GGUFReader  # noqa: E402
from llama_model import Llama, config, load_checkpoint  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

PROMPTS = ["And God said", "In the beginning", "The LORD is my shepherd", "A fool and his money"]
N_GREEDY = 64
EXTRA_STRINGS = [
    "Hello, world!",
    "It's 1234567 o'clock; they'll say \"don't\" and WE'VE said 'no'.",
    "  leading spaces\tand\ttabs   and trailing  ",
    "line one\nline two\n\n\nthree\r\nfour",
    "naïve café — “quoted” ½ € 😀 日本語",
    "UPPER lower MiXeD 3.14159 2,000,000 1st 22nd",
    "The LORD's house, and the LORD'S; thee, thou, thy.",
    "x" * 40 + " " + "ab" * 30,
]


def sum64(path):
    """Wrapping sum of the file's little-endian 64-bit words (zero-padded): ties goldens to a file."""
    with open(path, "rb") as f:
        data = f.read()
    data += b"\0" * (-len(data) % 8)
    return f"{int(np.frombuffer(data, '<u8').sum(dtype=np.uint64)):016x}"


def model_from_gguf(path):
    g = GGUFReader(path)
    md = g.metadata
    if md["general.architecture"] != "llama":
        raise SystemExit("make_goldens: expected a llama GGUF")
    cfg = config(vocab_size=g.tensor_infos["token_embd.weight"][0][1], context_length=md["llama.context_length"],
                 dim=md["llama.embedding_length"], n_layers=md["llama.block_count"], n_heads=md["llama.attention.head_count"],
                 n_kv_heads=md["llama.attention.head_count_kv"], ffn_dim=md["llama.feed_forward_length"],
                 rope_theta=float(md["llama.rope.freq_base"]), norm_eps=float(md["llama.attention.layer_norm_rms_epsilon"]))
    sd = {"model.embed_tokens.weight": g.tensor("token_embd.weight"), "model.norm.weight": g.tensor("output_norm.weight"),
          "lm_head.weight": g.tensor("output.weight")}
    for i in range(cfg.n_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        sd[p + "input_layernorm.weight"] = g.tensor(b + "attn_norm.weight")
        sd[p + "self_attn.q_proj.weight"] = unpermute_for_llama(g.tensor(b + "attn_q.weight"), cfg.n_heads)
        sd[p + "self_attn.k_proj.weight"] = unpermute_for_llama(g.tensor(b + "attn_k.weight"), cfg.n_kv_heads)
        sd[p + "self_attn.v_proj.weight"] = g.tensor(b + "attn_v.weight")
        sd[p + "self_attn.o_proj.weight"] = g.tensor(b + "attn_output.weight")
        sd[p + "post_attention_layernorm.weight"] = g.tensor(b + "ffn_norm.weight")
        sd[p + "mlp.gate_proj.weight"] = g.tensor(b + "ffn_gate.weight")
        sd[p + "mlp.up_proj.weight"] = g.tensor(b + "ffn_up.weight")
        sd[p + "mlp.down_proj.weight"] = g.tensor(b + "ffn_down.weight")
    m = Llama(cfg)
    m.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()})
    return m.float().eval(), g


def logits_of(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]))[0].float()


def rel_err(a, b):
    return float((a - b).norm() / b.norm())


def hf_check(model, probe):
    """Relative difference of the plain model's logits from transformers' LlamaForCausalLM."""
    try:
        import transformers
    except ImportError:
        return None
    try:
        return _hf_check(transformers, model, probe)
    except Exception as e:  # an API change in transformers, not a disagreement: say so, go on
        print(f"warning: transformers cross-check skipped: {type(e).__name__}: {e}")
        return None


def _hf_check(transformers, model, probe):
    c = model.cfg
    hf_cfg = transformers.LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn_dim,
                                      num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                                      num_key_value_heads=c.n_kv_heads, max_position_embeddings=c.context_length,
                                      rope_theta=c.rope_theta, rms_norm_eps=c.norm_eps, tie_word_embeddings=False,
                                      attention_bias=False, mlp_bias=False)
    hf = transformers.LlamaForCausalLM(hf_cfg).float().eval()
    hf.config._attn_implementation = "eager"
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    if [k for k in missing if "rotary" not in k] or unexpected:
        raise SystemExit(f"make_goldens: state dict does not fit LlamaForCausalLM: {missing} {unexpected}")
    with torch.no_grad():
        ref = hf(torch.tensor([probe])).logits[0].float()
    return rel_err(logits_of(model, probe), ref)


def greedy(model, ids):
    ids, tokens, margins = list(ids), [], []
    for _ in range(N_GREEDY):
        top = torch.topk(logits_of(model, ids)[-1], 2)
        tokens.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(tokens[-1])
    return tokens, margins


def perplexity(model, ids, ctx, stride):
    nll_sum, scored, window_nll, begin, prev_end = 0.0, 0, [], 0, 0
    while True:
        end = min(begin + ctx, len(ids))
        first = max(prev_end, begin + 1)
        if first < end:
            logp = torch.log_softmax(logits_of(model, ids[begin:end]).double(), dim=-1)
            rows = torch.arange(first - 1 - begin, end - 1 - begin)
            nll = float(-logp[rows, torch.tensor(ids[first:end])].sum())
        else:
            nll = 0.0
        window_nll.append(nll)
        nll_sum += nll
        scored += max(0, end - first)
        prev_end = end
        if end == len(ids):
            break
        begin += stride
    return {"ctx": ctx, "stride": stride, "n_tokens": len(ids), "n_scored": scored, "n_windows": len(window_nll),
            "nll_sum": nll_sum, "mean_nll": nll_sum / scored, "perplexity": math.exp(nll_sum / scored),
            "window_nll": window_nll}


def main(gguf_path, pt_path, tokenizer_path, heldout_path, out_path):
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    torch.manual_seed(0)
    model, g = model_from_gguf(gguf_path)
    tok = Tokenizer.from_file(tokenizer_path)
    tokens, _, _ = tokenizer_metadata(tokenizer_path)
    if g.metadata["tokenizer.ggml.tokens"] != tokens:
        raise SystemExit("make_goldens: the GGUF's tokens differ from tokenizer.json's")
    bos = g.metadata["tokenizer.ggml.bos_token_id"]
    assert g.metadata["tokenizer.ggml.add_bos_token"] and bos == tok.token_to_id("<|begin_of_text|>")

    # Cross-checks against the checkpoint (and transformers).
    pt_model, _ = load_checkpoint(pt_path)
    pt_sd, gg_sd = pt_model.state_dict(), model.state_dict()
    weight_err = max(float((gg_sd[k] - pt_sd[k]).abs().max() / pt_sd[k].abs().max()) for k in pt_sd)
    probe = [bos] + tok.encode("And God said, Let there be light: and there was light.", add_special_tokens=False).ids
    checks = {"max_weight_err_rel_to_absmax": weight_err,
              "gguf_vs_checkpoint_logits_rel_err": rel_err(logits_of(model, probe), logits_of(pt_model, probe)),
              "checkpoint_vs_transformers_logits_rel_err": hf_check(pt_model, probe)}
    print("checks:", json.dumps(checks))
    if weight_err > 0.01 or checks["gguf_vs_checkpoint_logits_rel_err"] > 0.05:
        raise SystemExit("make_goldens: the GGUF does not hold the checkpoint's weights (permutation? export?)")
    if checks["checkpoint_vs_transformers_logits_rel_err"] is not None and checks["checkpoint_vs_transformers_logits_rel_err"] > 1e-4:
        raise SystemExit("make_goldens: the plain model and transformers' Llama disagree")

    golden = {"model_file": os.path.basename(gguf_path), "model_bytes": os.path.getsize(gguf_path),
              "model_sum64": sum64(gguf_path), "checks": checks, "greedy": []}
    for p in PROMPTS:
        ids = [bos] + tok.encode(p, add_special_tokens=False).ids
        out, margins = greedy(model, ids)
        golden["greedy"].append({"prompt": p, "prompt_ids": ids, "tokens": out, "margins": margins,
                                 "text": tok.decode(out, skip_special_tokens=False)})
        print(f"greedy {p!r}: {golden['greedy'][-1]['text']!r} (min margin {min(margins):.4f})")

    with open(heldout_path, encoding="utf-8") as f:
        text = f.read()
    ids = [bos] + tok.encode(text, add_special_tokens=False).ids
    ctx = model.cfg.context_length
    ppl = perplexity(model, ids, ctx, ctx // 2)
    ppl.update(file=os.path.basename(heldout_path), text_bytes=len(text.encode("utf-8")), add_bos=True, ids=ids)
    golden["perplexity"] = ppl
    print(f"perplexity {ppl['perplexity']:.4f} over {ppl['n_scored']} tokens ({ppl['n_windows']} windows), "
          f"mean NLL {ppl['mean_nll']:.6f}")

    lines = [line for line in text.split("\n") if line.strip()]
    golden["tokenize"] = [{"text": s, "ids": tok.encode(s, add_special_tokens=False).ids} for s in lines + EXTRA_STRINGS]
    import tokenizers
    golden["versions"] = {"torch": torch.__version__, "tokenizers": tokenizers.__version__}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False)
    print(f"wrote {out_path} ({len(golden['tokenize'])} tokenizer strings)")


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])

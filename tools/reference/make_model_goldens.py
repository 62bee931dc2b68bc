"""Reference logits for anvil's CPU forward pass (run on the GPU machine: PyTorch + transformers).

For each architecture (llama, qwen2, qwen3) it builds a small random-init HF model, writes it to
GGUF the way llama.cpp's converter does (Q/K rows permuted for `llama`, so its interleaved RoPE
equals HF's rotate_half), runs it in float32 on the CPU and stores, next to the GGUF:
  - the logits of every position of two prompts (run separately, so positions start at 0);
  - 64 greedy tokens continuing the first prompt.
Usage: python3 make_model_goldens.py OUT_DIR
"""
import json
import os
import sys

import numpy as np
import torch
import transformers

from gguf_writer import GGUFWriter

VOCAB = 272  # 256 byte tokens + 3 control tokens + reserved filler, like anvil's synthetic tokenizer

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
CONFIGS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
              dict(COMMON, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(COMMON, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(COMMON, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                   head_dim=32, num_attention_heads=4)),
}


def byte_tokens():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def rope_theta_of(cfg):
    # transformers 5 keeps it in rope_parameters; older versions in rope_theta.
    params = getattr(cfg, "rope_parameters", None)
    if params and "rope_theta" in params:
        assert params.get("rope_type", "default") == "default", params
        return float(params["rope_theta"])
    return float(cfg.rope_theta)


def permute_for_llama(w, n_head):
    # convert_hf_to_gguf.py's LlamaModel.permute: rotate_half pairs -> adjacent pairs.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(arch, cfg, model, path):
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = GGUFWriter()
    w.string("general.architecture", arch)
    w.string("general.name", f"anvil reference {arch}")
    w.u32(f"{arch}.context_length", cfg.max_position_embeddings)
    w.u32(f"{arch}.embedding_length", cfg.hidden_size)
    w.u32(f"{arch}.block_count", cfg.num_hidden_layers)
    w.u32(f"{arch}.feed_forward_length", cfg.intermediate_size)
    w.u32(f"{arch}.attention.head_count", cfg.num_attention_heads)
    w.u32(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    w.u32(f"{arch}.attention.key_length", head_dim)
    w.u32(f"{arch}.attention.value_length", head_dim)
    w.f32(f"{arch}.rope.freq_base", rope_theta_of(cfg))
    w.f32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    tokens = byte_tokens() + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens += [f"<|reserved_{i}|>" for i in range(len(tokens), VOCAB)]
    w.string("tokenizer.ggml.model", "gpt2")
    w.string("tokenizer.ggml.pre", "qwen2")
    w.strings("tokenizer.ggml.tokens", tokens)
    w.i32s("tokenizer.ggml.token_type", [1] * 256 + [3] * 3 + [5] * (VOCAB - 259))
    w.u32("tokenizer.ggml.eos_token_id", 256)
    w.bool("tokenizer.ggml.add_bos_token", False)

    w.tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if arch == "llama":
            q, k = permute_for_llama(q, cfg.num_attention_heads), permute_for_llama(k, cfg.num_key_value_heads)
        w.tensor(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        w.tensor(b + "attn_q.weight", q)
        w.tensor(b + "attn_k.weight", k)
        w.tensor(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        if arch == "qwen2":
            for n in "qkv":
                w.tensor(b + f"attn_{n}.bias", sd[p + f"self_attn.{n}_proj.bias"])
        if arch == "qwen3":
            w.tensor(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            w.tensor(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        w.tensor(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        w.tensor(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        w.tensor(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        w.tensor(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        w.tensor(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.tensor("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        w.tensor("output.weight", sd["lm_head.weight"])
    w.write(path)


def randomise(model, gen):
    # Norm weights and biases away from their 1/0 initialisation, so a forgotten one shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def main(out):
    os.makedirs(out, exist_ok=True)
    summary = {}
    for arch, (config_cls, model_cls, kw) in CONFIGS.items():
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3}[arch])
        cfg = config_cls(**kw)
        model = model_cls(cfg).eval().float()
        model.config._attn_implementation = "eager"
        randomise(model, gen)
        write_gguf(arch, cfg, model, os.path.join(out, f"ref-{arch}.gguf"))

        prompts = [torch.randint(0, 259, (n,), generator=gen).tolist() for n in (23, 9)]
        logits = []
        with torch.no_grad():
            for p in prompts:
                logits.append(model(torch.tensor([p])).logits[0].float().numpy())
            ids = torch.tensor([prompts[0]])
            greedy = []
            for _ in range(64):
                nxt = int(model(ids).logits[0, -1].argmax())
                greedy.append(nxt)
                ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
        np.concatenate(logits).astype("<f4").tofile(os.path.join(out, f"ref-{arch}.logits.f32"))
        golden = {"arch": arch, "vocab": VOCAB, "prompts": prompts, "greedy": greedy,
                  "transformers": transformers.__version__, "torch": torch.__version__}
        with open(os.path.join(out, f"ref-{arch}.json"), "w") as f:
            json.dump(golden, f)
        summary[arch] = {"greedy_first": greedy[:8], "logit_std": float(np.concatenate(logits).std())}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])

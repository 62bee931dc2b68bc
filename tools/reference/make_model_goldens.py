"""Reference logits for anvil's CPU forward pass (run on the GPU machine: PyTorch + transformers).

For each architecture (llama, qwen2, qwen3, qwen2moe, qwen3moe, mixtral: llama with experts,
gpt-oss, gemma3, gemma4, gemma4e, qwen35, qwen35moe and mistral3) it builds a small random-init HF model, writes it to
GGUF the way llama.cpp's converter does (Q/K rows permuted for `llama`, so its interleaved RoPE
equals HF's rotate_half), runs it in float32 on the CPU and stores, next to the GGUF:
  - the logits of every position of two prompts (run separately, so positions start at 0);
  - 64 greedy tokens continuing the first prompt.
Usage: python3 make_model_goldens.py OUT_DIR [ARCH ...]   (default: every architecture)
"""
import json
import os
import sys

import numpy as np
import torch
import transformers

from gguf_writer import GGUFWriter

VOCAB = 272  # 256 byte tokens + 3 control tokens + reserved filler, like anvil's synthetic tokenizer
QWEN35_ROPE = {"theta": 10000000.0, "partial": 0.25}
# mistral3 (Ministral 3): YaRN x16 over an original context of 8 (so the prompts pass it), HF's
# mscale = mscale_all_dim = 1 (no magnitude factor), Llama 4's query temperature with beta 0.1.
MISTRAL3_ROPE = dict(theta=1000000.0, factor=16.0, original=8, beta_fast=32.0, beta_slow=1.0, temp=0.1)
# gemma4: the sliding layers' base, the global layers' base and the quarter of their pairs that turn.
GEMMA4_ROPE = {"local": 10000.0, "global": 1000000.0, "partial": 0.25}
GEMMA4_GLOBAL = {"head_dim": 64, "kv_heads": 1}  # the global layers' heads (HF pops these into per_layer_config)
GEMMA3_ROPE = {"global": 1000000.0, "local": 10000.0, "factor": 8.0}  # the global layers' base and linear factor; the sliding layers' base

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
    # Mixtures of experts. Each expert's width differs from half the hidden size, so the fused
    # expert layouts of newer transformers read unambiguously (see expert_matrices).
    "qwen3moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                 dict(COMMON, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      head_dim=32, num_attention_heads=4, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=48, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])),
    "qwen2moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                 dict(COMMON, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                      shared_expert_intermediate_size=96, norm_topk_prob=False, decoder_sparse_step=1,
                      mlp_only_layers=[], qkv_bias=True)),
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                dict(COMMON, rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                     num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
    # gpt-oss: a window of 8 on layer 0 (the first prompt is 23 tokens), full attention on layer 1,
    # YaRN over an original context of 64, sinks, biases, the clamped SwiGLU; head_dim 32 x 4 heads
    # is wider than the hidden size, as in the real model.
    "gpt-oss": (getattr(transformers, "GptOssConfig", None), getattr(transformers, "GptOssForCausalLM", None),
                dict(COMMON, intermediate_size=48, rope_theta=150000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                     head_dim=32, num_local_experts=8, num_experts_per_tok=2, sliding_window=8,
                     layer_types=["sliding_attention", "full_attention"], attention_bias=True,
                     rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                                       original_max_position_embeddings=64))),
    # gemma3: six layers so the sixth is global (the pattern GGUF files imply), a window of 8 on
    # the other five, their own RoPE base (10000) against the global layers' linearly scaled one,
    # the sandwich norms, GeGLU and the scaled embedding; tied head, as the real models.
    "gemma3": (getattr(transformers, "Gemma3TextConfig", None), getattr(transformers, "Gemma3ForCausalLM", None),
               dict(COMMON, num_hidden_layers=6, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=32, sliding_window=8,
                    layer_types=["sliding_attention"] * 5 + ["full_attention"], final_logit_softcapping=None,
                    attn_logit_softcapping=None, rope_theta=GEMMA3_ROPE["global"], rope_local_base_freq=GEMMA3_ROPE["local"],
                    rope_scaling=dict(rope_type="linear", factor=GEMMA3_ROPE["factor"]))),
    # gemma4 (Gemma 4 text, as the 31B): five sliding layers (window 8, heads of 32 on two KV heads,
    # their own RoPE base) to one global (heads of 64 on one KV head, V its K projection, RoPE on a
    # quarter of the pairs); V normalised, scores unscaled, a scalar per layer's output, logits
    # soft-capped at 5 (so that the cap bites on these small logits); tied head.
    "gemma4": (getattr(transformers, "Gemma4TextConfig", None), getattr(transformers, "Gemma4ForCausalLM", None),
               dict(COMMON, num_hidden_layers=6, head_dim=32, global_head_dim=GEMMA4_GLOBAL["head_dim"],
                    num_global_key_value_heads=GEMMA4_GLOBAL["kv_heads"],
                    attention_k_eq_v=True, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    hidden_activation="gelu_pytorch_tanh", sliding_window=8,
                    layer_types=["sliding_attention"] * 5 + ["full_attention"], final_logit_softcapping=5.0,
                    hidden_size_per_layer_input=0, num_kv_shared_layers=0, enable_moe_block=False,
                    use_double_wide_mlp=False,
                    rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=GEMMA4_ROPE["local"]),
                                     "full_attention": dict(rope_type="proportional", rope_theta=GEMMA4_ROPE["global"],
                                                            partial_rotary_factor=GEMMA4_ROPE["partial"])})),
    # gemma4moe (Gemma 4 26B-A4B's make): the same layers, each feed-forward a dense one (96 wide)
    # beside eight experts of 48, two used, routed on the residual.
    "gemma4moe": (getattr(transformers, "Gemma4TextConfig", None), getattr(transformers, "Gemma4ForCausalLM", None),
                  dict(COMMON, intermediate_size=96, num_hidden_layers=6, head_dim=32,
                       global_head_dim=GEMMA4_GLOBAL["head_dim"], num_global_key_value_heads=GEMMA4_GLOBAL["kv_heads"],
                       attention_k_eq_v=True, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       hidden_activation="gelu_pytorch_tanh", sliding_window=8,
                       layer_types=["sliding_attention"] * 5 + ["full_attention"], final_logit_softcapping=5.0,
                       hidden_size_per_layer_input=0, num_kv_shared_layers=0, enable_moe_block=True,
                       num_experts=8, top_k_experts=2, moe_intermediate_size=48, use_double_wide_mlp=False,
                       rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=GEMMA4_ROPE["local"]),
                                        "full_attention": dict(rope_type="proportional", rope_theta=GEMMA4_ROPE["global"],
                                                               partial_rotary_factor=GEMMA4_ROPE["partial"])})),
    # gemma4e (Gemma 4 E2B / E4B's make): gemma4's layers, eight of them, with per-layer token
    # embeddings of 16 per layer, the last two layers (a sliding and a global one) on the KV of layers
    # 4 and 5, and their feed-forwards double-wide.
    "gemma4e": (getattr(transformers, "Gemma4TextConfig", None), getattr(transformers, "Gemma4ForCausalLM", None),
                dict(COMMON, num_hidden_layers=8, head_dim=32, global_head_dim=GEMMA4_GLOBAL["head_dim"],
                     num_global_key_value_heads=GEMMA4_GLOBAL["kv_heads"],
                     attention_k_eq_v=True, rms_norm_eps=1e-6, tie_word_embeddings=True,
                     hidden_activation="gelu_pytorch_tanh", sliding_window=8,
                     layer_types=["sliding_attention"] * 5 + ["full_attention", "sliding_attention", "full_attention"],
                     final_logit_softcapping=5.0, hidden_size_per_layer_input=16, vocab_size_per_layer_input=VOCAB,
                     num_kv_shared_layers=2, use_double_wide_mlp=True, enable_moe_block=False,
                     rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=GEMMA4_ROPE["local"]),
                                      "full_attention": dict(rope_type="proportional", rope_theta=GEMMA4_ROPE["global"],
                                                             partial_rotary_factor=GEMMA4_ROPE["partial"])})),
    # qwen35 (Qwen3.5, dense): three gated DeltaNet layers then a gated full-attention layer, twice
    # the value heads of key heads (the head order the converter rewrites), RoPE on a quarter of
    # each head (8 of 32 dims; the multimodal sections all see the text position).
    "qwen35": (getattr(transformers, "Qwen3_5TextConfig", None), getattr(transformers, "Qwen3_5ForCausalLM", None),
               dict(COMMON, num_hidden_layers=4, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    layer_types=["linear_attention"] * 3 + ["full_attention"], linear_conv_kernel_dim=4,
                    linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                    hidden_act="silu", attention_bias=False,
                    rope_parameters=dict(rope_type="default", rope_theta=QWEN35_ROPE["theta"],
                                         partial_rotary_factor=QWEN35_ROPE["partial"], mrope_section=[2, 1, 1],
                                         mrope_interleaved=True))),
    # qwen35moe (Qwen3.5 / 3.6 MoE): the same layers, every feed-forward routed experts (softmax,
    # top-2 of 8, renormalised) plus a shared expert behind its sigmoid gate.
    "qwen35moe": (getattr(transformers, "Qwen3_5MoeTextConfig", None), getattr(transformers, "Qwen3_5MoeForCausalLM", None),
                  dict({k: v for k, v in COMMON.items() if k != "intermediate_size"}, num_hidden_layers=4, head_dim=32,
                       rms_norm_eps=1e-6, tie_word_embeddings=False,
                       layer_types=["linear_attention"] * 3 + ["full_attention"], linear_conv_kernel_dim=4,
                       linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                       hidden_act="silu", attention_bias=False, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=48, shared_expert_intermediate_size=96,
                       rope_parameters=dict(rope_type="default", rope_theta=QWEN35_ROPE["theta"],
                                            partial_rotary_factor=QWEN35_ROPE["partial"], mrope_section=[2, 1, 1],
                                            mrope_interleaved=True))),
    # mistral3: Llama's blocks with interleaved RoPE in the GGUF, heads of 32 dims (wider than
    # hidden / heads, as Ministral 3's), YaRN and the queries' temperature past position 8.
    "mistral3": (getattr(transformers, "Ministral3Config", None), getattr(transformers, "Ministral3ForCausalLM", None),
                 dict(COMMON, head_dim=32, rms_norm_eps=1e-5, tie_word_embeddings=False, sliding_window=None,
                      max_position_embeddings=int(MISTRAL3_ROPE["factor"]) * MISTRAL3_ROPE["original"],
                      rope_parameters=dict(rope_type="yarn", rope_theta=MISTRAL3_ROPE["theta"],
                                           factor=MISTRAL3_ROPE["factor"],
                                           original_max_position_embeddings=MISTRAL3_ROPE["original"],
                                           beta_fast=MISTRAL3_ROPE["beta_fast"], beta_slow=MISTRAL3_ROPE["beta_slow"],
                                           mscale=1.0, mscale_all_dim=1.0,
                                           llama_4_scaling_beta=MISTRAL3_ROPE["temp"]))),
}
SEEDS = {"llama": 1, "qwen2": 2, "qwen3": 3, "qwen3moe": 4, "mixtral": 5, "qwen2moe": 6, "gpt-oss": 7, "gemma3": 8,
         "qwen35": 9, "qwen35moe": 10, "mistral3": 11, "gemma4": 12, "gemma4moe": 13,
         "gemma4e": 14}
GGUF_ARCH = {"mixtral": "llama", "gemma4moe": "gemma4", "gemma4e": "gemma4"}  # Mixtral files say llama, with llama.expert_count
GPT_OSS_YARN = dict(factor=32.0, original=64, beta_fast=32.0, beta_slow=1.0)


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
    if params and "full_attention" in params:  # per layer type (Gemma 3): the global layers'
        return float(params["full_attention"]["rope_theta"])
    if params and "rope_theta" in params:
        assert params.get("rope_type", "default") in ("default", "yarn"), params
        return float(params["rope_theta"])
    return float(cfg.rope_theta)


def yarn_inv_freq(base, dim, y, truncate=False):
    """HF's _compute_yarn_parameters (truncate=False: gpt-oss), as anvil computes it."""
    def corr(rot):
        return dim * np.log(y["original"] / (rot * 2 * np.pi)) / (2 * np.log(base))
    low, high = corr(y["beta_fast"]), corr(y["beta_slow"])
    if truncate:
        low, high = np.floor(low), np.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrap = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    return extrap * (ramp / y["factor"] + (1 - ramp)), 0.1 * np.log(y["factor"]) + 1


def ensure_yarn(cfg):
    """transformers 5 keeps rope settings in rope_parameters (with rope_theta) and may not carry an
    old-style rope_scaling over: set YaRN there too, before the model builds its rotary table."""
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict) and params.get("rope_type") != "yarn":
        params.update(rope_type="yarn", factor=GPT_OSS_YARN["factor"], beta_fast=GPT_OSS_YARN["beta_fast"],
                      beta_slow=GPT_OSS_YARN["beta_slow"], truncate=False,
                      original_max_position_embeddings=GPT_OSS_YARN["original"])


def check_gpt_oss_rope(model, cfg, head_dim):
    """The model's rotary table must be the YaRN anvil implements (HF's config handling has
    changed across versions: a silently different rope would make a golden anvil cannot match)."""
    rot = model.model.rotary_emb
    want, mscale = yarn_inv_freq(rope_theta_of(cfg), head_dim, GPT_OSS_YARN)
    got = rot.inv_freq.double().numpy()
    assert np.allclose(got, want, rtol=1e-6), (got, want)
    assert abs(float(rot.attention_scaling) - mscale) < 1e-6, (rot.attention_scaling, mscale)


def check_mistral3(model, cfg, head_dim):
    """The rotary table must be YaRN with HF's rounded ramp and no magnitude factor, and the
    attention must scale its queries by Llama 4's temperature (checked on the module's source, as
    the forward pass is what the goldens come from)."""
    import inspect
    rot = model.model.rotary_emb
    want, _ = yarn_inv_freq(MISTRAL3_ROPE["theta"], head_dim, MISTRAL3_ROPE, truncate=True)
    got = rot.inv_freq.double().numpy()
    assert np.allclose(got, want, rtol=1e-6), (got, want)
    assert abs(float(rot.attention_scaling) - 1.0) < 1e-6, rot.attention_scaling
    src = inspect.getsource(type(model.model.layers[0].self_attn))
    assert "llama_4" in src or "attn_scale" in src, "Ministral3 attention without the query temperature?"


def gemma4_rope_freqs(model, global_dim):
    """The global layers' proportional RoPE as llama.cpp's converter writes it (rope_freqs: 1 for
    the pairs that turn, 1e30 for the rest), checked against the model's own table."""
    turning = int(GEMMA4_ROPE["partial"] * global_dim // 2)
    want = 1.0 / GEMMA4_ROPE["global"] ** (np.arange(0, global_dim, 2, dtype=np.float64) / global_dim)
    want[turning:] = 0
    got = [b.double().numpy() for n, b in model.model.named_buffers() if "full_attention_inv_freq" in n and "original" not in n]
    assert got and np.allclose(got[0], want, rtol=1e-6), (got, want)
    local = 1.0 / GEMMA4_ROPE["local"] ** (np.arange(0, 32, 2, dtype=np.float64) / 32)
    got = [b.double().numpy() for n, b in model.model.named_buffers() if "sliding_attention_inv_freq" in n and "original" not in n]
    assert got and np.allclose(got[0], local, rtol=1e-6), (got, local)
    return np.where(np.arange(global_dim // 2) < turning, 1.0, 1e30).astype(np.float32)


def ensure_gemma3_rope(cfg):
    """transformers 5 keeps Gemma 3's RoPE per layer type in rope_parameters: set both there."""
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict):
        params["full_attention"] = dict(rope_type="linear", factor=GEMMA3_ROPE["factor"], rope_theta=GEMMA3_ROPE["global"])
        params["sliding_attention"] = dict(rope_type="default", rope_theta=GEMMA3_ROPE["local"])
        for k in [k for k in params if k not in ("full_attention", "sliding_attention")]:
            del params[k]


def check_gemma3_rope(model, head_dim):
    """The model's rotary tables must be the two anvil implements: the global layers' base 1e6
    with positions scaled by 1/8, the sliding layers' base 10000 unscaled."""
    want = {k: 1.0 / GEMMA3_ROPE[k] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim) for k in ("global", "local")}
    want["global"] /= GEMMA3_ROPE["factor"]
    got = [b.double().numpy() for n, b in model.model.named_buffers() if "inv_freq" in n and "original" not in n]
    for k, w in want.items():
        assert any(g.shape == w.shape and np.allclose(g, w, rtol=1e-6) for g in got), (k, w, got)


def gpt_oss_experts(sd, p, cfg, mlp):
    """A gpt-oss layer's router (weight, bias) and experts' gate, up [E, ff, hidden], down [E,
    hidden, ff] and biases, from GptOssExperts' fused gate_up_proj (gate and up interleaved along
    the output, HF's layout; concatenated is tried too), checked against the module's own forward."""
    n, ff, hidden = cfg.num_local_experts, cfg.intermediate_size, cfg.hidden_size
    q = p + "mlp."
    gate_up, gate_up_b = sd[q + "experts.gate_up_proj"], sd[q + "experts.gate_up_proj_bias"]
    down, down_b = sd[q + "experts.down_proj"], sd[q + "experts.down_proj_bias"]
    if gate_up.shape == (n, hidden, 2 * ff):
        gate_up = gate_up.transpose(0, 2, 1)
    if down.shape == (n, ff, hidden):
        down = down.transpose(0, 2, 1)
    assert gate_up.shape == (n, 2 * ff, hidden) and down.shape == (n, hidden, ff), (gate_up.shape, down.shape)
    router_w, router_b = sd[q + "router.weight"], sd[q + "router.bias"]
    x = np.random.default_rng(0).standard_normal((5, hidden)).astype(np.float32)
    with torch.no_grad():
        got = mlp(torch.tensor(x)[None])
        got = (got[0] if isinstance(got, tuple) else got).reshape(5, hidden).double().numpy()
    for split in ("interleaved", "halves"):
        if split == "interleaved":
            gate, up, gb, ub = gate_up[:, 0::2], gate_up[:, 1::2], gate_up_b[:, 0::2], gate_up_b[:, 1::2]
        else:
            gate, up, gb, ub = gate_up[:, :ff], gate_up[:, ff:], gate_up_b[:, :ff], gate_up_b[:, ff:]
        want = np.zeros((5, hidden))
        logits = x.astype(np.float64) @ router_w.T + router_b
        for t in range(5):
            top = np.argsort(-logits[t], kind="stable")[: cfg.num_experts_per_tok]
            w = np.exp(logits[t, top] - logits[t, top].max())
            w /= w.sum()
            for e, we in zip(top, w):
                g = np.minimum(gate[e] @ x[t] + gb[e], 7.0)
                u = np.clip(up[e] @ x[t] + ub[e], -7.0, 7.0)
                h = g / (1 + np.exp(-1.702 * g)) * (u + 1)
                want[t] += we * (down[e] @ h + down_b[e])
        if np.allclose(got, want, rtol=1e-3, atol=1e-4):
            return router_w, router_b, gate, up, down, gb, ub, down_b
    raise AssertionError("gpt-oss experts: neither layout reproduces the module's output")


def permute_for_llama(w, n_head):
    # convert_hf_to_gguf.py's LlamaModel.permute: rotate_half pairs -> adjacent pairs.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def n_experts_of(cfg):
    return getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or 0


def expert_ff_of(cfg):
    return getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size


def expert_matrices(sd, p, cfg):
    """A layer's router [E, hidden] and its experts' gate, up [E, ff, hidden] and down [E, hidden,
    ff], from either layout transformers uses: one module per expert (4.x: Qwen3-MoE's
    mlp.experts.N.gate_proj / up_proj / down_proj, Mixtral's block_sparse_moe.experts.N.w1 / w3 /
    w2) or the experts fused (gate_up_proj [E, 2 ff, hidden] with gate first, down_proj)."""
    n, ff, hidden = n_experts_of(cfg), expert_ff_of(cfg), cfg.hidden_size
    keys = [k for k in sd if k.startswith(p)]
    router = [k for k in keys if k.endswith(".gate.weight") and "experts" not in k]
    assert len(router) == 1, keys
    moe = router[0][: -len("gate.weight")]
    def per_expert(*names):
        for name in names:
            if f"{moe}experts.0.{name}.weight" in sd:
                return np.stack([sd[f"{moe}experts.{e}.{name}.weight"] for e in range(n)])
        return None
    gate, up, down = per_expert("gate_proj", "w1"), per_expert("up_proj", "w3"), per_expert("down_proj", "w2")
    if gate is None:
        gate_up, down = sd[f"{moe}experts.gate_up_proj"], sd[f"{moe}experts.down_proj"]
        if gate_up.shape[1:] == (hidden, 2 * ff):
            gate_up = gate_up.transpose(0, 2, 1)
        if down.shape[1:] == (ff, hidden):
            down = down.transpose(0, 2, 1)
        assert gate_up.shape == (n, 2 * ff, hidden) and down.shape == (n, hidden, ff), (gate_up.shape, down.shape)
        gate, up = gate_up[:, :ff], gate_up[:, ff:]
    assert gate.shape == (n, ff, hidden) and up.shape == gate.shape and down.shape == (n, hidden, ff), keys
    return sd[router[0]], gate, up, down


def check_qwen35_rope(model, head_dim):
    """Plain NeoX RoPE on the first quarter of each head, base 1e7 (text positions)."""
    rot = int(head_dim * QWEN35_ROPE["partial"])
    want = 1.0 / QWEN35_ROPE["theta"] ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    got = model.model.rotary_emb.inv_freq.double().numpy()
    assert got.shape == want.shape and np.allclose(got, want, rtol=1e-6), (got, want)
    assert float(getattr(model.model.rotary_emb, "attention_scaling", 1.0)) == 1.0
    return rot


def tile_v_heads(a, hk, hv, axis=0):
    """HF's value heads are grouped by key head (v-head j = g * r + i uses key head g); GGUF files
    store them tiled (position p = i * hk + g), so that v-head p uses key head p % hk, as llama.cpp's
    converter writes them. `a` holds hv equal blocks along `axis`."""
    r = hv // hk
    blocks = np.split(a, hv, axis=axis)
    return np.concatenate([blocks[(p % hk) * r + p // hk] for p in range(hv)], axis=axis)


def write_qwen35_delta_net(w, sd, p, b, cfg):
    lin = p + "linear_attn."
    keys = [k for k in sd if k.startswith(lin)]
    need = ["in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight", "conv1d.weight",
            "dt_bias", "A_log", "norm.weight", "out_proj.weight"]
    assert all(lin + n in sd for n in need), keys
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    key = hk * cfg.linear_key_head_dim
    qkv = sd[lin + "in_proj_qkv.weight"]                  # [2 key + value, D]
    conv = sd[lin + "conv1d.weight"].reshape(qkv.shape[0], -1)  # [channels, kernel]
    qkv = np.concatenate([qkv[:2 * key], tile_v_heads(qkv[2 * key:], hk, hv)])
    conv = np.concatenate([conv[:2 * key], tile_v_heads(conv[2 * key:], hk, hv)])
    w.tensor(b + "attn_qkv.weight", qkv)
    w.tensor(b + "attn_gate.weight", tile_v_heads(sd[lin + "in_proj_z.weight"], hk, hv))
    w.tensor(b + "ssm_beta.weight", tile_v_heads(sd[lin + "in_proj_b.weight"], hk, hv))
    w.tensor(b + "ssm_alpha.weight", tile_v_heads(sd[lin + "in_proj_a.weight"], hk, hv))
    w.tensor(b + "ssm_conv1d.weight", np.ascontiguousarray(conv))
    w.tensor(b + "ssm_dt.bias", tile_v_heads(sd[lin + "dt_bias"], hk, hv))
    w.tensor(b + "ssm_a", tile_v_heads(-np.exp(sd[lin + "A_log"]), hk, hv))
    w.tensor(b + "ssm_norm.weight", sd[lin + "norm.weight"])  # the gated norm: a plain multiplier
    w.tensor(b + "ssm_out.weight", np.ascontiguousarray(tile_v_heads(sd[lin + "out_proj.weight"], hk, hv, axis=1)))


def write_experts(w, sd, p, b, cfg):
    router, gate, up, down = expert_matrices(sd, p, cfg)
    w.tensor(b + "ffn_gate_inp.weight", router)
    w.tensor(b + "ffn_gate_exps.weight", gate)
    w.tensor(b + "ffn_up_exps.weight", up)
    w.tensor(b + "ffn_down_exps.weight", down)
    if getattr(cfg, "shared_expert_intermediate_size", 0):
        s = p + "mlp.shared_expert."
        w.tensor(b + "ffn_gate_inp_shexp.weight", sd[p + "mlp.shared_expert_gate.weight"].reshape(-1))
        w.tensor(b + "ffn_gate_shexp.weight", sd[s + "gate_proj.weight"])
        w.tensor(b + "ffn_up_shexp.weight", sd[s + "up_proj.weight"])
        w.tensor(b + "ffn_down_shexp.weight", sd[s + "down_proj.weight"])


def write_gemma4_experts(w, sd, p, b):
    """Gemma 4's experts as llama.cpp's converter writes them: the router (its weight, the scale on
    its input, the per-expert scale as ffn_down_exps.scale), gate and up in one stacked tensor, the
    norms around the two branches."""
    w.tensor(b + "ffn_gate_inp.weight", sd[p + "router.proj.weight"])
    w.tensor(b + "ffn_gate_inp.scale", sd[p + "router.scale"])
    w.tensor(b + "ffn_down_exps.scale", sd[p + "router.per_expert_scale"])
    w.tensor(b + "ffn_gate_up_exps.weight", np.ascontiguousarray(sd[p + "experts.gate_up_proj"]))
    w.tensor(b + "ffn_down_exps.weight", np.ascontiguousarray(sd[p + "experts.down_proj"]))
    w.tensor(b + "post_ffw_norm_1.weight", sd[p + "post_feedforward_layernorm_1.weight"])
    w.tensor(b + "pre_ffw_norm_2.weight", sd[p + "pre_feedforward_layernorm_2.weight"])
    w.tensor(b + "post_ffw_norm_2.weight", sd[p + "post_feedforward_layernorm_2.weight"])


def write_gguf(name, cfg, model, path):
    arch = GGUF_ARCH.get(name, name)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    if arch == "gemma4":  # per-layer heads: the sliding layers' from their layer config, the global layers' ours
        head_dim, swa = GEMMA4_GLOBAL["head_dim"], cfg.per_layer_config[0]
    else:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    gpt_oss, gemma3, qwen35 = arch == "gpt-oss", arch == "gemma3", arch in ("qwen35", "qwen35moe")
    mistral3, gemma4 = arch == "mistral3", arch == "gemma4"
    # Gemma's and Qwen3.5's RMSNorms multiply by 1 + w; llama.cpp's converter stores 1 + w.
    norm = (lambda v: v + 1) if gemma3 or qwen35 else (lambda v: v)
    w = GGUFWriter()
    w.string("general.architecture", arch)
    w.string("general.name", f"anvil reference {name}")
    w.u32(f"{arch}.context_length", cfg.max_position_embeddings)
    w.u32(f"{arch}.embedding_length", cfg.hidden_size)
    w.u32(f"{arch}.block_count", cfg.num_hidden_layers)
    widths = [layer.mlp.intermediate_size for layer in model.model.layers] if gemma4 else []
    if widths and len(set(widths)) > 1:  # gemma4 E2B / E4B: the shared layers' double-wide
        w.i32s(f"{arch}.feed_forward_length", widths)
    elif getattr(cfg, "intermediate_size", None):  # a MoE config may have none
        w.u32(f"{arch}.feed_forward_length", cfg.intermediate_size)
    w.u32(f"{arch}.attention.head_count", cfg.num_attention_heads)
    if gemma4:  # llama.cpp's converter: the global layers' head size, the KV heads per layer
        sliding = [t == "sliding_attention" for t in cfg.layer_types]
        w.bools(f"{arch}.attention.sliding_window_pattern", sliding)
        w.i32s(f"{arch}.attention.head_count_kv", [swa.num_key_value_heads if s else GEMMA4_GLOBAL["kv_heads"] for s in sliding])
        w.u32(f"{arch}.attention.key_length_swa", swa.head_dim)
        w.u32(f"{arch}.attention.value_length_swa", swa.head_dim)
        w.u32(f"{arch}.rope.dimension_count", head_dim)
        w.u32(f"{arch}.rope.dimension_count_swa", swa.head_dim)
        w.f32(f"{arch}.rope.freq_base_swa", GEMMA4_ROPE["local"])
        w.u32(f"{arch}.attention.sliding_window", cfg.sliding_window)
        w.f32(f"{arch}.final_logit_softcapping", cfg.final_logit_softcapping)
        w.u32(f"{arch}.embedding_length_per_layer_input", cfg.hidden_size_per_layer_input or 0)
        w.u32(f"{arch}.attention.shared_kv_layers", cfg.num_kv_shared_layers or 0)
    else:
        w.u32(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    w.u32(f"{arch}.attention.key_length", head_dim)
    w.u32(f"{arch}.attention.value_length", head_dim)
    w.f32(f"{arch}.rope.freq_base", rope_theta_of(cfg))
    w.f32(f"{arch}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    if n_experts_of(cfg):
        w.u32(f"{arch}.expert_count", n_experts_of(cfg))
        w.u32(f"{arch}.expert_used_count", cfg.top_k_experts if gemma4 else cfg.num_experts_per_tok)
        if arch != "llama":
            w.u32(f"{arch}.expert_feed_forward_length", expert_ff_of(cfg))
        if getattr(cfg, "shared_expert_intermediate_size", 0):
            w.u32(f"{arch}.expert_shared_feed_forward_length", cfg.shared_expert_intermediate_size)
    if gpt_oss:
        check_gpt_oss_rope(model, cfg, head_dim)
        w.u32(f"{arch}.attention.sliding_window", cfg.sliding_window)
        w.string(f"{arch}.rope.scaling.type", "yarn")
        w.f32(f"{arch}.rope.scaling.factor", GPT_OSS_YARN["factor"])
        w.u32(f"{arch}.rope.scaling.original_context_length", GPT_OSS_YARN["original"])
    if qwen35:
        w.u32(f"{arch}.rope.dimension_count", check_qwen35_rope(model, head_dim))
        w.u32(f"{arch}.full_attention_interval", 4)
        w.u32(f"{arch}.ssm.conv_kernel", cfg.linear_conv_kernel_dim)
        w.u32(f"{arch}.ssm.state_size", cfg.linear_key_head_dim)
        w.u32(f"{arch}.ssm.group_count", cfg.linear_num_key_heads)
        w.u32(f"{arch}.ssm.time_step_rank", cfg.linear_num_value_heads)
        w.u32(f"{arch}.ssm.inner_size", cfg.linear_num_value_heads * cfg.linear_value_head_dim)
    if mistral3:  # as llama.cpp's converter writes Ministral 3
        check_mistral3(model, cfg, head_dim)
        w.string(f"{arch}.rope.scaling.type", "yarn")
        w.f32(f"{arch}.rope.scaling.factor", MISTRAL3_ROPE["factor"])
        w.u32(f"{arch}.rope.scaling.original_context_length", MISTRAL3_ROPE["original"])
        w.f32(f"{arch}.rope.scaling.yarn_beta_fast", MISTRAL3_ROPE["beta_fast"])
        w.f32(f"{arch}.rope.scaling.yarn_beta_slow", MISTRAL3_ROPE["beta_slow"])
        w.f32(f"{arch}.rope.scaling.yarn_log_multiplier", 1.0)
        w.f32(f"{arch}.attention.temperature_scale", MISTRAL3_ROPE["temp"])
    if gemma3:
        check_gemma3_rope(model, head_dim)
        w.u32(f"{arch}.attention.sliding_window", cfg.sliding_window)
        w.string(f"{arch}.rope.scaling.type", "linear")
        w.f32(f"{arch}.rope.scaling.factor", GEMMA3_ROPE["factor"])
    tokens = byte_tokens() + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens += [f"<|reserved_{i}|>" for i in range(len(tokens), VOCAB)]
    w.string("tokenizer.ggml.model", "gpt2")
    w.string("tokenizer.ggml.pre", "qwen2")
    w.strings("tokenizer.ggml.tokens", tokens)
    w.i32s("tokenizer.ggml.token_type", [1] * 256 + [3] * 3 + [5] * (VOCAB - 259))
    w.u32("tokenizer.ggml.eos_token_id", 256)
    w.bool("tokenizer.ggml.add_bos_token", False)

    w.tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    if gemma4:
        w.tensor("rope_freqs.weight", gemma4_rope_freqs(model, head_dim))
    if gemma4 and cfg.hidden_size_per_layer_input:  # E2B / E4B's per-layer token embeddings
        w.tensor("per_layer_token_embd.weight", sd["model.embed_tokens_per_layer.weight"])
        w.tensor("per_layer_model_proj.weight", sd["model.per_layer_model_projection.weight"])
        w.tensor("per_layer_proj_norm.weight", sd["model.per_layer_projection_norm.weight"])
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        if qwen35:
            w.tensor(b + "attn_norm.weight", norm(sd[p + "input_layernorm.weight"]))
            w.tensor(b + "post_attention_norm.weight", norm(sd[p + "post_attention_layernorm.weight"]))
            if n_experts_of(cfg):
                write_experts(w, sd, p, b, cfg)
            else:
                for t in ("gate", "up", "down"):
                    w.tensor(b + f"ffn_{t}.weight", sd[p + f"mlp.{t}_proj.weight"])
            if cfg.layer_types[i] == "linear_attention":
                write_qwen35_delta_net(w, sd, p, b, cfg)
                continue
            # q_proj's rows: each head's query, then its gate (no permutation: NeoX RoPE).
            for n in "qkvo":
                w.tensor(b + ("attn_output" if n == "o" else f"attn_{n}") + ".weight", sd[p + f"self_attn.{n}_proj.weight"])
            w.tensor(b + "attn_q_norm.weight", norm(sd[p + "self_attn.q_norm.weight"]))
            w.tensor(b + "attn_k_norm.weight", norm(sd[p + "self_attn.k_norm.weight"]))
            continue
        q, k = sd[p + "self_attn.q_proj.weight"], sd.get(p + "self_attn.k_proj.weight")
        if arch in ("llama", "mistral3"):
            q, k = permute_for_llama(q, cfg.num_attention_heads), permute_for_llama(k, cfg.num_key_value_heads)
        w.tensor(b + "attn_norm.weight", norm(sd[p + "input_layernorm.weight"]))
        w.tensor(b + "attn_q.weight", q)
        if k is not None:  # gemma4 E2B / E4B's shared layers have none: they read an earlier layer's KV
            w.tensor(b + "attn_k.weight", k)
        if p + "self_attn.v_proj.weight" in sd:  # gemma4's global layers have none: V is K's projection
            w.tensor(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        if arch in ("qwen2", "qwen2moe", "gpt-oss"):
            for n in "qkv":
                w.tensor(b + f"attn_{n}.bias", sd[p + f"self_attn.{n}_proj.bias"])
        if arch in ("qwen3", "qwen3moe", "gemma3", "gemma4"):
            w.tensor(b + "attn_q_norm.weight", norm(sd[p + "self_attn.q_norm.weight"]))
            if k is not None:
                w.tensor(b + "attn_k_norm.weight", norm(sd[p + "self_attn.k_norm.weight"]))
        w.tensor(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        if gpt_oss:
            w.tensor(b + "attn_output.bias", sd[p + "self_attn.o_proj.bias"])
            w.tensor(b + "attn_sinks.weight", sd[p + "self_attn.sinks"])
            w.tensor(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"])
            router_w, router_b, gate, up, down, gb, ub, db = gpt_oss_experts(sd, p, cfg, model.model.layers[i].mlp)
            w.tensor(b + "ffn_gate_inp.weight", router_w)
            w.tensor(b + "ffn_gate_inp.bias", router_b)
            for t, m, bias in (("gate", gate, gb), ("up", up, ub), ("down", down, db)):
                w.tensor(b + f"ffn_{t}_exps.weight", np.ascontiguousarray(m))
                w.tensor(b + f"ffn_{t}_exps.bias", np.ascontiguousarray(bias))
            continue
        if gemma3 or gemma4:
            w.tensor(b + "post_attention_norm.weight", norm(sd[p + "post_attention_layernorm.weight"]))
            w.tensor(b + "ffn_norm.weight", norm(sd[p + "pre_feedforward_layernorm.weight"]))
            w.tensor(b + "post_ffw_norm.weight", norm(sd[p + "post_feedforward_layernorm.weight"]))
            if gemma4:
                w.tensor(b + "layer_output_scale.weight", sd[p + "layer_scalar"].reshape(1))
        else:
            w.tensor(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        if gemma4 and n_experts_of(cfg):  # the 26B-A4B's experts beside the dense feed-forward
            write_gemma4_experts(w, sd, p, b)
        if n_experts_of(cfg) and not gemma4:
            write_experts(w, sd, p, b, cfg)
        else:
            w.tensor(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
            w.tensor(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
            w.tensor(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
        if gemma4 and cfg.hidden_size_per_layer_input:  # the layer's use of its per-layer input
            w.tensor(b + "inp_gate.weight", sd[p + "per_layer_input_gate.weight"])
            w.tensor(b + "proj.weight", sd[p + "per_layer_projection.weight"])
            w.tensor(b + "post_norm.weight", sd[p + "post_per_layer_input_norm.weight"])
    w.tensor("output_norm.weight", norm(sd["model.norm.weight"]))
    if not cfg.tie_word_embeddings:
        w.tensor("output.weight", sd["lm_head.weight"])
    w.write(path)


def randomise(model, gen, norm_mean=1.0):
    # Norm weights and biases away from their 1/0 initialisation, so a forgotten one shows
    # (Gemma's norms multiply by 1 + w: mean 0 there); gemma4's layer scalars (buffers) too.
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.8 + 0.1 * torch.randn(b.shape, generator=gen))
        for name, p in model.named_parameters():
            if name.endswith(("router.scale", "router.per_expert_scale")):  # gemma4's: gains around 1
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif model.config.model_type == "gemma4_text" and name.endswith(("q_norm.weight", "k_norm.weight")):
                # Gemma 4 does not scale its scores: trained q/k norms set the softmax's temperature.
                # Around dim^-1/4 each, q.k is on the scale of a 1/sqrt(dim) model's scores (with 1,
                # the random heads' scores run to the head size and every rounding of K shows).
                p.copy_(p.shape[-1] ** -0.25 * (1.0 + 0.2 * torch.randn(p.shape, generator=gen)))
            elif name.endswith("linear_attn.norm.weight"):  # Qwen3.5's gated norm multiplies by w (around 1)
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(norm_mean + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("sinks"):  # gpt-oss: on the scale of the scores
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("experts.gate_up_proj"):  # gpt-oss: fan-in is the hidden size; x3 so the clamp at 7 bites
                p.copy_(3 * torch.randn(p.shape, generator=gen) / model.config.hidden_size ** 0.5)
            elif name.endswith("experts.down_proj"):
                ff = getattr(model.config, "intermediate_size", None) or expert_ff_of(model.config)
                p.copy_(torch.randn(p.shape, generator=gen) / ff ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def main(out, only=None):
    os.makedirs(out, exist_ok=True)
    summary = {}
    for arch, (config_cls, model_cls, kw) in CONFIGS.items():
        if only and arch not in only:
            continue
        if config_cls is None:
            raise SystemExit(f"transformers {transformers.__version__} has no model class for {arch}")
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(SEEDS[arch])
        cfg = config_cls(**kw)
        if arch == "gpt-oss":
            ensure_yarn(cfg)
        if arch == "gemma3":
            ensure_gemma3_rope(cfg)
        model = model_cls(cfg).eval().float()
        model.config._attn_implementation = "eager"
        randomise(model, gen, norm_mean=0.0 if arch in ("gemma3", "qwen35", "qwen35moe") else 1.0)
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
    main(sys.argv[1], sys.argv[2:])

"""The default model's architecture, written out plainly in PyTorch: Llama (pre-norm RMSNorm
blocks, grouped-query attention with RoPE, SwiGLU feed-forward, final RMSNorm, separate output
head). Parameter names are Hugging Face's LlamaForCausalLM names, so a state dict of this model
loads into transformers unchanged (make_goldens.py checks the two agree).

RoPE is HF's "rotate_half" form (pairs (i, i + head_dim/2)); GGUF's llama architecture rotates
adjacent pairs, so export_gguf.py permutes the rows of q_proj and k_proj the way llama.cpp's
converter does.
"""
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class config:
    vocab_size: int = 4096
    context_length: int = 512
    dim: int = 384
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 2
    ffn_dim: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0  # on the attention and MLP outputs, training only

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(cfg, n_pos, device):
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32, device=device) / cfg.head_dim))
    freqs = torch.outer(torch.arange(n_pos, dtype=torch.float32, device=device), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # [n_pos, head_dim]
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def causal_attention(q, k, v, scale):
    if hasattr(F, "scaled_dot_product_attention"):  # PyTorch >= 2.0: flash / memory-efficient kernels
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * scale
    att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(att.float(), dim=-1).to(q.dtype) @ v


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        c, hd = self.cfg, self.cfg.head_dim
        q = self.q_proj(x).view(b, t, c.n_heads, hd).transpose(1, 2)     # [b, h, t, hd]
        k = self.k_proj(x).view(b, t, c.n_kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, c.n_kv_heads, hd).transpose(1, 2)
        cos, sin = cos[:t].to(q.dtype), sin[:t].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = c.n_heads // c.n_kv_heads  # query head h reads kv head h // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = causal_attention(q, k, v, 1.0 / math.sqrt(hd))
        return self.o_proj(y.transpose(1, 2).reshape(b, t, c.n_heads * hd))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin):
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Backbone(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self._rope = None

    def init_weights(self, seed):
        """N(0, 0.02) everywhere, output projections scaled by 1/sqrt(2 * n_layers) (GPT-2)."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight") or name == "model.norm.weight":
                    p.fill_(1.0)
                    continue
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def rope(self, device):
        if self._rope is None or self._rope[0].device != device:
            self._rope = rope_tables(self.cfg, self.cfg.context_length, device)
        return self._rope

    def forward(self, ids):
        """ids [b, t] -> logits [b, t, vocab] (float32 when not under autocast)."""
        if ids.shape[1] > self.cfg.context_length:
            raise ValueError(f"{ids.shape[1]} tokens exceed the context length {self.cfg.context_length}")
        cos, sin = self.rope(ids.device)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


def load_checkpoint(path, device="cpu"):
    """(model, checkpoint dict) from a train.py checkpoint, in float32, eval mode."""
    ck = torch.load(path, map_location=device)
    cfg = config(**{**ck["config"], "dropout": 0.0})
    m = Llama(cfg)
    m.load_state_dict(ck["state_dict"])
    return m.float().eval().to(device), ck

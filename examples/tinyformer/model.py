"""A small decoder-only transformer (GPT-style, pre-norm).

Only torch and the standard library are imported, and there are no relative
imports, so this file can be inlined into standalone replay scripts.
"""

import enum
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


class Activation(enum.Enum):
    GELU = "gelu"
    SILU = "silu"
    RELU = "relu"


@dataclass
class TinyConfig:
    vocab_size: int = 256
    dim: int = 64
    n_heads: int = 4
    n_layers: int = 4
    mlp_ratio: int = 4
    max_seq_len: int = 64
    dropout: float = 0.1
    norm_eps: float = 1e-5
    activation: Activation = Activation.GELU


def make_activation(activation: Activation) -> nn.Module:
    if activation is Activation.GELU:
        return nn.GELU()
    if activation is Activation.SILU:
        return nn.SiLU()
    if activation is Activation.RELU:
        return nn.ReLU()
    raise ValueError(f"unknown activation: {activation!r}")


class Attention(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        if cfg.dim % cfg.n_heads != 0:
            raise ValueError("dim must be divisible by n_heads")
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=True,
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, activation: Activation, dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = make_activation(activation)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.ln1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = MLP(cfg.dim, cfg.mlp_ratio * cfg.dim, cfg.activation, cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class TinyFormer(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg, i) for i in range(cfg.n_layers)])
        self.ln_f = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.cfg.max_seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))

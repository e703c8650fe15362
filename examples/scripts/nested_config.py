# A script whose model is built from a nested dataclass config (with a
# torch.dtype field and an enum field), all defined in __main__.
import enum
from dataclasses import dataclass, field

import torch
import torch.nn as nn


class NormKind(enum.Enum):
    LAYER = "layer"
    NONE = "none"


@dataclass
class AttnConfig:
    n_heads: int = 4
    dropout: float = 0.0
    bias: bool = True


@dataclass
class EncoderConfig:
    dim: int = 32
    n_layers: int = 2
    mlp_hidden: int = 64
    attn: AttnConfig = field(default_factory=AttnConfig)
    dtype: torch.dtype = torch.float32
    norm: NormKind = NormKind.LAYER


class EncoderLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.attn = nn.MultiheadAttention(
            cfg.dim,
            cfg.attn.n_heads,
            dropout=cfg.attn.dropout,
            bias=cfg.attn.bias,
            batch_first=True,
            dtype=cfg.dtype,
        )
        self.mlp = nn.Sequential(
            nn.Linear(cfg.dim, cfg.mlp_hidden, dtype=cfg.dtype),
            nn.GELU(),
            nn.Linear(cfg.mlp_hidden, cfg.dim, dtype=cfg.dtype),
        )
        if cfg.norm is NormKind.LAYER:
            self.norm1 = nn.LayerNorm(cfg.dim, dtype=cfg.dtype)
            self.norm2 = nn.LayerNorm(cfg.dim, dtype=cfg.dtype)
        else:
            self.norm1 = nn.Identity()
            self.norm2 = nn.Identity()

    def forward(self, x):
        h = self.norm1(x)
        attn_out, _ = self.attn(h, h, h, need_weights=False)
        x = x + attn_out
        return x + self.mlp(self.norm2(x))


class Encoder(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.head = nn.Linear(cfg.dim, 1, dtype=cfg.dtype)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1)).squeeze(-1)


def main():
    torch.manual_seed(0)
    cfg = EncoderConfig(attn=AttnConfig(n_heads=4, dropout=0.0))
    model = Encoder(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(2):
        x = torch.randn(4, 10, cfg.dim, dtype=cfg.dtype)
        target = torch.randn(4, dtype=cfg.dtype)
        loss = torch.nn.functional.mse_loss(model(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

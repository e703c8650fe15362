"""Small training runs, each with a planted fault or healthy, for testing gather-stats' findings.

    python examples/faults/zoo.py --case branch              # a branch, taken on some steps only, blows up 590x
    python examples/faults/zoo.py --case branch --healthy    # the same branch, well initialised
    python examples/faults/zoo.py --case sigmoid20           # 20 sigmoid layers: gradients vanish
    python examples/faults/zoo.py --case sigmoid20 --healthy # 20 ReLU layers with He init
    python examples/faults/zoo.py --case raw-bn              # raw-scale inputs (rms 2e4) into BatchNorm1d: healthy
    python examples/faults/zoo.py --case cnn-bn | lstm | transformer | mlp   # healthy models
    python examples/faults/zoo.py --case lr-spike            # the learning rate is 1000x too large at step 10
    python examples/faults/zoo.py --case attention           # attention logits grow until the softmax is one-hot
    python examples/faults/zoo.py --case router              # a sparse ReLU mixture-of-experts router: healthy
    python examples/faults/zoo.py --case router --healthy    # ... and with every unit dead (--healthy: alive)
    python examples/faults/zoo.py --case frozen-embedding    # an embedding frozen by design: healthy

``build(case, healthy)`` returns ``(model, batches)`` where ``batches(step)`` gives the arguments of
the model call and the regression target; ``train(model, batches, steps)`` runs the loop (Adam,
MSE). Tests import both to run the cases in-process.

Cases:

- ``branch``: ``stem`` -> (``branch``, only on steps 0, 2, 4, 8 and 10: data-dependent control flow)
  -> ``head``. Faulty, the branch's weights are 150x too large (output rms about 590x its input rms):
  ``exploding_activation`` on ``branch``, also with ``--steps 12`` where step 11 does not run it.
- ``sigmoid20``: 20 x (Linear, Sigmoid) -> ``head``: ``vanishing_gradient`` (and not
  ``exploding_gradient`` on the healthy layers near the loss); healthy twin: ReLU, He init.
- ``raw-bn``: inputs with rms about 2e4 -> ``bn`` (BatchNorm1d) -> MLP: no finding.
- ``cnn-bn``, ``lstm``, ``transformer``, ``mlp``: healthy models, no finding.
- ``lr-spike``: a 6-layer ReLU MLP whose learning rate is 1000x too large at step
  :data:`SPIKE_STEP` only (a schedule bug): every layer blows up at once; the healthy twin keeps
  its learning rate.
- ``attention``: causal self-attention through ``F.scaled_dot_product_attention`` whose logit scale
  grows with every step until the attention weights are one-hot: ``softmax_saturation``; the
  healthy twin keeps the 1/sqrt(d) scale.
- ``router``: a mixture of 16 experts gated by a sparse ReLU router (about 96% of its outputs exactly
  zero, every expert chosen by some tokens of a batch of 64): healthy, no finding. Its faulty twin
  (the default) has a router bias of -15: every expert is dead.
- ``frozen-embedding``: a token embedding frozen by design (no gradient, not in the optimizer) ->
  MLP: healthy, no finding.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn as nn

BRANCH_STEPS = {0, 2, 4, 8, 10}
SPIKE_STEP = 10
Batches = Callable[[int], tuple[tuple, torch.Tensor]]
LearningRate = Callable[[int], float]


class Branchy(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.stem = nn.Linear(dim, dim)
        self.branch = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, route: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        if bool(route.any()):  # data-dependent: the batch says whether to take the branch
            h = self.branch(h)
        return self.head(h)


class Deep(nn.Module):
    def __init__(self, dim: int, depth: int, act: type[nn.Module], he_init: bool):
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            fc = nn.Linear(dim, dim)
            if he_init:
                nn.init.kaiming_normal_(fc.weight, nonlinearity="relu")
                nn.init.zeros_(fc.bias)
            layers += [fc, act()]
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class LSTMNet(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.emb(tokens))
        return self.head(out[:, -1])


class Transformer(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.emb(tokens)).mean(1))


class GrowingAttention(nn.Module):
    """Causal self-attention whose logit scale grows by ``growth`` x 1/sqrt(d) with every call."""

    def __init__(self, dim: int = 32, heads: int = 4, growth: float = 0.0):
        super().__init__()
        self.heads, self.growth, self.calls = heads, growth, 0
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        scale = (1.0 + self.growth * self.calls) / (C // self.heads) ** 0.5
        self.calls += 1
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class AttentionNet(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32, growth: float = 0.0):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.norm = nn.LayerNorm(dim)
        self.attn = GrowingAttention(dim, 4, growth)
        self.head = nn.Linear(dim, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        return self.head((h + self.attn(self.norm(h))).mean(1))


class Router(nn.Module):
    """A mixture of experts gated by a sparse ReLU router: each token's gate is relu(W x + b), and
    the experts' outputs are summed with those gates."""

    def __init__(self, dim: int = 16, experts: int = 16, bias: float = -7.0):
        super().__init__()
        self.gate = nn.Linear(dim, experts)
        self.act = nn.ReLU()
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        self.head = nn.Linear(dim, 1)
        with torch.no_grad():
            self.gate.weight.normal_(0.0, 1.0)
            self.gate.bias.fill_(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.act(self.gate(x))
        return self.head(sum(g[:, i:i + 1] * e(x) for i, e in enumerate(self.experts)))


class FrozenEmbedding(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.emb.weight.requires_grad_(False)  # a pretrained table kept fixed on purpose
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(tokens).mean(1))


def _dense(dim: int, scale: float = 1.0) -> Batches:
    def batch(step: int) -> tuple[tuple, torch.Tensor]:
        x = torch.randn(16, dim) * scale
        return (x,), x[:, :1] / scale
    return batch


def build(case: str, healthy: bool = False) -> tuple[nn.Module, Batches]:
    """The model of ``case`` and its batches (see the module docstring)."""
    if case == "branch":
        model = Branchy()
        if not healthy:
            with torch.no_grad():
                model.branch.weight.mul_(1000.0)  # default init: output rms about 0.6x input rms -> 590x

        def batch(step: int) -> tuple[tuple, torch.Tensor]:
            x = torch.randn(16, 16)
            return (x, torch.tensor([step in BRANCH_STEPS])), x[:, :1]
        return model, batch
    if case == "sigmoid20":
        return (Deep(32, 20, nn.ReLU, he_init=True) if healthy else Deep(32, 20, nn.Sigmoid, he_init=False)), _dense(32)
    if case == "raw-bn":
        return nn.Sequential(nn.BatchNorm1d(16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)), _dense(16, 2e4)
    if case == "mlp":
        return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)), _dense(16)
    if case == "cnn-bn":
        def images(step: int) -> tuple[tuple, torch.Tensor]:
            x = torch.randn(8, 3, 16, 16)
            return (x,), x.mean((1, 2, 3)).unsqueeze(1)
        return CNN(), images
    def tokens(step: int) -> tuple[tuple, torch.Tensor]:
        t = torch.randint(0, 50, (8, 12))
        return (t,), (t[:, :1].float() / 50)

    if case in ("lstm", "transformer"):
        return (LSTMNet() if case == "lstm" else Transformer()), tokens
    if case == "lr-spike":
        return Deep(32, 6, nn.ReLU, he_init=True), _dense(32)
    if case == "attention":
        return AttentionNet(growth=0.0 if healthy else 10.0), tokens
    if case == "router":
        def tokens64(step: int) -> tuple[tuple, torch.Tensor]:
            x = torch.randn(64, 16)
            return (x,), x[:, :1]
        return Router(bias=-7.0 if healthy else -15.0), tokens64
    if case == "frozen-embedding":
        return FrozenEmbedding(), tokens
    raise SystemExit(f"unknown case {case!r}")


def learning_rate(case: str, healthy: bool = False, lr: float = 1e-3) -> LearningRate:
    """The learning rate of each step: constant, except for the lr-spike case."""
    spike = case == "lr-spike" and not healthy
    return lambda step: lr * (1000.0 if spike and step == SPIKE_STEP else 1.0)


def train(model: nn.Module, batches: Batches, steps: int, lr: float | LearningRate = 1e-3) -> None:
    schedule = lr if callable(lr) else (lambda step: lr)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=schedule(0))
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = schedule(step)
        args, target = batches(step)
        loss = nn.functional.mse_loss(model(*args), target)
        opt.zero_grad()
        loss.backward()
        opt.step()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", required=True)
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    a = p.parse_args()
    torch.manual_seed(0)
    model, batches = build(a.case, a.healthy)
    train(model, batches, a.steps, learning_rate(a.case, a.healthy, a.lr))


if __name__ == "__main__":
    main()

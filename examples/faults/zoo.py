"""Small training runs, each with a planted fault or healthy, for testing gather-stats' findings.

    python examples/faults/zoo.py --case branch              # a branch, taken on some steps only, blows up 590x
    python examples/faults/zoo.py --case branch --healthy    # the same branch, well initialised
    python examples/faults/zoo.py --case sigmoid20           # 20 sigmoid layers: gradients vanish
    python examples/faults/zoo.py --case sigmoid20 --healthy # 20 ReLU layers with He init
    python examples/faults/zoo.py --case raw-bn              # raw-scale inputs (rms 2e4) into BatchNorm1d: healthy
    python examples/faults/zoo.py --case cnn-bn | lstm | transformer | mlp   # healthy models

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
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn as nn

BRANCH_STEPS = {0, 2, 4, 8, 10}
Batches = Callable[[int], tuple[tuple, torch.Tensor]]


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
    if case in ("lstm", "transformer"):
        def tokens(step: int) -> tuple[tuple, torch.Tensor]:
            t = torch.randint(0, 50, (8, 12))
            return (t,), (t[:, :1].float() / 50)
        return (LSTMNet() if case == "lstm" else Transformer()), tokens
    raise SystemExit(f"unknown case {case!r}")


def train(model: nn.Module, batches: Batches, steps: int, lr: float = 1e-3) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps):
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
    train(model, batches, a.steps, a.lr)


if __name__ == "__main__":
    main()

"""Small training scripts with planted faults and healthy look-alikes (gather_stats round 4): each
``build_<case>()`` returns a model and ``train_<case>`` trains it for ``steps`` steps. Used by
tests/test_stats_round4.py through the Python API."""

from __future__ import annotations

import torch
import torch.nn as nn


class DetachedEncoder(nn.Module):
    """The encoder's output is detach()ed: its 4 parameters are in the optimizer but never get a gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).detach())


class ReluRNN(nn.Module):
    """A ReLU RNN whose recurrent weight is orthogonal x 1.3: gradients explode over time steps."""

    def __init__(self, dim: int = 32, gain: float = 1.3) -> None:
        super().__init__()
        self.rnn = nn.RNN(8, dim, nonlinearity="relu", batch_first=True)
        with torch.no_grad():
            nn.init.orthogonal_(self.rnn.weight_hh_l0)
            self.rnn.weight_hh_l0.mul_(gain)
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class BufferGate(nn.Module):
    """Multiplies by a scale held in a buffer (never trained); 0 here."""

    def __init__(self, value: float = 0.0) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((1,), value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Scale(nn.Module):
    """A learnable scale initialised at 0 (ReZero, LayerScale)."""

    def __init__(self, dim: int = 1) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.alpha


class Block(nn.Module):
    def __init__(self, dim: int, gate: nn.Module) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.act = nn.ReLU()
        self.gate = gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gate(self.act(self.fc(x)))


class Residual(nn.Module):
    def __init__(self, gates: list[nn.Module], dim: int = 16) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim, g) for g in gates))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def buffer_gate() -> nn.Module:
    return Residual([BufferGate(0.0)])


def rezero() -> nn.Module:
    return Residual([Scale(), Scale(), Scale()])


class Deep(nn.Module):
    def __init__(self, dim: int = 32, depth: int = 6) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(m for _ in range(depth) for m in (nn.Linear(dim, dim), nn.ReLU())))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def train_dense(model: nn.Module, steps: int, opt: torch.optim.Optimizer, dim: int = 16,
                lr_of=None) -> None:
    for step in range(steps):
        if lr_of is not None:
            lr_of(opt, step)
        x = torch.randn(32, dim)
        loss = nn.functional.mse_loss(model(x), x[:, :1])
        opt.zero_grad()
        loss.backward()
        opt.step()


def train_rnn(model: ReluRNN, steps: int, lr: float = 0.05, length: int = 20) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)  # plain SGD, no clipping
    for _ in range(steps):
        x = torch.randn(16, length, 8)
        loss = nn.functional.mse_loss(model(x), x[:, -1, :1])
        opt.zero_grad()
        loss.backward()
        opt.step()


SPIKE_LAYER = "layers.4"  # the third Linear
SPIKE_STEP = 20


def lr_spike_in_one_layer(model: Deep, spike: bool = True, factor: float = 1000.0):
    """An Adam with one param group per Linear; the group of SPIKE_LAYER gets ``factor`` x its rate at SPIKE_STEP."""
    groups = [{"params": list(m.parameters()), "name": n} for n, m in model.named_modules()
              if isinstance(m, nn.Linear)]
    opt = torch.optim.Adam(groups, lr=1e-3)

    def lr_of(opt: torch.optim.Optimizer, step: int) -> None:
        for g in opt.param_groups:
            g["lr"] = 1e-3 * (factor if spike and g["name"] == SPIKE_LAYER and step == SPIKE_STEP else 1.0)
    return opt, lr_of

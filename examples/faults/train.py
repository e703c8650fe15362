"""Train a small MLP with one planted fault, or none (the healthy twin).

The model is ``inp`` (Linear) -> ``blocks.0..N-1`` (each ``fc`` Linear + ``act`` ReLU) -> ``head``,
with He (kaiming) initialisation, trained with Adam on a fixed synthetic regression task:

    python examples/faults/train.py                                  # healthy
    python examples/faults/train.py --fault dead-relu --module blocks.2.act
    python examples/faults/train.py --fault explode --module blocks.1.fc
    python examples/faults/train.py --fault nan --module blocks.2.fc

Faults (``--module`` names where it is planted):

- ``dead-relu``: the Linear feeding the named ReLU gets a bias of -10, so the ReLU outputs zero for
  every unit (dead units: no gradient flows back through them).
- ``explode``: the named Linear's initial weights are scaled by 1000 (a wrong init scale).
- ``nan``: the named module produces NaN: a Linear gets one NaN weight; an activation is replaced
  by ``sqrt``, which is NaN for negative inputs.
- ``nan-at``: the named activation divides by zero at step ``--at`` only (a rare bad batch): NaN
  appears between two sampled steps, and the optimizer spreads it into every weight.
- ``lr-spike``: the learning rate is 1000x too large at step ``--at`` only (a schedule bug).

``--inplace`` uses ``ReLU(inplace=True)``.
"""

import argparse

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, dim: int, inplace: bool):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.act = nn.ReLU(inplace=inplace)

    def forward(self, x):
        return self.act(self.fc(x))


class MLP(nn.Module):
    def __init__(self, d_in: int, dim: int, depth: int, d_out: int, inplace: bool = False):
        super().__init__()
        self.inp = nn.Linear(d_in, dim)
        self.blocks = nn.ModuleList(Block(dim, inplace) for _ in range(depth))
        self.head = nn.Linear(dim, d_out)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class SqrtAct(nn.Module):
    """An activation that is NaN for negative inputs (the planted NaN fault)."""

    def forward(self, x):
        return torch.sqrt(x)


class FlakyReLU(nn.Module):
    """A ReLU that divides by zero on its call number ``at`` (one call per training step)."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at
        self.calls = 0

    def forward(self, x):
        y = torch.relu(x)
        if self.calls == self.at:
            y = y / (y - y)  # 0/0 and x/0: NaN and Inf
        self.calls += 1
        return y


def plant(model: MLP, fault: str, module: str, at: int = 7) -> None:
    if fault in ("none", "lr-spike"):
        return
    target = model.get_submodule(module)
    with torch.no_grad():
        if fault == "dead-relu":
            parent = model.get_submodule(module.rsplit(".", 1)[0]) if "." in module else model
            if not isinstance(target, nn.ReLU) or not isinstance(getattr(parent, "fc", None), nn.Linear):
                raise SystemExit(f"--fault dead-relu needs a ReLU module after a Linear, like blocks.2.act (got {module})")
            parent.fc.bias.fill_(-10.0)
        elif fault == "explode":
            if not isinstance(target, nn.Linear):
                raise SystemExit(f"--fault explode needs a Linear module, like blocks.1.fc (got {module})")
            target.weight.mul_(1000.0)
        elif fault in ("nan", "nan-at"):
            if fault == "nan" and isinstance(target, nn.Linear):
                target.weight[0, 0] = float("nan")
            elif isinstance(target, nn.Linear):
                raise SystemExit(f"--fault nan-at needs an activation module, like blocks.1.act (got {module})")
            else:
                parent_name, _, attr = module.rpartition(".")
                act = SqrtAct() if fault == "nan" else FlakyReLU(at)
                setattr(model.get_submodule(parent_name) if parent_name else model, attr, act)
        else:
            raise SystemExit(f"unknown fault {fault!r}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fault", choices=["none", "dead-relu", "explode", "nan", "nan-at", "lr-spike"], default="none")
    p.add_argument("--at", type=int, default=7, help="the step of nan-at and lr-spike (steps count from 0)")
    p.add_argument("--module", default="blocks.2.act", help="where to plant the fault")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--inplace", action="store_true", help="use ReLU(inplace=True)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    d_in, d_out = 16, 4
    model = MLP(d_in, args.dim, args.depth, d_out, inplace=args.inplace)
    plant(model, args.fault, args.module, args.at)
    teacher = torch.randn(d_in, d_out) / d_in**0.5
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed + 1)
    for step in range(1, args.steps + 1):
        if args.fault == "lr-spike":
            for group in opt.param_groups:
                group["lr"] = args.lr * (1000.0 if step - 1 == args.at else 1.0)
        x = torch.randn(args.batch_size, d_in, generator=gen)
        y = torch.tanh(x @ teacher)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == 1:
            print(f"step {step:4d} | loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()

"""Modules whose inputs share memory (torch only, so a standalone repro can inline them): used by
``test_capture_storage``."""

import torch.nn as nn


class AliasWriter(nn.Module):
    """Writes into ``x`` in place, then reads ``y`` (which overlaps ``x`` in the run) and branches on
    whether ``e`` is a broadcast view: a replay that gave separate copies would differ."""

    def forward(self, x, y, e):
        x.mul_(2.0)
        z = y + e
        if e.stride(0) == 0:
            z = z + 1.0
        return z


class Shifted(nn.Module):
    """Hands its block two overlapping windows of one activation and a broadcast row."""

    def __init__(self, grad: bool):
        super().__init__()
        self.pre = nn.Linear(9, 9) if grad else nn.Identity()
        self.block = AliasWriter()

    def forward(self, v, row):
        h = self.pre(v).reshape(-1)  # 9 values; an activation when grad
        return self.block(h[:8].view(2, 4), h[1:].view(2, 4), row.expand(2, 4))


class ViewsOut(nn.Module):
    """Returns its result, a view of it, and its transpose; ``copies`` (set by a test) makes it
    return copies instead, with the same values: a replay whose outputs are laid out otherwise."""

    copies = False

    def forward(self, x):
        y = x * 2.0
        if type(self).copies:
            return y, y[0].clone(), y.t().contiguous()
        return y, y[0], y.t()


class HoldsViewsOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = ViewsOut()

    def forward(self, x):
        return self.block(x)

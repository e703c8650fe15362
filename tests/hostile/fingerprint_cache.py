# A module candidate that caches its result keyed on a few sampled input values: fresh values per
# round defeat it across batches only if the values between calls of one batch change too.
# Issue 24: "custom at 4.7x, unflagged (honest: 0.03x)".
import torch
import torch.nn as nn

CACHE = True  # the honest twin sets this to False


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.seen = {}

    def forward(self, x):
        flat = x.reshape(-1)
        w = self.weight.reshape(-1)  # the weights too, so that only the timed batches' repeats hit
        key = (tuple(x.shape), float(flat[0]), float(flat[flat.numel() // 2]), float(flat[-1]), float(w[0]), float(w[-1]))
        if CACHE and key in self.seen:
            return self.seen[key]
        y = torch.tanh(x) * self.weight
        if CACHE:
            self.seen = {key: y}
        return y

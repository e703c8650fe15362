# A module candidate with an exact cache across batches: every result is kept with a copy of its
# input and weight, looked up by two cheap sums and confirmed by an exact comparison, so whatever it returns
# is right. The honest work is made slow (the same result computed REPEAT times), the lookup is
# cheap. When the two batches of one side in a round saw the same values and swaps, the second
# was all hits and the round kept it as the faster: a cache timed instead of the kernel.
# Issue 33: "a cache filled in the first batch serves the second".
import torch
import torch.nn as nn

CACHE = True  # the honest twin sets this to False
REPEAT = 40
KEPT = 4096


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.seen = {}

    def forward(self, x):
        key = None
        if CACHE:
            key = (tuple(x.shape), float(x.sum()), float(x.reshape(-1)[::7].sum()))
            hit = self.seen.get(key)
            if hit is not None and torch.equal(hit[0], x) and torch.equal(hit[1], self.weight):
                return hit[2].clone()
        y = None
        for _ in range(REPEAT):
            y = torch.tanh(x) * self.weight
        if CACHE:
            if len(self.seen) >= KEPT:
                self.seen.pop(next(iter(self.seen)))
            self.seen[key] = (x.clone(), self.weight.detach().clone(), y.detach().clone())
        return y

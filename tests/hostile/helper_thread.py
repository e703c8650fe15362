# A module candidate that splits its work with a helper thread it moves off the CPU the timing
# pinned it to (sched_setaffinity of the thread to every CPU): on a machine with a free core its
# batches take about half the wall time with the one thread allowed. The CPU-time clock counts the
# helper (a thread of the same process); the wall clock is refused when its batches used more
# CPUs than allowed. The honest twin (HELP = False) does the same work in one thread.
import os
import threading

import torch
import torch.nn as nn

HELP = True  # the honest twin sets this to False
REPEAT = 40


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.job = None
        self.go, self.done = threading.Event(), threading.Event()
        if HELP:
            threading.Thread(target=self._helper, daemon=True).start()

    def _work(self, x):
        y = None
        for _ in range(REPEAT):
            y = torch.tanh(x) * self.weight
        return y

    def _helper(self):
        try:
            os.sched_setaffinity(0, range(os.cpu_count() or 1))
        except OSError:
            pass
        while True:
            self.go.wait()
            self.go.clear()
            x, out = self.job
            with torch.no_grad():
                out.copy_(self._work(x))
            self.done.set()

    def forward(self, x):
        if not HELP or x.dim() < 2 or x.shape[0] < 2:
            return self._work(x)
        half = x.shape[0] // 2
        y = torch.empty_like(x)
        self.job = (x[half:], y[half:])
        self.done.clear()
        self.go.set()
        y[:half] = self._work(x[:half])
        self.done.wait()
        return y

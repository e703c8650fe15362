# A module candidate that forks a helper process at construction and has it compute half of every
# call's rows, on whatever CPU it likes (sched_setaffinity to every CPU), through memory shared
# before the fork (an anonymous shared mapping) and a pair of pipes. The helper is a child of the
# candidate's process, inside its PID namespace: its CPU time is in the tree's. The honest twin
# (HELP = False) does the same work in one thread.
import mmap
import os

import torch
import torch.nn as nn

HELP = True  # the honest twin sets this to False
REPEAT = 40
ROOM = 1 << 22  # bytes for an input half and an output half


def _work(x, w):
    y = None
    for _ in range(REPEAT):
        y = torch.tanh(x) * w
    return y


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.pid = None
        if HELP:
            self.shared = mmap.mmap(-1, 2 * ROOM, flags=mmap.MAP_SHARED)
            self.ask_r, self.ask_w = os.pipe()
            self.ans_r, self.ans_w = os.pipe()
            self.pid = os.fork()
            if self.pid == 0:
                self._helper()

    def _view(self, start, n, shape):
        return torch.frombuffer(self.shared, dtype=torch.float32, count=n, offset=start).view(shape)

    def _helper(self):
        try:
            os.sched_setaffinity(0, range(os.cpu_count() or 1))
        except OSError:
            pass
        torch.set_num_threads(1)
        while True:
            msg = os.read(self.ask_r, 64).decode().split()
            if not msg:
                os._exit(0)
            rows, cols = int(msg[0]), int(msg[1])
            x = self._view(0, rows * cols, (rows, cols))
            w = self._view(ROOM - 4 * cols, cols, (cols,))
            with torch.no_grad():
                self._view(ROOM, rows * cols, (rows, cols)).copy_(_work(x, w))
            os.write(self.ans_w, b"k")

    def forward(self, x):
        if (not HELP or self.pid is None or x.dim() != 2 or x.shape[0] < 2 or x.dtype != torch.float32
                or x.numel() * 4 > ROOM):
            return _work(x, self.weight)
        half = x.shape[0] // 2
        rows, cols = x.shape[0] - half, x.shape[1]
        self._view(0, rows * cols, (rows, cols)).copy_(x[half:])
        self._view(ROOM - 4 * cols, cols, (cols,)).copy_(self.weight.detach())  # its weights may have been replaced
        os.write(self.ask_w, f"{rows} {cols}".encode())
        y = torch.empty_like(x)
        y[:half] = _work(x[:half], self.weight)
        os.read(self.ans_r, 1)
        y[half:] = self._view(ROOM, rows * cols, (rows, cols))
        return y

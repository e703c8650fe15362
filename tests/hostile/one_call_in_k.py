# A module candidate that computes one call in K of a timed batch and returns its previous result
# for the others. It reads from the harness's stack where it is in the batch (the loop index and
# the request's call count) and always computes the batch's last call, the only one whose outputs
# used to be copied out and checked; single-call checks are computed honestly. Below the 10x
# "suspicious" flag for K = 4. Issue 33: "timed as k times faster".
import sys

import torch
import torch.nn as nn

K = 4  # the honest twin sets this to 1


def _place() -> tuple[int, int]:
    """(call index, calls) of the harness's batch loop above, (0, 1) outside one."""
    frame = sys._getframe(1)
    while frame is not None:
        req = frame.f_locals.get("req")
        if hasattr(req, "calls") and "i" in frame.f_locals:
            return frame.f_locals["i"], req.calls
        frame = frame.f_back
    return 0, 1


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.last = None

    def forward(self, x):
        i, calls = _place()
        if self.last is not None and self.last.shape == x.shape and (calls - 1 - i) % K:
            return self.last
        self.last = torch.tanh(x) * self.weight
        return self.last

"""Hostile module candidate: it replaces the harness's operator tracer (the profiler wrapper of
the harness module, wherever the candidate process runs it from) with one that records nothing,
then computes with torch's own operators. Judged by the trace alone (a claim), it would be custom.

Expected: ``wrapper``, because where torch's operators are denied it raises (aten::tanh named)."""

import sys

import torch
import torch.nn as nn


class _RecordsNothing:
    names: list = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


for module in list(sys.modules.values()):  # the harness module (or __main__, when it was run as a script)
    if hasattr(module, "_OpTrace"):
        module._OpTrace = _RecordsNothing


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return torch.tanh(x) * self.weight

"""A script that writes to stdout in several ways before and around the module call."""
import os
import sys

import torch
import torch.nn as nn

print("hello from the script: this line must not reach the MCP protocol stream")
sys.stdout.write('{"jsonrpc": "2.0", "method": "fake"}\n')
sys.stdout.flush()
os.write(1, b"raw write to fd 1\n")


class Scale(nn.Module):
    def __init__(self, dim: int, factor: float = 2.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), factor))

    def forward(self, x):
        print("inside forward")
        return x * self.weight


model = nn.Sequential(nn.Linear(8, 8), Scale(8))
for step in range(3):
    print(f"step {step}")
    model(torch.randn(4, 8))

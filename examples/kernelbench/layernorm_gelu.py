import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm -> GELU -> Linear."""

    def __init__(self, dim, eps):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.act = nn.GELU()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear(self.act(self.norm(x)))


batch_size = 16
dim = 128


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim, 1e-5]

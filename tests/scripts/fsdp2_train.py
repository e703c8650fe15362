"""A tiny model trained with FSDP2 (``fully_shard`` per block and at the root) on CPU with gloo:
every block's parameters are DTensors sharded over the ranks outside its forward.

    python -m torch.distributed.run --nproc-per-node 2 tests/scripts/fsdp2_train.py --steps 2
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32, depth: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim, hidden) for _ in range(depth)])
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        x = torch.randn(4, 16, generator=gen)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

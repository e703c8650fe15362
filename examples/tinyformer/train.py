"""Train TinyFormer on a synthetic next-token task.

Each sequence is an arithmetic progression modulo the vocabulary size
(start and stride drawn from a seeded generator), so the next token is
fully determined by the previous two and the loss goes down quickly.

    python examples/tinyformer/train.py --steps 20
    python -m torch.distributed.run --nproc-per-node 2 examples/tinyformer/train.py --ddp
"""

import argparse

import torch
import torch.nn.functional as F
from model import TinyConfig, TinyFormer


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--ddp", action="store_true", help="use DistributedDataParallel (launch with torchrun)")
    return p.parse_args()


def get_batch(gen, batch_size, seq_len, vocab_size):
    start = torch.randint(0, vocab_size, (batch_size, 1), generator=gen)
    stride = torch.randint(1, 8, (batch_size, 1), generator=gen)
    pos = torch.arange(seq_len + 1).unsqueeze(0)
    seq = (start + stride * pos) % vocab_size
    return seq[:, :-1], seq[:, 1:]


def main():
    args = parse_args()

    rank, world_size = 0, 1
    if args.ddp:
        torch.distributed.init_process_group("gloo")
        rank = torch.distributed.get_rank()
        world_size = torch.distributed.get_world_size()

    torch.manual_seed(args.seed)  # same initial weights on every rank
    cfg = TinyConfig(n_layers=args.n_layers, dim=args.dim, n_heads=args.n_heads, max_seq_len=max(64, args.seq_len))
    model = TinyFormer(cfg)
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(args.seed + rank)

    model.train()
    for step in range(1, args.steps + 1):
        x, y = get_batch(gen, args.batch_size, args.seq_len, cfg.vocab_size)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if rank == 0 and (step % 5 == 0 or step == 1 or step == args.steps):
            print(f"step {step:4d} | loss {loss.item():.4f} | world_size {world_size}", flush=True)

    if args.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

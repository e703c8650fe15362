"""Train a tiny randomly initialised transformers model (GPT-2 or Llama) on a synthetic
next-token task, with a sequence length that changes from step to step (as dynamic padding or
length bucketing does in real runs).

Each sequence is an arithmetic progression modulo the vocabulary size (start and stride drawn
from a seeded generator). The model is built in code from a small config (no download), with
eager attention so the attention softmax is an operator of its own.

    python examples/transformers_tiny/train.py --model gpt2 --steps 6 --lengths 16,24,12
    python examples/transformers_tiny/train.py --model llama --steps 6 --lengths 32,48
"""

import argparse

import torch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--lengths", default="16,24,12", help="sequence lengths, cycled over the steps")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def build_model(args):
    if args.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=args.vocab, n_positions=256, n_embd=args.dim, n_layer=args.layers,
                         n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=0, eos_token_id=0)
        cfg._attn_implementation = "eager"
        return GPT2LMHeadModel(cfg)
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=2 * args.dim,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
                      max_position_embeddings=256, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg)


def get_batch(gen, batch_size, seq_len, vocab):
    start = torch.randint(0, vocab, (batch_size, 1), generator=gen)
    stride = torch.randint(1, 8, (batch_size, 1), generator=gen)
    return (start + stride * torch.arange(seq_len).unsqueeze(0)) % vocab


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    model = build_model(args).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed + 1)
    lengths = [int(x) for x in args.lengths.split(",")]
    for step in range(args.steps):
        ids = get_batch(gen, args.batch_size, lengths[step % len(lengths)], args.vocab)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print(f"step {step} length {ids.shape[1]} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

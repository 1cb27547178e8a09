"""A typical FSDP2 training script, ported to the blueprint: GPT-2 from its config, dropout, AdamW with a
warmup schedule, and a dataset whose position the library saves. Run with
`python -m trainer --entrypoint=examples.gpt2.train:train -- --layers 2` (the chart:
`entrypoint: examples.gpt2.train:train`), or `torchrun -m examples.gpt2.train -- --layers 2`."""

from __future__ import annotations

import argparse

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler
from transformers import GPT2Config, GPT2LMHeadModel

from examples.gpt2.data import Progressions
from trainer import api


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def build_model(args: argparse.Namespace, mesh: DeviceMesh) -> GPT2LMHeadModel:
    config = GPT2Config(
        n_layer=args.layers,
        n_embd=args.width,
        n_head=4,
        vocab_size=256,
        n_positions=args.seq_len,
        resid_pdrop=args.dropout,
        embd_pdrop=args.dropout,
        attn_pdrop=args.dropout,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = GPT2LMHeadModel(config)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train(job: api.Job) -> None:
    args = parse(list(job.args))
    rank, world = job.rank, job.world_size
    model = build_model(args, job.mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / args.warmup))
    dataset = Progressions(100_000, args.seq_len, 256, seed=args.seed)
    sampler = DistributedSampler(dataset, world, rank, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(args.seed + 1 + rank)  # dropout masks differ between ranks
    for step, batch in job.loop(model=model, optimizer=optim, scheduler=sched, data=loader):
        loss = model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        sched.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}")
        job.log(loss)


if __name__ == "__main__":
    api.main(train)

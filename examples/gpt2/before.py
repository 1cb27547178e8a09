"""A typical FSDP2 training script, before the port: GPT-2 from its config, dropout, AdamW with a warmup
schedule, a DataLoader with a DistributedSampler, DCP checkpoints every few steps. Run with
`torchrun --nproc-per-node=2 -m examples.gpt2.before --steps 20`."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler
from transformers import GPT2Config, GPT2LMHeadModel

from examples.gpt2.data import Progressions


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
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ckpt-dir", default="out/gpt2-ckpt")
    p.add_argument("--ckpt-every", type=int, default=5)
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


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = build_model(args, mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / args.warmup))
    dataset = Progressions(100_000, args.seq_len, 256, seed=args.seed)
    sampler = DistributedSampler(dataset, world, rank, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    torch.manual_seed(args.seed + 1 + rank)  # dropout masks differ between ranks
    step, epoch = 0, 0
    if os.path.exists(os.path.join(args.ckpt_dir, ".metadata")):
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd, "sched": sched.state_dict(), "step": 0}
        dcp.load(state, checkpoint_id=args.ckpt_dir)
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        sched.load_state_dict(state["sched"])
        step = state["step"]  # the epoch starts over: its first batches are seen twice
    while step < args.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
            sched.step()
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f}")
            step += 1
            if step % args.ckpt_every == 0:
                model_sd, optim_sd = get_state_dict(model, optim)
                state = {"model": model_sd, "optim": optim_sd, "sched": sched.state_dict(), "step": step}
                dcp.save(state, checkpoint_id=args.ckpt_dir)
            if step == args.steps:
                break
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

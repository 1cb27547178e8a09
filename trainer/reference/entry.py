"""The reference training function: the project's Llama-style model on its token files, through the
public API (trainer/api) like any team's. `python -m trainer` runs it unless `--entrypoint` names another.

Its options (`--preset`, `--data-path`, `--seq-len`, `--micro-batch-size`, `--lr`) are its own
(trainer/reference/config.py), given after `--` (`job.args`); `check_reference` parses and checks them and
the token file in the library's preflight, so a bad one stops the `check-config` init container.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.api import Job, JobConfig, World, checked_by
from trainer.reference.config import reference_config
from trainer.reference.data import BatchCursor, TokenDataset
from trainer.reference.data_check import check_batch_tokens, check_token_file
from trainer.reference.model import build_model


def check_reference(config: JobConfig, world: World) -> None:
    """The reference model's inputs: its options, and the token file fits the preset's vocabulary and
    the world size."""
    ref = reference_config(config.args)
    check_token_file(
        ref.data.path,
        vocab_size=ref.arch.vocab_size,
        seq_len=ref.data.seq_len,
        world_size=world.world_size or 1,
    )


@checked_by(check_reference)
def train(job: Job) -> None:
    ref = reference_config(job.args)
    model = build_model(ref.arch, mesh=job.mesh, device=job.device, seed=job.seed)
    optim = torch.optim.AdamW(model.parameters(), lr=ref.optim.lr)
    data = BatchCursor(
        TokenDataset(ref.data.path),
        ref.data.seq_len,
        ref.data.micro_batch_size,
        job.rank,
        job.world_size,
        job.seed,
    )
    for step, (inputs, targets) in job.loop(model=model, optimizer=optim, data=data):
        check_batch_tokens(inputs, targets, ref.arch.vocab_size, step=step, path=ref.data.path)
        logits = model(inputs.to(job.device))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.to(job.device).flatten())
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        job.log(loss)

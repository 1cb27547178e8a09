"""The reference training function: the project's Llama-style model on its token files, through the
public API (trainer/api) like any team's. `python -m trainer` runs it unless `--entrypoint` names another.

Its options (`--preset`, `--data-path`, `--seq-len`, `--micro-batch-size`, `--lr`) are the library's
`model`, `data` and `run` components; its own check (`check_token_data`) runs in the preflight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.api import Job, checked_by
from trainer.reference.data import BatchCursor, TokenDataset
from trainer.reference.data_check import check_batch_tokens
from trainer.reference.model import build_model
from trainer.runtime.preflight import check_token_data


@checked_by(check_token_data)
def train(job: Job) -> None:
    cfg = job.config
    model = build_model(cfg.arch, mesh=job.mesh, device=job.device, seed=job.seed)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.run.lr)
    data = BatchCursor(
        TokenDataset(cfg.data.path),
        cfg.data.seq_len,
        cfg.data.micro_batch_size,
        job.rank,
        job.world_size,
        job.seed,
    )
    for step, (inputs, targets) in job.loop(model=model, optimizer=optim, data=data):
        check_batch_tokens(inputs, targets, cfg.arch.vocab_size, step=step, path=cfg.data.path)
        logits = model(inputs.to(job.device))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.to(job.device).flatten())
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        job.log(loss)

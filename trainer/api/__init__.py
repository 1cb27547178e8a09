"""The public API: a team's own FSDP2 training function gets the whole recovery stack.

A training function takes one argument, the `Job`, builds what only it knows (the model, sharded with
`fully_shard` on `job.mesh`; the optimizer; an LR scheduler; a data source whose position can be saved;
any other state) and runs its own step inside `job.loop(...)`:

    from trainer import api

    def train(job: api.Job) -> None:
        model = build_my_model(job.device)  # fully_shard(block, mesh=job.mesh), ..., fully_shard(model)
        optim = torch.optim.AdamW(model.parameters(), lr=3e-4)
        sched = torch.optim.lr_scheduler.LambdaLR(optim, warmup)
        data = api.SampleCursor(my_dataset, batch_size=8, job=job)
        for step, batch in job.loop(model=model, optimizer=optim, scheduler=sched, data=data):
            loss = model(batch).loss
            loss.backward()
            optim.step()
            optim.zero_grad()
            sched.step()
            job.log(loss)

    if __name__ == "__main__":
        api.main(train)

The library owns everything around the step: the process group and mesh, tier 1 (the in-process
Wrapper re-runs `train` in the same process after an exception), tier 2 (ft_launcher, prefork workers,
node beats, hot spares), snapshots and peer replicas, the durable checkpoints (NVMe and FSx, atomic
commit, retention, verified resume), fault injection, preflight checks, events, summary.json and the
Prometheus endpoint. `job.loop` restores the newest state every rank has before its first step and
chooses the step boundaries at which it snapshots and saves. `python -m trainer` runs the reference model
(`trainer.reference:train`) through this same API; the chart runs a team's with the value `entrypoint`
(docs/bring-your-own.md).

Stable names: `Job` (a typed, read-only view: `job.mesh` is a DeviceMesh, `job.device` a torch.device,
`job.config` a `JobConfig`), `StatefulData` (the protocol of a data source whose position is saved),
`JobConfig`, `World`, `ConfigError`, `CheckFn` (what `checked_by` takes), `TrainFn`, `Misuse`,
`SampleCursor`, `checked_by`, `main`.

The api imports nothing above itself: the runtime (trainer/runtime/) implements `Job` (`RunningJob`) and
imports the api; `main` alone starts the runtime, importing it when called.
"""

from __future__ import annotations

from trainer.api.check import CheckFn, World, checked_by
from trainer.api.cursor import SampleCursor
from trainer.api.entry import main
from trainer.api.job import Job, JobConfig, StatefulData, TrainFn
from trainer.api.misuse import Misuse
from trainer.config.settings import ConfigError

__all__ = [
    "CheckFn",
    "ConfigError",
    "Job",
    "JobConfig",
    "Misuse",
    "SampleCursor",
    "StatefulData",
    "TrainFn",
    "World",
    "checked_by",
    "main",
]

"""The step's one all_reduce, with the numerical guard folded in (trainer/resilience/guard.py).

Without the guard the loop reduces the logged loss alone (one float, for the step event). With it, each
rank first judges its own step (`local_finding`: its loss, and its gradient norm taken in the optimizer's
step) and the same all_reduce carries `guard.PACKED` floats instead of one, so every rank learns the
verdict with no collective of its own. The gradient norm is read where the library can see the gradients:
an optimizer step pre-hook, active only inside the team's step (a restore's template build runs the
optimizer too). The same hook applies an injected nan or spike fault to the gradients, so the update the
optimizer then makes is really corrupt, and `job.log` applies it to the loss.

Cost: the hook's one pass over the local gradients (a foreach norm), the rank's own check (a few
medians of `window` floats), and on a GPU one read of the loss and norm to the host per step on every
rank, where without the guard only rank 0 reads the reduced loss (for the step event): the next step's
first collective waits for rank 0 anyway. No collective is added, but for an all_gather of one flag per
rank in a step where more than one rank tripped. bench/guard.py measures it.

The straggler watch's timings (trainer/runtime/straggler_watch.py) ride in the same all_reduce: `extra`
slots after the guard's, which the watch fills before `reduce` and reads after.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainer.resilience.guard import PACKED, Guard, Verdict, Windows, local_finding, pack, unpack

if TYPE_CHECKING:
    from trainer.runtime.faults import FaultInjector


@dataclass(frozen=True)
class Checked:
    """What one step's reduction gave this rank."""

    loss_mean: float
    """The mean logged loss over ranks (NaN when none was logged, or the guard tripped)."""
    verdict: Verdict | None
    """The guard's verdict (None: the guard is off)."""
    finding: str | None = None
    """Why this rank tripped, if it did."""
    loss: float | None = None
    grad_norm: float | None = None


class StepCheck:
    """One attempt's step reduction and optimizer hook. `close` removes the hook."""

    def __init__(
        self,
        guard: Guard,
        optimizer: torch.optim.Optimizer,
        windows: Windows,
        faults: FaultInjector,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        extra: int = 0,
    ) -> None:
        self.guard, self.windows, self.faults = guard, windows, faults
        self.rank, self.world_size = rank, world_size
        on = guard.enabled
        self._head = PACKED if on else 1
        self.buf = torch.zeros(
            self._head + extra, dtype=torch.float64 if on else torch.float32, device=device
        )
        self.extra = self.buf[self._head :]
        """`extra` slots after the guard's, reduced (SUM) in the same all_reduce: their owner (the
        straggler watch) fills them before `reduce` and reads them after."""
        self.step = -1
        """The step whose body is running (-1: outside the team's step)."""
        self._grad_norm: torch.Tensor | None = None
        self._handle = (
            optimizer.register_step_pre_hook(self._pre_step) if on or faults.specs else None
        )  # no hook at all without the guard and without faults: the loop is as it was

    def begin(self, step: int) -> None:
        self.step, self._grad_norm = step, None

    def end(self) -> None:
        self.step = -1

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def faulted_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss as `job.log` records it: times an injected nan or spike of this step, if any."""
        factor = self.faults.numeric(self.step) if self.step >= 0 else None
        return loss if factor is None else loss * factor

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.step < 0:
            return
        with torch.no_grad():  # no autograd node per to_local(): it returns the local shard itself
            grads = [
                p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                for group in optimizer.param_groups
                for p in group["params"]
                if p.grad is not None
            ]
            if not grads:
                return
            factor = self.faults.numeric(self.step)
            if factor is not None:
                torch._foreach_mul_(grads, factor)
            if self.guard.enabled:
                self._grad_norm = torch.nn.utils.get_total_norm(grads, foreach=True)

    def reduce(self, loss: torch.Tensor | None) -> Checked:
        """The step's all_reduce (a collective: every rank calls it after the team's step)."""
        head = self.buf[: self._head]
        if not self.guard.enabled:
            if loss is not None:
                head.copy_(loss.to(self.buf.device, torch.float32).reshape(1))
            else:
                head.zero_()
            dist.all_reduce(self.buf)  # mean loss over ranks for the log (and a per-step liveness check)
            mean = head.item() / self.world_size if loss is not None and self.rank == 0 else math.nan
            return Checked(mean, None)
        value = float(loss.float().reshape(())) if loss is not None else None
        grad = float(self._grad_norm) if self._grad_norm is not None else None
        finding = local_finding(value, grad, self.windows, self.guard.cfg)
        head.copy_(torch.tensor(pack(value if value is not None else 0.0, finding, self.rank, grad)))
        dist.all_reduce(self.buf)
        verdict = unpack(head.tolist())
        if verdict.ok:
            self.windows.keep(value, grad)
        mean = verdict.loss_sum / self.world_size if value is not None and verdict.ok else math.nan
        return Checked(mean, verdict, finding, value, grad)

    def tripped_ranks(self, checked: Checked) -> list[int]:
        """The ranks that tripped (a collective when more than one did: every rank calls it then)."""
        assert checked.verdict is not None
        if checked.verdict.tripped <= 1:
            return checked.verdict.ranks()
        flag = torch.tensor([1 if checked.finding is not None else 0], device=self.buf.device)
        flags = [torch.empty_like(flag) for _ in range(self.world_size)]
        dist.all_gather(flags, flag)
        return checked.verdict.ranks([int(f.item()) for f in flags])

"""trainer/api/misuse.py: each rule of the API, broken, raises `Misuse` with one line naming the field and
the fix; the correct use passes. Real FSDP2 (`fully_shard`) on a 1-rank gloo group (conftest `one_rank`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader

from trainer.api import Misuse, SampleCursor, misuse
from trainer.config.errors import EXIT_NO_RESTART, UnrecoverableError, error_line


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


def sharded(mesh: Any) -> Tiny:
    """The model as the API wants it: each block, then the root."""
    model = Tiny()
    fully_shard(model.block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = int(state["n"])


class Holding:
    """A saveable entry whose state_dict holds `value`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return {"ok": torch.zeros(2), "bad": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Opaque:
    pass


def raised(fn: Any, *args: Any, **kwargs: Any) -> Misuse:
    with pytest.raises(Misuse) as info:
        fn(*args, **kwargs)
    return info.value


def assert_line(exc: Misuse, field: str, *texts: str) -> str:
    """One line, `config error: <field>: ...`, with each of `texts` in it."""
    line = error_line(exc)
    assert exc.field == field, line
    assert "\n" not in line and "\r" not in line and line == line.strip(), line
    assert line.startswith(f"config error: {field}: "), line
    assert str(exc) == f"{field}: {exc.why}"
    for text in texts:
        assert text in line, line
    return line


def test_misuse_is_unrecoverable_and_one_line() -> None:
    exc = Misuse("data", "two\nlines\x1b[31m and a tab\t")
    assert isinstance(exc, UnrecoverableError) and isinstance(exc, RuntimeError)
    assert exc.exit_code == EXIT_NO_RESTART
    line = error_line(exc)
    assert len(line.splitlines()) == 1 and "\x1b" not in line and "\t" not in line
    assert line.startswith("config error: data: two\\nlines")


# ---- model ---------------------------------------------------------------------------------------------


def test_correct_use_passes(one_rank: Any) -> None:
    model = sharded(one_rank)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0 / (s + 1))
    data = SampleCursor([torch.zeros(4)] * 8, batch_size=2)
    misuse.check_model(model)
    misuse.check_optimizer(optim, model)
    assert misuse.check_data(data, allow_unsaved=False) == (data, True)
    extra = misuse.check_state(sched, {"counter": Counter(), "ema_2": Counter()})
    assert list(extra) == ["scheduler", "counter", "ema_2"] and extra["scheduler"] is sched
    misuse.check_encodable({**extra, "data": data})
    misuse.check_groups(misuse.process_groups())
    assert misuse.check_state(None, None) == {}


def test_unsharded_model(one_rank: Any) -> None:
    exc = raised(misuse.check_model, Tiny())
    assert_line(exc, "model", "Tiny is not sharded with FSDP2", "fully_shard(model, mesh=job.mesh)")


def test_not_a_module() -> None:
    assert_line(raised(misuse.check_model, lambda x: x), "model", "must be a torch.nn.Module, got function")


def test_only_a_child_sharded(one_rank: Any) -> None:
    model = Tiny()
    fully_shard(model.block, mesh=one_rank)
    assert_line(raised(misuse.check_model, model), "model", "Tiny is not sharded", "fully_shard")


def test_root_sharded_with_plain_parameters(one_rank: Any) -> None:
    # Constructible two ways: parameters fully_shard was told to ignore, and a module added after it.
    model = Tiny()
    fully_shard(model, mesh=one_rank, ignored_params=set(model.head.parameters()))
    line = assert_line(raised(misuse.check_model, model), "model", "parameter head.weight is not sharded")
    assert "(2 in all)" in line and "fully_shard every module" in line

    late = sharded(one_rank)
    late.extra = nn.Linear(1, 1)
    assert_line(raised(misuse.check_model, late), "model", "parameter extra.weight is not sharded (2 in all)")


# ---- optimizer -----------------------------------------------------------------------------------------


def test_optimizer_built_before_fully_shard(one_rank: Any) -> None:
    model = Tiny()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fully_shard(model.block, mesh=one_rank)
    fully_shard(model, mesh=one_rank)
    misuse.check_model(model)
    exc = raised(misuse.check_optimizer, optim, model)
    assert_line(
        exc, "optimizer", "6 of its parameters are not the model's", "build the optimizer after fully_shard"
    )


def test_optimizer_of_another_model(one_rank: Any) -> None:
    model, other = sharded(one_rank), sharded(one_rank)
    optim = torch.optim.SGD([*model.parameters(), next(other.parameters())], lr=0.1)
    assert_line(raised(misuse.check_optimizer, optim, model), "optimizer", "1 of its parameters")


def test_not_an_optimizer(one_rank: Any) -> None:
    model = sharded(one_rank)
    exc = raised(misuse.check_optimizer, {"lr": 1e-3}, model)
    assert_line(exc, "optimizer", "must be a torch.optim.Optimizer, got dict")


# ---- data ----------------------------------------------------------------------------------------------


def test_plain_dataloader_is_refused_unless_allowed() -> None:
    loader = DataLoader([torch.zeros(2)] * 4, batch_size=2)
    exc = raised(misuse.check_data, loader, allow_unsaved=False)
    assert_line(exc, "data", "DataLoader cannot save its position", "SampleCursor", "allow_unsaved_data=True")
    assert misuse.check_data(loader, allow_unsaved=True) == (loader, False)
    gen = (x for x in range(3))  # an iterator without a position: the same rule
    assert_line(raised(misuse.check_data, gen, allow_unsaved=False), "data", "generator cannot save")
    assert misuse.check_data(gen, allow_unsaved=True) == (gen, False)


def test_dataloader_over_a_distributed_sampler_is_wrapped() -> None:
    from torch.utils.data import DistributedSampler

    from trainer.api.loader import LoaderCursor

    samples = [torch.zeros(2)] * 4
    loader = DataLoader(samples, batch_size=2, sampler=DistributedSampler(samples, num_replicas=1, rank=0))
    source, saved = misuse.check_data(loader, allow_unsaved=False)
    assert saved is True and isinstance(source, LoaderCursor) and source.loader is loader


def test_not_iterable_data() -> None:
    for data in (42, Opaque(), None):
        exc = raised(misuse.check_data, data, allow_unsaved=True)
        assert_line(exc, "data", "must be an iterator or iterable of batches", f"got {type(data).__name__}")


def test_saveable_data_passes_either_way() -> None:
    cursor = SampleCursor([0, 1, 2, 3], batch_size=2)
    assert misuse.check_data(cursor, allow_unsaved=False) == (cursor, True)
    assert misuse.check_data(cursor, allow_unsaved=True) == (cursor, True)


# ---- scheduler and state -------------------------------------------------------------------------------


def test_scheduler_without_state_dict() -> None:
    exc = raised(misuse.check_state, Opaque(), None)
    assert_line(exc, "scheduler", "Opaque has no state_dict/load_state_dict")


@pytest.mark.parametrize("name", ["model", "optim", "trainer", "scheduler"])
def test_reserved_state_names(name: str) -> None:
    exc = raised(misuse.check_state, None, {name: Counter()})
    assert_line(exc, "state", f"'{name}' is the library's own entry", "pick another name")


@pytest.mark.parametrize("name", ["2fast", "with space", "a-b", "", "naïve", "a\nb", 3, ("a",)])
def test_state_names_must_be_ascii_identifiers(name: Any) -> None:
    exc = raised(misuse.check_state, None, {name: Counter()})
    assert_line(exc, "state", "names must be ASCII identifiers", f"got {name!r:.60}")


def test_state_without_state_dict() -> None:
    exc = raised(misuse.check_state, None, {"ema": Opaque()})
    assert_line(exc, "state", "ema: Opaque has no state_dict/load_state_dict", "give it both methods")

    class HalfSaveable:
        def state_dict(self) -> dict[str, Any]:
            return {}

    exc = raised(misuse.check_state, None, {"half": HalfSaveable()})
    assert_line(exc, "state", "half: HalfSaveable has no state_dict/load_state_dict")


@pytest.mark.parametrize(("value", "kind"), [({1, 2}, "set"), (Opaque(), "Opaque"), (1 + 2j, "complex")])
def test_state_dict_that_cannot_be_encoded(value: Any, kind: str) -> None:
    exc = raised(misuse.check_encodable, {"fine": Counter(), "ema": Holding(value)})
    assert_line(exc, "state", f"ema: snapshot cannot hold a {kind}", "a state_dict may hold tensors")


def test_encodable_state_passes() -> None:
    nested = {
        "t": torch.ones(3),
        "l": [1, 2.5, "s", None, True],
        "tu": (torch.zeros(1), {"k": 1}),
        "b": b"raw bytes",
    }
    misuse.check_encodable({"counter": Counter(), "ema": Holding(nested)})


# ---- process groups ------------------------------------------------------------------------------------


def test_group_made_outside_the_library(one_rank: Any) -> None:
    known = misuse.process_groups()
    assert known  # the default group and the mesh's
    misuse.check_groups(known)
    group = dist.new_group([0])
    try:
        exc = raised(misuse.check_groups, known)
        assert_line(exc, "process_group", "1 process group(s) were created outside the library", "job.mesh")
        misuse.check_groups(known | misuse.process_groups())  # known to the library: fine
    finally:
        dist.destroy_process_group(group)
    misuse.check_groups(known)


def test_no_groups_without_a_process_group() -> None:
    assert not dist.is_initialized()
    assert misuse.process_groups() == set()
    misuse.check_groups(set())

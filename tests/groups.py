"""A pytest plugin: which tests `make test`'s xdist workers run together (`--dist loadgroup`).

Each test gets a group, so that a module's (or the session's) shared run or synth is started once, on one
worker:
- HEAVY: every module with a multi-process training run (a `slow` test, or one reading the session's
  shared runs). They run one after another on one worker: their timeouts are sized for one run on a
  loaded 2-core machine beside the other worker's work;
- SECOND_LANE: heavy modules that read no shared run of HEAVY's (a run read from two groups would be
  started twice: such a test fails before it starts, naming the run) and assert outcomes, not seconds,
  run one after another on the *other* worker, first thing, beside HEAVY; the other worker's light
  groups follow. Without them the other worker ran out of work a third of the suite before HEAVY did.
  Three workers (two lanes and the light groups) were tried and lost: 1,064 s against 951 s, every run
  about twice as slow at load 13-15 (2026-12-06);
- "infra": the infra tests, which read one synth of the app per session (tests/infra/conftest.py);
- CLUSTER: every module with a test that uses the session's control plane (the `control_plane` fixture of
  tests/conftest.py), wherever it lives, so that one worker starts one control plane for all of them. A
  module both HEAVY and CLUSTER goes to CLUSTER: a second control plane would cost more than the overlap;
- every other module is its own group: the other worker takes them while HEAVY runs.

Registered in tests/conftest.py; does nothing outside an xdist worker of `--dist loadgroup`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import pytest
from _pytest.nodeid import NodeId

_T = TypeVar("_T")

HEAVY = "heavy"
SECOND_LANE = "heavy-2"
SECOND_LANE_MODULES = frozenset(
    {
        "tests/examples/test_gpt2_faults.py",  # its own clean and faulted pods runs, outcomes only
        "tests/trainer/checkpoint/test_ckpt_dist.py",  # mp ranks, no launcher, outcomes only
        "tests/trainer/checkpoint/test_ckpt_faults.py",  # its own fault chain, outcomes only
        "tests/trainer/runtime/test_guard_rollback.py",  # its own NaN-and-kill run, outcomes only
        "tests/trainer/runtime/test_read_only_root.py",  # its own pod-command run, outcomes only
        "tests/trainer/events/test_prometheus_scrape.py",  # its own run and Prometheus, what it stored
        "tests/trainer/checkpoint/test_ckpt_wait.py",  # its own slow-peer runs, outcomes only
    }
)
"""The heavy modules of SECOND_LANE: about what the other worker's light groups leave of HEAVY's time
(measured with `-v --durations=0`), so that both workers end together."""
EARLY_MODULES = frozenset(
    {
        "tests/chart/test_values_generated.py",  # one test, 23 s
        "tests/bench/test_scale.py",  # three tests, 20 s (one simulation they share)
        "tests/trainer/checkpoint/test_helper_server.py",  # five tests, 24 s
        "tests/trainer/checkpoint/test_ckpt_local_tier.py",  # five tests, 21 s
        "tests/trainer/checkpoint/test_ownership.py",  # five tests, 18 s
        "tests/bench/test_guard_bench.py",  # one test, 8 s
        "tests/trainer/checkpoint/test_ckpt_nvrx_close.py",  # two tests, 14 s
    }
)
"""Light modules that take long for their few tests (`make test-fast -v --durations=0`, 3 workers): run
right after FIRST's groups, before the many-test modules, so that none of them starts last on one worker
while the others have run out of work (the last 20 s of make test-fast were one worker's, 2026-12-06)."""
CLUSTER = "controlplane"
FIRST = (HEAVY, SECOND_LANE, CLUSTER)
"""Scheduled first, in this order (make test runs xdist with --no-loadscope-reorder): HEAVY and SECOND_LANE
start on different workers, and the long groups never start last."""
CONTROL_PLANE_FIXTURE = "control_plane"
SHARED_RUNS = frozenset({"clean_run", "faulty_run", "pods_clean_run"})
"""Session fixtures of tests/trainer/conftest.py that start a multi-process run."""
_SPLIT_RUNS = pytest.StashKey[dict[str, list[str]]]()


def group_suffix(item: pytest.Item) -> str | None:
    """The group this plugin gave `item` (its id's `@<group>`), None outside `--dist loadgroup`."""
    if not getattr(item.config.option, "loadgroup", False):
        return None
    return item.nodeid.rsplit("@", 1)[-1] if "@" in item.nodeid.rsplit("]", 1)[-1] else None


def ends_group(item: pytest.Item, nextitem: pytest.Item | None, group: str) -> bool:
    """Whether `item` is the last test of `group` that this worker runs: under `--dist loadgroup` a group's
    tests run one after another on one worker, and a worker runs a test only once it holds the next one
    (or at its end), so `nextitem` is the test that really comes next. Never outside loadgroup, where a
    group's modules are not run together."""
    return group_suffix(item) == group and (nextitem is None or group_suffix(nextitem) != group)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def is_heavy(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None or bool(
        SHARED_RUNS & set(getattr(item, "fixturenames", ()))
    )


def uses_control_plane(item: pytest.Item) -> bool:
    return CONTROL_PLANE_FIXTURE in getattr(item, "fixturenames", ())


def group_of(nodeid: str, heavy_modules: Iterable[str], cluster_modules: Iterable[str] = ()) -> str:
    module = module_of(nodeid)
    if module in cluster_modules:
        return CLUSTER
    if module in heavy_modules:
        return SECOND_LANE if module in SECOND_LANE_MODULES else HEAVY
    if module.startswith("tests/infra/"):
        return "infra"
    return module


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set in an xdist worker of `--dist loadgroup` only
        return
    heavy_modules = {module_of(item.nodeid) for item in items if is_heavy(item)}
    cluster_modules = {module_of(item.nodeid) for item in items if uses_control_plane(item)}
    groups: dict[int, str] = {}
    for item in items:
        group = groups[id(item)] = group_of(item.nodeid, heavy_modules, cluster_modules)
        item.add_marker(pytest.mark.xdist_group(group))
        # The controller schedules by the suffix `@<group>` of each test's id. xdist 3.8 appends it to
        # `item._nodeid`, which pytest 9 no longer reads (the id lives in `item._id`): without this
        # every test was scheduled alone, and the session's shared runs ran once per worker.
        if "@" not in item.nodeid.rsplit("]", 1)[-1]:
            item._id = NodeId.parse(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]
    items[:] = scheduling_order(items, lambda item: groups[id(item)])


def pytest_collection_finish(session: pytest.Session) -> None:
    # Here, not above: this plugin's grouping runs first, before `-m` deselects (the soak tests).
    if not getattr(session.config.option, "loadgroup", False):
        return
    session.config.stash[_SPLIT_RUNS] = shared_runs_split(
        session.items, lambda item: item.nodeid.rsplit("@", 1)[-1]
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that reads a shared run of several groups fails before the run starts (once more, on each
    worker that takes one of those groups: minutes of the suite), naming the run and its groups."""
    split = item.config.stash.get(_SPLIT_RUNS, {})
    runs = sorted(set(split) & set(getattr(item, "fixturenames", ())))
    if runs:
        pytest.fail(
            f"tests/groups.py: the shared run {runs[0]} is read from the groups {split[runs[0]]}: "
            "put its readers in one group",
            pytrace=False,
        )


def shared_runs_split(items: list[pytest.Item], group: Callable[[pytest.Item], str]) -> dict[str, list[str]]:
    """The shared runs (SHARED_RUNS) that tests of more than one group read, each with those groups."""
    readers: dict[str, set[str]] = {}
    for item in items:
        for run in SHARED_RUNS & set(getattr(item, "fixturenames", ())):
            readers.setdefault(run, set()).add(group(item))
    return {run: sorted(groups) for run, groups in readers.items() if len(groups) > 1}


def scheduling_order(items: list[_T], group: Callable[[_T], str]) -> list[_T]:
    """The items grouped as xdist schedules them: FIRST's groups in that order, then EARLY_MODULES', then
    the others by their number of tests, most first (xdist's own reordering, which --no-loadscope-reorder
    turns off), each group's tests in their collection order."""
    members: dict[str, list[_T]] = {}
    for item in items:
        members.setdefault(group(item), []).append(item)
    first = [g for g in FIRST if g in members]
    rest = sorted(
        (g for g in members if g not in FIRST), key=lambda g: (g not in EARLY_MODULES, -len(members[g]))
    )
    return [item for g in first + rest for item in members[g]]

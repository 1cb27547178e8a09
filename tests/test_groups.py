"""tests/groups.py: the multi-process runs share one worker, and the grouping reaches xdist's scheduler."""

from __future__ import annotations

from typing import Any

import pytest

from tests.groups import CLUSTER, HEAVY, group_of


def test_heavy_modules_share_one_group_infra_another_and_the_rest_their_own() -> None:
    heavy = {"tests/trainer/runtime/test_exact_resume.py", "tests/trainer/resilience/test_inprocess.py"}
    assert group_of("tests/trainer/runtime/test_exact_resume.py::test_x[a]", heavy) == HEAVY
    assert group_of("tests/trainer/resilience/test_inprocess.py::test_y", heavy) == HEAVY
    assert group_of("tests/infra/test_stacks.py::test_z", heavy) == "infra"
    assert group_of("tests/chart/test_lint.py::test_w", heavy) == "tests/chart/test_lint.py"


def test_every_module_on_the_control_plane_shares_one_group_even_a_heavy_one() -> None:
    heavy = {"tests/tools/test_demo_cluster.py"}
    cluster = {"tests/controlplane/test_install.py", "tests/tools/test_demo_cluster.py"}
    assert group_of("tests/controlplane/test_install.py::test_a", heavy, cluster) == CLUSTER
    assert group_of("tests/tools/test_demo_cluster.py::test_b", heavy, cluster) == CLUSTER
    assert (
        group_of("tests/controlplane/test_other.py::test_c", heavy, cluster)
        == "tests/controlplane/test_other.py"
    )


def test_this_test_is_scheduled_by_its_group(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("checks the scheduling of make test's xdist workers (run with -n 2 --dist loadgroup)")
    # The suffix is what xdist's controller groups by; without it each test is scheduled alone.
    assert request.node.nodeid.endswith("@tests/test_groups.py")


def test_the_second_lane_takes_its_heavy_modules_and_the_long_groups_are_scheduled_first() -> None:
    from tests.groups import EARLY_MODULES, FIRST, SECOND_LANE, SECOND_LANE_MODULES, scheduling_order

    lane_module = sorted(SECOND_LANE_MODULES)[0]
    heavy = {lane_module, "tests/trainer/runtime/test_exact_resume.py"}
    assert group_of(f"{lane_module}::test_a", heavy) == SECOND_LANE
    assert group_of("tests/trainer/runtime/test_exact_resume.py::test_b", heavy) == HEAVY
    # Only a heavy module goes to the lane: listed but without a training run here, it is its own group.
    assert group_of(f"{lane_module}::test_a", set()) == lane_module
    assert FIRST[:2] == (HEAVY, SECOND_LANE)

    items = ["small::1", "infra::1", "lane::1", "infra::2", "heavy::1", "cluster::1", "lane::2", "infra::3",
             "long::1"]  # fmt: skip
    long_module = sorted(EARLY_MODULES)[0]
    group = {"small": "tests/x.py", "infra": "infra", "lane": SECOND_LANE, "heavy": HEAVY, "cluster": CLUSTER,
             "long": long_module}  # fmt: skip
    order = scheduling_order(items, lambda item: group[item.split("::")[0]])
    assert order == [
        "heavy::1", "lane::1", "lane::2", "cluster::1", "long::1",
        "infra::1", "infra::2", "infra::3", "small::1",
    ]  # fmt: skip
    from tests.helpers import REPO_ROOT

    assert all((REPO_ROOT / module).is_file() for module in EARLY_MODULES | SECOND_LANE_MODULES)


def test_a_shared_run_read_from_two_groups_is_found() -> None:
    from types import SimpleNamespace

    from tests.groups import SECOND_LANE, shared_runs_split

    items = [
        SimpleNamespace(nodeid="a.py::t", fixturenames=["pods_clean_run", "tmp_path"]),
        SimpleNamespace(nodeid="b.py::t", fixturenames=["pods_clean_run"]),
        SimpleNamespace(nodeid="c.py::t", fixturenames=["clean_run"]),
        SimpleNamespace(nodeid="d.py::t", fixturenames=["clean_run"]),
    ]
    group = {"a.py": SECOND_LANE, "b.py": HEAVY, "c.py": HEAVY, "d.py": HEAVY}
    split = shared_runs_split(items, lambda item: group[item.nodeid.split("::")[0]])  # type: ignore[arg-type]
    assert split == {"pods_clean_run": sorted([SECOND_LANE, HEAVY])}


def test_a_group_ends_at_its_last_test_on_the_worker_and_never_outside_loadgroup() -> None:
    from types import SimpleNamespace

    from tests.groups import ends_group

    def item(nodeid: str, loadgroup: bool = True) -> Any:
        return SimpleNamespace(
            nodeid=nodeid, config=SimpleNamespace(option=SimpleNamespace(loadgroup=loadgroup))
        )

    a1, a2 = item(f"tests/a.py::t1@{CLUSTER}"), item(f"tests/b.py::t2[x@y]@{CLUSTER}")
    other = item("tests/c.py::t3@tests/c.py")
    assert not ends_group(a1, a2, CLUSTER)  # the group goes on
    assert ends_group(a2, other, CLUSTER) and ends_group(a2, None, CLUSTER)
    assert not ends_group(other, None, CLUSTER)  # not one of the group's
    assert not ends_group(item("tests/d.py::t4[x@controlplane]"), None, CLUSTER)  # a parameter, no group
    plain = item(f"tests/a.py::t1@{CLUSTER}", loadgroup=False)
    assert not ends_group(plain, other, CLUSTER)  # plain pytest: the group's modules are not together

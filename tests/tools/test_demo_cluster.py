"""tools/demo_cluster.py's pieces: which nodes a node-loss fault took, when each replacement came, and the
side-by-side table. (The whole run is `make demo-cluster`: minutes of training, kept out of make test.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client

import tools.demo_cluster as demo_cluster
from tools.demo_cluster import compare, lost_nodes, replacements


def pod_with(node: str, code: int | None) -> client.V1Pod:
    state = client.V1ContainerState(
        terminated=client.V1ContainerStateTerminated(exit_code=code) if code is not None else None,
        running=client.V1ContainerStateRunning() if code is None else None,
    )
    status = client.V1ContainerStatus(
        name="trainer", image="t", image_id="", ready=False, restart_count=0, state=state
    )
    return client.V1Pod(
        spec=client.V1PodSpec(node_name=node, containers=[]),
        status=client.V1PodStatus(container_statuses=[status]),
    )


def test_only_a_pod_killed_whole_loses_its_node() -> None:
    pods = [pod_with("a", 137), pod_with("b", 1), pod_with("c", None), pod_with("d", 0)]
    assert lost_nodes(pods) == {"a"}


def test_replacements_name_each_index_s_next_pod_and_its_delay() -> None:
    def pod(name: str, phase: str, code: int, created: float, finished: float) -> dict[str, object]:
        index, node = name.split("-")[1], {"j-0-b": "n3", "j-0-a": "n0", "j-1-a": "n1"}[name]
        return {"name": name, "index": index, "node": node, "phase": phase, "exit_code": code,
                "created": created, "finished": finished}  # fmt: skip

    pods = [
        pod("j-0-b", "Succeeded", 0, 110.0, 200.0),
        pod("j-0-a", "Failed", 137, 0.0, 100.4),
        pod("j-1-a", "Succeeded", 0, 0.0, 200.0),
    ]
    assert replacements(pods) == [
        "index 0: j-0-a ended Failed (exit 137) on n0; the Job controller created j-0-b 10 s later, on n3"
    ]


def test_compare_puts_the_two_reports_side_by_side(tmp_path: Path) -> None:
    def report(folder: str, mttr: float, joined: float, eff: float) -> Path:
        out = tmp_path / folder
        out.mkdir()
        fault = {
            "type": "node-loss",
            "step": 37,
            "mttr_s": mttr,
            "takeover": {"pod": "pod-2", "joined_after_s": joined},
        }
        data = {"job_succeeded": True, "steps": 60, "steps_recomputed": 1, "wall_s": 80.0,
                "training_efficiency": eff, "faults": [fault]}  # fmt: skip
        (out / "report.json").write_text(json.dumps(data))
        return out

    table = compare(report("a", 2.5, 1.25, 0.93), report("b", 3.0, 1.5, 0.91)).splitlines()
    assert "stand-in" in table[0] and "real control plane" in table[0]
    rows = {line.split("  ")[0].strip(): line.split() for line in table[1:]}
    assert rows["node-loss@37 spare joined after"][-4:] == ["1.25", "s", "1.50", "s"]
    assert rows["training efficiency"][-2:] == ["93.0%", "91.0%"]


@pytest.mark.parametrize("built", [False, True])
def test_make_demo_runs_on_the_real_control_plane_once_it_is_built(
    built: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(demo_cluster, "control_plane_built", lambda: built)
    monkeypatch.setattr(demo_cluster.demo, "main", lambda argv: ran.append("stand-in") or 0)
    monkeypatch.setattr(demo_cluster, "run", lambda *args: ran.append("real control plane") or 0)
    assert demo_cluster.main(["--stand-in-unless-built", "--out", str(tmp_path)]) == 0
    assert ran == ["real control plane" if built else "stand-in"]


def test_the_control_plane_counts_as_built_only_with_all_four_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tools.controlplane import launch

    monkeypatch.setattr(launch, "DEFAULT_BIN_DIR", tmp_path)
    for name in launch.BINARIES[:-1]:
        (tmp_path / name).write_text("")
    assert not demo_cluster.control_plane_built()
    (tmp_path / launch.BINARIES[-1]).write_text("")
    assert demo_cluster.control_plane_built()


@pytest.mark.soak
def test_the_demo_runs_on_the_real_control_plane(tmp_path: Path) -> None:
    """`make demo-cluster` whole (about 3 minutes on 2 cores): the installed chart's Job completes through
    the real Job controller, the node-loss fault's pod is replaced on another node, both faults recover."""
    from tools.demo_cluster import REPO, run

    out = tmp_path / "demo-cluster"
    rc = run(REPO / "teams.yaml", REPO / "tools/demo-values.yaml", out, timeout_s=900)
    assert rc == 0
    pods = json.loads((out / "pods.json").read_text())
    lost = [p for p in pods if p["exit_code"] == 137]
    assert len(lost) == 1 and lost[0]["phase"] == "Failed"
    replacement = [p for p in pods if p["index"] == lost[0]["index"] and p["name"] != lost[0]["name"]]
    assert len(replacement) == 1 and replacement[0]["node"] != lost[0]["node"]
    report = json.loads((out / "report.json").read_text())
    assert [f["type"] for f in report["faults"]] == ["exception", "node-loss"]
    assert all(f["recovered"] for f in report["faults"])

"""The demo's pieces: CloudFormation values read offline, kubelet-style expansion, the rendered pod."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tools.cfn import helm_releases, resolve
from tools.podspec import expand, load_manifests, trainer_pod

REPO = Path(__file__).resolve().parents[2]
HELM = REPO / ".tools/bin/helm"
PSEUDO = {"AWS::AccountId": "123456789012", "AWS::Region": "us-east-2"}


def test_resolve_evaluates_join_sub_select_and_keeps_unknown_refs_visible() -> None:
    expr = {
        "Fn::Join": [
            "",
            [
                '{"repo":"',
                {"Fn::Sub": "${AWS::AccountId}.dkr.ecr.${AWS::Region}.amazonaws.com/x"},
                '","az":"',
                {"Fn::Select": [1, {"Fn::Split": [",", "a,b,c"]}]},
                '","bucket":"',
                {"Ref": "ChartBucket"},
                '"}',
            ],
        ]
    }
    assert json.loads(resolve(expr, PSEUDO)) == {
        "repo": "123456789012.dkr.ecr.us-east-2.amazonaws.com/x",
        "az": "b",
        "bucket": "<Ref:ChartBucket>",
    }


def test_helm_releases_parses_values_of_each_release(tmp_path: Path) -> None:
    template = {
        "Resources": {
            "Chart1": {
                "Type": "Custom::AWSCDK-EKS-HelmChart",
                "Properties": {
                    "Release": "trainer",
                    "Namespace": "team-a",
                    "Values": {"Fn::Join": ["", ['{"nodes":', "2", "}"]]},
                },
            },
            "Other": {"Type": "AWS::S3::Bucket", "Properties": {}},
        }
    }
    path = tmp_path / "t.template.json"
    path.write_text(json.dumps(template))
    releases = helm_releases(path, PSEUDO)
    assert list(releases) == ["trainer"]
    assert releases["trainer"]["Values"] == {"nodes": 2}
    assert releases["trainer"]["Namespace"] == "team-a"


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("--x=$(A)", {"A": "1"}, "--x=1"),
        ("$(A)$(B)", {"A": "1", "B": "2"}, "12"),
        ("$(MISSING)", {}, "$(MISSING)"),  # the kubelet leaves unknown references as written
        ("$$(A)", {"A": "1"}, "$(A)"),  # $$ escapes
        ('$(dirname "$P")', {"P": "x"}, '$(dirname "$P")'),  # shell syntax is not a variable reference
    ],
)
def test_expand_follows_kubelet_rules(text: str, env: dict[str, str], expected: str) -> None:
    assert expand(text, env) == expected


def test_trainer_pod_from_the_rendered_chart_runs_ft_launcher_with_local_places() -> None:
    rendered = subprocess.run(
        [str(HELM), "template", "trainer", str(REPO / "k8s"), "-f", str(REPO / "tools/demo-values.yaml")],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    pod = trainer_pod(load_manifests(rendered))
    # The Job name carries a digest of its spec (a changed spec is a new Job on helm upgrade).
    assert re.fullmatch(r"trainer-[0-9a-f]{6}", pod.job_name), pod.job_name
    assert [c.name for c in pod.init_containers] == ["synthetic-data", "check-config"]
    argv = pod.trainer.resolved_argv({"RDZV_ENDPOINT": "127.0.0.1:1234", "OUT_DIR": "/tmp/run"})
    assert argv[:4] == ["python", "-m", "trainer.launcher", "ft_launcher"]  # warm worker starts
    assert "--rdzv-endpoint=127.0.0.1:1234" in argv
    assert "--nnodes=2:3" in argv and "--nproc-per-node=2" in argv  # 2 training pods + 1 hot spare
    assert "--out-dir=/tmp/run" in argv
    # Both tiers' faults travel through the chart's values into the trainer's arguments.
    faults = sorted(a for a in argv if a.startswith("--fault="))
    assert faults == ["--fault=exception:step=17:rank=1", "--fault=node-loss:step=37:node=0"]
    assert not [a for a in argv if "$(" in a], "every $(VAR) of the pod command has a value"


def test_trainer_pod_rejects_manifests_without_a_job() -> None:
    with pytest.raises(ValueError, match="expected one trainer Job"):
        trainer_pod([{"kind": "Service", "metadata": {"name": "x"}}])


def test_the_report_names_the_slow_steps_as_ranges() -> None:
    from tools.demo import describe_slow_steps, step_ranges

    assert step_ranges([38, 0, 1, 2, 16, 36, 37]) == "0-2, 16, 36-38"
    assert describe_slow_steps({"median_s": 0.5, "steps": [], "over_median_s": 0.0}) == []
    (line,) = describe_slow_steps({"median_s": 0.5, "steps": [0, 1, 7], "over_median_s": 4.25})
    assert line.startswith("slow steps    3 steps (0-1, 7) ran 4.2 s beyond the median step (0.50 s)"), line


def test_the_report_has_a_line_per_straggler_saying_what_the_policy_did() -> None:
    from tools.demo import describe_stragglers

    assert describe_stragglers([]) == []
    found = {"step": 9, "node": 1, "score": 2.76, "history": 2.5, "action": "evict"}
    (evicted,) = describe_stragglers([{**found, "reason": "a hot spare stands by"}])
    assert evicted.startswith("straggler     node 1 at step 9: 2.76x its peers' step time"), evicted
    assert "evicted into the hot spare (a hot spare stands by)" in evicted
    (reported,) = describe_stragglers([{**found, "action": "report", "reason": "no hot spare stands by"}])
    assert "reported (no hot spare stands by)" in reported


def test_values_files_layer_in_order_and_a_null_drops_a_key(tmp_path: Path) -> None:
    from tools.demo import layer

    base = tmp_path / "base.yaml"
    base.write_text(
        "steps: 60\nfaults:\n  soft: exception:step=17:rank=1\n  hard: node-loss:step=37:node=0\n"
    )
    over = tmp_path / "over.yaml"
    over.write_text("faults:\n  soft: null\n  slow: slow:step=5:node=1:factor=3\nstragglerPolicy: report\n")
    assert layer([base, over]) == {
        "steps": 60,
        "faults": {"hard": "node-loss:step=37:node=0", "slow": "slow:step=5:node=1:factor=3"},
        "stragglerPolicy": "report",
    }
    # The project's own overlays render: the straggler demo has the slow fault and only it.
    repo = Path(__file__).resolve().parents[2] / "tools"
    straggler = layer([repo / "demo-values.yaml", repo / "demo-straggler.yaml"])
    assert straggler["faults"] == {"slow": "slow:step=5:node=1:factor=3"}
    assert layer([repo / "demo-values.yaml", repo / "demo-fault-free.yaml"])["faults"] == {}


def test_the_report_names_the_guards_rollbacks_and_suspect_nodes() -> None:
    from tools.demo import GUARD_NAME, describe_guard, handled_by

    assert describe_guard({"rollbacks": 0, "skipped_steps": [], "suspect_nodes": []}) == []
    guard = {"rollbacks": 2, "skipped_steps": [4, 9], "rollback_s": {"median": 0.25}, "suspect_nodes": [1]}
    (line,) = describe_guard(guard)
    assert line == (
        "guard         2 step(s) rolled back, the batch of step(s) 4, 9 skipped, 0.25 s median per rollback; "
        "suspect nodes: 1"
    ), line
    assert handled_by({"tier": None, "type": "nan"}) == GUARD_NAME
    assert handled_by({"tier": None, "type": "sigkill"}) == "tier ?"
    assert handled_by({"tier": 2, "type": "spike"}).startswith("tier 2")


@pytest.mark.parametrize(
    ("faults", "expected", "ok"),
    [
        ([], False, True),  # a fault-free overlay: nothing to recover
        ([], True, False),  # faults were injected but none fired
        ([{"recovered": True}], True, True),
        ([{"recovered": True}, {"recovered": False}], True, False),
    ],
)
def test_the_demo_fails_when_a_fault_did_not_recover_or_none_fired_that_was_injected(
    faults: list[dict[str, bool]], expected: bool, ok: bool
) -> None:
    from tools.demo import faults_recovered

    assert faults_recovered({"faults": faults}, expected) is ok

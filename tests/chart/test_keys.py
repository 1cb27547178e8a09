"""The keys of docs/design.md Contract 5 in the rendered chart: the per-release replica key Secret (random,
never a value), both key files mounted read-only from non-optional Secret volumes, their paths in the
trainer's env and nowhere in its argv."""

from __future__ import annotations

import base64

from tests.chart.helm import by_kind, env_of, render, trainer_container


def _replica_key(docs: list[dict]) -> str:  # type: ignore[type-arg]
    (secret,) = [s for s in by_kind(docs, "Secret") if s["metadata"]["name"].endswith("-replica-key")]
    return base64.b64decode(secret["data"]["replica.key"]).decode()


def test_the_replica_key_is_random_per_install_and_only_a_file_in_the_pod() -> None:
    first, second = render({}), render({"steps": 11})  # two renders: no live Secret to look up
    key = _replica_key(first)
    assert len(key) == 48 and key.isalnum() and key != _replica_key(second)
    container = trainer_container(first)
    env = env_of(container)
    assert env["TRAINER_REPLICA_KEY_FILE"] == "/var/run/trainer/replica-key/replica.key"
    assert env["TRAINER_CKPT_KEY_FILE"] == "/var/run/trainer/ckpt-key/checkpoint.key"
    assert key not in str(container), "the key itself reached the container spec"
    pod = by_kind(first, "Job")[0]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (secret,) = [s for s in by_kind(first, "Secret") if s["metadata"]["name"].endswith("-replica-key")]
    assert volumes["replica-key"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert volumes["ckpt-key"]["secret"]["secretName"] == "checkpoint-key"
    for name in ("replica-key", "ckpt-key"):
        assert (
            volumes[name]["secret"]["optional"] is False and volumes[name]["secret"]["defaultMode"] == 0o440
        )
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["replica-key"]["readOnly"] is True and mounts["ckpt-key"]["readOnly"] is True
    args = " ".join(container.get("command", []) + container.get("args", []))
    assert "KEY" not in args and key not in args


def test_the_team_key_secret_name_is_a_value() -> None:
    docs = render({"checkpointKey": {"secretName": "team-a-ckpt"}})
    pod = by_kind(docs, "Job")[0]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["ckpt-key"]["secret"]["secretName"] == "team-a-ckpt"

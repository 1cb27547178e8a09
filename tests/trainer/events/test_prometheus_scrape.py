"""A real Prometheus server scrapes a real faulted training run; PromQL over what it stored matches the
run's summary.json.

Prometheus is Debian's `prometheus` package (`make prometheus`, a dependency of `make test`). The run is
2 gloo ranks under torchrun with an injected exception that the in-process tier (1) recovers. The
trainer's endpoint lingers after completion until one more scrape has been answered, which is how a
collector on a cluster gets a finished run's final figures before the pod goes away; queries use
`last_over_time`, as a dashboard does for a run whose target is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO_ROOT, free_port

STEPS = 12
SCRAPE = "500ms"  # Prometheus durations take no fractions
TIMEOUTS = ["--collective-timeout=3", "--inprocess-soft-timeout=5", "--inprocess-hard-timeout=30",
            "--inprocess-barrier-timeout=40", "--heartbeat-timeout=60"]  # fmt: skip


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read().decode())


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A Prometheus server on 127.0.0.1 scraping 127.0.0.1:<metrics port>; yields (url, metrics port)."""
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("prometheus is not on PATH: run `make prometheus` (Debian's prometheus package)")
    metrics_port, web_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: {SCRAPE}, scrape_timeout: {SCRAPE}}}\n"
        "scrape_configs:\n"
        f"  - job_name: trainer\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(
        [exe, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web_port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{web_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((tmp_path / "prometheus.log").read_text()[-3000:]) from None
                time.sleep(0.2)
        yield url, metrics_port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    reply = _get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert reply["status"] == "success", reply
    return list(reply["data"]["result"])


def _scalar(url: str, promql: str) -> float:
    (sample,) = _query(url, promql)
    return float(sample["value"][1])


@pytest.mark.slow
def test_prometheus_sees_the_runs_goodput_faults_and_tiers(
    tmp_path: Path, prometheus: tuple[str, int]
) -> None:
    from trainer.reference.data import write_synthetic_tokens
    from trainer.reference.model import PRESETS

    url, metrics_port = prometheus
    data = write_synthetic_tokens(tmp_path / "tokens.npy", 100_000, PRESETS["tiny"].vocab_size, seed=3)
    out, log = tmp_path / "run", tmp_path / "job.log"
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    argv = [
        torchrun, "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--max-restarts=0", "--monitor-interval=0.2",
        "-m", "trainer", f"--steps={STEPS}", "--ckpt-interval=3", "--ckpt-keep=3", "--ckpt-mode=nvrx",
        f"--out-dir={out}", "--device=cpu", "--seed=11", "--inprocess", "--fault=exception:step=6:rank=1",
        f"--metrics-port={metrics_port}", "--metrics-linger=60", "--snapshot-interval=0", *TIMEOUTS,
        "--", "--preset=tiny", f"--data-path={data}", "--seq-len=32", "--micro-batch-size=2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "w") as fh:
        job = subprocess.run(
            argv, cwd=REPO_ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=300, check=False
        )
    assert job.returncode == 0, log.read_text()[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"

    # Everything Prometheus stored for the run, as a dashboard of a finished run queries it.
    window = "[10m]"
    goodput = _scalar(url, f"last_over_time(trainer_goodput_ratio{window})")
    assert abs(goodput - summary["training_efficiency"]) <= 0.01, (goodput, summary["training_efficiency"])
    assert _scalar(url, f"last_over_time(trainer_run_completed{window})") == 1
    # Collected live, not only at the end: several scrapes while the run trained.
    assert _scalar(url, f"count_over_time(trainer_goodput_ratio{window})") >= 3
    assert _scalar(url, f"count_over_time(trainer_seconds_since_last_step{window})") >= 2

    def by_labels(name: str, *labels: str) -> list[tuple[Any, ...]]:
        found = _query(url, f"last_over_time({name}{window})")
        return sorted((*(s["metric"][k] for k in labels), float(s["value"][1])) for s in found)

    kinds: dict[str, int] = {}
    tiers: dict[tuple[str, str], int] = {}
    for f in summary["faults"]:
        kinds[f["type"]] = kinds.get(f["type"], 0) + 1
        if f["recovered"]:
            tiers[(str(f["tier"]), f["type"])] = tiers.get((str(f["tier"]), f["type"]), 0) + 1
    assert by_labels("trainer_faults_total", "kind") == sorted((k, float(n)) for k, n in kinds.items())
    recovered = by_labels("trainer_faults_recovered_total", "tier", "kind")
    assert recovered == sorted((t, k, float(n)) for (t, k), n in tiers.items())
    assert recovered == [("1", "exception", 1.0)]  # what the run injected, recovered in-process
    assert _scalar(url, f"sum(last_over_time(trainer_faults_total{window}))") == len(summary["faults"])

    (fault,) = summary["faults"]
    recovery = _scalar(
        url, f"last_over_time(trainer_recovery_seconds_sum{{tier='1',kind='exception'}}{window})"
    )
    assert recovery == pytest.approx(fault["mttr_s"], abs=1e-6)
    assert (
        _scalar(url, f"last_over_time(trainer_steps_recomputed_total{window})") == summary["steps_recomputed"]
    )
    assert (
        _scalar(url, f"last_over_time(trainer_checkpoint_commits_total{window})")
        == summary["ckpt"]["commits"]
    )

"""Synth scaling benchmark: wall time and peak memory of `cdk synth` for N generated teams, and cdk.out size.

    python -m bench.synth --teams 1 5 20 --repeats 3 [--via cli|python] [--out results.json]

Each run synthesizes into a fresh temporary folder. CPU time (user + system of the process tree) is
reported next to wall time because it barely moves with the machine's load. Memory is the peak of the
summed RSS of the whole process tree (cdk CLI -> python app.py -> jsii's node), sampled every 50 ms; the
largest single process's peak (from wait4) is reported too. Medians over the repeats, with min and max:
on a shared machine the spread matters as much as the median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
CDK_CLI = REPO_ROOT / "node_modules" / ".bin" / "cdk"
_INSTANCE_CYCLE = ["p5.48xlarge", "p5en.48xlarge", "p5e.48xlarge", "p4d.24xlarge"]


def generate_teams(n_teams: int) -> dict[str, Any]:
    """A valid teams document with `n_teams` teams, cycling instance types and capacity kinds."""
    if not 1 <= n_teams <= 250:
        raise ValueError(f"n_teams must be 1..250 (one /16 VPC each), got {n_teams}")
    teams = []
    for i in range(n_teams):
        capacity: dict[str, Any] = {"type": "on-demand"}
        if i % 3 == 1:
            capacity = {"type": "reservation", "id": f"cr-{i:017x}"}
        elif i % 3 == 2:
            capacity = {"type": "capacity-block", "id": f"cr-{i + 1:017x}"}
        teams.append(
            {
                "name": f"team-{i:03d}",
                "account": f"{100000000000 + i:012d}",
                "region": "us-east-2",
                "network": {
                    "vpc_cidr": f"10.{i}.0.0/16",
                    "availability_zones": ["us-east-2a", "us-east-2b", "us-east-2c"],
                    "gpu_availability_zone": "us-east-2b",
                },
                "admin_principal_arns": [f"arn:aws:iam::{100000000000 + i:012d}:role/Admin"],
                "gpu_node_group": {
                    "instance_type": _INSTANCE_CYCLE[i % 4],
                    "min_nodes": 0,
                    "desired_nodes": 2,
                    "max_nodes": 4,
                    "capacity": capacity,
                },
                "fsx": {
                    "storage_gib": 2400,
                    "throughput_per_tib": 250,
                    **({"s3_path": f"s3://ckpt-{i:03d}/exports"} if i % 2 == 0 else {}),
                },
            }
        )
    return {"teams": teams}


def _tree_rss_bytes(root_pid: int) -> int:
    """Summed RSS of `root_pid` and all its descendants (Linux /proc)."""
    total, stack, seen = 0, [root_pid], set()
    page = os.sysconf("SC_PAGE_SIZE")
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
            for task in Path(f"/proc/{pid}/task").iterdir():
                stack.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _command(via: str, teams_file: Path, outdir: Path) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ, JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
    if via == "cli":
        return [str(CDK_CLI), "synth", "--quiet", "-o", str(outdir), "-c", f"teams_file={teams_file}"], env
    # app.py exactly as the CLI invokes it: cdk.json context and the output folder through the environment
    # (read here, not through infra/, so this process never starts CDK's jsii runtime itself).
    context = json.loads((REPO_ROOT / "cdk.json").read_text()).get("context", {})
    env["CDK_OUTDIR"] = str(outdir)
    env["CDK_CONTEXT_JSON"] = json.dumps({**context, "teams_file": str(teams_file)})
    return [sys.executable, "app.py"], env


def synth_once(teams_file: Path, outdir: Path, via: str = "cli") -> dict[str, float]:
    """One synth into `outdir`: wall and CPU seconds, peak tree and largest-process RSS, cdk.out (MiB)."""
    cmd, env = _command(via, teams_file, outdir)
    peak = 0
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_bytes(proc.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stderr = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"synth failed ({proc.returncode}): {stderr.decode(errors='replace')[-2000:]}")
    return {
        "wall_s": wall,
        # CPU seconds of the tree (descendants the CLI waited for): far less load-sensitive than wall time.
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "tree_peak_rss_mib": peak / 2**20,
        "max_process_rss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
        "cdk_out_mib": _dir_bytes(outdir) / 2**20,
        "templates": len(list(outdir.glob("*.template.json"))),
    }


def _stats(values: list[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "runs": [round(v, 3) for v in values],
    }


def measure_synth(n_teams: int, repeats: int = 3, via: str = "cli") -> dict[str, Any]:
    """Synthesize `n_teams` generated teams `repeats` times; medians, spreads and cdk.out size."""
    if via == "cli" and not CDK_CLI.exists():
        raise FileNotFoundError(f"{CDK_CLI} missing: run `make setup`, or use via='python'")
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-synth-") as tmp:
        teams_file = Path(tmp) / "teams.yaml"
        teams_file.write_text(yaml.safe_dump(generate_teams(n_teams), sort_keys=False))
        for i in range(repeats):
            runs.append(synth_once(teams_file, Path(tmp) / f"out{i}", via))
    templates = {r["templates"] for r in runs}
    if templates != {n_teams}:
        raise RuntimeError(f"expected {n_teams} templates, got {templates}")
    return {
        "teams": n_teams,
        "repeats": repeats,
        "via": via,
        "wall_s": _stats([r["wall_s"] for r in runs]),
        "cpu_s": _stats([r["cpu_s"] for r in runs]),
        "tree_peak_rss_mib": _stats([r["tree_peak_rss_mib"] for r in runs]),
        "max_process_rss_mib": _stats([r["max_process_rss_mib"] for r in runs]),
        "cdk_out_mib": round(statistics.median(r["cdk_out_mib"] for r in runs), 1),
        "host": {"cpus": os.cpu_count(), "loadavg_1m_after": round(os.getloadavg()[0], 2)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, nargs="+", default=[1, 5, 20], help="team counts to measure")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--via",
        choices=["cli", "python"],
        default="cli",
        help="cli: `cdk synth` (what `make synth` runs); python: app.py alone",
    )
    parser.add_argument("--out", type=Path, help="write the JSON here instead of stdout")
    args = parser.parse_args(argv)
    results = [measure_synth(n, args.repeats, args.via) for n in args.teams]
    text = json.dumps({"synth": results}, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

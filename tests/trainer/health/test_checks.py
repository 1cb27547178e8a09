"""Each node check on its own: passing, failing and skipped with its reason; the device tools are small
scripts standing in for nvidia-smi and fi_info on a PATH of their own."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from trainer.config.settings import ConfigError
from trainer.health import checks
from trainer.health.config import HealthConfig


def tool(folder: Path, name: str, body: str) -> str:
    script = folder / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(folder)


def test_storage_probe_writes_reads_back_and_leaves_nothing(tmp_path: Path) -> None:
    result = checks.StorageProbe(tmp_path, 5.0)()
    assert result.status == "pass", result
    assert list(tmp_path.iterdir()) == []


def test_storage_probe_makes_its_directory_and_fails_where_it_cannot_write(tmp_path: Path) -> None:
    assert checks.StorageProbe(tmp_path / "out" / "run", 5.0)().status == "pass"
    assert (tmp_path / "out" / "run").is_dir()
    (tmp_path / "file").write_text("not a directory")
    blocked = checks.StorageProbe(tmp_path / "file" / "run", 5.0)()
    assert blocked.status == "fail" and "NotADirectoryError" in blocked.detail


def test_storage_probe_skipped_without_a_path() -> None:
    assert checks.StorageProbe(None, 5.0)() == checks.CheckResult("storage", "skip", "no storage path given")


def test_a_blocked_storage_probe_fails_at_its_deadline_and_the_next_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hung mount blocks the probe's thread in the kernel: stood in by a probe that waits on an event.
    release = threading.Event()
    calls: list[Path] = []

    def hung(directory: Path, outcome: list[str]) -> None:
        calls.append(directory)
        release.wait(30)

    monkeypatch.setattr(checks, "_probe_file", hung)
    probe = checks.StorageProbe(tmp_path, 0.2)
    first = probe()
    assert first.status == "fail" and "no answer within 0.2 s" in first.detail
    second = probe()
    assert second.status == "fail" and "still blocked" in second.detail
    assert len(calls) == 1, "a second thread was started on a blocked mount"
    release.set()
    for _ in range(100):
        if probe().status == "pass":
            break
        threading.Event().wait(0.05)
    else:
        pytest.fail("the probe never recovered once the mount answered")
    assert len(calls) == 2


def test_nvme_free_space_against_the_floor(tmp_path: Path) -> None:
    assert checks.nvme_free(tmp_path, 0.0).status == "pass"
    low = checks.nvme_free(tmp_path, 1e9)
    assert low.status == "fail" and "floor 1e+09 GiB" in low.detail
    assert checks.nvme_free(tmp_path / "gone", 0.0).status == "fail"
    assert checks.nvme_free(None, 1.0).status == "skip"


def test_gpu_check_skipped_without_nvidia_smi(tmp_path: Path) -> None:
    result = checks.gpus(8, 5.0, search_path=str(tmp_path))
    assert result.status == "skip" and "nvidia-smi" in result.detail


@pytest.mark.parametrize(
    ("body", "expected", "status", "says"),
    [
        ('echo "0, 00000000:10:1C.0, 0"; echo "1, 00000000:10:1D.0, [N/A]"', 2, "pass", "2 GPU(s)"),
        ('echo "0, 00000000:10:1C.0, 0"', 2, "fail", "lists 1 GPU(s), the pod has 2"),
        (
            'echo "0, 00000000:10:1C.0, 3"; echo "1, 00000000:10:1D.0, 0"',
            2,
            "fail",
            "ECC errors on 00000000:10:1C.0",
        ),
        ('echo "NVIDIA-SMI has failed" >&2; exit 9', 0, "fail", "exited 9: NVIDIA-SMI has failed"),
        ("sleep 5", 0, "fail", "did not finish within 0.5 s"),
    ],
)
def test_gpu_check_reads_nvidia_smi(tmp_path: Path, body: str, expected: int, status: str, says: str) -> None:
    result = checks.gpus(expected, 0.5, search_path=tool(tmp_path, "nvidia-smi", body))
    assert (result.status, says in result.detail) == (status, True), result


def efa_devices(tmp_path: Path, count: int) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(count):
        (dev / f"uverbs{i}").touch()
    return dev


FI_INFO_TWO = (
    'printf "provider: efa\\n    domain: rdmap16s27-rdm\\nprovider: efa\\n    domain: rdmap32s27-rdm\\n"'
)


def test_efa_check_skips_with_its_reason(tmp_path: Path) -> None:
    assert "no EFA device expected" in checks.efa(0, 5.0).detail
    assert "fi_info is not in this container" in checks.efa(2, 5.0, search_path=str(tmp_path)).detail
    bin_dir = tool(tmp_path, "fi_info", FI_INFO_TWO)
    result = checks.efa(2, 5.0, search_path=bin_dir, dev=efa_devices(tmp_path, 0))
    assert result.status == "skip" and "no EFA device visible" in result.detail


def test_efa_check_counts_the_providers_devices(tmp_path: Path) -> None:
    bin_dir, dev = tool(tmp_path, "fi_info", FI_INFO_TWO), efa_devices(tmp_path, 2)
    assert checks.efa(2, 5.0, search_path=bin_dir, dev=dev).status == "pass"
    short = checks.efa(4, 5.0, search_path=bin_dir, dev=dev)
    assert short.status == "fail" and "lists 2 EFA device(s), the pod has 4" in short.detail
    (tmp_path / "broken").mkdir()
    broken = tool(tmp_path / "broken", "fi_info", "exit 61")
    assert checks.efa(2, 5.0, search_path=broken, dev=dev).status == "fail"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"socket": Path("relative.sock")}, "socket"),
        ({"socket": Path("/" + "s" * 120)}, "socket"),
        ({"storage_path": Path("fsx")}, "storage_path"),
        ({"nvme_path": Path("nvme")}, "nvme_path"),
        ({"storage_deadline_s": 0.0}, "storage_deadline"),
        ({"nvme_min_free_gib": -1.0}, "nvme_min_free_gib"),
        ({"gpus": -1}, "gpus"),
        ({"tool_timeout_s": float("inf")}, "tool_timeout"),
    ],
)
def test_the_config_refuses_a_bad_field_by_name(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=f"^config error: {named}: "):
        HealthConfig(**{"socket": Path("/run/h.sock"), **fields})  # type: ignore[arg-type]


def test_the_config_takes_absolute_paths() -> None:
    cfg = HealthConfig(socket=Path("/run/h.sock"), storage_path=Path("/fsx"), nvme_path=Path("/nvme"))
    assert (cfg.storage_deadline_s, cfg.gpus) == (10.0, 0)
    assert os.path.isabs(cfg.socket)

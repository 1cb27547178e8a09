"""tools/localjob.py: on one machine only pod 0's launcher may host the rendezvous (`is_host`)."""

from __future__ import annotations

import pytest

from tools.localjob import with_rdzv_host


@pytest.mark.parametrize(
    ("argv", "is_host", "expected"),
    [
        (["/v/bin/ft_launcher", "--rdzv-conf=join_timeout=60", "-m", "trainer"], True,
         ["/v/bin/ft_launcher", "--rdzv-conf=join_timeout=60,is_host=1", "-m", "trainer"]),
        (["ft_launcher", "--rdzv-conf", "join_timeout=60", "-m", "trainer"], False,
         ["ft_launcher", "--rdzv-conf", "join_timeout=60,is_host=0", "-m", "trainer"]),
        (["/v/bin/torchrun", "--nnodes=2", "-m", "trainer", "--rdzv-conf=x"], False,
         ["/v/bin/torchrun", "--rdzv-conf=is_host=0", "--nnodes=2", "-m", "trainer", "--rdzv-conf=x"]),
        (["python", "-c", "print(1)"], True, ["python", "-c", "print(1)"]),
    ],
)  # fmt: skip
def test_the_launcher_is_told_whether_it_hosts(argv: list[str], is_host: bool, expected: list[str]) -> None:
    assert with_rdzv_host(argv, is_host) == expected


def test_nvrx_and_torch_read_it_over_the_endpoint_s_loopback_match() -> None:
    from nvidia_resiliency_ext.fault_tolerance.launcher import _is_store_host_from_config
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname

    assert _matches_machine_hostname("127.0.0.1")  # why every local launcher thought it was the host
    assert _is_store_host_from_config("127.0.0.1", {"is_host": "0"}) is False
    assert _is_store_host_from_config("127.0.0.1", {"is_host": "1"}) is True

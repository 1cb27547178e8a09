"""The node-loss MTTR model (goodput/node_loss.py): a sum of its parts, each growing as its source says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from goodput import PlanError
from goodput.inputs import DEFAULT_TIERS, NODE_LOSS_MTTR_S
from goodput.node_loss import (
    FSX_READ_S,
    LIVENESS_TIMEOUT_S,
    NCCL_REFERENCE_GPUS,
    NCCL_REFERENCE_S,
    node_loss_mttr,
    node_loss_parts,
    rendezvous_fit_from,
)
from goodput.tiers import parse_tier_spec


def test_the_mttr_is_the_sum_of_its_parts_and_grows_with_the_job() -> None:
    small, large = node_loss_parts(128), node_loss_parts(16_384)
    for p in (small, large):
        parts = (p.detection_s, p.rendezvous_s, p.process_start_s, p.restore_s, p.collective_start_s)
        assert p.total_s == pytest.approx(sum(parts)) and all(x > 0 for x in parts)
        assert p.detection_s == LIVENESS_TIMEOUT_S
    assert large.rendezvous_s > small.rendezvous_s
    assert large.collective_start_s == pytest.approx(NCCL_REFERENCE_S * 16_384 / NCCL_REFERENCE_GPUS)
    assert node_loss_mttr(NCCL_REFERENCE_GPUS) > node_loss_mttr(16_384) > node_loss_mttr(1024)
    assert set(large.as_dict()["sources"]) == {
        "detection_s", "rendezvous_s", "process_start_s", "restore_s", "collective_start_s"
    }  # fmt: skip
    with pytest.raises(PlanError, match="gpus"):
        node_loss_parts(4)


def test_the_default_tier_takes_the_model_at_16k_gpus() -> None:
    (spec,) = [parse_tier_spec(s) for s in DEFAULT_TIERS if s.startswith("node-loss")]
    assert spec.mttr_s == NODE_LOSS_MTTR_S == round(node_loss_mttr(16_384))
    assert spec.fallback_mttr_s == NODE_LOSS_MTTR_S + FSX_READ_S


def test_the_rendezvous_fit_comes_from_a_scale_result(tmp_path: Path) -> None:
    path = tmp_path / "scale.json"
    series = "rendezvous round (store work + polls)"
    path.write_text(json.dumps({"fits": [{"series": series, "a": 2.0, "exponent": 0.5}]}))
    fit = rendezvous_fit_from(path)
    assert fit == {"a": 2.0, "k": 0.5}
    assert node_loss_parts(8 * 400, fit).rendezvous_s == pytest.approx(2.0 * 20 + 1.0)
    path.write_text("{}")
    with pytest.raises(PlanError, match="rendezvous fit"):
        rendezvous_fit_from(path)

"""Model: config validation, presets, causality, and FSDP2 sharding that keeps the seeded init."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.trainer._dist import run_ranks
from trainer.reference.model import PRESETS, ModelConfig, build_model

CPU = torch.device("cpu")


def test_presets_exist_and_param_counts_match_modules() -> None:
    assert {"tiny", "small", "1b", "8b", "70b"} <= PRESETS.keys()
    for name in ("tiny", "small"):
        cfg = PRESETS[name]
        model = build_model(cfg, mesh=None, device=CPU, seed=0)
        assert sum(p.numel() for p in model.parameters()) == cfg.num_params(), name
    # The large presets follow the published Llama 3 shapes (8.03B and 70.6B parameters).
    assert round(PRESETS["8b"].num_params() / 1e9, 2) == 8.03
    assert round(PRESETS["70b"].num_params() / 1e9, 1) == 70.6


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dim", 0),
        ("n_heads", 3),
        ("n_kv_heads", 3),
        ("vocab_size", -1),
        ("max_seq_len", 1.5),
        ("rope_theta", 0),
    ],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{field}:"):
        dataclasses.replace(PRESETS["tiny"], **{field: value})


def test_forward_shape_and_causality() -> None:
    cfg = PRESETS["tiny"]
    model = build_model(cfg, mesh=None, device=CPU, seed=1)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert logits.shape == (2, 16, cfg.vocab_size)
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % cfg.vocab_size
    other = model(changed)
    # Earlier positions must not see later tokens; later positions must.
    torch.testing.assert_close(other[:, :10], logits[:, :10])
    assert not torch.allclose(other[:, 10:], logits[:, 10:])
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.long))


def test_init_is_deterministic_in_the_seed() -> None:
    cfg = ModelConfig(
        dim=32, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=64, ffn_hidden=48, max_seq_len=16
    )
    a = build_model(cfg, mesh=None, device=CPU, seed=3).state_dict()
    b = build_model(cfg, mesh=None, device=CPU, seed=3).state_dict()
    c = build_model(cfg, mesh=None, device=CPU, seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["layers.0.attn.wq.weight"], c["layers.0.attn.wq.weight"])


def _sharded_matches_unsharded(rank: int, world_size: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    # An odd vocabulary so dim-0 shards are uneven (FSDP2 pads the last one).
    cfg = ModelConfig(
        dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=67, ffn_hidden=48, max_seq_len=16
    )
    mesh = init_device_mesh("cpu", (world_size,))
    sharded = build_model(cfg, mesh=mesh, device=CPU, seed=5)
    full = build_model(cfg, mesh=None, device=CPU, seed=5)
    for name, param in sharded.named_parameters():
        assert isinstance(param, DTensor), name
        assert torch.equal(param.full_tensor(), full.get_parameter(name)), name
    tokens = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(rank))
    torch.testing.assert_close(sharded(tokens), full(tokens))


@pytest.mark.slow
def test_fsdp2_sharded_init_equals_single_process_init() -> None:
    run_ranks(_sharded_matches_unsharded, 2)

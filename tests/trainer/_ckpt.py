"""Small checkpoint fixtures' pieces shared by test_checkpoint.py and test_checkpoint_dist.py (a helper
module, not a test module: spawned ranks import it by name)."""

from __future__ import annotations

from typing import Any

import torch

from trainer.reference.model import ModelConfig, build_model

SMALL = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_hidden=48, max_seq_len=16)


class Events:
    """Records what a checkpoint or snapshot component emits: `seen` as event dicts, `records` as
    (name, fields) pairs; `of(name)` the fields of one kind."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.records: list[tuple[str, dict[str, Any]]] = []

    def emit(self, ev: str, **fields: Any) -> None:
        self.seen.append({"ev": ev, **fields})
        self.records.append((ev, fields))

    def of(self, ev: str) -> list[dict[str, Any]]:
        return [f for e, f in self.records if e == ev]


class Counter:
    """A minimal trainer Stateful: a step and this process's RNG state."""

    def __init__(self) -> None:
        self.step = -1

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        torch.set_rng_state(state["rng"])


def make_state(mesh: Any, seed: int = 0) -> dict[str, Any]:
    model = build_model(SMALL, mesh=mesh, device=torch.device("cpu"), seed=seed)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return {"model": model, "optim": optim, "trainer": Counter()}


def train_step(state: dict[str, Any], step: int) -> None:
    tokens = torch.randint(0, SMALL.vocab_size, (2, 8), generator=torch.Generator().manual_seed(step))
    state["model"](tokens).float().pow(2).mean().backward()
    state["optim"].step()
    state["optim"].zero_grad()
    state["trainer"].step = step


def snapshot(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": v.full_tensor().clone() for k, v in state["model"].state_dict().items()}
    for i, st in state["optim"].state_dict()["state"].items():
        for k, v in st.items():
            out[f"optim.{i}.{k}"] = (v.full_tensor() if hasattr(v, "full_tensor") else v).clone()
    return out

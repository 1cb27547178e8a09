"""Named failure rates (faults per GPU-hour) of published large training runs, for ``--profile``."""

from __future__ import annotations

# Failure rates per GPU-hour of named runs.
PROFILES: dict[str, tuple[float, str]] = {
    # Llama 3 405B pre-training: 419 unexpected interruptions in a 54-day snapshot on 16,384 H100
    # (Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, section 3.3.4).
    "llama3-405b": (
        419 / (54 * 24 * 16384),
        "Llama 3 405B: 419 unexpected interruptions, 54 days, 16,384 H100",
    ),
    # Meta RSC cluster study (Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning
    # Research Clusters", HPCA 2025, arXiv:2410.21680): projected job MTTF 7.9 h at 1,024 GPUs and
    # 1.8 h at 16,384 GPUs (A100).
    "rsc-1k": (1 / (7.9 * 1024), "Meta RSC: MTTF 7.9 h for 1,024-GPU jobs"),
    "rsc-16k": (1 / (1.8 * 16384), "Meta RSC: MTTF 1.8 h for 16,384-GPU jobs"),
}

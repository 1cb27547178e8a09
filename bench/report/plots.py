"""matplotlib without a display, and saving a figure as PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, png: Path) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt().close(fig)
    return png

"""Markdown building blocks shared by the report's sections: spreads, tables, cells."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def fmt_spread(s: dict[str, float] | None, unit: str = "s", digits: int = 2) -> str:
    """``median (min-max)`` of a spread dict, or a dash."""
    if not s:
        return "-"
    med, lo, hi = (f"{float(s[k]):.{digits}f}" for k in ("median", "min", "max"))
    sep = " " if unit else ""
    return f"{med}{sep}{unit} ({lo}-{hi})" if s.get("n", 1) > 1 else f"{med}{sep}{unit}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def as_spread(s: dict[str, Any], n: int | None) -> dict[str, Any]:
    return {"median": s["median"], "min": s["min"], "max": s["max"], "n": n or len(s.get("runs", [1]))}


def cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if math.isfinite(v) else str(v)
    if isinstance(v, dict) and "median" in v:
        return fmt_spread(v, "", 3).strip()
    return "-" if v is None else str(v)


def rows_section(title: str, res: dict[str, Any]) -> str:
    """Markdown for a result that carries ``rows`` (a list of flat dicts) and optional ``note``."""
    rows = res.get("rows") or []
    if not rows:
        return f"### {title}\n\n(no rows)\n"
    header = list(rows[0])
    body = [[cell(r.get(h)) for h in header] for r in rows]
    text = [f"### {title}"]
    if res.get("note"):
        text.append(str(res["note"]))
    text += ["", md_table(header, body), ""]
    return "\n".join(text)

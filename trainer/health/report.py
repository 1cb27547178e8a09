"""One check round folded into the reply NVRx's launcher reads (`HealthCheckResponse.output`, JSON):
it refuses the node when `fail_count` > 0 and logs `failed_checks`; `checks` keeps every result, skipped
ones with their reason, for whoever reads the daemon's log."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from trainer.health.checks import CheckResult


def report(results: Iterable[CheckResult], args: Sequence[str] = ()) -> dict[str, object]:
    results = list(results)
    failed = [f"{r.name}: {r.detail}" for r in results if r.status == "fail"]
    return {
        "fail_count": len(failed),
        "failed_checks": failed,
        "checks": [r.as_dict() for r in results],
        # What the launcher asked for (NVRx sends nvhcd's groups): recorded, never acted on.
        "args": list(args),
    }


def report_json(results: Iterable[CheckResult], args: Sequence[str] = ()) -> str:
    return json.dumps(report(results, args), sort_keys=True)

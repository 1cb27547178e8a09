"""What a run reports: its event log and summary (Contract 3 of docs/design.md), the same figures live
for Prometheus, and the start-up spans of an attempt.

- metrics.py:        `EventLog` (JSONL, one writer per node), `summarize` into summary.json;
- metrics_fold.py:   the live figures folded incrementally from the event log;
- metrics_export.py: the Prometheus collector over that fold;
- metrics_server.py: its HTTP endpoint, a child process of local rank 0 (docs/metrics.md);
- spans.py:          where an attempt's time goes from `run_start` to its `restore` event.

Imports no other trainer package: every other part writes through `EventLog` and `spans`.
"""

"""The port of a typical FSDP2 script to the blueprint, as docs/bring-your-own.md shows it: the diff in
the doc is the diff of the two files (examples/gpt2/before.py -> train.py), and its counts are right."""

from __future__ import annotations

import difflib
import re

from tests.helpers import REPO_ROOT

BEFORE, AFTER = "examples/gpt2/before.py", "examples/gpt2/train.py"
DOC = REPO_ROOT / "docs" / "bring-your-own.md"


def port_diff() -> list[str]:
    before = (REPO_ROOT / BEFORE).read_text().splitlines()
    after = (REPO_ROOT / AFTER).read_text().splitlines()
    return list(difflib.unified_diff(before, after, BEFORE, AFTER, lineterm=""))


def counts(diff: list[str]) -> tuple[int, int]:
    body = [line for line in diff if not line.startswith(("---", "+++", "@@"))]
    return sum(line.startswith("+") for line in body), sum(line.startswith("-") for line in body)


def counts_ignoring_indentation() -> tuple[int, int]:
    strip = [line.strip() for line in (REPO_ROOT / BEFORE).read_text().splitlines()]
    after = [line.strip() for line in (REPO_ROOT / AFTER).read_text().splitlines()]
    return counts(list(difflib.unified_diff(strip, after, lineterm="")))


def test_the_doc_shows_the_real_diff() -> None:
    text = DOC.read_text()
    block = re.search(r"```diff\n(.*?)\n```", text, re.S)
    assert block, "docs/bring-your-own.md has no ```diff block"
    assert block.group(1).splitlines() == port_diff(), "stale diff in the doc: paste port_diff()"


def test_the_doc_states_the_counts_and_a_port_writes_at_most_30_lines() -> None:
    added, deleted = counts(port_diff())
    added_ws, deleted_ws = counts_ignoring_indentation()
    line = (
        f"{added} lines added and {deleted} deleted ({added_ws} added and {deleted_ws} deleted ignoring "
        "changes of indentation)"
    )
    assert line in DOC.read_text(), line
    assert added_ws <= 30  # what the team writes or rewrites: the target
    assert deleted_ws > added_ws  # the port mostly deletes: the library does that work now

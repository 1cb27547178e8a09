"""Generated chart values: k8s/values.yaml and k8s/examples/*.yaml, mutated leaf by leaf (types, strings that
break YAML or carry invisible characters, NaN/Inf, boundaries, keys removed and added), one `helm template`
each. Every mutant is either refused naming the value (the schema's `at '/path'`, a _validate.tpl message
starting with the value's name, or helm's own parse error naming NaN/Inf) or rendered into manifests that
parse, with every string value present exactly. A seeded sample keeps the run short (helm ~0.1 CPU-s each).
"""

from __future__ import annotations

import random
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from tests.chart.helm import CHART, HELM, JOBSET_API
from tests.mutate import Mutant, describe, mutants, replaced, to_yaml

SEED = 15
# Every string leaf gets the edits that would inject YAML if pasted; the rest of the catalogue is sampled.
INJECTIONS = {"injected field", "yaml comment", "trailing newline", "template braces", "yaml true"}
SAMPLED = {"values.yaml": 90, "examples/local-cpu.yaml": 40, "examples/byo-values.yaml": 10}

SCHEMA = re.compile(r"^- at '(/[^']*)': ", re.MULTILINE)
TEMPLATE = re.compile(
    r"^Error: execution error at \(trainer/templates/[\w./-]+:\d+:\d+\): ([\w./\[\]-]+)[: ]"
)
HELM_PARSE = re.compile(r"^Error: failed to parse \S+: .*json: unsupported value: (NaN|\+Inf|-Inf)$")


def _render(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(HELM),
            "template",
            "smoke",
            str(CHART),
            "-n",
            "team-a",
            "--api-versions",
            JOBSET_API,
            "-f",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _manifests(text: str) -> list[Any]:
    """The documents of a render, parsed by libyaml (the C parser: the pure-Python one took half the run)."""
    return [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (str(k), *_strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


def _top(mutant: Mutant) -> str:
    return str(mutant.path[0])


def _check_refusal(mutant: Mutant, stderr: str) -> None:
    """A refusal must name the mutated value (or, for NaN/Inf, helm's parser names the value itself)."""
    # helm may log a warning first (e.g. `level=INFO msg="warning: skipped value for ...: Not a table."`).
    lines = [line for line in stderr.splitlines() if not line.startswith("level=")]
    first = lines[0] if lines else ""
    key = _top(mutant)
    if first.startswith("Error: values don't meet the specifications of the schema(s)"):
        violations = [line for line in lines[1:] if line.startswith("- at '")]
        assert violations, f"{describe(mutant)}: schema error without a violation:\n{stderr}"
        named = any(line.startswith(f"- at '/{key}") or f"'{key}'" in line for line in violations)
        assert named, f"{describe(mutant)}: the schema error does not name {key}:\n{stderr}"
        return
    if TEMPLATE.match(first):
        assert key in first, f"{describe(mutant)}: the template error does not name {key}: {first}"
        assert len(lines) <= 3, f"{describe(mutant)}: more than one message:\n{stderr}"
        return
    if HELM_PARSE.match(first):
        return
    raise AssertionError(f"{describe(mutant)}: not a clean refusal:\n{stderr}")


def _flat(docs: list[Any]) -> dict[tuple[Any, ...], Any]:
    """Every scalar of the rendered documents by its path; the workload's digest-carrying name (it changes
    with any value, see _workload_name.tpl) is replaced by a placeholder."""
    names = [d["metadata"]["name"] for d in docs if d["kind"] in ("Job", "JobSet")]
    out: dict[tuple[Any, ...], Any] = {}

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, (*path, i))
        else:
            for name in names:
                node = node.replace(name, "<workload>") if isinstance(node, str) else node
            out[path] = node

    walk(docs, ())
    return out


def _at(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


_RENDERED: dict[str, list[Any] | None] = {}


def _docs_of(values: Any, tmp_path: Path) -> list[Any] | None:
    """The manifests of `values` (None if refused), rendered once per distinct input."""
    text = to_yaml(values)
    if text not in _RENDERED:
        path = tmp_path / f"render-{len(_RENDERED)}.yaml"
        path.write_text(text, encoding="utf-8")
        result = _render(path)
        _RENDERED[text] = _manifests(result.stdout) if result.returncode == 0 else None
    return _RENDERED[text]


def _check_render(mutant: Mutant, stdout: str, base: Any, tmp_path: Path) -> None:
    """The manifests parse, and a string value sits exactly where the chart uses it: every scalar the
    value reaches (found by a probe render with a harmless suffix) now holds the new string, and nothing
    else changed shape (no key added, no string turned into a boolean)."""
    docs = _manifests(stdout)  # YAML that parses: nothing was pasted into it
    assert any(d["kind"] in ("Job", "JobSet") for d in docs), describe(mutant)
    old = _at(base, mutant.path)
    if not (isinstance(mutant.value, str) and isinstance(old, str) and old and mutant.value):
        return
    original = _docs_of(base, tmp_path)
    probe = _docs_of(replaced(base, mutant.path, old + "x9"), tmp_path)
    assert original is not None
    mutated = _flat(docs)
    if probe is None:  # no harmless suffix passes the schema (an enum, a quantity): the value must appear
        assert any(isinstance(v, str) and mutant.value in v for v in mutated.values()), describe(mutant)
        return
    before, after = _flat(original), _flat(probe)
    # the replica key Secret is random in every render (templates/replica-key-secret.yaml): not a use
    used = [k for k in after if before.get(k) != after[k] and k[-1] != "replica.key"]
    assert used, f"{describe(mutant)}: the probe changed nothing"
    # The shape to keep is the probe's: a value can select what renders (an entrypoint other than the
    # reference model's drops the reference's own options), and the probe changed it the same way.
    assert set(mutated) == set(after), (
        f"{describe(mutant)}: the manifests changed shape: {set(mutated) ^ set(after)}"
    )
    for key in used:
        expected = after[key].replace(old + "x9", mutant.value) if isinstance(after[key], str) else after[key]
        assert mutated[key] == expected, (
            f"{describe(mutant)}: at {key} rendered {mutated[key]!r}, not {expected!r}"
        )


def _cases() -> list[tuple[Any, Mutant]]:
    """(the valid input, one mutant of it) pairs."""
    out: list[tuple[Any, Mutant]] = []
    for rel, count in SAMPLED.items():
        data = yaml.safe_load((CHART / rel).read_text(encoding="utf-8"))
        every = mutants(data, seed=SEED)
        chosen = [m for m in every if m.label in INJECTIONS]
        chosen += random.Random(SEED).sample([m for m in every if m.label not in INJECTIONS], count)
        out += [(data, m) for m in chosen]
    return out


def test_value_mutants_are_refused_naming_the_value_or_render_exactly(tmp_path: Path) -> None:
    cases = _cases()
    files = []
    for i, (_, mutant) in enumerate(cases):
        path = tmp_path / f"{i}.yaml"
        path.write_text(to_yaml(mutant.data), encoding="utf-8")
        files.append(path)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(_render, files))
    refused = 0
    problems = []
    for (base, mutant), result in zip(cases, results, strict=True):
        try:
            assert "panic" not in result.stderr and "goroutine" not in result.stderr, result.stderr
            if result.returncode:
                refused += 1
                _check_refusal(mutant, result.stderr)
            else:
                _check_render(mutant, result.stdout, base, tmp_path)
        except AssertionError as exc:
            problems.append(str(exc))
    assert not problems, "\n".join(problems)
    print(f"chart values: {len(cases)} mutants, {refused} refused, {len(cases) - refused} rendered")
    assert len(cases) - refused > 10 and refused > len(cases) // 2

"""Generated chart values per class of the third bad-input sweep: random members of each class, refused by
`helm template` in one line naming the value (the schema's `at '/path'` or a template message starting
with the value's name), or rendered exactly as written. Few renders per property (~0.3 s each).

Classes here: keys Helm reads as YAML 1.1 booleans in maps of labels, annotations, selectors and env;
Kubernetes quantities that parse (by Kubernetes' own rules) to an absurd size (memory under 1Mi, no CPU).
"""

from __future__ import annotations

import re
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity

from tests.chart.helm import template_result

RENDERS = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))


def raw_result(text: str, values: dict[str, Any] | None = None) -> Any:
    """`helm template` with a values file written as YAML text, exactly (keys unquoted as a user writes)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", encoding="utf-8") as vf:
        vf.write(text)
        vf.flush()
        return template_result(values, "-f", vf.name)


def one_line_naming(result: Any, name: str) -> str:
    assert result.returncode != 0, result.stdout[:200]
    err = result.stderr
    assert re.search(rf"^- at '/{re.escape(name)}'|\): {re.escape(name)}[:. ]", err, re.MULTILINE), err
    assert "panic" not in err and "goroutine" not in err, err
    return err


# ---- YAML 1.1 booleans as keys ------------------------------------------------------------------------

BOOL_WORDS = [
    "y",
    "Y",
    "yes",
    "Yes",
    "YES",
    "on",
    "On",
    "ON",
    "n",
    "N",
    "no",
    "No",
    "off",
    "OFF",
    "true",
    "false",
]
# (the value's name, how a key is written under it, the value a key maps to)
KEY_MAPS = [
    ("podLabels", "podLabels:\n  {key}: a\n"),
    ("podAnnotations", "podAnnotations:\n  {key}: a\n"),
    ("nodeSelector", "nodeSelector:\n  {key}: a\n"),
    ("extraEnv", 'extraEnv:\n  {key}: "1"\n'),
    ("podMonitor.labels", "podMonitor:\n  labels:\n    {key}: a\n"),
    ("rendezvous.nodeSelector", "rendezvous:\n  nodeSelector:\n    {key}: a\n"),
]


@RENDERS
@given(word=st.sampled_from(BOOL_WORDS), where=st.sampled_from(KEY_MAPS))
def test_boolean_looking_key_is_refused_naming_the_map(word: str, where: tuple[str, str]) -> None:
    name, form = where
    err = one_line_naming(raw_result(form.format(key=word)), name)
    assert "YAML 1.1" in err and "quote the key" in err, err


def test_quoted_boolean_words_as_keys_render_as_written() -> None:
    """The way out the message names: a quoted key is the string written."""
    result = raw_result('podLabels:\n  "yes": a\nextraEnv:\n  "Y": "1"\n')
    assert result.returncode == 0, result.stderr
    assert "yes: a" in result.stdout or '"yes": a' in result.stdout
    assert 'name: "Y"' in result.stdout


# ---- quantities ----------------------------------------------------------------------------------------

MEBIBYTE = 1 << 20
quantities = st.tuples(
    st.sampled_from(["0", "1", "512", "1023", "1024", "2", "0.5", "1.5", "64"]),
    st.sampled_from(["", "m", "k", "Ki", "M", "Mi", "G", "Gi"]),
).map("".join)
MEMORY_VALUES = ["memoryRequest", "shmSize", "scratchSize", "memoryLimit"]


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(MEMORY_VALUES), quantity=quantities)
def test_memory_size_under_a_mebibyte_is_refused_as_kubernetes_parses_it(name: str, quantity: str) -> None:
    values: dict[str, Any] = {name: quantity}
    if name == "memoryLimit":  # the limit must cover the request and /dev/shm
        values |= {"memoryRequest": "1Mi", "shmSize": "1Mi"}
    result = template_result(values)
    if parse_quantity(quantity) < MEBIBYTE:
        err = one_line_naming(result, name)
        assert "under 1Mi" in err or "does not match pattern" in err, err  # the schema takes no m for limits
    else:
        assert result.returncode == 0, result.stderr


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(quantity=st.sampled_from(["0", "0m", "0.0", "0k"]))
def test_cpu_request_of_zero_is_refused(quantity: str) -> None:
    one_line_naming(template_result({"cpuRequest": quantity}), "cpuRequest")

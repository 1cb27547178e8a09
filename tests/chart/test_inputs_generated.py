"""Generated chart values per class of bad input (templates/_inputs.tpl, values.schema.json): random members,
not only the examples. The rule: refused naming the value (the schema's `at '/path'` or a template message
starting with the value's name), or rendered exactly as written.

Classes: integers past what Helm's float64 and the templates' int conversion keep exact; names that collide
with the chart's own env, command variables, labels and annotations (derived from a render, not a list);
loader and interpreter variables; trainer settings in forms the trainer cannot parse (the chart and the
trainer must agree); system paths as mounts or hostPath. Few renders per property (helm ~0.2 s each).
"""

from __future__ import annotations

import json
import re
import string
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.chart.helm import CHART, env_of, render, template_result, trainer_container, workload_pod_spec

RENDERS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
AGREEMENT = settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
SCHEMA_JSON = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
EXACT_FLOAT = 2**53  # Helm holds numbers as float64: integers above this are rounded
WEEK = 604800


def refused(values: dict[str, Any], name: str) -> str:
    result = template_result(values)
    assert result.returncode != 0, f"helm accepted {values}"
    err = result.stderr
    # the schema's `at '/name'`, or a template's `): name: why` / `): name (value) why`
    assert re.search(rf"^- at '/{re.escape(name)}'|\): {re.escape(name)}[:. ]", err, re.MULTILINE), err
    return err


@pytest.fixture(scope="module")
def default_render() -> list[dict[str, Any]]:
    return render({})


# ---- integers ------------------------------------------------------------------------------------------


def _integer_properties() -> dict[str, dict[str, Any]]:
    out = {}
    for name, prop in SCHEMA_JSON["properties"].items():
        if "$ref" in prop:
            prop = SCHEMA_JSON["definitions"][prop["$ref"].rsplit("/", 1)[1]]
        kinds = prop.get("type")
        if kinds == "integer" or (isinstance(kinds, list) and "integer" in kinds):
            out[name] = prop
    return out


def test_every_integer_and_timeout_is_bounded_where_helm_is_exact() -> None:
    """Each integer value has a maximum at or below 2^53 (so `int` in a template is exact), each seconds
    value a maximum of a week; a new field without one fails here."""
    integers = _integer_properties()
    assert len(integers) > 20
    for name, prop in integers.items():
        assert "maximum" in prop and prop["maximum"] <= EXACT_FLOAT, name
    for name, prop in SCHEMA_JSON["properties"].items():
        if prop.get("$ref") == "#/definitions/seconds" or name in ("metricsLinger", "ckptWriteTimeout"):
            target = SCHEMA_JSON["definitions"]["seconds"] if "$ref" in prop else prop
            assert target["maximum"] == WEEK, name


# (value name, how it appears in the trainer's argv)
RENDERED_INTEGERS = {
    "steps": "--steps={}",
    "seed": "--seed={}",
    "faultSeed": "--fault-seed={}",
    "ckptKeep": "--ckpt-keep={}",
    "ckptFailureLimit": "--ckpt-failure-limit={}",
    "maxRestarts": "--max-restarts={}",
    "maxNoProgressCycles": "--ft-max-no-progress-cycles={}",
}
big_integers = st.one_of(
    st.integers(0, 10**6), st.integers(2**50, 2**66), st.sampled_from([2**53 - 1, 2**53, 2**63, 10**19])
)


@RENDERS
@given(values=st.fixed_dictionaries({name: big_integers for name in RENDERED_INTEGERS}))
def test_integers_render_as_written_or_are_refused(values: dict[str, int]) -> None:
    props = _integer_properties()
    too_big = [n for n, v in values.items() if not props[n].get("minimum", 0) <= v <= props[n]["maximum"]]
    result = template_result(values)
    if too_big:
        assert result.returncode != 0, values
        named = re.findall(r"^- at '/(\w+)'", result.stderr, re.MULTILINE)
        assert named and set(named) <= set(too_big), result.stderr
        return
    assert result.returncode == 0, result.stderr
    argv = result.stdout
    for name, form in RENDERED_INTEGERS.items():
        assert form.format(values[name]) in argv, (name, values[name])


@pytest.mark.parametrize(
    ("values", "name"),
    [
        ({"steps": 9223372036854775808}, "steps"),  # wrapped to -9223372036854775808 before
        ({"nodes": 12345678901234567890}, "nodes"),  # negative completions before
        ({"syntheticTokens": 10**20}, "syntheticTokens"),
        ({"collectiveTimeout": 1e14}, "collectiveTimeout"),  # overflowed timedelta in the trainer
        ({"terminationGracePeriodSeconds": 10**9}, "terminationGracePeriodSeconds"),
        ({"faults": {"a": "sigkill:step=010"}}, "faults/a"),  # a template reads 010 as octal 8
    ],
)
def test_issue_examples_refused(values: dict[str, Any], name: str) -> None:
    refused(values, name)


# ---- names the chart sets ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart_env_names(default_render: list[dict[str, Any]]) -> set[str]:
    """The env names the chart renders plus every $(NAME) its command expands, read from a render."""
    container = trainer_container(default_render)
    names = set(env_of(container))
    names |= set(re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(container["args"])))
    assert {"MAX_NNODES", "NNODES", "CHECKPOINT_DIR", "HOME"} <= names
    return names


def test_every_env_name_the_chart_renders_is_reserved(chart_env_names: set[str]) -> None:
    """All at once is one render per name; a sample of six keeps it fast and still covers new names."""
    for name in sorted(chart_env_names)[:: max(1, len(chart_env_names) // 6)]:
        refused({"extraEnv": {name: "1"}}, f"extraEnv.{name}")


@RENDERS
@given(
    name=st.sampled_from(["PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "BASH_ENV"])
    | st.from_regex(r"(LD|TORCHELASTIC)_[A-Z0-9_]{1,12}", fullmatch=True)
)
def test_loader_and_interpreter_variables_refused(name: str) -> None:
    refused({"extraEnv": {name: "/x"}}, f"extraEnv.{name}")


env_name = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True).filter(
    lambda n: (
        not re.match(r"(TRAINER_|LD_|DYLD_|TORCHELASTIC_|PYTHON)", n)
        and n
        not in (
            "PATH",
            "ENV",
            "IFS",
            "BASH_ENV",
            "MASTER_ADDR",
            "MASTER_PORT",
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "JOB_COMPLETION_INDEX",
        )
    )
)
env_value = st.text(st.characters(blacklist_categories=["Cs", "Cc"]), max_size=30)


@RENDERS
@given(env=st.dictionaries(env_name, env_value, min_size=1, max_size=6))
def test_other_env_delivered_exactly(env: dict[str, str], chart_env_names: set[str]) -> None:
    env = {k: v for k, v in env.items() if k not in chart_env_names}
    manifests = render({"extraEnv": env})
    rendered = env_of(trainer_container(manifests))
    for name, value in env.items():
        assert rendered[name] == value


# The trainer's own parser is the other half: the chart accepts a setting iff the trainer would.
seconds_text = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.from_regex(r"[+-]?[0-9]{0,7}(\.[0-9]{0,3})?([eE][+-]?[0-9]{1,3})?", fullmatch=True),
    st.text(string.printable + "١٢", max_size=8),
)


@AGREEMENT
@given(
    name=st.sampled_from(["TRAINER_INPROCESS_MONITOR_INTERVAL", "TRAINER_INPROCESS_LAST_CALL_WAIT"]),
    text=seconds_text,
)
def test_chart_and_trainer_agree_on_trainer_settings(tmp_path_factory, name: str, text: str) -> None:
    from trainer.config.inputs import check_env
    from trainer.config.train_config import ConfigError

    try:
        check_env({name: text})
        trainer_ok = True
    except ConfigError:
        trainer_ok = False
    # A JSON values file: the value stays a string (PyYAML would leave `1E5` unquoted, a number to Helm).
    values_file = tmp_path_factory.mktemp("values") / "values.json"
    values_file.write_text(json.dumps({"extraEnv": {name: text}}), encoding="utf-8")
    result = template_result(None, "-f", str(values_file))
    if trainer_ok:
        assert result.returncode == 0, result.stderr
        manifests = [d for d in yaml.safe_load_all(result.stdout) if d]
        assert env_of(trainer_container(manifests))[name] == text
    else:
        assert result.returncode != 0 and f"extraEnv.{name}" in result.stderr, (text, result.stderr)


def test_chart_knows_every_trainer_setting_extra_env_may_set() -> None:
    """Each TRAINER_* setting the trainer reads is either formed-checked by the chart or refused by it."""
    from trainer.config.inputs import ENV_SETTINGS

    for name in sorted(n for n in ENV_SETTINGS if n.startswith("TRAINER_")):
        result = template_result({"extraEnv": {name: "not-a-valid-value!"}})
        assert result.returncode != 0 and f"extraEnv.{name}" in result.stderr, (name, result.stderr)


def test_chart_labels_and_annotations_are_reserved(default_render: list[dict[str, Any]]) -> None:
    pod = next(m for m in default_render if m["kind"] == "Job")["spec"]["template"]["metadata"]
    for key in pod["labels"]:
        refused({"podLabels": {key: "x"}}, f"podLabels.{key}")
    scrape = render({"metricsPort": 9400, "metricsScrapeAnnotations": True})
    annotations = next(m for m in scrape if m["kind"] == "Job")["spec"]["template"]["metadata"]["annotations"]
    for key in annotations:
        refused(
            {"metricsPort": 9400, "metricsScrapeAnnotations": True, "podAnnotations": {key: "x"}},
            f"podAnnotations.{key}",
        )
    refused(
        {"nodeSelector": {"node.kubernetes.io/instance-type": "x"}},
        "nodeSelector.node.kubernetes.io/instance-type",
    )


@RENDERS
@given(
    labels=st.dictionaries(
        st.from_regex(r"example\.com/[a-z]([a-z0-9-]{0,9}[a-z0-9])?", fullmatch=True),  # ends alphanumeric
        st.from_regex(r"[a-z0-9]{1,10}", fullmatch=True),
        min_size=1,
        max_size=4,
    )
)
def test_other_labels_delivered_exactly(labels: dict[str, str]) -> None:
    manifests = render({"podLabels": labels})
    pod_labels = next(m for m in manifests if m["kind"] == "Job")["spec"]["template"]["metadata"]["labels"]
    for key, value in labels.items():
        assert pod_labels[key] == value


# ---- paths ---------------------------------------------------------------------------------------------

SYSTEM_UNDER = ["/bin", "/dev", "/etc", "/proc", "/sys", "/usr", "/var/lib/kubelet", "/run", "/var/run"]
SYSTEM_EXACT = ["/", "/var", "/var/lib", "/home", "/mnt", "/root"]
segment = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,8}", fullmatch=True)


@RENDERS
@given(
    field=st.sampled_from(["localNvmePath", "mountPath"]),
    path=st.one_of(
        st.sampled_from(SYSTEM_EXACT),
        st.builds(
            lambda base, tail: base + "".join("/" + s for s in tail),
            st.sampled_from(SYSTEM_UNDER),
            st.lists(segment, max_size=2),
        ),
    ),
)
def test_system_paths_refused_as_mounts_and_host_paths(field: str, path: str) -> None:
    storage = {"mountPath": "/fsx", "localNvmePath": "/mnt/nvme", field: path}
    values: dict[str, Any] = {"storage": storage}
    if field == "mountPath":
        values["dataPath"] = path.rstrip("/") + "/tokens.npy"
    refused(values, f"storage.{field}")


@RENDERS
@given(tail=st.lists(segment, min_size=1, max_size=3), base=st.sampled_from(["/mnt", "/data", "/scratch"]))
def test_other_host_paths_delivered_exactly(tail: list[str], base: str) -> None:
    path = base + "".join("/" + s for s in tail)
    manifests = render({"storage": {"mountPath": "/fsx", "localNvmePath": path}})
    volumes = {v["name"]: v for v in workload_pod_spec(manifests)["volumes"]}
    assert volumes["local-nvme"]["hostPath"]["path"] == path

"""Generated chart values per class of the third bad-input sweep: random members of each class, refused by
`helm template` in one line naming the value (the schema's `at '/path'` or a template message starting
with the value's name), or rendered exactly as written. Few renders per property (~0.3 s each).

Classes here: keys Helm reads as YAML 1.1 booleans in maps of labels, annotations, selectors and env;
Kubernetes quantities that parse (by Kubernetes' own rules) to an absurd size (memory under 1Mi, no CPU);
pod-spec fragments the API server would refuse (tolerations, affinity, annotations past 256 KiB, system
priority classes outside kube-system), judged by the strict Kubernetes schemas (kubernetes-validate) plus
the API server's own field rules written out below.
"""

from __future__ import annotations

import functools
import re
import tempfile
from typing import Any

import kubernetes_validate
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity

from tests.chart.helm import CHART, env_of, render, template_result, trainer_container, workload_pod_spec

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
    # the schema's `at '/name'` (or a path below it), or a template's `): name: why` / `name[i]...`
    schema_path = re.escape(name.replace(".", "/"))
    assert re.search(rf"^- at '/{schema_path}[/']|\): {re.escape(name)}[:. \[]", err, re.MULTILINE), err
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
    (
        "networkPolicy.metricsPodSelector.matchLabels",
        "networkPolicy:\n  enabled: true\n  metricsPodSelector:\n    matchLabels:\n      {key}: a\n",
    ),
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


# ---- pod-spec fragments, validated as the API server will ----------------------------------------------

K8S_VERSION = "1.35.0"
QUALIFIED = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def schema_accepts(spec_fragment: dict[str, Any]) -> bool:
    """kubernetes-validate's strict schema of a Pod holding the fragment (types, shapes, unknown fields)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}], **spec_fragment},
    }
    try:
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError:
        return False
    return True


def toleration_rules_accept(t: dict[str, Any]) -> bool:
    """The API server's toleration rules the schema does not carry (core/v1 validation)."""
    key, op, value = t.get("key", ""), t.get("operator", "Equal") or "Equal", t.get("value", "")
    if not isinstance(value, str) or not isinstance(key, str):
        return False
    if key and not QUALIFIED.fullmatch(key):
        return False
    if not key and op != "Exists":
        return False
    if op == "Exists" and value:
        return False
    if op == "Equal" and not LABEL_VALUE.fullmatch(value):
        return False
    if op not in ("Exists", "Equal"):
        return False
    if t.get("effect", "") not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
        return False
    return "tolerationSeconds" not in t or t.get("effect") == "NoExecute"


def _without_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


tolerations = st.builds(
    lambda key, op, value, effect, seconds, extra: _without_none(
        {"key": key, "operator": op, "value": value, "effect": effect, "tolerationSeconds": seconds, **extra}
    ),
    key=st.sampled_from([None, "", "a", "nvidia.com/gpu", "bad key!"]),
    op=st.sampled_from([None, "Exists", "Equal", "In"]),
    value=st.sampled_from([None, "", "true", "bad value!"]),
    effect=st.sampled_from([None, "", "NoSchedule", "PreferNoSchedule", "NoExecute", "NoScheduleX"]),
    seconds=st.sampled_from([None, 5, "5"]),
    extra=st.sampled_from([{}, {}, {"foo": 1}]),
)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(toleration=tolerations)
def test_tolerations_render_exactly_when_the_api_server_accepts_them(toleration: dict[str, Any]) -> None:
    accepted = schema_accepts({"tolerations": [toleration]}) and toleration_rules_accept(toleration)
    result = template_result({"tolerations": [toleration]})
    if not accepted:
        one_line_naming(result, "tolerations")
        return
    assert result.returncode == 0, (toleration, result.stderr)
    pod = workload_pod_spec([d for d in yaml.safe_load_all(result.stdout) if d])
    # the GPU node group's taint stays tolerated when a team adds its own
    assert pod["tolerations"][0] == {
        "key": "nvidia.com/gpu",
        "operator": "Equal",
        "value": "true",
        "effect": "NoSchedule",
    }
    assert pod["tolerations"][1:] == [toleration]


def _requirement(op: str, values: list[str] | None) -> dict[str, Any]:
    return _without_none({"key": "node.kubernetes.io/zone", "operator": op, "values": values})


affinities = st.one_of(
    st.sampled_from([{"nodeAffinity": "yes please"}, {"podAffinity": []}, {"nodeAffinity": {"bogus": 1}}]),
    st.builds(
        lambda op, values: {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [_requirement(op, values)]}]
                }
            }
        },
        op=st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Inn"]),
        values=st.sampled_from([None, [], ["a"], ["3"], ["1", "2"]]),
    ),
    st.builds(
        lambda weight, key: {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": weight,
                        "podAffinityTerm": _without_none({"topologyKey": key, "labelSelector": {}}),
                    }
                ]
            }
        },
        weight=st.sampled_from([0, 1, 100, 101]),
        key=st.sampled_from([None, "kubernetes.io/hostname"]),
    ),
)


def affinity_rules_accept(affinity: dict[str, Any]) -> bool:
    """The API server's affinity rules the schema does not carry (enums, weights, requirement values)."""
    node = affinity.get("nodeAffinity") or {}
    for term in (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms", []
    ):
        for r in term.get("matchExpressions", []):
            values = r.get("values") or []
            if r["operator"] not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
                return False
            if r["operator"] in ("In", "NotIn") and not values:
                return False
            if r["operator"] in ("Exists", "DoesNotExist") and values:
                return False
            if r["operator"] in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
                return False
    for w in (affinity.get("podAntiAffinity") or {}).get(
        "preferredDuringSchedulingIgnoredDuringExecution", []
    ):
        if not 1 <= w["weight"] <= 100 or not w["podAffinityTerm"].get("topologyKey"):
            return False
    return True


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(affinity=affinities)
def test_affinity_renders_exactly_when_the_api_server_accepts_it(affinity: dict[str, Any]) -> None:
    accepted = schema_accepts({"affinity": affinity}) and affinity_rules_accept(affinity)
    result = template_result({"affinity": affinity})
    if not accepted:
        one_line_naming(result, "affinity")
        return
    assert result.returncode == 0, (affinity, result.stderr)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(size=st.sampled_from([1000, 200_000, 262_000, 262_144, 300_000]))
def test_annotations_past_the_api_servers_256_kib_are_refused(size: int) -> None:
    values = {"podAnnotations": {"team.example.com/notes": "x" * size}}
    result = template_result(values)
    # the chart's own prometheus.io annotations count too
    total = (
        len("team.example.com/notes")
        + size
        + sum(
            len(k) + len(v)
            for k, v in {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9400",
                "prometheus.io/path": "/metrics",
            }.items()
        )
    )
    if total > 256 * 1024:
        one_line_naming(result, "podAnnotations")
    else:
        assert result.returncode == 0, result.stderr


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.sampled_from(["system-node-critical", "system-cluster-critical", "system-x", "high", "team-a"]),
    namespace=st.sampled_from(["team-a", "kube-system"]),
)
def test_system_priority_classes_only_in_kube_system(name: str, namespace: str) -> None:
    result = template_result({"priorityClassName": name}, namespace=namespace)
    if name.startswith("system-") and namespace != "kube-system":
        one_line_naming(result, "priorityClassName")
    else:
        assert result.returncode == 0, result.stderr


def test_issue_examples_refused() -> None:
    one_line_naming(
        template_result({"tolerations": [{"key": "a", "operator": "Exists", "effect": "NoScheduleX"}]}),
        "tolerations",
    )
    one_line_naming(template_result({"affinity": {"nodeAffinity": "yes please"}}), "affinity")
    one_line_naming(template_result({"priorityClassName": "system-node-critical"}), "priorityClassName")
    one_line_naming(template_result({"podAnnotations": {"a": "x" * 300_000}}), "podAnnotations")
    spec = workload_pod_spec(render({"tolerations": [{"key": "a", "operator": "Exists"}]}))
    assert {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]


# ---- nothing the chart checked can be overridden -------------------------------------------------------

VALUES_YAML = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))


@functools.cache
def _chart_flags() -> list[str]:
    """The trainer flags a default render sets (after `-m trainer`), without -- and values."""
    container = trainer_container(render({}))
    args = container["args"]
    after = args[args.index("trainer", args.index("-m")) + 1 :]
    return sorted({a[2:].split("=", 1)[0] for a in after if a.startswith("--") and a != "--"})


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    flag=st.deferred(lambda: st.sampled_from(_chart_flags())),
    form=st.sampled_from(["--{}=1", "--{}", "--no-{}", "--{}=$(NNODES)"]),
    cut=st.integers(0, 3),
)
def test_extra_trainer_args_repeating_a_chart_flag_are_refused_naming_the_value(
    flag: str, form: str, cut: int
) -> None:
    base = flag.removeprefix("no-")
    written = base[: max(2, len(base) - cut)] if cut and len(base) > 4 else base
    arg = form.format(written)
    err = one_line_naming(
        template_result({"extraTrainerArgs": ["--snapshot-dir=/dev/shm/s", arg]}), "extraTrainerArgs"
    )
    named = re.search(r"from the value (\S+?)[;, ]", err)
    assert named, err
    value = named.group(1)
    # the value the message points to is one a user can set (a key of values.yaml, or its first part)
    assert value.split(".")[0] in VALUES_YAML, (value, err)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(codes=st.sets(st.sampled_from([1, 2, 3, 93, 126, 137, 143, 255]), max_size=5).map(sorted))
def test_fail_job_exit_codes_always_keep_2_and_93(codes: list[int]) -> None:
    result = template_result({"failJobExitCodes": codes})
    if {2, 93} <= set(codes):
        assert result.returncode == 0, result.stderr
        job = next(d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Job")
        rule = next(r for r in job["spec"]["podFailurePolicy"]["rules"] if r["action"] == "FailJob")
        assert rule["onExitCodes"]["values"] == codes
    else:
        one_line_naming(result, "failJobExitCodes")


dollar_strings = st.lists(
    st.sampled_from(["$(NNODES)", "$$", "$", "$(", "cost ", "$(HOME)x", "$$(A)", "a", ")"]),
    min_size=1,
    max_size=6,
).map("".join)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(value=dollar_strings, arg=dollar_strings)
def test_user_strings_reach_env_and_command_exactly_as_written(value: str, arg: str) -> None:
    """What the kubelet makes of the rendered env value and argument (it expands $(VAR), reads $$ as $)
    is the string the user wrote."""
    from tools.podspec import expand

    container = trainer_container(
        render({"extraEnv": {"TEAM_NOTE": value}, "extraTrainerArgs": [f"--snapshot-dir=/dev/shm/{arg}"]})
    )
    env = env_of(container)
    assert expand(env["TEAM_NOTE"], env) == value
    (rendered,) = [a for a in container["args"] if a.startswith("--snapshot-dir=")]
    assert expand(rendered, env) == f"--snapshot-dir=/dev/shm/{arg}"


def test_issue_examples_of_overrides_refused() -> None:
    one_line_naming(template_result({"extraTrainerArgs": ["--steps=5"]}), "extraTrainerArgs")
    one_line_naming(template_result({"failJobExitCodes": [137, 143]}), "failJobExitCodes")
    env = env_of(trainer_container(render({"extraEnv": {"NOTE": "cost $(NNODES) nodes"}})))
    assert env["NOTE"] == "cost $$(NNODES) nodes"

"""Small helpers over synthesized templates (never hashed logical IDs: resources are found by type and
properties, or through the construct objects the stacks expose)."""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Stack


def resources(template: dict[str, Any], type_: str) -> list[dict[str, Any]]:
    """All resources of one CloudFormation type."""
    return [r for r in template["Resources"].values() if r["Type"] == type_]


def only(template: dict[str, Any], type_: str) -> dict[str, Any]:
    """The single resource of `type_` (fails if there are zero or several)."""
    found = resources(template, type_)
    assert len(found) == 1, f"expected one {type_}, found {len(found)}"
    return found[0]


def ref(stack: Stack, construct: Any) -> dict[str, str]:
    """The `{"Ref": logicalId}` CloudFormation uses for a construct's resource."""
    cfn = construct.node.default_child if construct.node.default_child is not None else construct
    return {"Ref": stack.resolve(stack.get_logical_id(cfn))}


def flatten(value: Any) -> str:
    """A property value with tokens as placeholders: Fn::Join is joined, Ref/GetAtt become <...>."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(flatten(p) for p in parts)
    if isinstance(value, dict) and "Ref" in value:
        return f"<{value['Ref']}>"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return "<{}.{}>".format(*value["Fn::GetAtt"])
    raise AssertionError(f"cannot flatten {value!r}")


def manifests(template: dict[str, Any]) -> list[dict[str, Any]]:
    """Every Kubernetes object applied by the kubectl provider (KubernetesManifest resources)."""
    out: list[dict[str, Any]] = []
    for resource in resources(template, "Custom::AWSCDK-EKS-KubernetesResource"):
        out.extend(json.loads(flatten(resource["Properties"]["Manifest"])))
    return out


def helm_releases(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Helm releases by release name, with their values parsed."""
    out = {}
    for resource in resources(template, "Custom::AWSCDK-EKS-HelmChart"):
        props = dict(resource["Properties"])
        props["Values"] = json.loads(flatten(props.get("Values", "{}")))
        out[props["Release"]] = props
    return out

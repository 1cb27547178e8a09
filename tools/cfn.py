"""Read values out of a synthesized CloudFormation template without AWS.

The trainer's Helm values live in the template as a CloudFormation expression (a JSON string built
with Fn::Join around asset URIs and account ids). Deploy-time values such as the account are filled
from what the caller knows; anything else becomes a visible `<Ref:...>` placeholder, never a guess.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

HELM_CHART_TYPE = "Custom::AWSCDK-EKS-HelmChart"


def resolve(expr: Any, pseudo: dict[str, str]) -> Any:
    """Evaluate the intrinsic functions that can be evaluated offline."""
    if isinstance(expr, list):
        return [resolve(item, pseudo) for item in expr]
    if not isinstance(expr, dict):
        return expr
    if len(expr) != 1:
        return {key: resolve(value, pseudo) for key, value in expr.items()}
    ((fn, arg),) = expr.items()
    if fn == "Ref":
        return pseudo.get(arg, f"<Ref:{arg}>")
    if fn == "Fn::GetAtt":
        target = ".".join(arg) if isinstance(arg, list) else arg
        return f"<GetAtt:{target}>"
    if fn == "Fn::Join":
        separator, parts = arg
        return separator.join(str(resolve(part, pseudo)) for part in parts)
    if fn == "Fn::Sub":
        template, variables = (arg, {}) if isinstance(arg, str) else arg
        names = {**pseudo, **{k: str(resolve(v, pseudo)) for k, v in variables.items()}}
        return re.sub(r"\$\{([^}!]+)\}", lambda m: names.get(m.group(1), f"<Ref:{m.group(1)}>"), template)
    if fn == "Fn::Select":
        index, items = arg
        return resolve(items, pseudo)[int(index)]
    if fn == "Fn::Split":
        separator, source = arg
        return str(resolve(source, pseudo)).split(separator)
    return {fn: resolve(arg, pseudo)}


def helm_releases(template_path: Path, pseudo: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Every Helm release in a template: release name -> its properties, with Values parsed."""
    template = json.loads(template_path.read_text())
    releases = {}
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") != HELM_CHART_TYPE:
            continue
        props = resolve(resource.get("Properties", {}), pseudo)
        values = props.get("Values")
        props["Values"] = json.loads(values) if isinstance(values, str) and values else (values or {})
        releases[props.get("Release", "?")] = props
    return releases

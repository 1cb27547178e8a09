"""The infra side of docs/security.md, over the session synth (conftest.py): no node credentials in pods
(IMDS hop limit 1, add-on credentials through Pod Identity), the S3 link (no imported deletions, the
team's bucket checked before the link), the team checkpoint key created in-cluster, and one policy scan
over every workload the stacks apply, with the checks tests/chart/test_hardening.py applies to the
trainer's pods."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from aws_cdk import CfnResource

from infra.checkpoint_key import CHECKPOINT_KEY_FIELD, CHECKPOINT_KEY_SECRET, INITIALIZER
from infra.collectors import TRAINER_METRICS_PORT
from infra.s3_bucket_check import CHECK_ACTIONS
from tests.helpers import REPO_ROOT
from tests.infra._synth import SynthResult
from tests.infra.helpers import flatten, helm_releases, manifests, ref, resources

ALL_TEAMS = ["ml-research", "llm-platform", "vision", "speech"]
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "Pod"}
LONG_RUNNING = {"Deployment", "DaemonSet", "StatefulSet"}


# -- no node credentials in pods -----------------------------------------------------------------------
@pytest.mark.parametrize("team", ALL_TEAMS)
def test_every_launch_template_has_imds_hop_limit_1(team: str, templates: dict) -> None:
    launch_templates = resources(templates[team], "AWS::EC2::LaunchTemplate")
    nodegroups = resources(templates[team], "AWS::EKS::Nodegroup")
    # Every node group that runs pods has a launch template of ours (none falls back to EKS's default,
    # whose hop limit is 2).
    assert len(nodegroups) == len(launch_templates) == 2
    assert all("LaunchTemplate" in n["Properties"] for n in nodegroups)
    for lt in launch_templates:
        options = lt["Properties"]["LaunchTemplateData"]["MetadataOptions"]
        assert options == {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"}


def _pod_identity_roles(template: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(namespace, service account) -> role logical id, from add-ons and standalone associations."""
    found = {}
    for addon in resources(template, "AWS::EKS::Addon"):
        namespace = (
            "amazon-cloudwatch"
            if addon["Properties"]["AddonName"].startswith("amazon-cloudwatch")
            else "kube-system"
        )
        for assoc in addon["Properties"].get("PodIdentityAssociations", []):
            found[(namespace, assoc["ServiceAccount"])] = assoc["RoleArn"]["Fn::GetAtt"][0]
    for assoc in resources(template, "AWS::EKS::PodIdentityAssociation"):
        props = assoc["Properties"]
        found[(props["Namespace"], props["ServiceAccount"])] = props["RoleArn"]["Fn::GetAtt"][0]
    return found


@pytest.mark.parametrize(
    ("team", "expected"),
    [
        ("ml-research", {("kube-system", "aws-node"), ("kube-system", "fsx-csi-controller-sa"),
                         ("amazon-cloudwatch", "cloudwatch-agent"),
                         ("amazon-cloudwatch", "cwagent-prometheus")}),
        ("vision", {("kube-system", "aws-node"), ("kube-system", "fsx-csi-controller-sa"),
                    ("monitoring", "alertmanager")}),
    ],
)  # fmt: skip
def test_addons_that_call_aws_get_their_own_pod_identity_role(
    team: str, expected: set[tuple[str, str]], templates: dict
) -> None:
    template = templates[team]
    roles = _pod_identity_roles(template)
    assert set(roles) == expected
    for logical_id in set(roles.values()):
        trust = template["Resources"][logical_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        (statement,) = trust
        assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    # No IRSA annotation and no other way to a role: the trainer's service account has no AWS role.
    for obj in manifests(template):
        if obj["kind"] == "ServiceAccount":
            assert "eks.amazonaws.com/role-arn" not in obj["metadata"].get("annotations", {})
    assert ("ml-research" if team == "ml-research" else team, "trainer") not in roles


def test_the_vpc_cni_role_carries_only_the_cni_policy(synth: SynthResult, templates: dict) -> None:
    stack = synth.stacks["ml-research"]
    role_id = ref(stack, stack.addons.vpc_cni_role)["Ref"]
    role = templates["ml-research"]["Resources"][role_id]["Properties"]
    (policy,) = role["ManagedPolicyArns"]
    assert flatten(policy).endswith(":iam::aws:policy/AmazonEKS_CNI_Policy")
    assert "Policies" not in role


# -- the S3 link ---------------------------------------------------------------------------------------
def test_s3_association_never_imports_deletions_and_waits_for_the_bucket_check(
    synth: SynthResult, templates: dict
) -> None:
    template = templates["ml-research"]
    (association,) = resources(template, "AWS::FSx::DataRepositoryAssociation")
    s3 = association["Properties"]["S3"]
    assert s3["AutoImportPolicy"]["Events"] == ["NEW", "CHANGED"]
    assert s3["AutoExportPolicy"]["Events"] == ["NEW", "CHANGED"]
    stack = synth.stacks["ml-research"]
    check = stack.storage.bucket_check
    check_id = stack.resolve(stack.get_logical_id(check.resource.node.default_child))
    assert check_id in association["DependsOn"]
    (custom,) = resources(template, "Custom::S3BucketCheck")
    assert custom["Properties"]["Bucket"] == "ml-research-checkpoints-111111111111"
    for team in ("llm-platform", "vision", "speech"):  # no s3_path: no check, no link
        assert resources(templates[team], "Custom::S3BucketCheck") == []


def test_the_bucket_check_may_read_three_settings_of_that_bucket_only(
    synth: SynthResult, templates: dict
) -> None:
    stack = synth.stacks["ml-research"]
    role_id = ref(stack, stack.storage.bucket_check.function.role)["Ref"]
    template = templates["ml-research"]
    statements = [
        s
        for p in resources(template, "AWS::IAM::Policy")
        if {"Ref": role_id} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    s3 = [s for s in statements if any(a.startswith("s3:") for a in s["Action"])]
    (only,) = s3
    assert sorted(only["Action"]) == sorted(CHECK_ACTIONS)
    # The partition literal or token, depending on the @aws-cdk/core:enablePartitionLiterals flag.
    assert flatten(only["Resource"]).split(":", 2)[2] == "s3:::ml-research-checkpoints-111111111111"
    others = {a for s in statements if s not in s3 for a in s["Action"]}
    assert others <= {"logs:CreateLogStream", "logs:PutLogEvents"}
    assert "ManagedPolicyArns" not in template["Resources"][role_id]["Properties"]


def test_the_bucket_check_logs_to_a_group_only_its_key_encrypts_and_gives_up_after_10_minutes(
    synth: SynthResult, templates: dict
) -> None:
    stack, template = synth.stacks["ml-research"], templates["ml-research"]
    check = stack.storage.bucket_check
    key_id = ref(stack, check.log_key)["Ref"]
    function = template["Resources"][ref(stack, check.function)["Ref"]]["Properties"]
    group_id = function["LoggingConfig"]["LogGroup"]["Ref"]
    group = template["Resources"][group_id]
    assert group["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    key = template["Resources"][key_id]
    (logs,) = [s for s in key["Properties"]["KeyPolicy"]["Statement"] if "Service" in s["Principal"]]
    arn = json.dumps(logs["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"])
    assert group["Properties"]["LogGroupName"] in arn  # this group only
    # The check's logs describe one deploy: group and key go with the stack, together.
    assert group["DeletionPolicy"] == key["DeletionPolicy"] == "Delete"
    (custom,) = resources(template, "Custom::S3BucketCheck")
    assert custom["Properties"]["ServiceTimeout"] == "600"  # seconds


# -- the team checkpoint key ---------------------------------------------------------------------------
@pytest.mark.parametrize("team", ALL_TEAMS)
def test_checkpoint_key_is_created_in_cluster_and_its_value_is_in_no_template(
    team: str, synth: SynthResult, templates: dict
) -> None:
    objects = [o for o in manifests(templates[team]) if o["metadata"].get("namespace") == team]
    assert not [o for o in manifests(templates[team]) if o["kind"] == "Secret"]
    (job,) = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].startswith(INITIALIZER)]
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert (env["SECRET_NAME"], env["SECRET_KEY"]) == (CHECKPOINT_KEY_SECRET, CHECKPOINT_KEY_FIELD)
    (role,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == INITIALIZER]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    stack = synth.stacks[team]
    if stack.trainer is not None:  # the release waits for the initializer's objects
        release_id = _logical_id(stack, stack.trainer.release)
        key_id = _logical_id(stack, stack.checkpoint_key.manifest)
        assert key_id in templates[team]["Resources"][release_id]["DependsOn"]


def _logical_id(stack: Any, construct: Any) -> str:
    """The CfnResource under an L2 custom resource (HelmChart, KubernetesManifest)."""
    (cfn,) = [c for c in construct.node.find_all() if isinstance(c, CfnResource)]
    return str(stack.resolve(stack.get_logical_id(cfn)))


# -- one policy scan over every workload the stacks apply ----------------------------------------------
def _bound_service_accounts(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {
        (s["namespace"], s["name"])
        for o in objects
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for s in o["subjects"]
        if s["kind"] == "ServiceAccount"
    }


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    return obj if obj["kind"] == "Pod" else obj["spec"]["template"]


def _selected(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in policy["spec"]["podSelector"].get("matchLabels", {}).items())


def hardening_findings(objects: list[dict[str, Any]]) -> list[str]:
    """Every way a workload of `objects` falls short of the trainer pods' hardening; [] when none."""
    findings = []
    bound = _bound_service_accounts(objects)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for obj in objects:
        if obj["kind"] not in WORKLOAD_KINDS:
            continue
        name = f"{obj['kind']} {obj['metadata']['namespace']}/{obj['metadata']['name']}"
        template = _pod(obj)
        pod, labels = template["spec"], template["metadata"]["labels"]
        psc = pod.get("securityContext", {})
        if psc.get("seccompProfile") != {"type": "RuntimeDefault"}:
            findings.append(f"{name}: no RuntimeDefault seccomp profile")
        if psc.get("runAsNonRoot") is not True:
            findings.append(f"{name}: may run as root")
        token = pod.get("automountServiceAccountToken")
        account = (obj["metadata"]["namespace"], pod.get("serviceAccountName", "default"))
        if token is None or (token is True and account not in bound):
            findings.append(f"{name}: mounts a service-account token without using the API")
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{name}/{c['name']}"
            sc = c.get("securityContext", {})
            if sc.get("readOnlyRootFilesystem") is not True:
                findings.append(f"{where}: writable root file system")
            if sc.get("allowPrivilegeEscalation") is not False or sc.get("privileged", False):
                findings.append(f"{where}: privilege escalation possible")
            if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("capabilities", {}).get("add"):
                findings.append(f"{where}: capabilities not dropped")
            if not {"cpu", "memory"} <= set(c.get("resources", {}).get("limits", {})):
                findings.append(f"{where}: no cpu and memory limits")
            if obj["kind"] in LONG_RUNNING and not ("livenessProbe" in c and "readinessProbe" in c):
                findings.append(f"{where}: no liveness and readiness probes")
        if obj["kind"] == "Job" and not obj["spec"].get("activeDeadlineSeconds"):
            findings.append(f"{name}: a Job without a deadline")
        mine = [
            p
            for p in policies
            if p["metadata"]["namespace"] == obj["metadata"]["namespace"] and _selected(p, labels)
        ]
        if not any(set(p["spec"]["policyTypes"]) == {"Ingress", "Egress"} for p in mine):
            findings.append(f"{name}: no NetworkPolicy restricting both ingress and egress")
    return findings


@pytest.mark.parametrize("team", ALL_TEAMS)
def test_every_workload_the_stack_applies_is_hardened(team: str, templates: dict) -> None:
    objects = manifests(templates[team])
    kinds = {o["kind"] for o in objects if o["kind"] in WORKLOAD_KINDS}
    assert "Job" in kinds  # the checkpoint-key initializer; the scraper with the CloudWatch collector
    if team != "vision":
        assert "Deployment" in kinds
    assert hardening_findings(objects) == []
    # Service accounts mount no token by default; the pods that call the API opt in.
    for sa in (o for o in objects if o["kind"] == "ServiceAccount"):
        assert sa.get("automountServiceAccountToken") is False, sa["metadata"]["name"]


def test_the_policy_scan_finds_what_the_old_scraper_lacked(templates: dict) -> None:
    """The scan can fail: the CloudWatch scraper without its hardening gets every finding."""
    objects = manifests(templates["ml-research"])
    (scraper,) = [o for o in objects if o["kind"] == "Deployment"]
    old = json.loads(json.dumps(scraper))
    pod = old["spec"]["template"]["spec"]
    for key in ("securityContext", "automountServiceAccountToken"):
        pod.pop(key)
    (container,) = pod["containers"]
    for key in ("livenessProbe", "readinessProbe"):
        container.pop(key)
    container["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    others = [o for o in objects if o is not scraper and o["kind"] != "NetworkPolicy"]
    findings = hardening_findings([old, *others])
    expected = ["seccomp", "root", "token", "writable root", "probes", "NetworkPolicy"]
    for word in expected:
        assert [f for f in findings if word in f and "cwagent-prometheus" in f], word


def test_scraper_reaches_only_the_trainer_metrics_port_dns_https_and_pod_identity(templates: dict) -> None:
    objects = manifests(templates["ml-research"])
    (policy,) = [
        o
        for o in objects
        if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == "amazon-cloudwatch"
    ]
    assert "ingress" not in policy["spec"]
    trainer, dns, https, pod_identity = policy["spec"]["egress"]
    assert trainer["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "ml-research"
    }
    assert trainer["ports"] == [{"protocol": "TCP", "port": TRAINER_METRICS_PORT}]
    assert {p["port"] for p in dns["ports"]} == {53} and https == {
        "ports": [{"protocol": "TCP", "port": 443}]
    }
    assert pod_identity["to"] == [{"ipBlock": {"cidr": "169.254.170.23/32"}}]
    chart_default = yaml.safe_load((REPO_ROOT / "k8s" / "values.yaml").read_text())["metricsPort"]
    assert chart_default == TRAINER_METRICS_PORT


def test_prometheus_charts_are_asked_for_the_same_hardening(templates: dict) -> None:
    values = helm_releases(templates["vision"])["kube-prometheus-stack"]["Values"]
    for component in ("prometheusOperator", "prometheus", "alertmanager", "grafana"):
        assert values[component]["networkPolicy"]["enabled"] is True, component
    pods = [
        values["prometheusOperator"]["securityContext"],
        values["prometheus"]["prometheusSpec"]["securityContext"],
        values["alertmanager"]["alertmanagerSpec"]["securityContext"],
        values["grafana"]["securityContext"],
    ]
    for psc in pods:
        assert psc["runAsNonRoot"] is True and psc["seccompProfile"] == {"type": "RuntimeDefault"}
    for csc in (
        values["prometheusOperator"]["containerSecurityContext"],
        values["grafana"]["containerSecurityContext"],
    ):
        assert csc["readOnlyRootFilesystem"] is True and csc["capabilities"] == {"drop": ["ALL"]}
    assert values["alertmanager"]["networkPolicy"]["policyTypes"] == ["Ingress", "Egress"]
    assert values["prometheusOperator"]["admissionWebhooks"] == {"enabled": False}
    assert values["grafana"]["testFramework"] == {"enabled": False}
    for component in (values["prometheusOperator"], values["grafana"], values["kube-state-metrics"]):
        assert set(component["resources"]["limits"]) == {"cpu", "memory"}
    releases = helm_releases(templates["vision"])
    dcgm = releases["dcgm-exporter"]["Values"]
    assert dcgm["podSecurityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    (dcgm_policy,) = [
        o
        for o in manifests(templates["vision"])
        if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == "monitoring"
    ]
    assert dcgm_policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert dcgm_policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 9400}]
    mounts = {m["mountPath"] for m in values["grafana"]["extraEmptyDirMounts"]}
    assert mounts == {"/var/log/grafana", "/tmp"}

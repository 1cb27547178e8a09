"""Deploy-time order and protections in the synthesized templates: add-ons wait for the system nodes,
the VPC CNI enforces NetworkPolicy, flow logs are encrypted with a key CloudWatch Logs may use, and the
FSx claim's request does not follow the file system's size."""

from __future__ import annotations

import json

import pytest

from infra.addons import VPC_CNI_CONFIGURATION
from infra.storage import PVC_REQUEST
from tests.infra._synth import SynthResult
from tests.infra.helpers import flatten, manifests, only, ref, resources

TEAMS = ["ml-research", "vision", "speech"]


def _logical_ids(template: dict, type_: str) -> list[str]:
    return [lid for lid, r in template["Resources"].items() if r["Type"] == type_]


def _depends_on(template: dict, logical_id: str) -> set[str]:
    depends = template["Resources"][logical_id].get("DependsOn", [])
    return {depends} if isinstance(depends, str) else set(depends)


@pytest.mark.parametrize("team", TEAMS)
def test_add_ons_and_releases_wait_for_the_system_node_group(
    team: str, synth: SynthResult, templates: dict
) -> None:
    template, stack = templates[team], synth.stacks[team]
    system = ref(stack, stack.cluster.system_nodegroup)["Ref"]
    waiting = _logical_ids(template, "AWS::EKS::Addon") + _logical_ids(
        template, "Custom::AWSCDK-EKS-HelmChart"
    )
    names = {template["Resources"][lid]["Properties"].get("AddonName") for lid in waiting}
    releases = {template["Resources"][lid]["Properties"].get("Release") for lid in waiting}
    # Every add-on and release of the stack is covered, the trainer's included.
    assert {"vpc-cni", "aws-fsx-csi-driver", "eks-pod-identity-agent", "eks-node-monitoring-agent"} <= names
    expected_releases = {"nvidia-device-plugin", "aws-efa-k8s-device-plugin"}
    if synth.teams[team].deploy_trainer:
        expected_releases.add("trainer")
    assert expected_releases <= releases
    for lid in waiting:
        assert system in _depends_on(template, lid), f"{lid} does not wait for the system node group"
    # ...and the node group itself waits for none of them (that would be a cycle CloudFormation refuses).
    assert not _depends_on(template, system) & set(waiting)


@pytest.mark.parametrize("team", TEAMS)
def test_vpc_cni_enforces_network_policy(team: str, templates: dict) -> None:
    (cni,) = [
        a for a in resources(templates[team], "AWS::EKS::Addon") if a["Properties"]["AddonName"] == "vpc-cni"
    ]
    props = cni["Properties"]
    assert (
        json.loads(props["ConfigurationValues"]) == {"enableNetworkPolicy": "true"} == VPC_CNI_CONFIGURATION
    )
    # Takes over the unmanaged CNI EKS installs; kept on deletion so running nodes keep their network.
    assert props["ResolveConflicts"] == "OVERWRITE" and props["PreserveOnDelete"] is True


@pytest.mark.parametrize("team", TEAMS)
def test_flow_logs_are_encrypted_with_a_key_cloudwatch_logs_may_use(
    team: str, synth: SynthResult, templates: dict
) -> None:
    template, stack = templates[team], synth.stacks[team]
    flow_log = only(template, "AWS::EC2::FlowLog")["Properties"]
    group_id = flow_log["LogGroupName"]["Ref"]
    group = template["Resources"][group_id]
    group_name = group["Properties"]["LogGroupName"]
    key_ref = ref(stack, stack.network.flow_log_key)["Ref"]
    assert group["Properties"]["KmsKeyId"] == {"Fn::GetAtt": [key_ref, "Arn"]}
    assert group["DeletionPolicy"] == "Retain"
    key = template["Resources"][key_ref]
    assert key["Properties"]["EnableKeyRotation"] is True and key["DeletionPolicy"] == "Retain"
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    (logs,) = [s for s in statements if "Service" in s["Principal"]]
    assert flatten(logs["Principal"]["Service"]) == f"logs.{synth.teams[team].region}.<AWS::URLSuffix>"
    assert {"kms:Encrypt*", "kms:Decrypt*", "kms:GenerateDataKey*"} <= set(logs["Action"])
    # Only for this one log group, named in the encryption context CloudWatch Logs sends.
    arn = json.dumps(logs["Condition"]["ArnEquals"]["kms:EncryptionContext:aws:logs:arn"])
    assert group_name in arn
    assert key_ref in _depends_on(template, group_id)


@pytest.mark.parametrize("team", TEAMS)
def test_fsx_claim_request_is_fixed_and_fits_the_volume(
    team: str, synth: SynthResult, templates: dict
) -> None:
    objects = {(m["kind"], m["metadata"]["name"]): m for m in manifests(templates[team])}
    pvc = objects[("PersistentVolumeClaim", "fsx-shared")]
    pv = objects[("PersistentVolume", pvc["spec"]["volumeName"])]
    assert pvc["spec"]["resources"]["requests"]["storage"] == PVC_REQUEST == "1200Gi"
    capacity_gib = int(pv["spec"]["capacity"]["storage"].removesuffix("Gi"))
    assert capacity_gib == synth.teams[team].fsx.storage_gib >= 1200

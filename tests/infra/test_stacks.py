"""Per-construct assertions over one synth of all test teams (see conftest.py)."""

from __future__ import annotations

import json
import subprocess

import pytest
from aws_cdk.assertions import Capture, Match, Template

from infra.instance_types import GPU_INSTANCE_TYPES
from tests.infra._synth import SynthResult
from tests.infra.helpers import flatten, helm_releases, manifests, only, ref, resources

ALL_TEAMS = ["ml-research", "llm-platform", "vision", "speech"]
EXPECTED_EFA = {"p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16, "p4d.24xlarge": 4}


@pytest.fixture(scope="module")
def cdk_templates(synth: SynthResult) -> dict[str, Template]:
    assert synth.error is None, f"synth failed: {synth.error}"
    return {name: Template.from_stack(stack) for name, stack in synth.stacks.items()}


def test_one_stack_per_team(synth: SynthResult) -> None:
    assert sorted(synth.stacks) == sorted(ALL_TEAMS)
    written = sorted(p.name for p in synth.outdir.glob("*.template.json"))
    assert written == sorted(f"{n}.template.json" for n in ALL_TEAMS)


def test_no_context_lookups(synth: SynthResult) -> None:
    manifest = json.loads((synth.outdir / "manifest.json").read_text())
    assert synth.error is None and manifest["artifacts"]
    assert "missing" not in manifest, f"synth wanted AWS lookups: {manifest['missing']}"


@pytest.mark.parametrize("team", ALL_TEAMS)
def test_efa_interfaces_follow_the_instance_type(
    team: str, synth: SynthResult, templates: dict, cdk_templates: dict
) -> None:
    instance = synth.teams[team].gpu_node_group.instance_type
    stack = synth.stacks[team]
    interfaces = Capture()
    cdk_templates[team].has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {"LaunchTemplateData": {"InstanceType": instance, "NetworkInterfaces": interfaces}},
    )
    found = interfaces.as_array()
    assert len(found) == EXPECTED_EFA[instance] == GPU_INSTANCE_TYPES[instance].efa_interfaces
    assert [i["NetworkCardIndex"] for i in found] == list(range(len(found)))
    assert (found[0]["InterfaceType"], found[0]["DeviceIndex"]) == ("efa", 0)
    assert {(i["InterfaceType"], i["DeviceIndex"]) for i in found[1:]} == {("efa-only", 1)}
    efa_sg = stack.resolve(stack.gpu.efa_security_group.security_group_id)
    assert all(efa_sg in i["Groups"] for i in found)


@pytest.mark.parametrize("team", ALL_TEAMS)
def test_gpu_nodegroup_ami_taint_label_repair(team: str, synth: SynthResult, cdk_templates: dict) -> None:
    config = synth.teams[team].gpu_node_group
    cdk_templates[team].has_resource_properties(
        "AWS::EKS::Nodegroup",
        {
            "AmiType": "AL2023_x86_64_NVIDIA",
            "InstanceTypes": Match.absent(),  # the instance type lives in the launch template
            "Taints": [{"Effect": "NO_SCHEDULE", "Key": "nvidia.com/gpu", "Value": "true"}],
            "Labels": {"blueprint.nvrx/node-role": "gpu"},
            "NodeRepairConfig": {"Enabled": True},
            "ScalingConfig": {
                "MinSize": config.min_nodes,
                "DesiredSize": config.node_count,  # training nodes + hot spares
                "MaxSize": config.max_nodes,
            },
            "Subnets": [ref(synth.stacks[team], synth.stacks[team].network.gpu_subnet)],
        },
    )
    cdk_templates[team].has_resource_properties("AWS::EKS::Addon", {"AddonName": "eks-node-monitoring-agent"})


def test_placement_group_only_for_plain_on_demand(synth: SynthResult, templates: dict) -> None:
    for team in ALL_TEAMS:
        stack, template = synth.stacks[team], templates[team]
        groups = resources(template, "AWS::EC2::PlacementGroup")
        lt_data = next(
            r["Properties"]["LaunchTemplateData"]
            for r in resources(template, "AWS::EC2::LaunchTemplate")
            if "NetworkInterfaces" in r["Properties"]["LaunchTemplateData"]
        )
        if synth.teams[team].gpu_node_group.capacity.type == "on-demand":
            assert [g["Properties"]["Strategy"] for g in groups] == ["cluster"], team
            assert lt_data["Placement"] == {"GroupName": ref(stack, stack.gpu.placement_group)}
        else:
            assert groups == [], team
            assert "Placement" not in lt_data


def test_capacity_targeting(cdk_templates: dict) -> None:
    cdk_templates["vision"].has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": {
                "CapacityReservationSpecification": {
                    "CapacityReservationTarget": {"CapacityReservationId": "cr-0fedcba9876543210"}
                },
                "InstanceMarketOptions": Match.absent(),
            }
        },
    )
    cdk_templates["vision"].has_resource_properties(
        "AWS::EKS::Nodegroup", {"AmiType": "AL2023_x86_64_NVIDIA", "CapacityType": "ON_DEMAND"}
    )
    cdk_templates["llm-platform"].has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": {
                "CapacityReservationSpecification": {
                    "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}
                },
                "InstanceMarketOptions": {"MarketType": "capacity-block"},
            }
        },
    )
    cdk_templates["llm-platform"].has_resource_properties(
        "AWS::EKS::Nodegroup", {"AmiType": "AL2023_x86_64_NVIDIA", "CapacityType": "CAPACITY_BLOCK"}
    )
    cdk_templates["ml-research"].has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": {
                "InstanceType": "p5.48xlarge",
                "CapacityReservationSpecification": Match.absent(),
            }
        },
    )


@pytest.mark.parametrize("team", ALL_TEAMS)
def test_every_launch_template_requires_imdsv2(team: str, templates: dict) -> None:
    templates_ = resources(templates[team], "AWS::EC2::LaunchTemplate")
    assert len(templates_) == 2  # system and GPU
    for lt in templates_:
        assert lt["Properties"]["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] == "required"


def test_efa_security_group_allows_all_traffic_within_itself(synth: SynthResult, templates: dict) -> None:
    stack = synth.stacks["ml-research"]
    sg_id = stack.resolve(stack.gpu.efa_security_group.security_group_id)
    self_rules = [
        r["Properties"]
        for r in resources(templates["ml-research"], "AWS::EC2::SecurityGroupIngress")
        if r["Properties"]["GroupId"] == sg_id
    ]
    assert self_rules == [
        {
            "IpProtocol": "-1",
            "GroupId": sg_id,
            "SourceSecurityGroupId": sg_id,
            "Description": "EFA: all traffic within the group",
        }
    ]


def test_gpu_user_data_builds_the_nvme_raid(templates: dict) -> None:
    lt = next(
        r
        for r in resources(templates["ml-research"], "AWS::EC2::LaunchTemplate")
        if "NetworkInterfaces" in r["Properties"]["LaunchTemplateData"]
    )
    encoded = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    assert encoded.startswith("MIME-Version: 1.0")
    assert "Content-Type: text/x-shellscript" in encoded
    assert "mdadm --create" in encoded and "MOUNT=/mnt/nvme" in encoded
    script = encoded.split('charset="us-ascii"\n\n', 1)[1].rsplit("\n--", 1)[0]
    assert script.startswith("#!/bin/bash")
    checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, check=False)
    assert checked.returncode == 0, checked.stderr
    assert encoded.isascii()  # the part is declared us-ascii


@pytest.mark.parametrize("team", ALL_TEAMS)
def test_azs_are_pinned_and_gpu_pieces_share_one_az(team: str, synth: SynthResult, templates: dict) -> None:
    config = synth.teams[team].network
    stack = synth.stacks[team]
    subnets = resources(templates[team], "AWS::EC2::Subnet")
    assert {s["Properties"]["AvailabilityZone"] for s in subnets} == set(config.availability_zones)
    gpu_subnet = templates[team]["Resources"][
        stack.resolve(stack.get_logical_id(stack.network.gpu_subnet.node.default_child))
    ]
    assert gpu_subnet["Properties"]["AvailabilityZone"] == config.gpu_availability_zone
    assert only(templates[team], "AWS::FSx::FileSystem")["Properties"]["SubnetIds"] == [
        ref(stack, stack.network.gpu_subnet)
    ]
    assert len(resources(templates[team], "AWS::EC2::NatGateway")) == config.nat_gateways


def test_vpc_endpoints_and_flow_logs(cdk_templates: dict, templates: dict) -> None:
    template = cdk_templates["ml-research"]
    template.has_resource_properties(
        "AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Gateway", "ServiceName": Match.object_like({})}
    )
    names = {
        flatten(r["Properties"]["ServiceName"])
        for r in resources(templates["ml-research"], "AWS::EC2::VPCEndpoint")
    }
    for service in ("s3", "ecr.api", "ecr.dkr", "sts", "ec2", "eks", "eks-auth", "logs"):
        assert any(n.endswith("." + service) for n in names), (service, names)
    template.resource_count_is("AWS::EC2::FlowLog", 1)
    template.has_resource("AWS::Logs::LogGroup", {"DeletionPolicy": "Retain"})


def test_cluster_version_logging_secrets_and_private_endpoint(cdk_templates: dict) -> None:
    cdk_templates["ml-research"].has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "Version": "1.35",
            "Logging": {
                "ClusterLogging": {
                    "EnabledTypes": [
                        {"Type": "api"},
                        {"Type": "audit"},
                        {"Type": "authenticator"},
                        {"Type": "controllerManager"},
                        {"Type": "scheduler"},
                    ]
                }
            },
            "EncryptionConfig": [{"Provider": {"KeyArn": Match.any_value()}, "Resources": ["secrets"]}],
            "ResourcesVpcConfig": Match.object_like(
                {"EndpointPrivateAccess": True, "EndpointPublicAccess": False}
            ),
            "ComputeConfig": {"Enabled": False},
        },
    )


def test_public_endpoint_is_restricted_to_the_configured_cidrs(cdk_templates: dict) -> None:
    cdk_templates["llm-platform"].has_resource_properties(
        "AWS::EKS::Cluster",
        {
            "ResourcesVpcConfig": Match.object_like(
                {
                    "EndpointPrivateAccess": True,
                    "EndpointPublicAccess": True,
                    "PublicAccessCidrs": ["203.0.113.0/24"],
                }
            )
        },
    )


@pytest.mark.parametrize("team", ALL_TEAMS)
def test_every_cluster_logs_all_control_plane_types(team: str, templates: dict) -> None:
    cluster = only(templates[team], "AWS::EKS::Cluster")["Properties"]
    enabled = {t["Type"] for t in cluster["Logging"]["ClusterLogging"]["EnabledTypes"]}
    assert enabled == {"api", "audit", "authenticator", "controllerManager", "scheduler"}
    vpc_config = cluster["ResourcesVpcConfig"]
    assert vpc_config["EndpointPrivateAccess"] is True
    assert vpc_config.get("EndpointPublicAccess") is False or vpc_config["PublicAccessCidrs"]
    assert "0.0.0.0/0" not in vpc_config.get("PublicAccessCidrs", [])


def test_access_entries_for_every_admin(synth: SynthResult, cdk_templates: dict) -> None:
    for arn in synth.teams["llm-platform"].admin_principal_arns:
        cdk_templates["llm-platform"].has_resource_properties(
            "AWS::EKS::AccessEntry",
            {
                "PrincipalArn": arn,
                "AccessPolicies": [{"AccessScope": {"Type": "cluster"}, "PolicyArn": Match.any_value()}],
            },
        )


@pytest.mark.parametrize("team", ALL_TEAMS)
def test_kms_keys_rotate_and_are_retained(team: str, synth: SynthResult, templates: dict) -> None:
    keys = resources(templates[team], "AWS::KMS::Key")
    # EKS secrets, FSx, VPC flow logs, the alarm topic (infra/observability.py); with an S3 link, the
    # bucket check's logs, deleted with its log group (they describe a deploy, not data).
    check_logs = [k for k in keys if k["Properties"]["Description"].startswith("Logs of the deploy-time")]
    assert len(check_logs) == (synth.teams[team].fsx.s3_path is not None)
    assert len(keys) == 4 + len(check_logs)
    for key in keys:
        assert key["Properties"]["EnableKeyRotation"] is True
        expected = ("Delete", "Delete") if key in check_logs else ("Retain", "Retain")
        assert (key["DeletionPolicy"], key["UpdateReplacePolicy"]) == expected


@pytest.mark.parametrize("team", ALL_TEAMS)
def test_fsx_persistent2_lustre215_lz4_kms_retained(
    team: str, synth: SynthResult, cdk_templates: dict
) -> None:
    config = synth.teams[team].fsx
    stack = synth.stacks[team]
    cdk_templates[team].has_resource(
        "AWS::FSx::FileSystem",
        {
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
            "Properties": Match.object_like(
                {
                    "FileSystemTypeVersion": "2.15",
                    "StorageCapacity": config.storage_gib,
                    "KmsKeyId": ref(stack, stack.storage.key),
                    "LustreConfiguration": {
                        "DeploymentType": "PERSISTENT_2",
                        "DataCompressionType": "LZ4",
                        "PerUnitStorageThroughput": config.throughput_per_tib,
                    },
                }
            ),
        },
    )


def test_fsx_security_group_opens_lustre_ports(synth: SynthResult, templates: dict) -> None:
    stack = synth.stacks["ml-research"]
    sg_id = stack.resolve(stack.storage.security_group.security_group_id)
    rules = [
        r["Properties"]
        for r in resources(templates["ml-research"], "AWS::EC2::SecurityGroupIngress")
        if r["Properties"]["GroupId"] == sg_id
    ]
    ports = sorted({(r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in rules})
    assert ports == [("tcp", 988, 988), ("tcp", 1018, 1023)]
    sources = {stack.resolve(stack.cluster.cluster.cluster_security_group_id)["Fn::GetAtt"][0]}
    assert {r["SourceSecurityGroupId"]["Fn::GetAtt"][0] for r in rules} == sources | {sg_id["Fn::GetAtt"][0]}
    assert len(rules) == 4  # both ports, from the nodes (cluster SG) and between file servers


def test_s3_association_only_when_configured(
    synth: SynthResult, templates: dict, cdk_templates: dict
) -> None:
    cdk_templates["ml-research"].has_resource_properties(
        "AWS::FSx::DataRepositoryAssociation",
        {
            "DataRepositoryPath": "s3://ml-research-checkpoints-111111111111/exports",
            "FileSystemPath": "/export",
            "S3": {
                "AutoExportPolicy": {"Events": ["NEW", "CHANGED"]},
                "AutoImportPolicy": {"Events": ["NEW", "CHANGED"]},
            },
        },
    )
    for team in ("llm-platform", "vision", "speech"):
        assert resources(templates[team], "AWS::FSx::DataRepositoryAssociation") == []


def test_fsx_csi_addon_uses_pod_identity(synth: SynthResult, cdk_templates: dict) -> None:
    stack = synth.stacks["ml-research"]
    role = Capture()
    cdk_templates["ml-research"].has_resource_properties(
        "AWS::EKS::Addon",
        {
            "AddonName": "aws-fsx-csi-driver",
            "PodIdentityAssociations": [{"RoleArn": role, "ServiceAccount": "fsx-csi-controller-sa"}],
        },
    )
    role_id = role.as_object()["Fn::GetAtt"][0]
    role_resource = cdk_templates["ml-research"].to_json()["Resources"][role_id]
    statements = role_resource["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert {
        a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    } == {"sts:AssumeRole", "sts:TagSession"}
    assert all(s["Principal"] == {"Service": "pods.eks.amazonaws.com"} for s in statements)
    policy = next(
        p
        for p in resources(cdk_templates["ml-research"].to_json(), "AWS::IAM::Policy")
        if p["Properties"]["Roles"] == [{"Ref": role_id}]
    )
    actions = {s["Action"] for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert actions == {"fsx:DescribeFileSystems"}  # no create/delete: it cannot remove checkpoints
    assert stack.storage.csi_addon is not None
    cdk_templates["ml-research"].has_resource_properties(
        "AWS::EKS::Addon", {"AddonName": "eks-pod-identity-agent"}
    )


@pytest.mark.parametrize("team", ALL_TEAMS)
def test_namespace_quota_service_account_and_static_volume(
    team: str, synth: SynthResult, templates: dict
) -> None:
    config = synth.teams[team]
    objects = {(o["kind"], o["metadata"]["name"]): o for o in manifests(templates[team])}
    assert ("Namespace", team) in objects
    quota = objects[("ResourceQuota", "gpu-quota")]
    assert quota["metadata"]["namespace"] == team
    assert quota["spec"]["hard"] == {"requests.nvidia.com/gpu": str(config.effective_gpu_quota)}
    account = objects[("ServiceAccount", "trainer")]
    assert account["metadata"]["namespace"] == team
    pvc = objects[("PersistentVolumeClaim", "fsx-shared")]
    assert pvc["metadata"]["namespace"] == team
    pv = objects[("PersistentVolume", pvc["spec"]["volumeName"])]
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["spec"]["accessModes"] == pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pv["spec"]["csi"]["driver"] == "fsx.csi.aws.com"
    assert pv["spec"]["capacity"]["storage"] == f"{config.fsx.storage_gib}Gi"


@pytest.mark.parametrize("team", ALL_TEAMS)
def test_device_plugins_are_pinned_helm_charts(team: str, templates: dict) -> None:
    releases = helm_releases(templates[team])
    nvidia, efa = releases["nvidia-device-plugin"], releases["aws-efa-k8s-device-plugin"]
    assert (nvidia["Repository"], nvidia["Version"]) == (
        "https://nvidia.github.io/k8s-device-plugin",
        "0.18.2",
    )
    assert (efa["Repository"], efa["Version"]) == ("https://aws.github.io/eks-charts", "v0.5.29")
    for release in (nvidia, efa):
        assert release["Namespace"] == "kube-system"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in release["Values"][
            "tolerations"
        ]
    assert efa["Values"]["nodeSelector"] == {"blueprint.nvrx/node-role": "gpu"}
    terms = nvidia["Values"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "blueprint.nvrx/node-role", "operator": "In", "values": ["gpu"]}]}
    ]


@pytest.mark.parametrize("team", ["ml-research", "llm-platform", "vision"])
def test_trainer_release_sets_exactly_contract_1(team: str, synth: SynthResult, templates: dict) -> None:
    config = synth.teams[team]
    release = helm_releases(templates[team])["trainer"]
    assert release["Namespace"] == team
    assert release["ChartAssetURL"].startswith("s3://") and release["ChartAssetURL"].endswith(".zip")
    values = release["Values"]
    instance = config.gpu_node_group.instance_type
    assert set(values) == {
        "image",
        "nodes",
        "spareNodes",
        "instanceType",
        "gpusPerNode",
        "efaPerNode",
        "storage",
        "serviceAccountName",
        "suspend",
        "networkPolicy",  # observability (tests/infra/test_observability.py)
        "podMonitor",
        # the sized checkpoint cadence (tests/infra/test_sizing_teams.py)
        "preset",
        "ckptInterval",
        "ckptKeep",
        "ckptWriteTimeout",
    }
    assert set(values["image"]) == {"repository", "tag"} and values["image"]["tag"]
    assert ".dkr.ecr." in values["image"]["repository"]
    assert values["nodes"] == config.gpu_node_group.desired_nodes
    assert values["spareNodes"] == config.gpu_node_group.spare_nodes
    assert values["instanceType"] == instance
    assert values["gpusPerNode"] == 8
    assert values["efaPerNode"] == EXPECTED_EFA[instance]
    assert values["storage"] == {"claimName": "fsx-shared", "localNvmePath": "/mnt/nvme"}
    assert values["serviceAccountName"] == "trainer"
    assert values["suspend"] is (not config.start_trainer)
    assert values["ckptInterval"] == config.checkpoints.steps_between_saves
    assert values["ckptKeep"] == config.checkpoints.keep


def test_no_trainer_release_when_disabled(templates: dict) -> None:
    assert "trainer" not in helm_releases(templates["speech"])

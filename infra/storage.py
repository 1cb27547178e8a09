"""Shared storage: FSx for Lustre PERSISTENT_2 (Lustre 2.15, LZ4, KMS), its security group, the FSx CSI
driver add-on with a Pod Identity role, an optional S3 data repository association (import and export of
new and changed files only; the team's bucket checked at deploy: infra/s3_bucket_check.py), and a static
PV/PVC.

Deleting a stack never deletes a team's checkpoints: the file system and its KMS key are retained (the
stack delete then stops at the subnet and security group the file system still uses, by design), the PV
reclaim policy is Retain, and the CSI role can describe the file system but not delete it.
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from infra.config import FsxConfig, TeamConfig
from infra.network import Network
from infra.s3_bucket_check import S3BucketCheck

FSX_PVC_NAME = "fsx-shared"
FSX_CSI_CONTROLLER_SA = "fsx-csi-controller-sa"
# Lustre: 988 for the client/server protocol, 1018-1023 for LNet between clients and servers.
LUSTRE_PORTS = [ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023)]
# The claim's request (see SharedStorage._volume): the smallest FSx capacity, so it never exceeds the PV's.
PVC_REQUEST = "1200Gi"


class SharedStorage(Construct):
    """The team's FSx for Lustre file system and its Kubernetes PV/PVC.

    Attributes: `file_system`, `security_group`, `key`, `csi_addon`, `pvc_manifest`, `repository_association`
    (None without `fsx.s3_path`), `bucket_check` (S3BucketCheck, with `fsx.s3_path` only).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        team: TeamConfig,
        network: Network,
        cluster: eks.Cluster,
        namespace: eks.KubernetesManifest,
    ) -> None:
        super().__init__(scope, construct_id)
        self.security_group = self._security_group(team, network, cluster)
        self.key = kms.Key(
            self,
            "Key",
            description=f"FSx for Lustre encryption for team {team.name}",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.file_system = self._file_system(team.fsx, network)
        self.repository_association = self._s3_association(team.fsx)
        self.csi_addon = self._csi_driver(cluster)
        self.pvc_manifest = self._volume(team, cluster)
        self.pvc_manifest.node.add_dependency(namespace)
        self.pvc_manifest.node.add_dependency(self.csi_addon)

    def _security_group(self, team: TeamConfig, network: Network, cluster: eks.Cluster) -> ec2.SecurityGroup:
        """Lustre ports only, from the file servers themselves and from the cluster's nodes."""
        group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=network.vpc,
            allow_all_outbound=True,
            description=f"FSx for Lustre of team {team.name}: Lustre ports from the file system and nodes",
        )
        for port in LUSTRE_PORTS:
            group.add_ingress_rule(group, port, "Lustre between file servers")
            group.connections.allow_from(cluster.cluster_security_group, port, "Lustre clients")
        return group

    def _file_system(self, config: FsxConfig, network: Network) -> fsx.CfnFileSystem:
        """PERSISTENT_2 in the GPU subnet, encrypted with the team key, retained past the stack."""
        # The L1 resource, not LustreFileSystem: the L2 opens 988-1023 within its group, wider than the
        # two port ranges Lustre uses.
        file_system = fsx.CfnFileSystem(
            self,
            "FileSystem",
            file_system_type="LUSTRE",
            file_system_type_version="2.15",
            storage_capacity=config.storage_gib,
            storage_type="SSD",
            subnet_ids=[network.gpu_subnet.subnet_id],  # the GPU AZ: no cross-AZ traffic or latency
            security_group_ids=[self.security_group.security_group_id],
            kms_key_id=self.key.key_id,
            lustre_configuration=fsx.CfnFileSystem.LustreConfigurationProperty(
                deployment_type="PERSISTENT_2",
                per_unit_storage_throughput=config.throughput_per_tib,
                data_compression_type="LZ4",
            ),
        )
        file_system.apply_removal_policy(RemovalPolicy.RETAIN)
        return file_system

    def _s3_association(self, config: FsxConfig) -> fsx.CfnDataRepositoryAssociation | None:
        """The optional S3 data repository association (None without `fsx.s3_path`)."""
        if config.s3_path is None:
            return None
        association = fsx.CfnDataRepositoryAssociation(
            self,
            "S3Association",
            file_system_id=self.file_system.ref,
            file_system_path=config.s3_file_system_path,
            data_repository_path=config.s3_path,
            batch_import_meta_data_on_create=True,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                # Deletions are not exported: keep-latest-k pruning on FSx must not prune the S3 copy.
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(
                    events=["NEW", "CHANGED"]
                ),
                # Deletions are not imported either: a deleted (or forged-then-deleted) S3 object must never
                # delete a live checkpoint on FSx. New and changed objects still appear.
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(
                    events=["NEW", "CHANGED"]
                ),
            ),
        )
        # The team's bucket is checked at deploy before the link exists (TLS only, private, encrypted).
        self.bucket_check = S3BucketCheck(self, "S3BucketCheck", s3_path=config.s3_path)
        association.node.add_dependency(self.bucket_check.resource)
        return association

    def _csi_driver(self, cluster: eks.Cluster) -> eks.CfnAddon:
        """The FSx CSI driver add-on; its controller may describe this file system and nothing else."""
        # Static provisioning only: the controller needs to describe, never to create or delete.
        csi_role = iam.Role(
            self,
            "CsiRole",
            # EKS Pod Identity assumes the role with session tags (sts:AssumeRole + sts:TagSession).
            assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com").with_session_tags(),
            description="FSx CSI controller (EKS Pod Identity), static provisioning only",
        )
        csi_role.add_to_policy(
            iam.PolicyStatement(
                actions=["fsx:DescribeFileSystems"],
                resources=[
                    Stack.of(self).format_arn(
                        service="fsx", resource="file-system", resource_name=self.file_system.ref
                    )
                ],
            )
        )
        return eks.CfnAddon(
            self,
            "CsiDriver",
            cluster_name=cluster.cluster_name,
            addon_name="aws-fsx-csi-driver",
            resolve_conflicts="OVERWRITE",
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=csi_role.role_arn, service_account=FSX_CSI_CONTROLLER_SA
                )
            ],
        )

    def _volume(self, team: TeamConfig, cluster: eks.Cluster) -> eks.KubernetesManifest:
        """The static PV (reclaim Retain) bound to the PVC the trainer mounts."""
        pv_name = f"{team.name}-fsx"
        return cluster.add_manifest(
            "FsxVolume",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv_name},
                "spec": {
                    # Mutable: follows the file system when its capacity grows.
                    "capacity": {"storage": f"{team.fsx.storage_gib}Gi"},
                    "volumeMode": "Filesystem",
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "mountOptions": ["flock"],
                    "csi": {
                        "driver": "fsx.csi.aws.com",
                        "volumeHandle": self.file_system.ref,
                        "volumeAttributes": {
                            "dnsname": self.file_system.attr_dns_name,
                            "mountname": self.file_system.attr_lustre_mount_name,
                        },
                    },
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": FSX_PVC_NAME, "namespace": team.name},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": pv_name,
                    # A constant, not the file system's size: a bound claim's request can only grow
                    # through a StorageClass that allows expansion (this one has none), so a request
                    # that followed fsx.storage_gib would make the API server refuse the next deploy
                    # after the file system grew. Binding only needs request <= the PV's capacity.
                    "resources": {"requests": {"storage": PVC_REQUEST}},
                },
            },
        )

"""The trainer release: the local k8s/ chart as a chart asset, the repo's Dockerfile as an image asset, and
exactly the Contract 1 values (docs/design.md) derived from the team config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import IgnoreMode
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from infra.addons import TRAINER_SERVICE_ACCOUNT
from infra.config import TeamConfig
from infra.instance_types import GPU_INSTANCE_TYPES
from infra.nvme_userdata import LOCAL_NVME_PATH
from infra.observability import trainer_metrics_values
from infra.storage import FSX_PVC_NAME
from infra.teams.checkpoints import checkpoint_values

TRAINER_RELEASE = "trainer"


def trainer_values(team: TeamConfig, image_repository: str, image_tag: str) -> dict[str, Any]:
    """The chart values infra sets (Contract 1); every other value keeps the chart default."""
    instance = GPU_INSTANCE_TYPES[team.gpu_node_group.instance_type]
    return {
        "image": {"repository": image_repository, "tag": image_tag},
        "nodes": team.gpu_node_group.desired_nodes,
        "spareNodes": team.gpu_node_group.spare_nodes,
        "instanceType": instance.name,
        "gpusPerNode": instance.gpus,
        "efaPerNode": instance.efa_interfaces,
        "storage": {"claimName": FSX_PVC_NAME, "localNvmePath": LOCAL_NVME_PATH},
        "serviceAccountName": TRAINER_SERVICE_ACCOUNT,
        "suspend": not team.start_trainer,
        **trainer_metrics_values(team.observability),
        # The checkpoint cadence the file system was sized for (sizing package, checked at synthesis).
        **checkpoint_values(team.checkpoints, team.storage_sizing.write_s),
    }


class TrainerRelease(Construct):
    """The Helm release of the trainer chart in the team namespace.

    Attributes: `image` (DockerImageAsset), `chart_asset`, `release` (HelmChart), `values`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        team: TeamConfig,
        cluster: eks.Cluster,
        chart_dir: Path,
        image_dir: Path,
    ) -> None:
        super().__init__(scope, construct_id)
        # The build context is the repo root; .dockerignore (allow-list) keeps staging to the few files
        # the Dockerfile needs, so synth never copies .venv, node_modules or cdk.out.
        self.image = ecr_assets.DockerImageAsset(
            self,
            "Image",
            directory=str(image_dir),
            file="Dockerfile",
            ignore_mode=IgnoreMode.DOCKER,
            platform=ecr_assets.Platform.LINUX_AMD64,
        )
        self.chart_asset = s3_assets.Asset(self, "Chart", path=str(chart_dir))
        self.values = trainer_values(team, self.image.repository.repository_uri, self.image.image_tag)
        self.release = cluster.add_helm_chart(
            "Trainer",
            chart_asset=self.chart_asset,
            release=TRAINER_RELEASE,
            namespace=team.name,
            create_namespace=False,
            values=self.values,
            # The Job starts training; deploy must not block until every GPU node is up.
            wait=False,
        )

"""One team's environment: a thin stack composing the constructs (differences between teams are data)."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Acknowledgment, Environment, Stack, Tags, Validations
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.addons import ClusterAddons
from infra.checkpoint_key import CheckpointKey
from infra.cluster import Cluster
from infra.config import TeamConfig
from infra.gpu_nodegroup import GpuNodeGroup
from infra.network import Network
from infra.observability import Observability
from infra.storage import SharedStorage
from infra.trainer_release import TrainerRelease


class TeamStack(Stack):
    """VPC, EKS cluster, GPU node group, add-ons, the checkpoint key, FSx, observability and the trainer
    release of one team."""

    def __init__(self, scope: Construct, *, team: TeamConfig, chart_dir: Path, image_dir: Path) -> None:
        super().__init__(
            scope,
            team.stack_name,
            env=Environment(account=team.account, region=team.region),
            description=f"NVRx fault-tolerant training environment of team {team.name} (EKS, GPU, FSx)",
        )
        self._azs = list(team.network.availability_zones)
        Validations.of(self).acknowledge(
            Acknowledgment(
                id="CloudFormation-Validate::W3010",
                reason="Literal AZs are intended: the teams file pins them so synth makes no AWS lookup and "
                "the GPU subnet lands in the AZ that holds the team's GPU capacity.",
            )
        )
        Tags.of(self).add("blueprint.nvrx/team", team.name)
        self.team = team
        self.network = Network(self, "Network", config=team.network)
        self.cluster = Cluster(self, "Cluster", team=team, network=self.network)
        eks_cluster = self.cluster.cluster
        self.gpu = GpuNodeGroup(self, "GpuNodes", team=team, network=self.network, cluster=eks_cluster)
        self.addons = ClusterAddons(self, "Addons", team=team, cluster=eks_cluster)
        self.checkpoint_key = CheckpointKey(self, "CheckpointKey", cluster=eks_cluster, namespace=team.name)
        self.checkpoint_key.manifest.node.add_dependency(self.addons.namespace)
        self.storage = SharedStorage(
            self,
            "Storage",
            team=team,
            network=self.network,
            cluster=eks_cluster,
            namespace=self.addons.namespace,
        )
        self.observability = Observability(
            self, "Observability", team_name=team.name, config=team.observability, cluster=eks_cluster
        )
        self.observability.node.add_dependency(self.addons.namespace)  # the scraper's Role lives there
        self.trainer: TrainerRelease | None = None
        if team.deploy_trainer:
            self.trainer = TrainerRelease(
                self, "Trainer", team=team, cluster=eks_cluster, chart_dir=chart_dir, image_dir=image_dir
            )
            self.trainer.release.node.add_dependency(self.addons.namespace_objects)
            self.trainer.release.node.add_dependency(self.storage.pvc_manifest)
            self.trainer.release.node.add_dependency(self.checkpoint_key.manifest)
            # With the Prometheus collector the release renders a PodMonitor: its CRD comes with the stack.
            self.trainer.release.node.add_dependency(self.observability)
        self._wait_for_system_nodes()

    def _wait_for_system_nodes(self) -> None:
        """Every add-on and Helm release waits for the system node group: their controllers and
        webhooks need a node to run on, or the add-on stays degraded and a release times out."""
        system_nodes = self.cluster.system_nodegroup
        for construct in self.node.find_all():
            if isinstance(construct, eks.CfnAddon | eks.HelmChart) and construct is not system_nodes:
                construct.node.add_dependency(system_nodes)

    @property
    def availability_zones(self) -> list[str]:
        """The teams file's AZs: constructs that ask the stack for AZs never trigger an AWS lookup."""
        return self._azs

"""Each component's command line. Defaults of the components are kept unless a reason is written here.

The settings mirror an EKS cluster where the chart can tell the difference (admission plugins, the
service address range, RBAC with the Node authorizer, privileged pods allowed) and are made fast where
it cannot (etcd without fsync, no leader election: one instance of each, in a test).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The admission plugins an EKS 1.35 control plane enables (EKS's "platform versions" page), those this
# API server version still has. The API server turns on its default set as well; this list makes the
# EKS ones explicit, so a default dropped upstream cannot silently leave one out.
EKS_ADMISSION_PLUGINS = (
    "NamespaceLifecycle",
    "LimitRanger",
    "ServiceAccount",
    "NodeRestriction",
    "ExtendedResourceToleration",
    "TaintNodesByCondition",
    "DefaultStorageClass",
    "DefaultTolerationSeconds",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ResourceQuota",
    "Priority",
    "StorageObjectInUseProtection",
    "PersistentVolumeClaimResize",
    "RuntimeClass",
    "DefaultIngressClass",
    "PodSecurity",
    "CertificateApproval",
    "CertificateSigning",
    "CertificateSubjectRestriction",
    "ClusterTrustBundleAttest",
)
SERVICE_CIDR = "10.100.0.0/16"
"""EKS's default service range for a VPC outside 10.0.0.0/8 (172.20.0.0/16 otherwise)."""
SERVICE_IP = "10.100.0.1"
"""The `kubernetes` Service's address: the first of the range."""
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Layout:
    """Where every component finds its files and ports; all paths under the control plane's work folder."""

    workdir: Path
    etcd_client_port: int
    etcd_peer_port: int
    api_port: int
    controller_manager_port: int
    scheduler_port: int

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_client_port}"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def kubeconfig(self, user: str) -> Path:
        return self.workdir / f"{user}.kubeconfig"


def etcd(layout: Layout) -> list[str]:
    peer = f"http://127.0.0.1:{layout.etcd_peer_port}"
    return [
        "--name=local",
        f"--data-dir={layout.workdir / 'etcd'}",
        f"--listen-client-urls={layout.etcd_url}",
        f"--advertise-client-urls={layout.etcd_url}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=local={peer}",
        # A test cluster lives minutes and is thrown away: durability buys nothing, fsync costs seconds.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def api_server(layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        f"--etcd-servers={layout.etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={layout.api_port}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        # The API server's own identity towards kubelets (logs, exec): a node agent can check it.
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        # No front proxy here; set anyway so the components' delegated authentication finds the
        # request-header CA it looks for (its absence fills their logs with errors every few seconds).
        f"--requestheader-client-ca-file={pki / 'ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--authorization-mode=Node,RBAC",
        f"--enable-admission-plugins={','.join(EKS_ADMISSION_PLUGINS)}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        # The `kubernetes` Service's endpoint would be 127.0.0.1, which the API server refuses for an
        # Endpoints object (loopback); nothing here routes service addresses anyway (no kube-proxy).
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",  # EKS allows privileged pods; PodSecurity decides per namespace
        "--profiling=false",
    ]


def _client_flags(kubeconfig: Path, port: int) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        # Delegated authentication/authorization of the component's own /healthz and /metrics.
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",  # one instance: no lease to take or lose
    ]


def controller_manager(layout: Layout) -> list[str]:
    pki = layout.pki
    return [
        *_client_flags(layout.kubeconfig("controller-manager"), layout.controller_manager_port),
        f"--cert-dir={layout.workdir / 'controller-manager-certs'}",
        # Every controller a cluster runs by default (Job, ReplicaSet, Deployment, EndpointSlice, namespace,
        # garbage collector, service accounts and their tokens, pod GC, node lifecycle, PV binder, ...);
        # the cloud ones stay off by themselves without a cloud provider.
        "--controllers=*",
        # Each controller calls the API server as its own service account, as on EKS: a controller
        # lacking a permission fails here as it would there.
        "--use-service-account-credentials=true",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
    ]


def scheduler(layout: Layout) -> list[str]:
    return _client_flags(layout.kubeconfig("scheduler"), layout.scheduler_port)

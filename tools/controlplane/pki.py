"""The control plane's certificates and keys, made with the openssl command line (the environment need
not have a Python crypto library).

One CA signs everything: the API server's serving certificate (valid for 127.0.0.1, localhost and the
in-cluster names of the `kubernetes` Service) and the client certificates (the API server's own, for
calls to kubelets; any a caller asks for, e.g. a node's). ECDSA P-256 keys: generated in milliseconds,
accepted by every component. The service accounts' tokens are signed by a key of their own.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

OPENSSL = "openssl"
DAYS = "3650"
CLUSTER_DOMAIN = "cluster.local"


class PkiError(RuntimeError):
    """openssl failed; the message names the file being made and openssl's own line."""


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(args: Sequence[str], what: Path) -> None:
    run = subprocess.run([OPENSSL, *args], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise PkiError(f"openssl could not make {what}: {last}")


def _new_key(path: Path) -> None:
    _openssl(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)], path)
    path.chmod(0o600)


def make_ca(folder: Path, name: str = "blueprint-local-ca") -> KeyPair:
    folder.mkdir(parents=True, exist_ok=True)
    pair = KeyPair(folder / "ca.crt", folder / "ca.key")
    _new_key(pair.key)
    _openssl(
        [
            "req",
            "-x509",
            "-new",
            "-key",
            str(pair.key),
            "-out",
            str(pair.cert),
            "-days",
            DAYS,
            "-subj",
            f"/CN={name}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        ],
        pair.cert,
    )
    return pair


def _signed(ca: KeyPair, folder: Path, name: str, subject: str, extensions: Sequence[str]) -> KeyPair:
    pair = KeyPair(folder / f"{name}.crt", folder / f"{name}.key")
    csr, ext = folder / f"{name}.csr", folder / f"{name}.ext"
    _new_key(pair.key)
    _openssl(["req", "-new", "-key", str(pair.key), "-out", str(csr), "-subj", subject], csr)
    ext.write_text("\n".join(extensions) + "\n")
    _openssl(
        [
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca.cert),
            "-CAkey",
            str(ca.key),
            "-CAcreateserial",
            "-out",
            str(pair.cert),
            "-days",
            DAYS,
            "-extfile",
            str(ext),
        ],
        pair.cert,
    )
    csr.unlink()
    ext.unlink()
    return pair


def serving_cert(ca: KeyPair, folder: Path, name: str, ips: Sequence[str], dns: Sequence[str]) -> KeyPair:
    """A TLS server certificate valid for the given addresses and names."""
    alt = ",".join([f"IP:{ip}" for ip in ips] + [f"DNS:{d}" for d in dns])
    return _signed(
        ca,
        folder,
        name,
        f"/CN={name}",
        [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=serverAuth",
            f"subjectAltName={alt}",
        ],
    )


def client_cert(ca: KeyPair, folder: Path, name: str, user: str, groups: Sequence[str] = ()) -> KeyPair:
    """A client certificate: the API server reads the user from the CN and the groups from the O fields."""
    subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
    return _signed(
        ca,
        folder,
        name,
        subject,
        [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=clientAuth",
        ],
    )


def api_server_names(service_ip: str) -> tuple[list[str], list[str]]:
    """IPs and DNS names the API server's certificate must cover: where the tests reach it and where a pod
    would (the first address of the service range and the `kubernetes` Service's names)."""
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    return ["127.0.0.1", service_ip], [*dns, f"kubernetes.default.svc.{CLUSTER_DOMAIN}"]


def service_account_key(folder: Path) -> KeyPair:
    """The key pair that signs service-account tokens (`cert` holds the public key, not a certificate)."""
    pair = KeyPair(folder / "sa.pub", folder / "sa.key")
    _new_key(pair.key)
    _openssl(["pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert)], pair.cert)
    return pair

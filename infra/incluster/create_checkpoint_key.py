"""Creates the team's checkpoint key Secret if it does not exist (runs once per deploy in a hardened Job).

The key is 32 random bytes from the pod's kernel, written as 64 hex characters (the trainer strips
surrounding whitespace from key files, which raw bytes could lose), sent straight to the Kubernetes API
(TLS, the pod's service-account token, the cluster CA): it never appears in a template, a ConfigMap, an
argument or a log.
`create` is atomic, so an existing key (409 Conflict) is kept: jobs share it and checkpoints outlive them.
Standard library only (the image is a plain Python image). Configuration is the pod's own environment:
KUBERNETES_SERVICE_HOST/PORT (set by the kubelet), POD_NAMESPACE, SECRET_NAME, SECRET_KEY.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
KEY_BYTES = 32


def secret_manifest(namespace: str, name: str, key: str) -> dict[str, object]:
    value = base64.b64encode(secrets.token_hex(KEY_BYTES).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "checkpoint-key-initializer"},
        },
        "type": "Opaque",
        "immutable": True,  # rotation is delete + re-run, never an in-place change under running jobs
        "data": {key: value},
    }


def create_once(service_account: Path = SERVICE_ACCOUNT) -> str:
    """POST the Secret; 'created' or 'exists'. Raises on any other answer."""
    namespace, name, key = (os.environ[v] for v in ("POD_NAMESPACE", "SECRET_NAME", "SECRET_KEY"))
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    host = f"[{host}]" if ":" in host else host
    context = ssl.create_default_context(cafile=str(service_account / "ca.crt"))
    token = (service_account / "token").read_text().strip()
    request = urllib.request.Request(
        f"https://{host}:{port}/api/v1/namespaces/{namespace}/secrets",
        data=json.dumps(secret_manifest(namespace, name, key)).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=30):
            return "created"
    except urllib.error.HTTPError as err:
        if err.code == 409:
            return "exists"
        raise RuntimeError(f"the API server answered {err.code} {err.reason}") from None


def main() -> int:
    name, namespace = os.environ.get("SECRET_NAME", "?"), os.environ.get("POD_NAMESPACE", "?")
    try:
        outcome = create_once()
    except Exception as err:  # one line, never the key
        print(f"checkpoint-key: could not create {namespace}/{name}: {err}", file=sys.stderr)
        return 1
    print(f"checkpoint-key: {namespace}/{name} {outcome}" + (" (kept as is)" if outcome == "exists" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

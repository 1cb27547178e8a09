"""The two small programs infra ships to run outside the synth, run for real:
- the S3 bucket check Lambda handler, against a fake S3 client and a local HTTP server standing in for
  CloudFormation's response URL;
- the checkpoint-key initializer, as a subprocess against a local HTTPS server standing in for the
  Kubernetes API (a self-signed certificate made with openssl, the token and CA read from a scratch
  service-account folder)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from infra.checkpoint_key import CHECKPOINT_KEY_FIELD, CHECKPOINT_KEY_SECRET, SCRIPT
from infra.lambdas.s3_bucket_check import index as bucket_check

TLS_ONLY = {
    "Effect": "Deny",
    "Principal": {"AWS": "*"},
    "Action": "s3:*",
    "Resource": ["arn:aws:s3:::b", "arn:aws:s3:::b/*"],
    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
}
ALL_BLOCKED = dict.fromkeys(bucket_check.PUBLIC_ACCESS_BLOCKS, True)
SSE = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms"}}]}


class _ClientError(Exception):
    """Shaped like botocore's ClientError (the handler reads `response`)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}}


class FakeS3:
    def __init__(self, pab: dict | None, policy: dict | None, encryption: dict | None) -> None:
        self.pab, self.policy, self.encryption = pab, policy, encryption
        self.calls: list[str] = []

    def get_public_access_block(self, Bucket: str) -> dict:
        self.calls.append(Bucket)
        if self.pab is None:
            raise _ClientError("NoSuchPublicAccessBlockConfiguration")
        return {"PublicAccessBlockConfiguration": self.pab}

    def get_bucket_policy(self, Bucket: str) -> dict:
        if self.policy is None:
            raise _ClientError("NoSuchBucketPolicy")
        return {"Policy": json.dumps(self.policy)}

    def get_bucket_encryption(self, Bucket: str) -> dict:
        if self.encryption is None:
            raise _ClientError("ServerSideEncryptionConfigurationNotFoundError")
        return {"ServerSideEncryptionConfiguration": self.encryption}


@pytest.mark.parametrize(
    ("pab", "statements", "encryption", "problems"),
    [
        (ALL_BLOCKED, [TLS_ONLY], SSE, []),
        (None, [TLS_ONLY], SSE, ["public access block"]),
        ({**ALL_BLOCKED, "RestrictPublicBuckets": False}, [TLS_ONLY], SSE, ["public access block"]),
        (ALL_BLOCKED, None, SSE, ["without TLS"]),
        (ALL_BLOCKED, [{**TLS_ONLY, "Effect": "Allow"}], SSE, ["without TLS"]),
        (ALL_BLOCKED, [{**TLS_ONLY, "Action": "s3:GetObject"}], SSE, ["without TLS"]),
        (
            ALL_BLOCKED,
            [{**TLS_ONLY, "Condition": {"Bool": {"aws:SecureTransport": "true"}}}],
            SSE,
            ["without TLS"],
        ),
        (ALL_BLOCKED, [TLS_ONLY], None, ["no default encryption"]),
        (None, None, None, ["public access block", "without TLS", "no default encryption"]),
    ],
)
def test_bucket_check_names_every_unsafe_setting(
    pab: dict | None, statements: list | None, encryption: dict | None, problems: list[str]
) -> None:
    policy = None if statements is None else {"Version": "2012-10-17", "Statement": statements}
    found = bucket_check.check_bucket("b", FakeS3(pab, policy, encryption))
    assert len(found) == len(problems)
    for text, expected in zip(found, problems, strict=True):
        assert expected in text


@pytest.fixture
def response_url() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local server that records the PUT bodies CloudFormation would receive."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/response", received
    server.shutdown()


def _event(url: str, request_type: str = "Create") -> dict[str, Any]:
    return {
        "RequestType": request_type,
        "ResponseURL": url,
        "StackId": "arn:aws:cloudformation:us-east-2:1:stack/s/1",
        "RequestId": "r1",
        "LogicalResourceId": "Check",
        "ResourceProperties": {"Bucket": "team-bucket"},
    }


def test_bucket_check_handler_fails_the_deploy_with_one_line_naming_the_field(response_url: Any) -> None:
    url, received = response_url
    bucket_check.handler(_event(url), None, s3=FakeS3(ALL_BLOCKED, None, SSE))
    bucket_check.handler(_event(url), None, s3=FakeS3(ALL_BLOCKED, {"Statement": [TLS_ONLY]}, SSE))
    bucket_check.handler(_event(url, "Delete"), None, s3=FakeS3(None, None, None))
    failed, passed, deleted = received
    assert failed["Status"] == "FAILED" and "\n" not in failed["Reason"]
    assert failed["Reason"].startswith("fsx.s3_path: bucket team-bucket is not safe for checkpoints: ")
    assert "without TLS" in failed["Reason"]
    assert passed["Status"] == "SUCCESS" and deleted["Status"] == "SUCCESS"
    assert {r["PhysicalResourceId"] for r in received} == {"s3-bucket-check-team-bucket"}


def test_bucket_check_reports_an_unreadable_bucket_instead_of_hanging(response_url: Any) -> None:
    url, received = response_url

    class Denied(FakeS3):
        def get_public_access_block(self, Bucket: str) -> dict:
            raise _ClientError("AccessDenied")

    bucket_check.handler(_event(url), None, s3=Denied(ALL_BLOCKED, None, SSE))
    (answer,) = received
    assert answer["Status"] == "FAILED" and "could not be read" in answer["Reason"]


# -- the checkpoint key initializer --------------------------------------------------------------------
@pytest.fixture(scope="module")
def fake_api_tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the fake API server's certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "ca.crt", folder / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class FakeApi:
    """Answers POST /api/v1/namespaces/<ns>/secrets like the API server: 201, then 409 for the same name."""

    def __init__(self, cert: Path, key: Path, token: str) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.requests.append((self.path, self.headers.get("Authorization", "")))
                if self.headers.get("Authorization") != f"Bearer {token}":
                    code = 401
                elif body["metadata"]["name"] in api.secrets:
                    code = 409
                else:
                    api.secrets[body["metadata"]["name"]] = body
                    code = 201
                self.send_response(code)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


def _initializer(service_account: Path, port: int) -> subprocess.CompletedProcess[str]:
    # The script reads the service account folder from its module constant; point it at the scratch one.
    runner = (
        "import runpy, sys; from pathlib import Path;"
        f"g = runpy.run_path({str(SCRIPT)!r});"
        f"g['SERVICE_ACCOUNT'] = Path({str(service_account)!r});"
        "g['create_once'].__defaults__ = (g['SERVICE_ACCOUNT'],);"
        "sys.exit(g['main']())"
    )
    env = {
        "PATH": os.environ["PATH"],
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(port),
        "POD_NAMESPACE": "ml-research",
        "SECRET_NAME": CHECKPOINT_KEY_SECRET,
        "SECRET_KEY": CHECKPOINT_KEY_FIELD,
    }
    return subprocess.run(
        [sys.executable, "-c", runner], env=env, text=True, capture_output=True, timeout=60, check=False
    )


def test_initializer_creates_the_key_once_over_tls_and_never_prints_it(
    tmp_path: Path, fake_api_tls: tuple[Path, Path]
) -> None:
    cert, key = fake_api_tls
    service_account = tmp_path / "sa"
    service_account.mkdir()
    shutil.copy(cert, service_account / "ca.crt")
    (service_account / "token").write_text("sa-token\n")
    api = FakeApi(cert, key, "sa-token")
    try:
        first = _initializer(service_account, api.port)
        second = _initializer(service_account, api.port)
    finally:
        api.server.shutdown()
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == f"checkpoint-key: ml-research/{CHECKPOINT_KEY_SECRET} created"
    assert second.returncode == 0 and "exists (kept as is)" in second.stdout
    assert [p for p, _ in api.requests] == ["/api/v1/namespaces/ml-research/secrets"] * 2
    secret = api.secrets[CHECKPOINT_KEY_SECRET]
    value = secret["data"][CHECKPOINT_KEY_FIELD]
    key_file = base64.b64decode(value)  # the file the chart mounts: 32 random bytes as hex
    assert len(key_file) == 64 and bytes.fromhex(key_file.decode()) and secret["immutable"] is True
    for out in (first.stdout, first.stderr, second.stdout, second.stderr):
        assert value not in out and "sa-token" not in out


def test_initializer_fails_in_one_line_on_a_refused_token_or_an_untrusted_server(
    tmp_path: Path, fake_api_tls: tuple[Path, Path]
) -> None:
    cert, key = fake_api_tls
    service_account = tmp_path / "sa"
    service_account.mkdir()
    shutil.copy(cert, service_account / "ca.crt")
    (service_account / "token").write_text("wrong-token")
    api = FakeApi(cert, key, "sa-token")
    try:
        refused = _initializer(service_account, api.port)
        # Another CA: the script must not talk to a server it cannot verify.
        other = tmp_path / "other"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=x",
             "-keyout", str(other.with_suffix(".key")), "-out", str(service_account / "ca.crt")],
            check=True, capture_output=True,
        )  # fmt: skip
        untrusted = _initializer(service_account, api.port)
    finally:
        api.server.shutdown()
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert "answered 401" in refused.stderr
    assert untrusted.returncode == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    assert api.secrets == {}

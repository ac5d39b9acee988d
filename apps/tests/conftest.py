"""Fixtures shared by the apps' tests: S3-compatible servers on 127.0.0.1 (moto's ``moto.server``, one process each).

moto's server mode answers the S3 REST API over real HTTP (https://docs.getmoto.org/en/latest/docs/server_mode.html);
subprocesses reach it through the endpoint URL like any S3 endpoint.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "AKIDTESTING",
    "AWS_SECRET_ACCESS_KEY": "test-secret-key",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",  # nothing from the machine running the tests
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
    "AWS_MAX_ATTEMPTS": "2",
}
_buckets = itertools.count()


def _moto_server(log_path, auth_free_requests: int | None = None):
    """``python -m moto.server`` on a free port of 127.0.0.1, in its own process (training in the test process does
    not share the GIL with it); returns (process, endpoint) once it answers."""
    import os
    import socket
    import subprocess
    import sys
    import time

    import requests

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    if auth_free_requests is not None:
        env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(auth_free_requests)
    with open(log_path, "wb") as log:  # the child keeps its copy
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while True:
        try:
            requests.get(endpoint + "/moto-api/", timeout=1).close()  # not an AWS action: not counted
            return server, endpoint
        except requests.ConnectionError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"moto_server did not start:\n{log_path.read_text()[-2000:]}") from None
            time.sleep(0.1)


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    server, endpoint = _moto_server(tmp_path_factory.mktemp("moto") / "moto.log")
    yield endpoint
    server.terminate()
    server.wait(30)


@pytest.fixture
def aws_env(monkeypatch):
    """The test credentials in this process's environment; returns them for subprocesses."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in AWS_TEST_ENV.items():
        monkeypatch.setenv(name, value)
    return dict(AWS_TEST_ENV)


@pytest.fixture
def s3_bucket(moto_endpoint, aws_env):
    """A fresh bucket: ``.name``, ``.client`` (boto3), ``.endpoint``, ``.url(prefix)``; emptied and removed after."""
    import boto3

    client = boto3.client("s3", endpoint_url=moto_endpoint)
    name = f"dinops-test-{next(_buckets)}"
    client.create_bucket(Bucket=name)
    yield SimpleNamespace(
        name=name, client=client, endpoint=moto_endpoint, url=lambda prefix="": f"s3://{name}/{prefix}"
    )
    for entry in client.list_objects_v2(Bucket=name).get("Contents", []):
        client.delete_object(Bucket=name, Key=entry["Key"])
    client.delete_bucket(Bucket=name)
    client.close()


@pytest.fixture(scope="session")
def moto_auth(tmp_path_factory):
    """A second moto server that checks signatures and permissions: its first 3 requests are
    not authenticated (INITIAL_NO_AUTH_ACTION_COUNT, https://docs.getmoto.org/en/latest/docs/iam.html) and create an
    IAM user, its access key and the bucket ``auth-bucket``. Yields ``.endpoint``, ``.key_id``, ``.secret``."""
    import boto3

    server, endpoint = _moto_server(tmp_path_factory.mktemp("moto_auth") / "moto.log", auth_free_requests=3)
    try:
        admin = {"aws_access_key_id": "admin", "aws_secret_access_key": "admin", "region_name": "us-east-1"}
        iam = boto3.client("iam", endpoint_url=endpoint, **admin)
        iam.create_user(UserName="trainer")
        key = iam.create_access_key(UserName="trainer")["AccessKey"]
        boto3.client("s3", endpoint_url=endpoint, **admin).create_bucket(Bucket="auth-bucket")
        yield SimpleNamespace(endpoint=endpoint, key_id=key["AccessKeyId"], secret=key["SecretAccessKey"])
    finally:
        server.terminate()
        server.wait(30)

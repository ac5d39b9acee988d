"""Helpers and fixtures for the cloud tests: one moto server per session, the real playbooks run against it.

moto listens on 127.0.0.1 on a free port. The playbooks get its URL as cloud_aws_endpoint_url and the dynamic
inventory through AWS_URL; credentials are fake and come from the environment only, as they would for a user.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
REGION = "us-east-1"
# Distinct values, so that a test can prove they never reach the output.
ACCESS_KEY = "AKIATESTNOTAREALKEY1"
SECRET_KEY = "secret-that-must-never-be-logged"
# The image cloud_up finds: same name pattern as Canonical's, owned by moto's account.
IMAGE_NAME = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20250610"
MOTO_ACCOUNT = "123456789012"
SSH_CIDR = "203.0.113.7/32"
PLAYBOOK_TIMEOUT_S = 300
RECAP_LINE = re.compile(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$")


@dataclass
class Moto:
    url: str

    def client(self, service: str = "ec2", region: str = REGION):  # type: ignore[no-untyped-def]
        return boto3.client(
            service,
            endpoint_url=self.url,
            region_name=region,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("w")
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("moto_server.py")), "127.0.0.1", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto did not start on {url}") from None
                time.sleep(0.3)
        moto = Moto(url)
        moto.client().register_image(
            Name=IMAGE_NAME,
            RootDeviceName="/dev/sda1",
            BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 8}}],
        )
        yield moto
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


@pytest.fixture(scope="session")
def public_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    key = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key.with_suffix(".pub")


def aws_env(moto: Moto, *, credentials: bool = True) -> dict[str, str]:
    """The environment of a user with (or without) credentials, isolated from this machine's AWS config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "ANSIBLE_"))}
    env.update(
        {
            "AWS_URL": moto.url,
            "AWS_CONFIG_FILE": "/nonexistent/aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
            # No instance metadata service to ask for credentials on a test machine.
            "AWS_EC2_METADATA_DISABLED": "true",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    if credentials:
        env.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY})
    return env


def base_vars(moto: Moto, public_key: Path, deployment: str) -> dict:
    return {
        "cloud_machines_deployment": deployment,
        "cloud_machines_owner": "pytest",
        "cloud_machines_region": REGION,
        "cloud_aws_endpoint_url": moto.url,
        "cloud_aws_image_owner": MOTO_ACCOUNT,
        "cloud_aws_ssh_cidr": SSH_CIDR,
        "cloud_aws_ssh_public_key_file": str(public_key),
        # The instances only exist inside moto: nothing answers SSH.
        "cloud_aws_wait_for_ssh": False,
    }


def run_playbook(
    playbook: str, extra_vars: dict, env: dict[str, str], tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    vars_file = tmp_path / f"vars-{time.monotonic_ns()}.json"
    vars_file.write_text(json.dumps(extra_vars))
    return subprocess.run(
        [
            str(VENV_BIN / "ansible-playbook"),
            "-i",
            "inventories/aws",
            f"playbooks/{playbook}",
            "-e",
            f"@{vars_file}",
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=PLAYBOOK_TIMEOUT_S,
    )


def play_recap(stdout: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP of an ansible-playbook run: host -> {ok, changed, failed, ...}."""
    recap: dict[str, dict[str, int]] = {}
    lines = stdout.split("PLAY RECAP", 1)[1].splitlines()[1:]
    for line in lines:
        match = RECAP_LINE.match(line.strip())
        if not match:
            break
        recap[match.group(1)] = {k: int(v) for k, v in (pair.split("=") for pair in match.group(2).split())}
    return recap


def deployment_instances(moto: Moto, deployment: str, states: tuple[str, ...] = ("pending", "running")) -> list[dict]:
    reservations = moto.client().describe_instances(
        Filters=[
            {"Name": "tag:Deployment", "Values": [deployment]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
    )["Reservations"]
    return [instance for reservation in reservations for instance in reservation["Instances"]]


def tags_of(resource: dict) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in resource.get("Tags", [])}

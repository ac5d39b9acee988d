"""No secret in any output: the workloads role run at -vvv with --diff, secrets in every input that takes one.

Two runs of the real role on this machine (local connection):

- Kubernetes planning (no cluster here): the layer of a host that keeps checkpoints in S3, with credentials, a
  proxy that carries a password and a public client, rendered on the controller.
- The Docker runtime, converged for real on this machine's Docker: the download Job of the demo with the S3
  Secret, a public client's Secret, and a wait that fails at once (workloads_download_timeout 0), so that the
  failed item of the wait is printed as Ansible prints it at default verbosity.

Every secret value must be absent from Ansible's output, the rendered layer, the fact file, the files the role leaves
outside its secret directories, and `docker inspect` of the containers. The proxy's password may sit in the pods'
ConfigMaps and the containers' environment (the proxy is the pods' setting); it must not be printed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dinops_testing import REPO

S3_KEY_ID = "AKIASECRETKEYIDTEST1"
S3_SECRET = "s3cr3t-Value/with+Chars0123456789abcdef"
PROXY_PASSWORD = "pr0xyPassw0rdTest"
CLIENT_PASSWORD = "cl1ent-Passw0rd-Test"
SECRETS = (S3_KEY_ID, S3_SECRET, PROXY_PASSWORD, CLIENT_PASSWORD)
NOT_IN_CONTAINERS = (S3_KEY_ID, S3_SECRET, CLIENT_PASSWORD)
# The Docker runtime's download Job (the demo: synthetic data, made by the train image) and the public client.
CONTAINERS = ("dinops-download", "dinops-client")


def _config(tmp: Path) -> Path:
    # The default callback, as a user sees it (the repository's config adds timing callbacks).
    config = tmp / "ansible.cfg"
    config.write_text(f"[defaults]\nroles_path = {REPO / 'roles'}\nstdout_callback = ansible.builtin.default\n")
    return config


def _play(tmp: Path, variables: dict) -> Path:
    play = [
        {
            "name": "The workloads with secrets in every input",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {
                "ansible_python_interpreter": sys.executable,
                "workloads_build_dir": str(tmp / "build"),
                "workloads_images_file": str(tmp / "images.json"),
                "workloads_fact_file": str(tmp / "facts.d" / "dinops_workloads.fact"),
                "workloads_s3_output": "s3://dinops-runs/secret-test",
                "workloads_s3_endpoint": "http://127.0.0.1:9",
                "workloads_s3_access_key_id": S3_KEY_ID,
                "workloads_s3_secret_access_key": S3_SECRET,
                "workloads_client_password": CLIENT_PASSWORD,
                "workloads_client_password_file": str(tmp / "etc" / "client-password"),
                "workloads_client_tls_dir": str(tmp / "etc" / "tls"),
                "dinops_publish_address": "0.0.0.0",
                "proxy_env": {"https_proxy": f"http://user:{PROXY_PASSWORD}@proxy.invalid:3128", "no_proxy": "x"},
                **variables,
            },
            "roles": ["workloads"],
            "post_tasks": [
                {
                    "name": "Keep the objects the role would apply",
                    "ansible.builtin.copy": {
                        "content": "{{ __workloads_objects | to_nice_json }}",
                        "dest": str(tmp / "objects.json"),
                        "mode": "0644",
                    },
                    "no_log": True,
                }
            ],
        }
    ]
    path = tmp / "play.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


def _run(tmp: Path, variables: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(_config(tmp)), "ANSIBLE_FORCE_COLOR": "0"}
    bin_dir = Path(sys.executable).parent
    return subprocess.run(
        [str(bin_dir / "ansible-playbook"), "-i", "localhost,", "-vvv", "--diff", str(_play(tmp, variables))],
        capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=600,
    )  # fmt: skip


def _leaks(text: str, secrets=SECRETS) -> list[str]:
    return [s for s in secrets if s in text]


def _output_leaks(output: str) -> list[str]:
    """Secrets in Ansible's output. The proxy's password is allowed on one kind of line only: at -vvv the connection
    prints each command with the task's `environment:` (`<host> EXEC /bin/sh -c 'https_proxy=... python ...'`),
    whatever no_log says; every role that passes proxy_env does so (docs/security.md, known limits)."""
    leaks = _leaks(output, (S3_KEY_ID, S3_SECRET, CLIENT_PASSWORD))
    others = "\n".join(line for line in output.splitlines() if not line.startswith("<localhost> EXEC "))
    return leaks + _leaks(others, (PROXY_PASSWORD,))


def _files_outside_secrets(root: Path) -> str:
    """The text of every file the role wrote under root (the layer, the fact file, the volumes), except the secret
    stores it keeps on purpose (checked apart) and the play, which is the inventory that gives the values."""
    texts = []
    for path in sorted(root.rglob("*")):
        stores = ".secrets" in path.parts or path.parent.name in ("etc", "tls")
        if path.is_file() and not stores and path.name != "play.yml":
            texts.append(f"--- {path}\n{path.read_text(errors='replace')}")
    return "\n".join(texts)


def test_kubernetes_planning_prints_no_secret(tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not on PATH; the role renders with `kubectl kustomize`")
    result = _run(
        tmp_path,
        {
            "ansible_local": {"dinops": {"gpu_count": 0}},
            "dinops_cluster": "k3s",
            "workloads_cluster_enabled": False,
            "workloads_kustomize_command": [kubectl, "kustomize"],
            "gpu_profile": {"host_vcpus": 8, "host_memory_gb": 32, "gpu_count": 0},
        },
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert _output_leaks(output) == [], "secret values in Ansible's output"
    layer = (tmp_path / "build" / "kustomization.yaml").read_text()
    assert _leaks(layer, NOT_IN_CONTAINERS) == [], "secret values in the generated layer"
    objects = (tmp_path / "objects.json").read_text()
    assert _leaks(objects, NOT_IN_CONTAINERS) == [], "secret values in the objects to apply"
    # The credentials reach the pods as files, the public client its login and TLS (k8s/components).
    parsed = json.loads(objects)
    files = next(o for o in parsed if o["metadata"]["name"] == "dinops-s3-credentials-file")
    assert files["data"] == {"AWS_SHARED_CREDENTIALS_FILE": "/run/secrets/dinops-s3/credentials"}
    client = next(o for o in parsed if o["kind"] == "Deployment" and o["metadata"]["name"] == "dinops-client")
    volumes = client["spec"]["template"]["spec"]["volumes"]
    assert {"name": "client-auth", "secret": {"secretName": "dinops-client-auth", "defaultMode": 0o440}} in volumes


def _runtime_containers(docker: str) -> list[str]:
    """The names of the containers of the Docker runtime on this machine (the label the role puts on each)."""
    return subprocess.run(
        [docker, "ps", "-a", "--filter", "label=dinops.io/runtime=docker", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip


@pytest.fixture
def docker_converge(tmp_path):
    """The Docker runtime converged with secrets; the containers and the network it made are removed after."""
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True, check=False).returncode != 0:
        pytest.fail("this test needs a running Docker daemon (docker info failed)")
    # The role removes dinops containers of the Docker runtime that the plan does not run: never someone else's.
    others = _runtime_containers(docker)
    if others:
        pytest.fail(f"containers of the Docker runtime exist already ({others}); this test would replace them")
    network = f"dinops-secret-test-{os.getpid()}"
    # The demo's dataset step can never complete: where `dinops synth` writes its dataset there is a file it may not
    # replace, so the download's wait fails whatever the machine's load (a quick download and a healthy client would
    # otherwise let the play pass, and the failed wait's output would go untested).
    dataset = tmp_path / "volumes" / "dinops-dataset"
    dataset.mkdir(parents=True)
    (dataset / "coco").write_text("not a directory\n")
    (dataset / "coco").chmod(0o444)
    try:
        result = _run(
            tmp_path,
            {
                "ansible_python_interpreter": sys.executable,
                "ansible_local": {"dinops": {"gpu_count": 0}},
                "dinops_cluster": "docker",
                "dinops_demo": True,
                "gpu_profile": {
                    "host_vcpus": 2,
                    "host_memory_gb": 8,
                    "gpu_count": 0,
                    "workloads": ["download", "client"],
                },
                "workloads_python_venv": str(Path(sys.executable).parent.parent),
                "workloads_docker_data_dir": str(tmp_path / "volumes"),
                "workloads_docker_network": network,
                "workloads_docker_client_port": 30999,
                # Waits that fail at once: the download cannot complete (above).
                "workloads_download_timeout": 0,
                "workloads_rollout_timeout": 0,
            },
        )
        made = _runtime_containers(docker)
        assert set(CONTAINERS) <= set(made), f"the play made {made}, not {CONTAINERS}"
        inspect = subprocess.run([docker, "inspect", *made], capture_output=True, text=True, check=False)
        yield tmp_path, result, inspect
    finally:
        # Every container the runtime made (Prometheus too: workloads_monitoring is on by default), none other
        # existed before (checked above).
        made = _runtime_containers(docker)
        if made:
            subprocess.run([docker, "rm", "-f", "-v", *made], capture_output=True, check=False)
        subprocess.run([docker, "network", "rm", network], capture_output=True, check=False)


def test_docker_runtime_prints_and_exposes_no_secret(docker_converge):
    tmp, result, inspect = docker_converge
    output = result.stdout + result.stderr
    assert result.returncode != 0, "the waits with timeouts of 0 s should have failed"
    # It failed where it should: the dataset Job's wait, with the container's state (no secret is in the tail).
    failed_wait = re.search(r"dinops-download (is running|is restarting|failed|exited)", output)
    assert failed_wait, output[-3000:] if not _output_leaks(output) else "(leaks)"
    assert inspect.returncode == 0, inspect.stderr
    assert _output_leaks(output) == [], "secret values in Ansible's output"
    # The proxy is the containers' setting (https_proxy in their environment, as on a cluster in their ConfigMap):
    # not printed, but there; the credentials are not.
    assert _leaks(inspect.stdout, NOT_IN_CONTAINERS) == [], "secret values in docker inspect"
    assert _leaks(_files_outside_secrets(tmp), NOT_IN_CONTAINERS) == [], "secret values in the layer or fact files"
    containers = {c["Name"].lstrip("/"): c for c in json.loads(inspect.stdout)}
    download, client = containers["dinops-download"], containers["dinops-client"]
    env = dict(item.split("=", 1) for item in download["Config"]["Env"])
    assert env.get("AWS_SHARED_CREDENTIALS_FILE") == "/run/secrets/dinops-s3/credentials"
    mounts = {m["Destination"]: m for m in download["Mounts"]}
    assert mounts["/run/secrets/dinops-s3"]["RW"] is False
    # The credentials file: readable by the container's user only, with the values the inventory gave.
    store = Path(mounts["/run/secrets/dinops-s3"]["Source"])
    assert oct(store.stat().st_mode & 0o777) == "0o500"
    credentials = store / "credentials"
    assert (credentials.stat().st_uid, oct(credentials.stat().st_mode & 0o777)) == (10001, "0o400")
    assert S3_SECRET in credentials.read_text()
    # The public client: its login and TLS as files, published where dinops_publish_address says.
    client_env = dict(item.split("=", 1) for item in client["Config"]["Env"])
    assert client_env["CLIENT_PUBLIC"] == "true"
    assert client_env["CLIENT_PASSWORD_FILE"] == "/run/secrets/dinops-client/password"
    auth = Path({m["Destination"]: m for m in client["Mounts"]}["/run/secrets/dinops-client"]["Source"])
    assert sorted(p.name for p in auth.iterdir()) == ["password", "tls.crt", "tls.key"]
    assert (auth / "password").read_text() == CLIENT_PASSWORD
    assert client["HostConfig"]["PortBindings"] == {"8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": "30999"}]}

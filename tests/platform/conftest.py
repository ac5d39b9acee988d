"""Fixtures of the platform role's tests: its filter plugins, its pinned releases, and a bundle directory of
synthetic manifests shaped like the upstream ones (kustomize output and release assets: CRDs, Namespaces,
Deployments with images, Katib's katib-mysql claim and katib-config, webhook configurations, Trainer's
ClusterTrainingRuntimes, KServe's inferenceservice-config), at the pinned versions.

The shapes follow the real manifests of the pinned releases (kubeflow/trainer@v2.3.0 manifests/overlays/manager and
runtimes, kubeflow/katib@v0.19.0 manifests/v1beta1/installs/katib-standalone, kubeflow/trainer@v1.9.4
manifests/overlays/standalone, kserve/kserve@v0.20.0 config/overlays/all, cert-manager v1.17.0's chart), cut down to
what the role reads.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import dinops_testing

REPO = dinops_testing.REPO


def _plugin(name: str):
    return dinops_testing.load_plugin(f"roles/platform/filter_plugins/{name}.py")


@pytest.fixture(scope="session")
def images_plugin():
    return _plugin("platform_images")


@pytest.fixture(scope="session")
def bundle_plugin():
    return _plugin("platform_bundle")


@pytest.fixture(scope="session")
def render_plugin():
    return _plugin("platform_render")


@pytest.fixture(scope="session")
def cluster_plugin():
    return _plugin("platform_cluster")


@pytest.fixture(scope="session")
def releases() -> dict:
    return yaml.safe_load((REPO / "roles/platform/vars/main.yml").read_text())["platform_releases"]


def crd(name: str, version: str) -> dict:
    plural, group = name.split(".", 1)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "annotations": {"controller-gen.kubebuilder.io/version": "v0.18.0"}},
        "spec": {
            "group": group,
            "names": {"kind": plural.capitalize()[:-1], "plural": plural},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"image": {"type": "string"}}}},
                }
            ],
        },
    }


def deployment(name: str, namespace: str, containers: list[dict], volumes: list | None = None) -> dict:
    labels = {"app.kubernetes.io/name": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": containers, **({"volumes": volumes} if volumes else {})},
            },
        },
    }


def namespace(name: str, labels: dict | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, **({"labels": labels} if labels else {})},
    }


def webhook(kind: str, name: str, service_namespace: str, annotations: dict | None = None) -> dict:
    metadata = {"name": name, **({"annotations": annotations} if annotations else {})}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "webhooks": [
            {
                "name": f"validator.{name}",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {"service": {"name": "webhook", "namespace": service_namespace, "path": "/validate"}},
                "rules": [{"apiGroups": ["x"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["y"]}],
            }
        ],
    }


def runtime(name: str, image: str) -> dict:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/webhook-validation": "disabled"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "spec": {"template": {"spec": {"containers": [{"name": "node", "image": image}]}}}
                            },
                        }
                    ]
                }
            },
        },
    }


KATIB_CONFIG = """apiVersion: config.kubeflow.org/v1beta1
kind: KatibConfig
init:
  certGenerator:
    enable: true
  controller:
    webhookPort: 8443
runtime:
  metricsCollectors:
    - kind: StdOut
      image: ghcr.io/kubeflow/katib/file-metrics-collector:v0.19.0
  suggestions:
    - algorithmName: random
      image: ghcr.io/kubeflow/katib/suggestion-hyperopt:v0.19.0
  earlyStoppings:
    - algorithmName: medianstop
      image: ghcr.io/kubeflow/katib/earlystopping-medianstop:v0.19.0
"""

KSERVE_CONFIG = {
    "_example": '# This block is not actually functional configuration\n#   "image" : "kserve/agent:latest"\n',
    "agent": '{\n    "image" : "kserve/agent:v0.20.0",\n    "memoryRequest": "100Mi"\n}',
    "deploy": '{\n  "defaultDeploymentMode": "Serverless"\n}',
    "explainers": (
        '{\n    "art": {\n        "image" : "kserve/art-explainer",\n        "defaultImageVersion": "latest"\n    }\n}'
    ),
    "ingress": (
        '{\n    "enableGatewayApi": false,\n    "ingressClassName" : "istio",\n'
        '    "domainTemplate": "{{ .Name }}-{{ .Namespace }}.{{ .IngressDomain }}",\n'
        '    "disableIngressCreation": false\n}'
    ),
    "storageInitializer": '{\n    "image" : "kserve/storage-initializer:v0.20.0",\n    "cpuLimit": "1"\n}',
}


def upstream_manifests() -> dict[str, dict[str, list[dict]]]:
    """{component: {file: [objects]}} as the pinned releases' bundle files hold them (in their shapes)."""
    return {
        "cert_manager": {
            "cert-manager.yaml": [
                namespace("cert-manager"),
                crd("certificates.cert-manager.io", "v1"),
                crd("issuers.cert-manager.io", "v1"),
                deployment(
                    "cert-manager",
                    "cert-manager",
                    [
                        {
                            "name": "cert-manager-controller",
                            "image": "quay.io/jetstack/cert-manager-controller:v1.17.0",
                            "args": [
                                "--v=2",
                                "--acme-http01-solver-image=quay.io/jetstack/cert-manager-acmesolver:v1.17.0",
                            ],
                        }
                    ],
                ),
                deployment(
                    "cert-manager-webhook",
                    "cert-manager",
                    [{"name": "cert-manager-webhook", "image": "quay.io/jetstack/cert-manager-webhook:v1.17.0"}],
                ),
                deployment(
                    "cert-manager-cainjector",
                    "cert-manager",
                    [{"name": "cert-manager-cainjector", "image": "quay.io/jetstack/cert-manager-cainjector:v1.17.0"}],
                ),
                webhook("ValidatingWebhookConfiguration", "cert-manager-webhook", "cert-manager"),
                # The chart's leader election Role lives in kube-system (values.yaml global.leaderElection).
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "cert-manager:leaderelection", "namespace": "kube-system"},
                    "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}],
                },
            ]
        },
        "trainer": {
            "manager.yaml": [
                namespace("kubeflow-system"),
                crd("clustertrainingruntimes.trainer.kubeflow.org", "v1alpha1"),
                crd("jobsets.jobset.x-k8s.io", "v1alpha2"),
                crd("trainingruntimes.trainer.kubeflow.org", "v1alpha1"),
                crd("trainjobs.trainer.kubeflow.org", "v1alpha1"),
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": "kubeflow-trainer-controller-manager", "namespace": "kubeflow-system"},
                },
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": "kubeflow-trainer-webhook-cert", "namespace": "kubeflow-system"},
                },
                deployment(
                    "jobset-controller-manager",
                    "kubeflow-system",
                    [
                        {
                            "name": "manager",
                            "image": "registry.k8s.io/jobset/jobset:v0.12.0",
                            # kubernetes-sigs/jobset@v0.12.0:config/components/manager/manager.yaml
                            "resources": {"requests": {"cpu": "500m", "memory": "128Mi"}, "limits": {"memory": "4Gi"}},
                        }
                    ],
                ),
                deployment(
                    "kubeflow-trainer-controller-manager",
                    "kubeflow-system",
                    [{"name": "manager", "image": "ghcr.io/kubeflow/trainer/trainer-controller-manager:v2.3.0"}],
                ),
                webhook("ValidatingWebhookConfiguration", "validator.trainer.kubeflow.org", "kubeflow-system"),
            ],
            "runtimes.yaml": [
                runtime("deepspeed-distributed", "ghcr.io/kubeflow/trainer/deepspeed-runtime:v2.3.0"),
                runtime("torch-distributed", "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"),
            ],
        },
        "katib": {
            "katib-standalone.yaml": [
                namespace("kubeflow", {"katib.kubeflow.org/metrics-collector-injection": "enabled"}),
                crd("experiments.kubeflow.org", "v1beta1"),
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "katib-config", "namespace": "kubeflow"},
                    "data": {"katib-config.yaml": KATIB_CONFIG},
                },
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "katib-mysql", "namespace": "kubeflow"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
                },
                deployment(
                    "katib-controller",
                    "kubeflow",
                    [{"name": "katib-controller", "image": "ghcr.io/kubeflow/katib/katib-controller:v0.19.0"}],
                ),
                deployment(
                    "katib-mysql",
                    "kubeflow",
                    [{"name": "katib-mysql", "image": "mysql:8.0.29", "args": ["--datadir", "/var/lib/mysql/datadir"]}],
                    [{"name": "katib-mysql", "persistentVolumeClaim": {"claimName": "katib-mysql"}}],
                ),
                webhook("MutatingWebhookConfiguration", "katib.kubeflow.org", "kubeflow"),
            ]
        },
        "training_operator": {
            "standalone.yaml": [
                namespace("kubeflow"),
                crd("pytorchjobs.kubeflow.org", "v1"),
                deployment(
                    "training-operator",
                    "kubeflow",
                    [
                        {
                            "name": "training-operator",
                            "image": "ghcr.io/kubeflow/training-v1/training-operator:v1-93c5489",
                            "command": ["/manager"],
                            "volumeMounts": [{"name": "cert", "mountPath": "/tmp/k8s-webhook-server/serving-certs"}],
                        }
                    ],
                    [{"name": "cert", "secret": {"secretName": "training-operator-webhook-cert"}}],
                ),
            ]
        },
        "kserve": {
            "kserve.yaml": [
                crd("inferenceservices.serving.kserve.io", "v1beta1"),
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "inferenceservice-config", "namespace": "kserve"},
                    "data": dict(KSERVE_CONFIG),
                },
                deployment(
                    "kserve-controller-manager",
                    "kserve",
                    [
                        {
                            "name": "manager",
                            "image": "kserve/kserve-controller:v0.20.0",
                            # kserve/kserve@v0.20.0:config/manager/manager.yaml
                            "resources": {
                                "requests": {"cpu": "100m", "memory": "200Mi"},
                                "limits": {"cpu": "100m", "memory": "300Mi"},
                            },
                        },
                        {"name": "kube-rbac-proxy", "image": "quay.io/brancz/kube-rbac-proxy:v0.18.0"},
                    ],
                ),
                {
                    "apiVersion": "cert-manager.io/v1",
                    "kind": "Issuer",
                    "metadata": {"name": "selfsigned-issuer", "namespace": "kserve"},
                    "spec": {"selfSigned": {}},
                },
                webhook(
                    "ValidatingWebhookConfiguration",
                    "inferenceservice.serving.kserve.io",
                    "kserve",
                    {"cert-manager.io/inject-ca-from": "kserve/serving-cert"},
                ),
            ]
        },
    }


def write_bundle(root: Path, releases: dict, manifests: dict | None = None, manifest_json: bool = True) -> Path:
    """The bundle directory: one file per pinned source, as YAML streams, and its bundle.json (written from the
    files, as playbooks/platform_bundle.yml writes it)."""
    manifests = copy.deepcopy(manifests or upstream_manifests())
    root.mkdir(parents=True, exist_ok=True)
    files = []
    for component, by_file in manifests.items():
        (root / component).mkdir(exist_ok=True)
        release = releases[component]
        for name, objects in by_file.items():
            path = root / component / name
            path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
            source = next(s for s in release["sources"] if s["file"] == name)
            files.append(
                {
                    "component": component,
                    "version": release["version"],
                    "bundled": release.get("bundled") or {},
                    "source": source.get("kustomize") or source.get("url"),
                    "path": f"{component}/{name}",
                    "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                }
            )
    if manifest_json:
        (root / "bundle.json").write_text(json.dumps({"format": 1, "files": files}, indent=2))
    return root


@pytest.fixture
def bundle_dir(tmp_path, releases) -> Path:
    return write_bundle(tmp_path / "bundle", releases)


def load_stream(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def run_playbook(tmp: Path, play: list | None = None, extra: dict | None = None, playbook: Path | None = None):
    """ansible-playbook on localhost with an ansible.cfg of its own (the repository's roles, the json callback);
    ``play`` is written to tmp/play.yml, or ``playbook`` (a repository playbook) runs with ``extra`` as -e."""
    config = tmp / "ansible.cfg"
    config.write_text(f"[defaults]\nroles_path = {REPO / 'roles'}\nstdout_callback = ansible.builtin.json\n")
    if playbook is None:
        playbook = tmp / "play.yml"
        playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    extra_file = tmp / "extra.json"
    extra_file.write_text(json.dumps({"ansible_python_interpreter": sys.executable, **(extra or {})}))
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook),
         "-e", f"@{extra_file}"],
        capture_output=True, text=True, check=False, timeout=300, cwd=REPO,
        env={**os.environ, "ANSIBLE_CONFIG": str(config)},
    )  # fmt: skip


def failure_messages(result: subprocess.CompletedProcess) -> str:
    """The msg of every failed task (json callback), joined: what the user reads."""
    report = json.loads(result.stdout)
    messages = []
    for play in report["plays"]:
        for task in play["tasks"]:
            for host in task["hosts"].values():
                if host.get("failed"):
                    messages.append(str(host.get("msg", "")))
                for item in host.get("results") or []:
                    if isinstance(item, dict) and item.get("failed"):
                        messages.append(str(item.get("msg", "")))
    return "\n".join(messages)


class Helpers:
    """What the test modules use besides the plugins (conftest functions are not importable by name)."""

    upstream_manifests = staticmethod(upstream_manifests)
    write_bundle = staticmethod(write_bundle)
    load_stream = staticmethod(load_stream)
    run_playbook = staticmethod(run_playbook)
    changed_tasks = staticmethod(dinops_testing.changed_tasks)
    failure_messages = staticmethod(failure_messages)
    deployment = staticmethod(deployment)


@pytest.fixture(scope="session")
def helpers() -> type[Helpers]:
    return Helpers

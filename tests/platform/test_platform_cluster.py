"""What the role reads from the cluster: the wait report (from `kubectl get deploy,statefulset,daemonset,pod,pvc
-o json`), the CRD check of an existing Kubeflow, the version check, and the objects `kubectl diff` found
different (from the real output of `diff -q -N` on directories named as kubectl names them)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest


def deployment(name: str, ready: bool, **status) -> dict:
    labels = {"katib.kubeflow.org/component": name}
    base = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1}
    base.update({"readyReplicas": 1, "availableReplicas": 1} if ready else {"unavailableReplicas": 1})
    base.update(status)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "kubeflow", "generation": 1, "uid": f"uid-{name}"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}}},
        "status": base,
    }


def pod(name: str, component: str, phase: str = "Running", conditions=(), statuses=(), claim: str = "") -> dict:
    spec = {"containers": [{"name": component, "image": f"ghcr.io/kubeflow/katib/{component}:v0.19.0"}]}
    if claim:
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "kubeflow", "labels": {"katib.kubeflow.org/component": component}},
        "spec": spec,
        "status": {"phase": phase, "conditions": list(conditions), "containerStatuses": list(statuses)},
    }


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "lastProbeTime": None,
    "lastTransitionTime": "2026-11-24T09:00:00Z",
    "message": "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes are "
    "available: 1 Preemption is not helpful for scheduling.",
}
PULL = {
    "name": "katib-ui",
    "image": "registry.local:5000/mirror/kubeflow/katib/katib-ui:v0.19.0",
    "imageID": "",
    "ready": False,
    "restartCount": 0,
    "started": False,
    "state": {
        "waiting": {
            "reason": "ImagePullBackOff",
            "message": 'Back-off pulling image "registry.local:5000/mirror/kubeflow/katib/katib-ui:v0.19.0"',
        }
    },
}
CRASH = {
    "name": "katib-db-manager",
    "image": "ghcr.io/kubeflow/katib/katib-db-manager:v0.19.0",
    "ready": False,
    "restartCount": 4,
    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s restarting failed container"}},
    "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
}


def kubectl_list(*items) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items), "metadata": {"resourceVersion": ""}})


def test_available_operators_are_ready(cluster_plugin):
    report = cluster_plugin.wait_report(
        kubectl_list(deployment("katib-controller", True), pod("katib-controller-5b9f-abcde", "katib-controller")),
        "kubeflow",
    )
    assert report == {"ready": True, "not_ready": [], "message": "every operator in kubeflow is available"}


def test_the_report_names_each_unavailable_operator_with_its_pods_reasons(cluster_plugin):
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "katib-mysql", "namespace": "kubeflow"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
        "status": {"phase": "Pending"},
    }
    listing = kubectl_list(
        deployment("katib-controller", True),
        deployment("katib-mysql", False),
        deployment("katib-ui", False),
        deployment("katib-db-manager", False),
        pod("katib-controller-5b9f-abcde", "katib-controller"),
        pod("katib-mysql-6c7f-x2x4q", "katib-mysql", "Pending", [UNSCHEDULABLE], claim="katib-mysql"),
        pod("katib-ui-7d8b-qwert", "katib-ui", "Pending", statuses=[PULL]),
        pod("katib-db-manager-5c6d-zxcvb", "katib-db-manager", statuses=[CRASH]),
        pvc,
    )
    report = cluster_plugin.wait_report(listing, "kubeflow")
    assert report["ready"] is False
    assert report["not_ready"] == ["Deployment katib-mysql", "Deployment katib-ui", "Deployment katib-db-manager"]
    lines = report["message"].split("\n")
    assert lines[0] == (
        "Deployment katib-mysql in kubeflow: 0 of 1 available; pod katib-mysql-6c7f-x2x4q Pending, not scheduled: "
        "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes are "
        "available: 1 Preemption is not helpful for scheduling.; PersistentVolumeClaim katib-mysql is Pending "
        "(storage class: the cluster's default class): no volume is bound; check the class exists and provisions "
        "(kubectl get storageclass), or set platform_katib_storage_class"
    )
    assert lines[1] == (
        "Deployment katib-ui in kubeflow: 0 of 1 available; pod katib-ui-7d8b-qwert container katib-ui cannot pull "
        "image registry.local:5000/mirror/kubeflow/katib/katib-ui:v0.19.0 (ImagePullBackOff: Back-off pulling image "
        '"registry.local:5000/mirror/kubeflow/katib/katib-ui:v0.19.0")'
    )
    assert lines[2] == (
        "Deployment katib-db-manager in kubeflow: 0 of 1 available; pod katib-db-manager-5c6d-zxcvb container "
        "katib-db-manager keeps crashing (4 restarts, last exit 1 Error)"
    )


def test_pods_rejected_at_admission_are_reported_from_the_deployment(cluster_plugin):
    failure = {
        "type": "ReplicaFailure",
        "status": "True",
        "reason": "FailedCreate",
        "message": 'pods "training-operator-6d4-" is forbidden: violates PodSecurity "restricted:latest"',
    }
    report = cluster_plugin.wait_report(kubectl_list(deployment("training-operator", False, conditions=[failure])))
    assert report["message"] == (
        'Deployment training-operator: 0 of 1 available; cannot create pods: pods "training-operator-6d4-" is '
        'forbidden: violates PodSecurity "restricted:latest"'
    )


def test_statefulsets_daemonsets_and_rollouts_in_progress(cluster_plugin):
    statefulset = {
        "kind": "StatefulSet",
        "metadata": {"name": "db", "generation": 2},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "db"}}},
        "status": {"observedGeneration": 2, "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1},
    }
    running = pod("db-0", "db", statuses=[{"name": "db", "ready": False, "state": {"running": {}}}])
    running["metadata"]["labels"] = {"app": "db"}
    # A DaemonSet for labelled nodes only (KServe's localmodelnode agent): nothing to schedule is available.
    daemonset = {
        "kind": "DaemonSet",
        "metadata": {"name": "kserve-localmodelnode-agent", "generation": 1},
        "spec": {"selector": {"matchLabels": {"a": "b"}}},
        "status": {
            "observedGeneration": 1,
            "desiredNumberScheduled": 0,
            "numberAvailable": 0,
            "updatedNumberScheduled": 0,
        },
    }
    stale = deployment("katib-ui", True)
    stale["metadata"]["generation"] = 3
    report = cluster_plugin.wait_report(kubectl_list(statefulset, running, daemonset, stale))
    assert report["not_ready"] == ["StatefulSet db", "Deployment katib-ui"]
    assert "pod db-0 container db running, not ready yet" in report["message"]
    assert "Deployment katib-ui: 1 of 1 available; no pod yet" in report["message"]


def test_a_failed_kubectl_call_is_not_ready_with_its_error(cluster_plugin):
    failed = {"rc": 1, "stdout": "", "stderr": "The connection to the server 127.0.0.1:6443 was refused"}
    assert cluster_plugin.wait_report(failed, "kubeflow") == {
        "ready": False,
        "not_ready": [],
        "message": "kubectl failed (exit 1): The connection to the server 127.0.0.1:6443 was refused",
    }
    assert cluster_plugin.wait_report(kubectl_list(), "kserve")["message"] == (
        "no Deployment, StatefulSet or DaemonSet in kserve yet"
    )


def crd(name: str, versions: dict[str, bool], established: bool = True) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {"versions": [{"name": v, "served": served, "storage": served} for v, served in versions.items()]},
        "status": {
            "conditions": [
                {"type": "NamesAccepted", "status": "True"},
                {"type": "Established", "status": str(established)},
            ]
        },
    }


def test_an_existing_kubeflow_must_serve_the_crds_at_the_expected_versions(cluster_plugin, releases):
    wanted = {
        name: version
        for component in ("trainer", "katib", "kserve")
        for name, version in releases[component]["crds"].items()
    }
    listing = json.dumps(
        {
            "kind": "List",
            "items": [
                crd("trainjobs.trainer.kubeflow.org", {"v1alpha1": True}),
                crd("clustertrainingruntimes.trainer.kubeflow.org", {"v1alpha1": True}),
                crd("trainingruntimes.trainer.kubeflow.org", {"v1alpha1": True}),
                crd("jobsets.jobset.x-k8s.io", {"v1alpha2": True}),
                crd("experiments.kubeflow.org", {"v1alpha3": True, "v1beta1": False}),
                crd("trials.kubeflow.org", {"v1beta1": True}, established=False),
                crd("suggestions.kubeflow.org", {"v1beta1": True}),
            ],
        }
    )
    assert cluster_plugin.crd_problems(listing, wanted) == [
        "experiments.kubeflow.org does not serve v1beta1 (it serves v1alpha3)",
        "inferenceservices.serving.kserve.io is not installed",
        "trials.kubeflow.org is not Established",
    ]


@pytest.mark.parametrize(
    ("server", "too_old"), [("v1.33.1", []), ("v1.30.14+k3s1", ["trainer"]), ("v1.26.0", ["trainer", "katib"])]
)
def test_the_cluster_must_be_new_enough_for_each_component(cluster_plugin, releases, server, too_old):
    version = {
        "clientVersion": {"major": "1", "minor": "33", "gitVersion": "v1.33.1"},
        "kustomizeVersion": "v5.6.0",
        "serverVersion": {"major": "1", "minor": server.split(".")[1], "gitVersion": server},
    }
    result = {"rc": 0, "stdout": json.dumps(version), "stderr": ""}
    problems = cluster_plugin.version_problems(result, releases, ["trainer", "katib"])
    assert [p.split()[0] for p in problems] == too_old
    if too_old:
        assert problems[0] == f"trainer v2.3.0 needs Kubernetes >= 1.31, the cluster runs {server}"
    with pytest.raises(cluster_plugin.ClusterError, match="no serverVersion"):
        cluster_plugin.version_problems(json.dumps({"clientVersion": {}}), releases, ["trainer"])


@pytest.mark.skipif(shutil.which("diff") is None, reason="needs diff (diffutils), as kubectl diff does")
def test_the_objects_kubectl_diff_found_different_are_named(cluster_plugin, tmp_path):
    """kubectl diff writes LIVE-* and MERGED-* directories with one file per object, named
    <group.>version.Kind.namespace.name, and runs KUBECTL_EXTERNAL_DIFF with the two directories first, then its
    flags (pkg/cmd/diff/diff.go getCommand); this runs the real `diff` the same way."""
    live, merged = tmp_path / "LIVE-1234", tmp_path / "MERGED-5678"
    live.mkdir()
    merged.mkdir()
    same = "apps.v1.Deployment.kubeflow.katib-controller"
    changed = "v1.ConfigMap.kubeflow.katib-config"
    created = "apiextensions.k8s.io.v1.CustomResourceDefinition..experiments.kubeflow.org"
    (live / same).write_text("a: 1\n")
    (merged / same).write_text("a: 1\n")
    (live / changed).write_text("a: 1\n")
    (merged / changed).write_text("a: 2\n")
    (merged / created).write_text("a: 1\n")
    result = subprocess.run(["diff", str(live), str(merged), "-q", "-N"], capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert sorted(cluster_plugin.diff_objects(result.stdout)) == [
        "ConfigMap kubeflow/katib-config",
        "CustomResourceDefinition experiments.kubeflow.org",
    ]
    assert cluster_plugin.diff_objects("") == []


def test_only_the_components_own_workloads_count_and_each_must_exist(cluster_plugin):
    # kube-system's own Deployment is down: not ours (cert-manager only keeps a Role there).
    listing = kubectl_list(deployment("coredns", False), deployment("katib-controller", True))
    assert cluster_plugin.wait_report(listing, "kube-system", ["Deployment katib-controller"])["ready"] is True
    report = cluster_plugin.wait_report(listing, "kubeflow", ["Deployment katib-controller", "Deployment katib-ui"])
    assert report == {
        "ready": False,
        "not_ready": ["Deployment katib-ui"],
        "message": "Deployment katib-ui in kubeflow: not created yet",
    }

"""The layer the workloads role generates from a host's GPU profile, rendered on top of each overlay."""

from __future__ import annotations

import pytest
from k8s.k8s_render import (
    GPU,
    PROFILE_VARIANTS,
    SITE_VARIANTS,
    container_env,
    find,
    load_workloads_filters,
    pod_spec,
    render_site,
    workloads,
)

filters = load_workloads_filters()
jobs = load_workloads_filters("jobs")
node_budget = load_workloads_filters("node_budget")
sizing = load_workloads_filters("sizing")
PROMETHEUS_CLAIM = load_workloads_filters("monitoring").CLAIM


def shm_limit(objects):
    return next(v for v in pod_spec(find(objects, "Job", "dinops-train"))["volumes"] if v["name"] == "shm")["emptyDir"]


@pytest.mark.parametrize("site", sorted(n for n, s in SITE_VARIANTS.items() if s.get("train")))
def test_shm_size_comes_from_the_profile(rendered_sites, site):
    if "train" not in SITE_VARIANTS[site].get("workloads", ["train"]):
        assert not [o for o in rendered_sites[site] if o["metadata"]["name"] == "dinops-train"]
        return
    assert shm_limit(rendered_sites[site]) == {"medium": "Memory", "sizeLimit": SITE_VARIANTS[site]["shm_size"]}


def test_exclusive_gpu_goes_to_training_and_inference_moves_to_cpu(rendered_sites):
    objects = rendered_sites["rtx3090-training-exclusive"]
    serve = find(objects, "Deployment", "dinops-serve")
    train = find(objects, "Job", "dinops-train")
    assert GPU not in pod_spec(serve)["containers"][0]["resources"]["limits"]
    assert "tolerations" not in pod_spec(serve)
    assert container_env(objects, pod_spec(serve)["containers"][0])["DINO_DEVICE"] == "cpu"
    assert pod_spec(train)["containers"][0]["resources"]["limits"][GPU] == 1
    env = container_env(objects, pod_spec(train)["containers"][0])
    assert (env["DINO_DEVICE"], env["DINO_BATCH_SIZE"], env["DINO_AMP"]) == ("cuda", "4", "true")


def test_time_slicing_keeps_the_gpu_for_both(rendered_sites):
    objects = rendered_sites["time-slicing-training"]
    for kind, name in (("Deployment", "dinops-serve"), ("Job", "dinops-train")):
        container = pod_spec(find(objects, kind, name))["containers"][0]
        assert container["resources"]["limits"][GPU] == 1
        assert container_env(objects, container)["DINO_DEVICE"] == "cuda"


def test_inference_host_without_training_keeps_the_gpu_for_inference(rendered_sites):
    objects = rendered_sites["rtx3060ti-inference"]
    assert pod_spec(find(objects, "Deployment", "dinops-serve"))["containers"][0]["resources"]["limits"][GPU] == 1


def test_images_are_renamed_and_retagged(rendered_sites):
    objects = rendered_sites["rtx3090-training-exclusive"]
    images = {o["metadata"]["name"]: pod_spec(o)["containers"][0]["image"] for o in workloads(objects)}
    assert images == {
        "dinops-download": "registry.local:5000/dinops-download:0.2.0-5f3a9c1e",
        "dinops-train": "registry.local/dinops-train:abc123",
        "dinops-serve": "registry.local:5000/dinops-serve:0.2.0-5f3a9c1e",
        "dinops-client": "registry.local:5000/dinops-client:0.2.0-5f3a9c1e",
        "dinops-prometheus": "registry.local:5000/dinops-prometheus:0.2.0-5f3a9c1e",
    }
    staged = {
        o["metadata"]["name"]: pod_spec(o)["containers"][0]["image"]
        for o in workloads(rendered_sites["images-stage-tags"])
    }
    assert staged == {
        "dinops-download": "dinops-download:0.1.0-0b0b",
        "dinops-train": "registry.local:5000/dinops-train:0.1.0-9c1d",
        "dinops-serve": "dinops-serve:0.1.0-3f2a",
        "dinops-client": "dinops-client:0.1.0-77aa",
        # Not in that images.json: the monitoring component's own tag stays.
        "dinops-prometheus": "dinops-prometheus:0.1.0",
    }
    # Without a tag from the images stage, the base's tag stays.
    assert pod_spec(find(rendered_sites["cpu-storage-class"], "Job", "dinops-download"))["containers"][0]["image"] == (
        "dinops-download:0.1.0"
    )


def test_ingress_only_when_asked(rendered_sites):
    ingresses = {site: [o for o in objs if o["kind"] == "Ingress"] for site, objs in rendered_sites.items()}
    assert {site for site, found in ingresses.items() if found} == {"rtx3060ti-inference"}
    paths = ingresses["rtx3060ti-inference"][0]["spec"]["rules"][0]["http"]["paths"]
    assert {p["path"]: p["backend"]["service"]["name"] for p in paths} == {"/v1": "dinops-serve", "/": "dinops-client"}
    # Behind the controller the client believes one proxy's X-Forwarded-* (its same-origin check sees https://host);
    # a client reached directly believes none, or any caller could claim another origin or address.
    for site, objects in rendered_sites.items():
        client = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "dinops-client"]
        hops = [container_env(objects, pod_spec(c)["containers"][0]).get("CLIENT_PROXY_HOPS") for c in client]
        assert hops == (["1"] if ingresses[site] else [None] * len(client)), site


def test_static_volumes_bind_by_label(rendered_sites):
    objects = rendered_sites["cpu-static-volumes"]
    volumes = [o for o in objects if o["kind"] == "PersistentVolume"]
    # The data claims; Prometheus' TSDB (k8s/components/monitoring) keeps the cluster's dynamic provisioning (k3s'
    # local-path is there beside the static volumes): no selector, no class of its own.
    claims = [o for o in objects if o["kind"] == "PersistentVolumeClaim" and o["metadata"]["name"] != PROMETHEUS_CLAIM]
    prometheus = find(objects, "PersistentVolumeClaim", PROMETHEUS_CLAIM)["spec"]
    assert "selector" not in prometheus and "storageClassName" not in prometheus
    assert len(volumes) == len(claims) == 2
    for claim in claims:
        selector = claim["spec"]["selector"]["matchLabels"]
        matching = [v for v in volumes if selector.items() <= v["metadata"]["labels"].items()]
        assert len(matching) == 1, claim["metadata"]["name"]
        volume = matching[0]
        assert claim["spec"]["storageClassName"] == volume["spec"]["storageClassName"] == ""
        assert set(claim["spec"]["accessModes"]) <= set(volume["spec"]["accessModes"])
        assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"


def test_storage_class_override(rendered_sites):
    claims = [o for o in rendered_sites["cpu-storage-class"] if o["kind"] == "PersistentVolumeClaim"]
    # The dataset, the output and Prometheus' TSDB.
    assert {c["metadata"]["name"]: c["spec"]["storageClassName"] for c in claims} == dict.fromkeys(
        ("dinops-dataset", "dinops-output", PROMETHEUS_CLAIM), "fast-ssd"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"overlay": "gke"}, "workloads_overlay must be one of"),
        ({"gpu_sharing": "mig"}, "workloads_gpu_sharing must be one of"),
        ({"shm_size": "8 GB"}, "workloads_shm_size must be a quantity"),
        ({"config": {"trainer": {"DINO_EPOCHS": 1}}}, "unknown app 'trainer'"),
        ({"config": {"train": {"DINO_RUN_NAME": "a\nb"}}}, "must be one line"),
        ({"checkpoint_url": "ftp://host/x.pth", "checkpoint_sha256": "a" * 64}, "workloads_checkpoint_url must be"),
        ({"checkpoint_url": "https://host/", "checkpoint_sha256": "a" * 64}, "workloads_checkpoint_url must be"),
        ({"checkpoint_url": "https://host/x.pth", "checkpoint_sha256": "abc"}, "workloads_checkpoint_sha256 must be"),
        ({"image_tag": "1.0 beta"}, "image tag of dinops-download must be a Docker tag"),
        ({"images": {"serve": "registry.local:5000/dinops-serve"}}, "image serve must be 'name:tag'"),
        ({"images": {"trainer": "dinops-trainer:1"}}, "images has unknown image 'trainer'"),
    ],
)
def test_bad_settings_are_refused_with_the_variable_named(change, message):
    settings = {"overlay": "cpu", "shm_size": "1Gi", **change}
    with pytest.raises(filters.WorkloadsError, match=message):
        filters.site_kustomization(settings)


def test_training_job_is_applied_only_when_asked(rendered_sites):
    # Without dinops_train the layer leaves the Job out already.
    assert not [o for o in rendered_sites["cpu-storage-class"] if o["metadata"]["name"] == "dinops-train"]
    objects = rendered_sites["cpu-training-storage-class"]
    names = lambda objs: {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] == "Job"}  # noqa: E731
    assert names(jobs.prepare_objects(objects, train=False)) == {("Job", "dinops-download")}
    assert names(jobs.prepare_objects(objects, train=True)) == {("Job", "dinops-download"), ("Job", "dinops-train")}


def test_jobs_are_replaced_only_when_their_template_changed(rendered_sites):
    before = jobs.prepare_objects(rendered_sites["cpu-training-storage-class"], train=True)
    after = jobs.prepare_objects(rendered_sites["cpu-static-volumes"], train=True)
    live = [o for o in before if o["kind"] == "Job"]
    assert jobs.jobs_to_replace(before, live) == []
    # Only the shm size differs between the two renders: the training Job changes, the download Job does not.
    assert jobs.jobs_to_replace(after, live) == ["dinops-train"]
    unstamped = [{"metadata": {"name": "dinops-download"}}]
    assert jobs.jobs_to_replace(after, unstamped) == ["dinops-download"]
    assert jobs.jobs_to_replace(after, []) == []


def test_a_checkpoint_url_is_fetched_into_the_output_volume_and_served(rendered_sites):
    objects = rendered_sites["rtx3060ti-inference"]
    job = find(objects, "Job", "dinops-checkpoint")
    container = pod_spec(job)["containers"][0]
    urls_volume = next(v for v in pod_spec(job)["volumes"] if v["name"] == "urls")
    urls = find(objects, "ConfigMap", urls_volume["configMap"]["name"])["data"]["urls.txt"]
    assert urls == "https://mirror.example/dino/checkpoint0011_4scale.pth sha256:" + "ab" * 32
    assert "--dest=/output/pretrained" in container["args"]
    output = next(v for v in pod_spec(job)["volumes"] if v["name"] == "output")
    assert output["persistentVolumeClaim"]["claimName"] == "dinops-output"
    serve = pod_spec(find(objects, "Deployment", "dinops-serve"))["containers"][0]
    assert container_env(objects, serve)["DINO_CHECKPOINT"] == "/models/pretrained/checkpoint0011_4scale.pth"
    assert not any(o["metadata"]["name"] == "dinops-checkpoint" for o in rendered_sites["cpu-storage-class"])


def _job(*conditions: dict, active: int = 0) -> list[dict]:
    """What k8s_info returns as ``resources`` for the download Job."""
    return [{"metadata": {"name": "dinops-download", "namespace": "dinops"},
             "status": {"active": active, "conditions": list(conditions)}}]  # fmt: skip


@pytest.mark.parametrize(
    ("job", "state", "words"),
    [
        ([], "missing", "does not exist"),
        (_job(active=1), "running", "1 active"),
        (_job({"type": "Complete", "status": "True"}), "complete", "completed"),
        (_job({"type": "Complete", "status": "False"}, active=1), "running", "running"),
        (
            _job(
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "PodFailurePolicy",
                    "message": "Container download for pod dinops/x failed with exit code 2 matching FailJob rule",
                }
            ),
            "failed",
            "failed (PodFailurePolicy): Container download for pod dinops/x failed with exit code 2",
        ),  # fmt: skip
        (_job({"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"}), "failed", "Backoff"),
        (
            _job({"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}),
            "complete",
            "completed",
        ),
    ],
)
def test_job_outcome_reports_failures_at_once_with_their_reason(job, state, words):
    outcome = jobs.job_outcome(job)
    assert outcome["state"] == state
    assert words in outcome["message"]
    if state == "failed":
        assert "kubectl -n dinops logs job/dinops-download" in outcome["message"]


# --- Profile intent, fit, proxies, placement -------------------------------------------------------------------
A10G = PROFILE_VARIANTS["profile-a10g-minikube-train"]


def test_time_slicing_is_refused_on_minikube():
    """minikube's device plugin addon cannot slice a GPU (finding 20)."""
    with pytest.raises(filters.WorkloadsError, match="workloads_gpu_sharing: time-slicing cannot work on minikube"):
        filters.site_kustomization({**A10G, "gpu_sharing": "time-slicing"})


def test_a_node_too_small_is_refused_naming_the_profile_and_what_is_short():
    small = {**A10G, "node": {**A10G["node"], "host_vcpus": 3, "host_memory_mb": 8192}}
    with pytest.raises(filters.WorkloadsError) as error:
        filters.site_kustomization(small)
    message = str(error.value)
    assert "profile a10g" in message and "short by 500m CPU" in message, message


def test_a_node_without_its_size_is_refused_naming_the_variable():
    with pytest.raises(filters.WorkloadsError, match=r"host_vcpus of profile a10g \(gpu_profile.host_vcpus\)"):
        filters.site_kustomization({**A10G, "node": {**A10G["node"], "host_vcpus": None}})


def test_the_a10g_training_host_is_sized_to_its_three_cpu_minikube_node():
    """g5.xlarge: 4 vCPU -> minikube --cpus 3; kubeadm and CoreDNS take 750m (facts/cluster.yml)."""
    node = node_budget.node_allocatable(A10G["node"], A10G["cluster_facts"])
    assert (node["capacity_cpu_m"], node["cpu_m"]) == (3000, 2250)
    assert (node["capacity_memory_mi"], node["memory_mi"]) == (12288, 12288 - 100 - 170)
    plan = sizing.site_plan(A10G)
    assert plan["serve_device"] == "cpu"
    requests = {app: r["requests"] for app, r in plan["resources"].items()}
    assert requests["serve"] == {"cpu": "250m", "memory": "1024Mi"}
    assert requests["train"]["cpu"] == f"{2250 - 500 - 250}m"


def test_dinops_train_without_train_in_the_profile_is_reported():
    t4 = PROFILE_VARIANTS["profile-t4-minikube-train"]
    plan = sizing.site_plan(t4)
    assert plan["apps"]["train"] is False
    assert "dinops_train is true but profile t4 lists no train" in plan["notes"][0]
    assert not sizing.site_plan({**t4, "train": False})["notes"]


def test_proxies_reach_the_download_and_checkpoint_pods_but_not_the_cluster(tmp_path):
    settings = {
        **PROFILE_VARIANTS["profile-t4-k3s-serve"],
        "checkpoint_url": "https://mirror.example/dino/c.pth",
        "checkpoint_sha256": "ab" * 32,
        "proxy_env": {"http_proxy": "http://proxy:3128", "https_proxy": "http://proxy:3128", "no_proxy": "internal"},
    }
    objects = render_site(tmp_path, "proxied", settings)
    expected_no_proxy = "internal,10.42.0.0/16,10.43.0.0/16,localhost,127.0.0.1,.svc,.cluster.local"
    for kind, name in (("Job", "dinops-download"), ("Job", "dinops-checkpoint")):
        env = container_env(objects, pod_spec(find(objects, kind, name))["containers"][0])
        for key in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
            assert env[key] == "http://proxy:3128", (name, key)
        assert env["NO_PROXY"] == env["no_proxy"] == expected_no_proxy, name
    serve = container_env(objects, pod_spec(find(objects, "Deployment", "dinops-serve"))["containers"][0])
    assert "HTTP_PROXY" not in serve
    minikube = filters.proxy_literals({"https_proxy": "http://p:1"}, "minikube", A10G["cluster_facts"])
    assert minikube["NO_PROXY"] == "10.244.0.0/16,10.96.0.0/12,localhost,127.0.0.1,.svc,.cluster.local"
    assert filters.proxy_literals({}, "k3s", A10G["cluster_facts"]) == {}
    with pytest.raises(filters.WorkloadsError, match="workloads_proxy_env has unknown keys"):
        filters.proxy_literals({"ftp_proxy": "x"}, "k3s", A10G["cluster_facts"])


def test_a_placement_is_honoured(tmp_path):
    """The k3s placement filter's contract: components and patches are added, requests_node sizes the pinned
    apps against their own node."""
    patch = {
        "target": {"kind": "Deployment", "name": "dinops-serve"},
        "patch": '[{"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {"dinops.io/role": "edge"}}]',
    }
    placement = {
        "components": ["components/ingress"],
        "patches": [patch],
        "requests_node": {"train": {"cpu_m": 15000, "memory_mi": 60000, "gpus": 1}},
    }
    settings = {**PROFILE_VARIANTS["profile-a10g-k3s-train"], "placement": placement}
    layer = filters.site_kustomization(settings)
    assert "../components/ingress" in layer["components"]
    assert patch in layer["patches"]
    plan = sizing.site_plan(settings)
    # A raw host size, as placement.py gives it: the k3s reservations come off (facts/cluster.yml).
    assert plan["nodes"]["train"] == {"cpu_m": 15000 - 200, "memory_mi": 60000 - 100 - 140, "gpus": 1}
    # Alone on a 15-CPU node, training gets its whole wish; the host's node keeps the others.
    assert plan["resources"]["train"]["requests"] == {"cpu": "2000m", "memory": "8192Mi"}
    assert plan["nodes"]["serve"]["cpu_m"] == 4000 - 200
    objects = render_site(tmp_path, "placed", settings)
    client = pod_spec(find(objects, "Deployment", "dinops-serve"))
    assert client["nodeSelector"] == {"dinops.io/role": "edge"}
    assert [o for o in objects if o["kind"] == "Ingress"]
    with pytest.raises(filters.WorkloadsError, match="workloads_placement must be a dict"):
        filters.site_kustomization({**settings, "placement": ["components/x"]})

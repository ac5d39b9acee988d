"""Fit by construction: every shipped GPU profile, on each cluster kind, with and without training, gets requests
that the node can allocate at the same time (nothing stays Pending), and runs what its profile lists.

The node's share comes from the workloads filter's node_allocatable (the same code the role runs) over
facts/cluster.yml (what minikube's kubeadm control plane or k3s' packaged pods request, the kubelet's eviction
threshold) and the profile's host_vcpus, host_memory_gb and gpu_count. Everything the layer applies counts as running
at once: the download Job runs beside training (whose init container waits for it) and inference.

With the platform stage (dinops_platform), everything else on the node counts too: each enabled operator's pods and,
during a search, Katib's suggestion pod and the metrics-collector sidecar of every trial pod, as
roles/platform/vars/main.yml pins them (pods, search_pods, trial_sidecar, each read from the release). Every
profile, on each cluster kind the platform runs on, with every combination of the platform switches, the train
kinds they allow and a search or none: the pods fit beside them, or the role refuses before applying anything and
says what is short. Nothing stays Pending.
"""

from __future__ import annotations

import itertools

import pytest
import yaml
from k8s.k8s_render import (
    GPU,
    PROFILE_VARIANTS,
    PROFILES,
    REPO,
    find,
    load_workloads_filters,
    pod_spec,
    workloads,
)

filters = load_workloads_filters()
jobs = load_workloads_filters("jobs")
node_budget = load_workloads_filters("node_budget")
quantities = load_workloads_filters("quantities")
sizing = load_workloads_filters("sizing")
RELEASES = yaml.safe_load((REPO / "roles/platform/vars/main.yml").read_text())["platform_releases"]
SWITCHES = list(RELEASES)


def pod_requests(obj: dict) -> dict[str, int]:
    """A pod's effective requests, as the scheduler counts them: the larger of the biggest init container and the
    sum of the containers (https://kubernetes.io/docs/concepts/workloads/pods/init-containers/#resource-sharing-within-containers)."""

    def of(container: dict) -> dict[str, int]:
        requests = container.get("resources", {}).get("requests", {})
        limits = container.get("resources", {}).get("limits", {})
        return {
            "cpu_m": quantities.cpu_m(requests.get("cpu", "0")),
            "memory_mi": quantities.quantity_mi(requests.get("memory", "0")),
            # Extended resources: the request is the limit.
            "gpus": int(limits.get(GPU, requests.get(GPU, 0))),
        }

    spec = pod_spec(obj)
    main = [of(c) for c in spec["containers"]]
    init = [of(c) for c in spec.get("initContainers", [])]
    return {k: max([sum(c[k] for c in main)] + [c[k] for c in init]) for k in ("cpu_m", "memory_mi", "gpus")}


def applied(name: str, objects: list[dict]) -> list[dict]:
    settings = PROFILE_VARIANTS[name]
    train = settings["train"] and "train" in settings["workloads"]
    download = "download" in settings["workloads"] or train
    return jobs.prepare_objects(objects, train, download)


@pytest.mark.parametrize("name", sorted(PROFILE_VARIANTS))
def test_everything_the_profile_runs_fits_its_node(rendered_sites, name):
    settings = PROFILE_VARIANTS[name]
    node = node_budget.node_allocatable(settings["node"], settings["cluster_facts"])
    running = [o for o in workloads(applied(name, rendered_sites[name]))]
    total = {"cpu_m": 0, "memory_mi": 0, "gpus": 0}
    lines = []
    for obj in running:
        requests = pod_requests(obj)
        replicas = obj["spec"].get("replicas", obj["spec"].get("parallelism", 1))
        for key in total:
            total[key] += requests[key] * replicas
        lines.append(f"  {obj['metadata']['name']}: {requests}")
    short = {key: total[key] - node[key] for key in total if total[key] > node[key]}
    assert not short, (
        f"{name}: requests {total} exceed what the node can allocate { ({k: node[k] for k in total}) }, short by "
        f"{short}; pods:\n" + "\n".join(lines)
    )


TRAINING = sorted(n for n, s in PROFILE_VARIANTS.items() if s["train"] and "train" in s["workloads"])


@pytest.mark.parametrize("name", TRAINING)
def test_training_memory_limit_holds_shm_and_the_working_set(rendered_sites, name):
    """/dev/shm (a memory emptyDir) counts against the container's memory limit
    (https://kubernetes.io/docs/concepts/storage/volumes/#emptydir): the limit must hold it plus the working set."""
    train = find(rendered_sites[name], "Job", "dinops-train")
    shm = next(v for v in pod_spec(train)["volumes"] if v["name"] == "shm")["emptyDir"]["sizeLimit"]
    container = next(c for c in pod_spec(train)["containers"] if c["name"] == "train")
    limit = quantities.quantity_mi(container["resources"]["limits"]["memory"])
    working_set = quantities.quantity_mi(container["resources"]["requests"]["memory"])
    assert limit >= quantities.quantity_mi(shm) + working_set, f"{name}: limit {limit} Mi < shm {shm} + request"


@pytest.mark.parametrize("name", sorted(PROFILE_VARIANTS))
def test_the_profile_decides_what_runs(rendered_sites, name):
    settings = PROFILE_VARIANTS[name]
    listed = set(settings["workloads"])
    names = {o["metadata"]["name"] for o in workloads(applied(name, rendered_sites[name]))}
    assert ("dinops-train" in names) == (settings["train"] and "train" in listed), name
    assert ("dinops-serve" in names) == ("inference" in listed), name
    assert ("dinops-client" in names) == ("client" in listed), name
    assert ("dinops-download" in names) == ("download" in listed or "dinops-train" in names), name


@pytest.mark.parametrize("name", TRAINING)
def test_training_uses_every_gpu_of_the_profile(rendered_sites, name):
    settings = PROFILE_VARIANTS[name]
    gpus = PROFILES[settings["profile"]]["gpu_count"]
    container = pod_spec(find(rendered_sites[name], "Job", "dinops-train"))["containers"][0]
    assert container["resources"]["limits"][GPU] == gpus
    if gpus > 1:
        assert container["args"][:3] == ["torchrun", "--standalone", f"--nproc-per-node={gpus}"]
        assert container["args"][3:] == ["-m", "dinops.train.main"]
    else:
        assert container["args"] == ["dinops", "train"]


@pytest.mark.parametrize("name", TRAINING)
def test_the_node_can_back_the_training_shm(rendered_sites, name):
    """A memory emptyDir is RAM of the node: the training pod's /dev/shm, filled by the DataLoader workers, comes on top
    of its own working set (its request) and of what every other pod requested. A profile whose shm_size the node
    cannot hold evicts or OOM-kills training when the workers fill it."""
    settings = PROFILE_VARIANTS[name]
    node = node_budget.node_allocatable(settings["node"], settings["cluster_facts"])
    running = workloads(applied(name, rendered_sites[name]))
    train = find(rendered_sites[name], "Job", "dinops-train")
    volume = next(v for v in pod_spec(train)["volumes"] if v["name"] == "shm")
    shm = quantities.quantity_mi(volume["emptyDir"]["sizeLimit"])
    requested = sum(pod_requests(o)["memory_mi"] for o in running)
    assert requested + shm <= node["memory_mi"], (
        f"{name}: the pods request {requested} Mi and training's /dev/shm may take {shm} Mi more, but the node has "
        f"{node['memory_mi']} Mi: lower the profile's shm_size or give the node more memory (cluster_memory_mb)"
    )


# --- With the platform -------------------------------------------------------------------------------------------
def platform_variants(settings: dict) -> list[tuple[dict, str, bool]]:
    """Every combination of the platform switches, with each train kind it serves and, with Katib, a search."""
    variants = []
    for bits in itertools.product((False, True), repeat=len(SWITCHES)):
        switches = dict(zip(SWITCHES, bits, strict=True))
        kinds = ["job"] + ["trainjob"] * switches["trainer"] + ["pytorchjob"] * switches["training_operator"]
        for kind in kinds:
            for hpo in (False, True) if switches["katib"] and settings["train"] else (False,):
                variants.append((switches, kind, hpo))
    return variants


def beside_dinops(switches: dict, kind: str, hpo: bool, trial_pods: int) -> dict[str, int]:
    """What the platform runs on the node, summed from the pinned releases."""
    pods = [pod for name, on in switches.items() if on for pod in (RELEASES[name].get("pods") or {}).values()]
    if hpo:
        pods += list(RELEASES["katib"]["search_pods"].values()) + [RELEASES["katib"]["trial_sidecar"]] * trial_pods
    return {key: sum(int(pod[key]) for pod in pods) for key in ("cpu_m", "memory_mi")}


PLATFORM_CLUSTERS = sorted(n for n, s in PROFILE_VARIANTS.items() if s["cluster"] in ("minikube", "k3s"))


@pytest.mark.parametrize("name", PLATFORM_CLUSTERS)
def test_with_the_platform_everything_fits_or_the_role_refuses(name):
    settings = PROFILE_VARIANTS[name]
    cluster = settings["cluster_facts"][settings["cluster"]]
    capacity = node_budget.node_allocatable(settings["node"], settings["cluster_facts"])
    system = {k: sum(int(p[k]) for p in cluster["system_pods"].values()) for k in ("cpu_m", "memory_mi")}
    eviction = capacity["capacity_memory_mi"] - system["memory_mi"] - capacity["memory_mi"]
    pending, refused = [], []
    for switches, kind, hpo in platform_variants(settings):
        variant = {**settings, "platform": switches, "train_kind": kind, "hpo": hpo}
        label = f"{','.join(k for k, on in switches.items() if on) or 'none'} {kind}{' hpo' if hpo else ''}"
        try:
            plan = sizing.site_plan(variant)
        except filters.WorkloadsError as error:
            assert "cannot all fit" in str(error) and "platform's" in str(error), f"{name} {label}: {error}"
            refused.append(label)
            continue
        trial_pods = plan["train_processes"] if kind == "job" else 1
        platform = beside_dinops(switches, kind, hpo, trial_pods)
        dinops = {
            "cpu_m": sum(quantities.cpu_m(r["requests"]["cpu"]) for r in plan["resources"].values()),
            "memory_mi": sum(quantities.quantity_mi(r["requests"]["memory"]) for r in plan["resources"].values()),
        }
        free = {
            "cpu_m": capacity["capacity_cpu_m"] - system["cpu_m"] - platform["cpu_m"],
            "memory_mi": capacity["capacity_memory_mi"] - eviction - system["memory_mi"] - platform["memory_mi"],
        }
        short = {k: dinops[k] - free[k] for k in free if dinops[k] > free[k]}
        if short:
            pending.append(f"  {label}: dinops {dinops}, platform {platform}, free {free}, short {short}")
    assert not pending, f"{name}: pods would stay Pending beside the platform:\n" + "\n".join(pending)
    # The platform's defaults (Trainer and Katib) run beside every shipped profile without a search.
    assert "katib,trainer job" not in refused and "trainer,katib job" not in refused, f"{name}: {refused}"


def test_the_refusal_names_the_platforms_pods():
    settings = PROFILE_VARIANTS["profile-a10g-minikube-train"]
    switches = dict.fromkeys(SWITCHES, True)
    with pytest.raises(filters.WorkloadsError) as refused:
        sizing.site_plan({**settings, "platform": switches, "train_kind": "job", "hpo": True})
    assert "trainer/jobset-controller-manager 500m/128Mi" in str(refused.value)
    assert "kserve/llmisvc-controller-manager 100m/300Mi" in str(refused.value)
    assert "katib/metrics-collector 50m/10Mi" in str(refused.value)

"""Training as a TrainJob or PyTorchJob and the search as a Katib Experiment, folded from the rendered Job.

Every shipped training profile on minikube and k3s, the CPU demo and a k3s cluster of two train hosts are rendered as
the workloads role renders them (k8s.k8s_render.TRAIN_KIND_VARIANTS), folded by roles/workloads/filter_plugins/
train_kinds.py, and each TrainJob, TrainingRuntime, PyTorchJob and Experiment (with its trial) is validated against
the schema of its pinned release (k8s.crd_schema). Then the rules no schema holds: the operators' reserved names,
the containers and labels they and Katib look for, Katib's webhook rules on trial parameters, the search's settings
against the training app's own table, the replacement of what changed, the waits' readings and the Docker refusal.
"""

from __future__ import annotations

import copy
import json
import re
import stat
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
from k8s.crd_schema import requires_crds, trial_parameter_references, validate
from k8s.k8s_render import (
    HPO_DEFAULTS,
    NFS_SETTINGS,
    PROFILES,
    SERVE_PROFILES,
    TRAIN_KIND_VARIANTS,
    TRAIN_PROFILES,
    WORKLOADS_DEFAULTS,
    find,
    load_workloads_filters,
    profile_settings,
    render_site,
    render_train_kind,
    train_cluster_settings,
    train_kind_variant,
)

from dinops_testing import ansible_playbook, load_plugin

REPO = Path(__file__).resolve().parents[2]
workloads = load_workloads_filters()
jobs = load_workloads_filters("jobs")
kind_components = load_workloads_filters("kind_components")
node_budget = load_workloads_filters("node_budget")
quantities = load_workloads_filters("quantities")
sizing = load_workloads_filters("sizing")
train_kinds = load_workloads_filters("train_kinds")
docker_runtime = load_workloads_filters("docker_runtime")
rollout = load_plugin("roles/workloads/filter_plugins/rollout.py")
# The launcher of distributed training (the platform contract, with the apps' --shutdown-timeout: docs/training.md
# "Launch under the Kubeflow operators"): torchrun reads the PET_* variables.
LAUNCHER = ["tini", "--", "torchrun", "--shutdown-timeout", "280", "-m", "dinops.train.main"]
KIND_OF = {"trainjob": "TrainJob", "pytorchjob": "PyTorchJob"}


@pytest.fixture(scope="module")
def folded(tmp_path_factory) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("train-kinds")
    return {name: render_train_kind(root, name, variant) for name, variant in TRAIN_KIND_VARIANTS.items()}


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def the_job(tmp_path, variant: dict) -> dict:
    """The prepared batch Job dinops-train of the same layer without the kind: what the fold starts from. The
    operators the kind needs stay switched on, so that the node budget (node_budget.platform_reserve) is the same."""
    kind = variant["site"]["train_kind"]
    platform = dict.fromkeys(node_budget.PLATFORM_NEEDS.get(kind, ()), True) | {"katib": variant["site"]["hpo"]}
    site = {**variant["site"], "train_kind": "job", "train_nodes": 1, "hpo": False, "platform": platform}
    objects = jobs.prepare_objects(render_site(tmp_path, "job", site), True, True)
    return find(objects, "Job", "dinops-train")


def pod_templates(obj: dict) -> list[dict]:
    """Every pod template of a training object or of an Experiment's trial (a TrainJob's lives in the runtime)."""
    if obj["kind"] == "Experiment":
        return pod_templates(obj["spec"]["trialTemplate"]["trialSpec"])
    if obj["kind"] == "PyTorchJob":
        return [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "TrainingRuntime":
        return [r["template"]["spec"]["template"] for r in obj["spec"]["template"]["spec"]["replicatedJobs"]]
    if obj["kind"] == "Job":
        return [obj["spec"]["template"]]
    return []


# --- The schemas of the pinned releases -------------------------------------------------------------------------


@requires_crds
@pytest.mark.parametrize("name", sorted(TRAIN_KIND_VARIANTS))
def test_every_kind_validates_against_its_release(folded, name):
    errors = []
    for obj in folded[name]:
        if obj["kind"] in ("TrainJob", "PyTorchJob", "Experiment"):
            errors += [f"{obj['kind']}: {e}" for e in validate(obj)]
        elif obj["kind"] == "TrainingRuntime":
            # A TrainingRuntime's spec is the ClusterTrainingRuntime's (both TrainingRuntimeSpec:
            # kubeflow/trainer@v2.3.0:pkg/apis/trainer/v1alpha1/trainingruntime_types.go); only the scope differs.
            errors += [f"TrainingRuntime: {e}" for e in validate({**obj, "kind": "ClusterTrainingRuntime"})]
        else:
            try:
                kubernetes_validate.validate(obj, "1.33", strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert errors == []


@requires_crds
def test_the_schema_check_sees_a_field_the_release_does_not_have(folded):
    """The check above can fail: runtimePatches' container has no envFrom at v2.3.0 (why we ship a runtime)."""
    trainjob = copy.deepcopy(by_kind(folded["kind-rtx3090-k3s-trainjob"], "TrainJob")[0])
    patch = {"name": "node", "envFrom": [{"configMapRef": {"name": "dinops-train-config"}}]}
    trainjob["spec"]["runtimePatches"] = [{"manager": "dinops.io/workloads", "trainingRuntimeSpec": {"template": {
        "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
            "containers": [patch]}}}}}]}}}}]  # fmt: skip
    assert any("envFrom" in e for e in validate(trainjob))


# --- What each kind is made of ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["kind-rtx3090-k3s-trainjob", "kind-a100-minikube-trainjob", "kind-cpu-demo-trainjob"])
def test_a_trainjob_runs_the_jobs_pod_in_our_runtime(folded, tmp_path, name):
    job = the_job(tmp_path, TRAIN_KIND_VARIANTS[name])
    objects = folded[name]
    assert by_kind(objects, "Job") and all(j["metadata"]["name"] != "dinops-train" for j in by_kind(objects, "Job"))
    runtime, trainjob = (
        find(objects, "TrainingRuntime", "dinops-train-runtime"),
        find(objects, "TrainJob", "dinops-train"),
    )
    # The runtime comes first: the Trainer's webhook looks it up when the TrainJob is created.
    assert objects.index(runtime) < objects.index(trainjob)
    assert trainjob["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                              "name": "dinops-train-runtime"}  # fmt: skip
    node = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    assert node["name"] == "node"
    assert node["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    pod, expected = node["template"]["spec"]["template"], copy.deepcopy(job["spec"]["template"])
    container = expected["spec"]["containers"][0]
    resources = container.pop("resources")
    container.pop("args")
    container["name"] = "node"
    assert pod["spec"] == expected["spec"]
    assert pod["metadata"]["labels"] == expected["metadata"]["labels"]
    assert pod["spec"]["initContainers"][0]["name"] == "wait-for-dataset"
    # The Job's failure semantics per node: exit 2 (a bad setting) fails at once, a disruption does not count.
    assert node["template"]["spec"]["backoffLimit"] == job["spec"]["backoffLimit"]
    rules = node["template"]["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"] == {"containerName": "node", "operator": "In", "values": [2]}
    assert rules[1]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    trainer = trainjob["spec"]["trainer"]
    assert trainer["command"] == LAUNCHER
    assert trainer["resourcesPerNode"] == resources
    assert trainer["numNodes"] == 1
    plan = sizing.site_plan(TRAIN_KIND_VARIANTS[name]["site"])
    assert trainer["numProcPerNode"] == plan["train_processes"] == max(plan["train_gpus"], 1)
    assert resources.get("limits", {}).get("nvidia.com/gpu", 0) == plan["train_gpus"]
    for obj in (runtime, trainjob):
        assert obj["metadata"]["namespace"] == "dinops"
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "dinops"


@pytest.mark.parametrize("name", ["kind-rtx3090-k3s-pytorchjob", "kind-2nodes-a100-nfs-pytorchjob"])
def test_a_pytorchjob_runs_the_jobs_pod_as_master_and_workers(folded, tmp_path, name):
    variant = TRAIN_KIND_VARIANTS[name]
    job = the_job(tmp_path, variant)
    pytorchjob = find(folded[name], "PyTorchJob", "dinops-train")
    replicas = pytorchjob["spec"]["pytorchReplicaSpecs"]
    nodes = variant["fold"]["nodes"]
    assert replicas["Master"]["replicas"] == 1
    assert replicas.get("Worker", {}).get("replicas", 0) == nodes - 1
    expected = copy.deepcopy(job["spec"]["template"]["spec"])
    expected.pop("restartPolicy")
    expected["containers"][0].pop("args")
    expected["containers"][0].update(name="pytorch", command=LAUNCHER)
    for replica in replicas.values():
        assert replica["restartPolicy"] == "OnFailure"
        assert replica["template"]["spec"] == expected
    plan = sizing.site_plan(variant["site"])
    assert pytorchjob["spec"]["nprocPerNode"] == str(plan["train_processes"])
    assert pytorchjob["spec"]["runPolicy"] == {"backoffLimit": job["spec"]["backoffLimit"]}


def test_two_training_nodes_are_two_pods_of_the_trainjob_on_the_train_hosts(folded):
    objects = folded["kind-2nodes-a100-class-trainjob"]
    trainer = find(objects, "TrainJob", "dinops-train")["spec"]["trainer"]
    gpus = trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"]
    assert (trainer["numNodes"], trainer["numProcPerNode"], gpus) == (2, 8, 8)
    pod = pod_templates(find(objects, "TrainingRuntime", "dinops-train-runtime"))[0]
    assert pod["spec"]["nodeSelector"] == {"dinops.io/train": "true"}
    claims = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    # The data every training pod mounts is shared; Prometheus' TSDB is its one pod's (k8s/components/monitoring).
    assert {name: spec["accessModes"] for name, spec in claims.items()} == {
        "dinops-dataset": ["ReadWriteMany"], "dinops-output": ["ReadWriteMany"],
        "dinops-prometheus-data": ["ReadWriteOnce"],
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(TRAIN_KIND_VARIANTS))
def test_what_the_operators_and_katib_look_for(folded, name):
    objects = folded[name]
    kind, hpo = TRAIN_KIND_VARIANTS[name]["fold"]["kind"], TRAIN_KIND_VARIANTS[name]["fold"]["hpo"]["enabled"]
    # The plain training object runs only without the search; with it, the trials are the training.
    trained = [o for o in objects if o["metadata"]["name"] == "dinops-train"]
    assert [o["kind"] for o in trained] == ([] if hpo else [KIND_OF[kind]])
    assert [o["metadata"]["name"] for o in by_kind(objects, "Experiment")] == (["dinops-hpo"] if hpo else [])
    checked = [o for o in objects if o["kind"] in ("TrainingRuntime", "PyTorchJob", "Experiment")]
    assert checked
    for obj in checked:
        for pod in pod_templates(obj):
            # An Istio sidecar never exits, so the pod never completes (facts: Trainer pitfall 6, Katib pitfall 3).
            assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
            names = [c["name"] for c in pod["spec"]["containers"]]
            assert names == [{"TrainingRuntime": "node", "PyTorchJob": "pytorch"}.get(obj["kind"], names[0])]
            for container in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
                assert not [e for e in container.get("env", []) if e["name"].startswith("PET_")]
    for obj in by_kind(objects, "PyTorchJob"):
        for replica in obj["spec"]["pytorchReplicaSpecs"].values():
            assert replica["template"]["spec"]["containers"][0]["command"] == LAUNCHER
    for trainjob in by_kind(objects, "TrainJob"):
        assert trainjob["spec"]["trainer"]["command"] == LAUNCHER
        assert not [e for e in trainjob["spec"]["trainer"].get("env", []) if e["name"].startswith("PET_")]


def test_reserved_pet_names_are_refused(tmp_path):
    variant = TRAIN_KIND_VARIANTS["kind-rtx3090-k3s-trainjob"]
    objects = jobs.prepare_objects(render_site(tmp_path, "pet", variant["site"]), True, True)
    find(objects, "Job", "dinops-train")["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "PET_NNODES", "value": "2"}
    ]
    with pytest.raises(train_kinds.TrainKindsError, match=r"sets \['PET_NNODES'\]: torchrun's PET_\* variables"):
        train_kinds.train_kinds(objects, {**variant["fold"], "processes": 1, "gpus": 1})


def test_a_job_field_the_fold_does_not_know_is_refused(tmp_path):
    variant = TRAIN_KIND_VARIANTS["kind-rtx3090-k3s-pytorchjob"]
    objects = jobs.prepare_objects(render_site(tmp_path, "field", variant["site"]), True, True)
    find(objects, "Job", "dinops-train")["spec"]["template"]["spec"]["containers"][0]["workingDir"] = "/srv"
    with pytest.raises(train_kinds.TrainKindsError, match=r"does not know \['workingDir'\]"):
        train_kinds.train_kinds(objects, {**variant["fold"], "processes": 1, "gpus": 1})


# --- The search ---------------------------------------------------------------------------------------------------
HPO_NAMES = sorted(name for name, variant in TRAIN_KIND_VARIANTS.items() if variant["fold"]["hpo"]["enabled"])


@pytest.mark.parametrize("name", HPO_NAMES)
def test_katibs_webhook_rules_on_the_trial_template(folded, name):
    """kubeflow/katib@v0.19.0:pkg/webhook/v1beta1/experiment/validator/validator.go validateTrialTemplate and
    pkg/controller.v1beta1/experiment/manifest/generator.go applyParameters: every ${trialParameters.x} is defined,
    every trial parameter is used and refers to a parameter or trial metadata, every parameter has a trial
    parameter, the trial has no name or namespace, and the primary container is in the trial's pod."""
    experiment = find(folded[name], "Experiment", "dinops-hpo")
    spec = experiment["spec"]
    template = spec["trialTemplate"]
    text = json.dumps(template["trialSpec"])
    defined = [p["name"] for p in template["trialParameters"]]
    assert len(defined) == len(set(defined))
    assert trial_parameter_references(text) == set(defined)
    parameters = {p["name"] for p in spec["parameters"]}
    references = {p["reference"] for p in template["trialParameters"]}
    assert references == parameters | {"${trialSpec.Name}"}
    assert not {"name", "namespace"} & set(template["trialSpec"]["metadata"])
    assert len(experiment["metadata"]["name"]) <= 40
    assert (
        0 < spec["parallelTrialCount"] <= spec["maxTrialCount"] and spec["maxFailedTrialCount"] <= spec["maxTrialCount"]
    )
    kind = TRAIN_KIND_VARIANTS[name]["fold"]["kind"]
    trial = template["trialSpec"]
    if kind == "trainjob":
        runtime = find(folded[name], "TrainingRuntime", "dinops-train-runtime")
        assert trial["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
        pods = pod_templates(runtime)
        assert template["primaryPodLabels"] == {"jobset.sigs.k8s.io/replicatedjob-name": "node",
                                                "batch.kubernetes.io/job-completion-index": "0"}  # fmt: skip
        assert trial["spec"]["trainer"]["command"] == LAUNCHER
    else:
        pods = pod_templates(trial)
        assert template.get("primaryPodLabels") == (
            {"training.kubeflow.org/job-role": "master"} if kind == "pytorchjob" else None
        )
    assert all(template["primaryContainerName"] in [c["name"] for c in p["spec"]["containers"]] for p in pods)
    if kind != "trainjob":  # a TrainJob's command is its trainer's, checked above
        # Katib needs the command on the primary container: without one it asks the registry for the entrypoint.
        assert all(c.get("command") for p in pods for c in p["spec"]["containers"])
    success = {"trainjob": "Complete", "pytorchjob": "Succeeded", "job": "Complete"}[kind]
    assert template["successCondition"] == f'status.conditions.#(type=="{success}")#|#(status=="True")#'
    assert template["failureCondition"] == 'status.conditions.#(type=="Failed")#|#(status=="True")#'
    assert spec["objective"] == {"type": "maximize", "objectiveMetricName": "bbox_ap",
                                 "additionalMetricNames": ["bbox_ap50", "bbox_ap75", "loss"],
                                 # unnamed, Katib would give loss the objective's max (experiment_defaults.go)
                                 "metricStrategies": [{"name": "bbox_ap", "value": "max"},
                                                      {"name": "bbox_ap50", "value": "max"},
                                                      {"name": "bbox_ap75", "value": "max"},
                                                      {"name": "loss", "value": "min"}]}  # fmt: skip
    assert spec["metricsCollectorSpec"] == {"collector": {"kind": "StdOut"}}
    assert spec["earlyStopping"]["algorithmName"] == "medianstop"
    assert spec["algorithm"] == {"algorithmName": WORKLOADS_DEFAULTS["workloads_hpo_algorithm"]}


def trial_env(experiment: dict) -> dict[str, str]:
    trial = experiment["spec"]["trialTemplate"]["trialSpec"]
    if trial["kind"] == "TrainJob":
        env = trial["spec"]["trainer"]["env"]
    else:
        envs = [p["spec"]["containers"][0]["env"] for p in pod_templates(trial)]
        assert all(e == envs[0] for e in envs), "every pod of a trial trains with the same values"
        env = envs[0]
    return {e["name"]: e["value"] for e in env}


@pytest.mark.parametrize("name", ["kind-rtx3090-k3s-trainjob-hpo", "kind-cpu-demo-job-hpo"])
def test_each_trial_writes_to_its_own_output_and_searches_the_settings(folded, name):
    experiment = find(folded[name], "Experiment", "dinops-hpo")
    env = trial_env(experiment)
    assert env["DINO_OUTPUT_DIR"] == "/output/hpo/${trialParameters.trialName}"
    assert {"name": "trialName", "reference": "${trialSpec.Name}", "description": "the trial's output directory"} in (
        experiment["spec"]["trialTemplate"]["trialParameters"])  # fmt: skip
    assert env["DINO_LR"] == "${trialParameters.lr}"
    # The overrides are appended to the layer's own (the demo's tiny model keeps its shape; a later name wins).
    config = find(
        folded[name],
        "ConfigMap",
        next(o["metadata"]["name"] for o in folded[name] if o["metadata"]["name"].startswith("dinops-train-config")),
    )["data"]
    base = config.get("DINO_MODEL_OVERRIDES", "")
    assert env["DINO_MODEL_OVERRIDES"] == ",".join(
        filter(None, [base, "dn_number=${trialParameters.dn_number}", "num_queries=${trialParameters.num_queries}"])
    )


def test_the_search_space_is_made_of_the_training_apps_own_settings(folded):
    """Each trial's environment, with Katib's values substituted, is accepted by `dinops train` itself (its settings
    table, apps/src/dinops/train/settings.py) and by the model's DINOConfig overrides."""
    from dinops.model.config import DINOConfig
    from dinops.train.main import parse_args
    from dinops.train.model_setup import parse_overrides
    from dinops.train.settings import SETTINGS

    names = {s.env for s in SETTINGS}
    fields = set(DINOConfig.__dataclass_fields__)
    for parameter in WORKLOADS_DEFAULTS["workloads_hpo_parameters"]:
        assert parameter["setting"] in names
        assert parameter.get("override") is None or parameter["override"] in fields
    # Learning rates are searched on a log scale.
    rates = [
        p for p in WORKLOADS_DEFAULTS["workloads_hpo_parameters"] if p["setting"] in ("DINO_LR", "DINO_LR_BACKBONE")
    ]
    assert len(rates) == 2 and all(p["distribution"] == "logUniform" for p in rates)
    objects = folded["kind-cpu-demo-job-hpo"]
    experiment = find(objects, "Experiment", "dinops-hpo")
    container = pod_templates(experiment)[0]["spec"]["containers"][0]
    config = find(objects, "ConfigMap", container["envFrom"][0]["configMapRef"]["name"])["data"]
    for pick in (0, -1):
        values = {"trialName": "dinops-hpo-5x2kqz7w"}
        for parameter in experiment["spec"]["parameters"]:
            space = parameter["feasibleSpace"]
            values[parameter["name"]] = (space.get("list") or [space["min"], space["max"]])[pick]
        environ = {**config}
        for key, value in trial_env(experiment).items():
            environ[key] = re.sub(r"\$\{trialParameters\.([^}]+)\}", lambda m, v=values: v[m.group(1)], value)
        args = parse_args([], environ)
        assert args.output_dir == "/output/hpo/dinops-hpo-5x2kqz7w"
        assert args.lr == float(values["lr"])
        overrides = parse_overrides(args.model_overrides)
        assert overrides["dn_number"] == int(values["dn_number"]) and overrides["hidden_dim"] == 64


def test_a_batch_job_trial_is_one_process_on_one_gpu(folded, tmp_path):
    """a100: 8 GPUs; the trial Job takes one, and an eighth of the CPU and memory (the /dev/shm share stays)."""
    name = "kind-a100-k3s-job-hpo"
    job = the_job(tmp_path, TRAIN_KIND_VARIANTS[name])
    experiment = find(folded[name], "Experiment", "dinops-hpo")
    trial = experiment["spec"]["trialTemplate"]["trialSpec"]
    container = trial["spec"]["template"]["spec"]["containers"][0]
    whole = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert whole["limits"]["nvidia.com/gpu"] == 8 and container["resources"]["limits"]["nvidia.com/gpu"] == 1
    cpu_m = quantities.cpu_m
    assert cpu_m(container["resources"]["requests"]["cpu"]) == cpu_m(whole["requests"]["cpu"]) // 8
    shm = quantities.quantity_mi(TRAIN_KIND_VARIANTS[name]["site"]["shm_size"])
    assert quantities.quantity_mi(container["resources"]["limits"]["memory"]) == (
        (quantities.quantity_mi(whole["limits"]["memory"]) - shm) // 8 + shm)  # fmt: skip
    assert (container["command"], container["args"]) == (["tini", "--"], ["dinops", "train"])
    assert trial["spec"]["podFailurePolicy"] == job["spec"]["podFailurePolicy"]
    assert trial["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "dinops-hpo"
    assert experiment["spec"]["parallelTrialCount"] == 8


@pytest.mark.parametrize(
    ("name", "parallel"),
    [
        ("kind-rtx3090-minikube-job-hpo", 1),  # one GPU, one trial
        ("kind-a100-minikube-job-hpo", 8),  # eight GPUs, a trial on each
        ("kind-a100-minikube-trainjob-hpo", 1),  # a TrainJob trial takes the node's eight
        ("kind-2nodes-a100-nfs-trainjob-hpo", 1),  # two train hosts, a trial on both
        ("kind-cpu-demo-job-hpo", 1),
    ],
)
def test_parallel_trials_follow_the_gpus_of_the_train_nodes(folded, name, parallel):
    assert find(folded[name], "Experiment", "dinops-hpo")["spec"]["parallelTrialCount"] == parallel


def test_parallel_trials_on_a_cluster_of_two_train_hosts(tmp_path):
    site, nodes = train_cluster_settings(TRAIN_PROFILES["a100"], SERVE_PROFILES["rtx3060ti"], "nfs")
    objects = render_train_kind(tmp_path, "p", train_kind_variant(site, "trainjob", True, 1, nodes))
    assert find(objects, "Experiment", "dinops-hpo")["spec"]["parallelTrialCount"] == 2


@pytest.mark.parametrize(
    "name", ["kind-rtx3090-k3s-trainjob-hpo", "kind-2nodes-a100-nfs-pytorchjob", "kind-h100-k3s-trainjob"]
)
def test_the_namespace_lets_the_operators_containers_in(folded, name):
    """Katib's collector and the Workers' init-pytorch carry no securityContext: enforce baseline, still warn and
    audit against restricted; without them the namespace stays restricted."""
    labels = find(folded[name], "Namespace", "dinops")["metadata"]["labels"]
    fold = TRAIN_KIND_VARIANTS[name]["fold"]
    relaxed = fold["hpo"]["enabled"] or (fold["kind"] == "pytorchjob" and fold["nodes"] > 1)
    assert labels["pod-security.kubernetes.io/enforce"] == ("baseline" if relaxed else "restricted")
    if relaxed:
        assert labels["pod-security.kubernetes.io/warn"] == labels["pod-security.kubernetes.io/audit"] == "restricted"
    assert (labels.get("katib.kubeflow.org/metrics-collector-injection") == "enabled") == fold["hpo"]["enabled"]


@pytest.mark.parametrize(("hpo", "enforced"), [(False, "restricted"), (True, "baseline")])
def test_with_the_platforms_operators_only_a_search_needs_baseline(tmp_path, hpo, enforced):
    """roles/platform gives init-pytorch a restricted securityContext and makes Katib's collector copy the trial
    container's; Katib's suggestion pod has none (kubeflow/katib@v0.19.0:pkg/controller.v1beta1/suggestion), so only
    a search still needs baseline."""
    variant = copy.deepcopy(TRAIN_KIND_VARIANTS["kind-2nodes-a100-nfs-pytorchjob"])
    variant["site"]["hpo"] = hpo
    variant["fold"]["hpo"]["enabled"] = hpo
    variant["fold"]["restricted_operators"] = True
    labels = find(render_train_kind(tmp_path, "restricted", variant), "Namespace", "dinops")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == enforced


# --- Settings that cannot run are refused, naming the setting -----------------------------------------------------
def k3s(**extra) -> dict:
    return {**profile_settings(PROFILES["rtx3090"], "k3s", True), **extra}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (k3s(train_kind="mpijob"), "workloads_train_kind must be one of job, trainjob, pytorchjob, got 'mpijob'"),
        (k3s(train_kind="trainjob", train_nodes=0), "workloads_train_nodes must be a whole number"),
        (k3s(train_nodes=2), "a batch Job runs one training pod: set workloads_train_kind"),
        ({**profile_settings(PROFILES["rtx3090"], "minikube", True), "train_kind": "trainjob", "train_nodes": 2},
         "a minikube cluster is one node"),
        (k3s(train_kind="pytorchjob", train_nodes=2), r"0 node\(s\) of the k3s cluster take training"),
    ],
)  # fmt: skip
def test_the_layer_refuses_training_that_cannot_run(settings, message):
    with pytest.raises(workloads.WorkloadsError, match=message):
        workloads.site_kustomization(settings)


def test_several_training_pods_need_storage_every_node_mounts():
    site, nodes = train_cluster_settings(TRAIN_PROFILES["rtx3090"], SERVE_PROFILES["rtx3060ti"], "nfs")
    site = {**site, "nfs": {}, "placement": {**site["placement"], "components": []}}
    with pytest.raises(workloads.WorkloadsError, match="workloads_shared_storage_class"):
        workloads.site_kustomization({**site, "train_kind": "trainjob", "train_nodes": 2, "cluster_nodes": nodes})
    with pytest.raises(workloads.WorkloadsError, match="2 node\\(s\\) of the k3s cluster take training"):
        workloads.site_kustomization({**site, "train_kind": "trainjob", "train_nodes": 3, "cluster_nodes": nodes,
                                      "nfs": NFS_SETTINGS})  # fmt: skip


def test_the_layer_adds_each_kinds_component_only_when_this_host_trains():
    cases = [("trainjob", False, ["trainjob"]), ("pytorchjob", True, ["pytorchjob", "katib-experiment"]),
             ("job", True, ["katib-experiment"]), ("job", False, [])]  # fmt: skip
    for kind, hpo, expected in cases:
        layer = workloads.site_kustomization(k3s(train_kind=kind, hpo=hpo))
        added = [c.rsplit("/", 1)[1] for c in layer.get("components", [])]
        assert [c for c in added if c in ("trainjob", "pytorchjob", "katib-experiment")] == expected
    serving = {**profile_settings(PROFILES["rtx3090"], "k3s", False), "train_kind": "trainjob", "hpo": True}
    layer = workloads.site_kustomization(serving)
    assert not any(c.endswith(("trainjob", "katib-experiment")) for c in layer.get("components", []))
    assert "workloads_hpo is true but profile rtx3090 does not train here" in sizing.site_plan(serving)["notes"][0]


def fold_hpo(tmp_path, **hpo) -> list[dict]:
    variant = copy.deepcopy(TRAIN_KIND_VARIANTS["kind-rtx3090-minikube-job-hpo"])
    variant["fold"]["hpo"].update(hpo)
    return render_train_kind(tmp_path, "hpo", variant)


P = HPO_DEFAULTS["parameters"]


@pytest.mark.parametrize(
    ("hpo", "message"),
    [
        ({"algorithm": "grid"}, "workloads_hpo_algorithm must be one of random, tpe, got 'grid'"),
        ({"max_trials": 0}, "workloads_hpo_max_trials must be a whole number >= 1"),
        ({"max_failed_trials": 30}, r"workloads_hpo_max_failed_trials \(30\) must not exceed"),
        ({"parallel_trials": 21}, r"workloads_hpo_parallel_trials \(21\) must not exceed"),
        ({"parameters": []}, "workloads_hpo_parameters must be a non-empty list"),
        ({"parameters": [{"setting": "LR", "type": "double", "min": 1, "max": 2}]}, r"\[0\].setting must be a DINO_"),
        ({"parameters": [{"setting": "DINO_OUTPUT_DIR", "type": "categorical", "list": ["/a", "/b"]}]},
         "DINO_OUTPUT_DIR is set per trial by the role"),
        ({"parameters": [{"setting": "DINO_LR", "override": "lr", "type": "double", "min": 1, "max": 2}]},
         "goes with setting DINO_MODEL_OVERRIDES only"),
        ({"parameters": [{"setting": "DINO_LR", "type": "double", "min": 0, "max": 1, "distribution": "logUniform"}]},
         "logUniform needs min > 0"),
        ({"parameters": [{"setting": "DINO_LR", "type": "double", "min": 2, "max": 1}]}, "min must be below max"),
        ({"parameters": [{"setting": "DINO_TRAIN_SCALES", "type": "categorical", "list": ['8"00', "640"]}]},
         "cannot be substituted"),
        ({"parameters": [{"setting": "DINO_MODEL_OVERRIDES", "override": "dn_number", "type": "discrete",
                          "list": ["many", "100"]}]}, "discrete values must be numbers"),
        ({"parameters": [P[0], P[0]]}, r"lr \(DINO_LR\) is searched twice"),
        ({"parameters": [{**P[0], "scale": "log"}]}, r"unknown keys \['scale'\]"),
    ],
)  # fmt: skip
def test_bad_search_settings_name_the_setting(tmp_path, hpo, message):
    # render_train_kind loads the plugin file afresh: its TrainKindsError is a ValueError of another module object.
    with pytest.raises(ValueError, match=message):
        fold_hpo(tmp_path, **hpo)


def test_early_stopping_can_be_turned_off_and_the_algorithm_chosen(tmp_path):
    spec = find(fold_hpo(tmp_path, early_stopping=False, algorithm="tpe"), "Experiment", "dinops-hpo")["spec"]
    assert "earlyStopping" not in spec and spec["algorithm"] == {"algorithmName": "tpe"}


# --- Replacing what changed ---------------------------------------------------------------------------------------
def live(obj: dict, conditions=()) -> dict:
    obj = copy.deepcopy(obj)
    obj["status"] = {"conditions": [{"type": t, "status": "True", "reason": t, "message": t} for t in conditions]}
    return obj


def test_a_trainjob_is_replaced_when_its_runtime_or_its_spec_changed(folded, tmp_path):
    before = folded["kind-rtx3090-k3s-trainjob"]
    variant = copy.deepcopy(TRAIN_KIND_VARIANTS["kind-rtx3090-k3s-trainjob"])
    variant["site"]["image_tag"] = "0.2.0-5f3a9c1e"  # only the runtime's pod changes
    after = render_train_kind(tmp_path, "after", variant)
    trainjob = find(before, "TrainJob", "dinops-train")
    assert find(after, "TrainJob", "dinops-train")["spec"] == trainjob["spec"]
    assert train_kinds.objects_to_delete(before, [live(trainjob)]) == []
    assert train_kinds.objects_to_delete(after, [live(trainjob)]) == [
        {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "dinops-train",
         "why": "its template changed"}]  # fmt: skip
    assert train_kinds.objects_to_delete(before, [live(trainjob, ["Failed"])])[0]["why"] == "it failed before"
    assert train_kinds.objects_to_delete(before, [live(trainjob, ["Complete"])]) == []


def test_training_of_another_kind_is_removed_only_when_this_run_trains(folded, tmp_path):
    job = the_job(tmp_path, TRAIN_KIND_VARIANTS["kind-rtx3090-k3s-trainjob"])
    pytorchjob = find(folded["kind-rtx3090-k3s-pytorchjob"], "PyTorchJob", "dinops-train")
    running = [live(job), live(pytorchjob, ["Running"])]
    gone = train_kinds.objects_to_delete(folded["kind-rtx3090-k3s-trainjob"], running)
    assert [(o["kind"], o["why"]) for o in gone] == [("Job", "training runs as another kind now"),
                                                     ("PyTorchJob", "training runs as another kind now")]  # fmt: skip
    # dinops_train false: nothing trains in this run, and what trains already is left alone.
    serving = [o for o in folded["kind-rtx3090-k3s-trainjob"] if o["kind"] not in ("TrainJob", "TrainingRuntime")]
    assert train_kinds.objects_to_delete(serving, running) == []


def test_an_experiment_with_another_search_is_replaced_once_finished_and_kept_while_running(folded, tmp_path):
    before = folded["kind-rtx3090-minikube-job-hpo"]
    experiment = find(before, "Experiment", "dinops-hpo")
    more = find(fold_hpo(tmp_path / "more", max_trials=40, parallel_trials=2), "Experiment", "dinops-hpo")
    assert train_kinds.objects_to_delete([more], [live(experiment, ["Running"])]) == []  # the counts are editable
    other = fold_hpo(tmp_path / "other", algorithm="tpe")
    assert train_kinds.objects_to_delete(other, [live(experiment, ["Succeeded"])]) == [
        {"apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment", "name": "dinops-hpo", "why": "its search changed"}
    ]
    with pytest.raises(train_kinds.TrainKindsError, match="kubectl -n dinops delete experiment dinops-hpo"):
        train_kinds.objects_to_delete(other, [live(experiment, ["Running"])])


@pytest.mark.parametrize(
    "change",
    [{"max_trials": 40}, {"max_failed_trials": 1}, {"parallel_trials": 2}],
    ids=["max_trials", "max_failed_trials", "parallel_trials"],
)
@pytest.mark.parametrize("outcome", ["Succeeded", "Failed"])
def test_a_finished_experiment_whose_trial_counts_changed_is_replaced(folded, tmp_path, change, outcome):
    """Katib's webhook refuses any spec change to a finished Experiment unless it is restartable (Succeeded by max
    trials with resumePolicy LongRunning or FromVolume; dinops leaves Never), the counts included
    (kubeflow/katib@v0.19.0:pkg/webhook/v1beta1/experiment/validator/validator.go, pkg/controller.v1beta1/
    experiment/util/status_util.go IsCompletedExperimentRestartable): it is deleted and created again instead."""
    experiment = find(folded["kind-rtx3090-minikube-job-hpo"], "Experiment", "dinops-hpo")
    changed = find(fold_hpo(tmp_path, **change), "Experiment", "dinops-hpo")
    assert train_kinds.objects_to_delete([changed], [live(experiment, [outcome])]) == [
        {"apiVersion": "kubeflow.org/v1beta1", "kind": "Experiment", "name": "dinops-hpo",
         "why": "its trial counts changed and Katib refuses any change to a finished Experiment"}]  # fmt: skip
    # Unchanged, a finished search stays (its results are kept); a running one takes the new counts.
    assert train_kinds.objects_to_delete([experiment], [live(experiment, [outcome])]) == []
    assert train_kinds.objects_to_delete([changed], [live(experiment, ["Running"])]) == []


def test_a_running_experiment_cannot_lower_its_trials_below_those_it_made(folded, tmp_path):
    """validator.go (v0.19.0): a changed spec needs maxTrialCount > status.trials, running or not."""
    experiment = live(find(folded["kind-rtx3090-minikube-job-hpo"], "Experiment", "dinops-hpo"), ["Running"])
    experiment["status"]["trials"] = 5
    fewer = find(fold_hpo(tmp_path, max_trials=5), "Experiment", "dinops-hpo")
    with pytest.raises(train_kinds.TrainKindsError, match="workloads_hpo_max_trials 5 is not above the 5 trials"):
        train_kinds.objects_to_delete([fewer], [experiment])


def test_the_crds_the_layer_needs_name_the_setting_and_the_platform(folded):
    crds = train_kinds.kubeflow_crds(folded["kind-rtx3090-k3s-trainjob-hpo"])
    needed = {c["crd"]: c["message"] for c in crds if c["needed"]}
    assert set(needed) == {"experiments.kubeflow.org", "trainingruntimes.trainer.kubeflow.org"}
    assert needed["experiments.kubeflow.org"].startswith("workloads_hpo needs Katib v0.19.0 (dinops_platform: true")
    assert [c["kind"] for c in train_kinds.kubeflow_crds([]) if c["live"]] == ["Experiment", "TrainJob", "PyTorchJob"]
    isvc = [{"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "dinops"}}]
    needed = {c["crd"]: c["message"] for c in train_kinds.kubeflow_crds(isvc) if c["needed"]}
    assert list(needed) == ["inferenceservices.serving.kserve.io"]
    assert needed["inferenceservices.serving.kserve.io"].startswith("workloads_inference_service needs KServe v0.20.0")


# --- The waits' readings ------------------------------------------------------------------------------------------
def status(kind, *conditions, name="dinops-train", **extra) -> dict:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "dinops"},
            "status": {"conditions": [{"type": t, "status": s, "reason": r, "message": m}
                                      for t, s, r, m in conditions], **extra}}  # fmt: skip


def test_where_a_trainjob_and_a_pytorchjob_stand():
    failed = ("Failed", "True", "FailedJobs", "jobset failed: job dinops-train-node-0 failed")
    assert rollout.train_outcome([status("TrainJob", failed)]) == {
        "state": "failed",
        "message": "TrainJob dinops-train failed (FailedJobs): jobset failed: job dinops-train-node-0 failed. Its "
        "pods: kubectl -n dinops get pods -l jobset.sigs.k8s.io/jobset-name=dinops-train",
    }
    assert (
        rollout.train_outcome([status("TrainJob", ("Complete", "True", "AllJobsCompleted", ""))])["state"] == "complete"
    )
    suspended = rollout.train_outcome([status("TrainJob", ("Suspended", "True", "Suspended", ""))])
    assert suspended == {"state": "running", "message": "TrainJob dinops-train is running (Suspended)"}
    created, running = ("Created", "True", "Created", ""), ("Running", "True", "Running", "")
    assert rollout.train_outcome([status("PyTorchJob", created, running)])["message"].endswith("(Running)")
    done = status("PyTorchJob", created, ("Running", "False", "", ""), ("Succeeded", "True", "Succeeded", ""))
    assert rollout.train_outcome([done])["state"] == "complete"
    assert (
        "training.kubeflow.org/job-name=dinops-train"
        in rollout.train_outcome([status("PyTorchJob", failed)])["message"]
    )
    assert rollout.train_outcome([])["state"] == "missing"


def gate_pod(name, labels, init_state, main_state=None) -> dict:
    containers = {"initContainerStatuses": [{"name": "wait-for-dataset", "state": init_state}]}
    if main_state:
        containers["containerStatuses"] = [{"name": "node", "state": main_state}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "dinops", "labels": labels},
            "status": {"phase": "Pending" if not main_state else "Running", **containers}}  # fmt: skip


MINE = {"app.kubernetes.io/name": "dinops-train", "jobset.sigs.k8s.io/jobset-name": "dinops-train"}
TRIALS = {"app.kubernetes.io/name": "dinops-train", "jobset.sigs.k8s.io/jobset-name": "dinops-hpo-7xk2"}
HELD = {"waiting": {"reason": "PodInitializing"}}
PAST = {"terminated": {"exitCode": 0}}
RUNNING = {"running": {"startedAt": "2026-11-23T20:05:00Z"}}


def test_the_training_gate_of_a_trainjob_reads_its_own_pods_only():
    trainjob = status("TrainJob")
    held = {"kind": "List", "items": [trainjob, gate_pod("dinops-train-node-0-0-x", MINE, {"running": {}}),
                                      gate_pod("dinops-hpo-7xk2-node-0-0-y", TRIALS, PAST, RUNNING)]}  # fmt: skip
    state = rollout.job_progress(json.dumps(held))
    assert state["state"] == "waiting" and state["message"].startswith("TrainJob dinops-train has not started yet")
    held["items"][1] = gate_pod("dinops-train-node-0-0-x", MINE, PAST, RUNNING)
    assert rollout.job_progress(held)["state"] == "started"
    stuck = {
        "name": "node",
        "image": "dinops-train:x",
        "state": {"waiting": {"reason": "ErrImagePull", "message": "no"}},
    }
    held["items"][1]["status"]["containerStatuses"] = [stuck]
    assert rollout.job_progress(held)["message"].startswith("TrainJob dinops-train cannot run: pod dinops-train-node")


def test_a_failed_trainjob_of_an_earlier_run_is_deleted_so_that_it_runs_again(folded):
    desired = folded["kind-rtx3090-k3s-trainjob"]
    failed = ("Failed", "True", "FailedJobs", "x")
    assert rollout.failed_jobs(desired, [status("TrainJob", failed)]) == ["dinops-train"]
    assert rollout.failed_jobs(desired, [status("PyTorchJob", failed)]) == []  # not applied: left alone


def test_where_the_search_stands():
    best = {
        "bestTrialName": "dinops-hpo-7xk2",
        "parameterAssignments": [{"name": "lr", "value": "0.00013"}],
        "observation": {"metrics": [{"name": "bbox_ap", "min": "0.1", "max": "0.41", "latest": "0.41"}]},
    }
    running = status("Experiment", ("Created", "True", "ExperimentCreated", "created"),
                     ("Running", "True", "ExperimentRunning", "Experiment is running"), name="dinops-hpo", trials=3,
                     trialsSucceeded=1, trialsRunning=2, currentOptimalTrial=best)  # fmt: skip
    assert rollout.experiment_state({"rc": 0, "stdout": json.dumps({"kind": "List", "items": [running]})}) == {
        "state": "running",
        "message": "Experiment dinops-hpo running (ExperimentRunning: Experiment is running); 3 trial(s): 1 "
        "succeeded, 2 running, 0 failed, 0 stopped early; best dinops-hpo-7xk2 (bbox_ap=0.41) with lr=0.00013",
    }
    failed = status("Experiment", ("Failed", "True", "ExperimentMaxFailedTrialsReached", "3 trials failed"),
                    name="dinops-hpo", trials=3, trialsFailed=3)  # fmt: skip
    assert rollout.experiment_state([failed])["state"] == "failed"
    assert rollout.experiment_state([{"kind": "Experiment", "metadata": {"name": "dinops-hpo"}}])["state"] == "created"
    assert rollout.experiment_state({"kind": "List", "items": []})["state"] == "missing"
    assert rollout.experiment_state({"rc": 1, "stdout": "", "stderr": "Unauthorized"})["state"] == "unknown"


FAKE_KUBECTL = """#!/bin/sh
# Canned answers by the selector (the last argument that names one); the resource kinds asked are recorded.
dir=$(dirname "$0")
echo "$*" >> "$dir/calls"
for arg in "$@"; do
  case "$arg" in
    --selector=app.kubernetes.io/name=*) cat "$dir/${arg#--selector=app.kubernetes.io/name=}.json"; exit 0 ;;
  esac
done
echo "unexpected: $*" >&2
exit 1
"""


def run_wait(tmp: Path, answers: dict, objects: list[dict]) -> subprocess.CompletedProcess:
    """roles/workloads/tasks/wait.yml with these objects applied, against a kubectl that prints canned answers."""
    for name, answer in answers.items():
        (tmp / f"{name}.json").write_text(json.dumps(answer))
    kubectl = tmp / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"__workloads_objects": objects, "workloads_kubectl": str(kubectl),
                      "workloads_kubeconfig": "/nonexistent", "workloads_namespace": "dinops",
                      "workloads_download_timeout": 10, "workloads_train_start_timeout": 5,
                      "workloads_rollout_timeout": 10, "workloads_serve_load_timeout": 10,
                      "workloads_unschedulable_grace": 60,
                      "workloads_fact_file": str(tmp / "facts.d" / "dinops_workloads.fact")},
             "tasks": [{"ansible.builtin.include_tasks": str(REPO / "roles/workloads/tasks/wait.yml")}]}]  # fmt: skip
    return ansible_playbook(tmp, play, config=f"filter_plugins = {REPO}/roles/workloads/filter_plugins\n")


def test_wait_gates_a_trainjob_and_reports_the_search(tmp_path, folded):
    """The kinds the role applied decide what wait.yml asks kubectl for; a failed search stops the run."""
    objects = [o for o in folded["kind-rtx3090-minikube-trainjob"] if o["kind"] in ("TrainJob", "TrainingRuntime")]
    experiment = status("Experiment", ("Running", "True", "ExperimentRunning", "Experiment is running"),
                        name="dinops-hpo", trials=2, trialsRunning=2)  # fmt: skip
    objects.append({"kind": "Experiment", "metadata": {"name": "dinops-hpo"}})
    started = gate_pod("dinops-train-node-0-0-x", MINE, PAST, RUNNING)
    answers = {"dinops-train": {"kind": "List", "items": [status("TrainJob"), started]},
               "dinops-hpo": {"kind": "List", "items": [experiment]}}  # fmt: skip
    result = run_wait(tmp_path, answers, objects)
    assert result.returncode == 0, result.stdout[-3000:]
    calls = (tmp_path / "calls").read_text()
    assert "get trainjobs.trainer.kubeflow.org,pods --selector=app.kubernetes.io/name=dinops-train" in calls
    assert "get experiments.kubeflow.org --selector=app.kubernetes.io/name=dinops-hpo" in calls
    assert "HPO: Experiment dinops-hpo running (ExperimentRunning: Experiment is running); 2 trial(s)" in result.stdout
    fact = json.loads((tmp_path / "facts.d" / "dinops_workloads.fact").read_text())
    assert (fact["train"], fact["hpo"], fact["workloads"]) == ("started", "running", ["dinops-train"])
    answers["dinops-hpo"]["items"][0] = status(
        "Experiment", ("Failed", "True", "ExperimentMaxFailedTrialsReached", "Experiment has failed"), name="dinops-hpo"
    )
    failed = run_wait(tmp_path, answers, objects)
    assert failed.returncode != 0 and "Experiment dinops-hpo failed (ExperimentMaxFailedTrialsReached" in failed.stdout


# --- The Docker runtime runs the batch Job only -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "setting"),
    [("TrainJob", "workloads_train_kind"), ("PyTorchJob", "workloads_train_kind"),
     ("TrainingRuntime", "workloads_train_kind"), ("Experiment", "workloads_hpo")],
)  # fmt: skip
def test_the_docker_runtime_refuses_the_kubeflow_kinds_naming_the_setting(kind, setting):
    obj = {"apiVersion": "x/v1", "kind": kind, "metadata": {"name": "dinops-train"}}
    with pytest.raises(docker_runtime.DockerRuntimeError, match=f"{kind} dinops-train comes from {setting}"):
        docker_runtime.docker_plan([obj], {"data_dir": "/var/lib/dinops/volumes", "network": "dinops"})


def test_the_role_refuses_a_kubeflow_kind_on_the_docker_runtime(tmp_path):
    """What render.yml keeps on a Docker host asked for a TrainJob reaches docker_plan, which refuses it."""
    site = {"overlay": "cpu", "cluster": "docker", "train": True, "shm_size": "1G", "cluster_facts": {}}
    objects = render_train_kind(tmp_path, "docker", train_kind_variant(site, "trainjob", False))
    with pytest.raises(docker_runtime.DockerRuntimeError, match="set workloads_train_kind: job"):
        docker_runtime.docker_plan(objects, {"data_dir": "/var/lib/dinops/volumes", "network": "dinops"})


def test_the_role_renders_the_search_over_a_trainjob(tmp_path):
    """render.yml for real (ansible-playbook, no cluster): the inventory's switches reach the fold, the defaults'
    search space keeps its numbers through Ansible's templating, and a bad kind stops the run naming the setting."""
    from cluster.test_workloads_role_render import run_playbook

    result = run_playbook(tmp_path, {"dinops_train": True, "workloads_train_kind": "trainjob", "workloads_hpo": True})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    objects = json.loads((tmp_path / "objects.json").read_text())
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("TrainingRuntime", "dinops-train-runtime"), ("Experiment", "dinops-hpo")} <= kinds
    assert not {("Job", "dinops-train"), ("TrainJob", "dinops-train")} & kinds
    experiment = find(objects, "Experiment", "dinops-hpo")
    assert experiment["spec"]["parameters"][0]["feasibleSpace"] == {
        "min": "2e-05", "max": "0.0004", "distribution": "logUniform"}  # fmt: skip
    assert experiment["spec"]["trialTemplate"]["trialSpec"]["kind"] == "TrainJob"
    (tmp_path / "refused").mkdir()
    refused = run_playbook(tmp_path / "refused", {"dinops_train": True, "workloads_train_kind": "mpijob"})
    assert refused.returncode != 0
    # meta/argument_specs.yml refuses it before the filter does (same choices).
    assert "value of workloads_train_kind must be one of: job, trainjob, pytorchjob, got: mpijob" in refused.stdout


def test_the_train_node_label_is_the_k3s_roles():
    assert kind_components.TRAIN_NODE_LABEL == load_plugin("roles/k3s/filter_plugins/k3s_nodes.py").LABEL_TRAIN


@pytest.mark.parametrize("name", ["kind-rtx3090-k3s-trainjob", "kind-rtx3090-k3s-pytorchjob"])
def test_torchrun_gives_the_workers_the_pods_grace_period_to_checkpoint(folded, name):
    """torchrun SIGKILLs its workers --shutdown-timeout seconds after SIGTERM; the kubelet the pod after its grace."""
    objects = folded[name]
    if "trainjob" in name:
        pod = pod_templates(find(objects, "TrainingRuntime", "dinops-train-runtime"))[0]
        command = find(objects, "TrainJob", "dinops-train")["spec"]["trainer"]["command"]
    else:
        pod = pod_templates(find(objects, "PyTorchJob", "dinops-train"))[0]
        command = pod["spec"]["containers"][0]["command"]
    timeout = int(command[command.index("--shutdown-timeout") + 1])
    assert 0 < timeout < pod["spec"]["terminationGracePeriodSeconds"]
    assert "torchrun --shutdown-timeout 280 -m dinops.train.main" in (REPO / "docs/training.md").read_text()

"""One description of the workloads, two runtimes: the Docker runtime is the rendered Kubernetes layer, translated.

Every Job and Deployment of a layer (the shipped GPU profiles on each cluster, the site variants and the Docker
runtime's own) is rendered with kustomize and translated by roles/workloads/filter_plugins/docker_runtime.py. The
tests read the pod spec independently and check that the container runs the same image, the same argv (with the
dataset gate in front), the same environment as the pod (its ConfigMaps), the same mounts, limits, GPUs, /dev/shm,
user and lock-down, and that the NodePort is published. A field the translation does not know is refused, so a
change to the manifests cannot drift away from this runtime unnoticed.
"""

from __future__ import annotations

import copy
import json

import pytest
from k8s.k8s_render import DOCKER_VARIANTS, MULTINODE_VARIANTS, SITE_VARIANTS, load_workloads_filters, render_site

DOCKER = load_workloads_filters("docker_runtime")
STATE = load_workloads_filters("docker_state")
WORKLOADS = load_workloads_filters()
JOBS = load_workloads_filters("jobs")
QUANTITIES = load_workloads_filters("quantities")
SIZING = load_workloads_filters("sizing")
SETTINGS = {"data_dir": "/var/lib/dinops/volumes", "network": "dinops"}
# One host's Docker: the k3s layers across hosts (node selectors, shared volumes) are not this runtime's, nor the
# ingress, which needs k3s' controller (refused on Docker: tests/k8s/test_ingress_security.py).
ALL_VARIANTS = {
    **{k: v for k, v in SITE_VARIANTS.items() if k not in MULTINODE_VARIANTS and not v.get("ingress")},
    **DOCKER_VARIANTS,
}


@pytest.fixture(scope="module")
def layers(tmp_path_factory, rendered_sites) -> dict[str, list[dict]]:
    root = tmp_path_factory.mktemp("docker-layers")
    out = {}
    for name, settings in ALL_VARIANTS.items():
        # The site variants as the session rendered them (conftest.py), the Docker ones here.
        site = render_site(root, name, settings) if name in DOCKER_VARIANTS else rendered_sites[name]
        # NVIDIA's DCGM exporter is a cluster's DaemonSet, which a layer of the Docker runtime never holds
        # (filter_plugins/monitoring.py DCGM_COMPONENTS): the cluster layers translated here leave it out.
        objects = [o for o in site if o["kind"] != "DaemonSet"]
        plan = SIZING.site_plan(settings)
        out[name] = JOBS.prepare_objects(objects, plan["apps"]["train"], plan["apps"]["download"])
    return out


def _mi(text: str) -> int:
    return QUANTITIES.quantity_mi(text)


def _pod_env(container: dict, objects: list[dict]) -> dict[str, str]:
    maps = {o["metadata"]["name"]: o.get("data") or {} for o in objects if o["kind"] == "ConfigMap"}
    env = {}
    for source in container.get("envFrom") or []:
        env.update(maps[source["configMapRef"]["name"]])
    env.update({e["name"]: e["value"] for e in container.get("env") or []})
    return env


@pytest.mark.parametrize("variant", sorted(ALL_VARIANTS))
def test_each_workload_runs_the_same_in_docker(layers, variant):
    objects = layers[variant]
    plan = DOCKER.docker_plan(objects, SETTINGS)
    workloads = [o for o in objects if o["kind"] in ("Job", "Deployment")]
    assert sorted(plan["names"]) == sorted(o["metadata"]["name"] for o in workloads)
    by_name = {c["name"]: c for c in plan["containers"]}
    for obj in workloads:
        pod = obj["spec"]["template"]["spec"]
        main = pod["containers"][0]
        got = by_name[obj["metadata"]["name"]]
        where = f"{variant}: {obj['kind']} {obj['metadata']['name']}"
        assert got["image"] == main["image"], where
        # The argv the process gets: the init containers' commands first, then the main one (under tini).
        inits = [" ".join(i["args"]) for i in pod.get("initContainers") or []]
        if inits:
            assert got["entrypoint"][:4] == ["/usr/bin/tini", "--", "sh", "-c"], where
            assert got["entrypoint"][4] == " && ".join(inits) + ' && exec "$@"', where
            assert got["command"] == main["args"], where
        else:
            assert got.get("command", []) == main.get("args", []), where
            assert "entrypoint" not in got, where
        assert got["env"] == _pod_env(main, objects), where
        # Mounts: the same paths, claims as host directories, read-only where the pod's are.
        volumes = {v["name"]: v for v in pod["volumes"]}
        expected = {}
        for mount in main["volumeMounts"]:
            volume = volumes[mount["name"]]
            if mount["mountPath"] == "/dev/shm":
                assert _mi(got["shm_size"][:-1] + "Mi") == _mi(volume["emptyDir"]["sizeLimit"]), where
                continue
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                expected[mount["mountPath"]] = ("bind", f"/var/lib/dinops/volumes/{claim}", bool(mount.get("readOnly")))
            elif "configMap" in volume:
                name = volume["configMap"]["name"]
                expected[mount["mountPath"]] = ("bind", f"/var/lib/dinops/volumes/.config/{name}", True)
                data = next(o["data"] for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name)
                files = {f["path"]: f["content"] for f in plan["files"]}
                assert {k: files[f"/var/lib/dinops/volumes/.config/{name}/{k}"] for k in data} == data, where
            elif "secret" in volume:
                secret = volume["secret"]["secretName"]
                expected[mount["mountPath"]] = ("bind", f"/var/lib/dinops/volumes/.secrets/{secret}", True)
                assert {"name": secret, "path": f"/var/lib/dinops/volumes/.secrets/{secret}", "owner": 10001} in (
                    plan["secrets"]
                ), where
            elif (volume["emptyDir"] or {}).get("medium") == "Memory":
                expected[mount["mountPath"]] = ("tmpfs", None, False)
            else:  # on the node's disk, as on Kubernetes: not in RAM inside the memory limit
                expected[mount["mountPath"]] = ("volume", None, False)
        mounts = {m["target"]: (m["type"], m.get("source"), bool(m.get("read_only"))) for m in got["mounts"]}
        assert mounts == expected, where
        # Resources: limits, GPUs, and requests as weight and reservation.
        limits = main["resources"].get("limits", {})
        requests = main["resources"].get("requests", {})
        assert got["cpus"] == QUANTITIES.cpu_m(limits["cpu"]) / 1000, where
        assert got["memory"] == f"{_mi(limits['memory'])}m" == got["memory_swap"], where
        assert got["memory_reservation"] == f"{_mi(requests['memory'])}m", where
        gpus = int(limits.get("nvidia.com/gpu", 0))
        assert sum(r["count"] for r in got.get("device_requests", [])) == gpus, where
        if gpus:
            assert got["device_requests"][0]["capabilities"] == [["gpu"]], where
        # Who runs it, locked down as the pod is.
        assert got["user"] == "10001:10001", where
        assert got["read_only"] is True and got["cap_drop"] == ["ALL"], where
        assert got["security_opts"] == ["no-new-privileges"], where
        if obj["kind"] == "Job":
            assert got["restart_policy"] == "on-failure", where
            assert got["restart_retries"] == obj["spec"]["backoffLimit"], where
        else:
            assert got["restart_policy"] == "unless-stopped", where
        assert got["stop_timeout"] == pod.get("terminationGracePeriodSeconds", 30), where
        # Docker's one health check GETs the readiness and the liveness endpoints.
        for probe in (main.get("readinessProbe"), main.get("livenessProbe")):
            if probe:
                assert f"{probe['httpGet']['path']}'" in got["healthcheck"]["test"][-1], where
        assert got["labels"]["dinops.io/kind"] == obj["kind"], where
        assert len(got["labels"]["dinops.io/template-sha256"]) == 64, where


def test_the_demo_makes_synthetic_data_trains_the_tiny_model_and_publishes_the_client(layers):
    plan = DOCKER.docker_plan(layers["docker-cpu-demo"], SETTINGS)
    by_name = {c["name"]: c for c in plan["containers"]}
    # Prometheus last: it scrapes the others (tests/k8s/test_monitoring.py).
    assert plan["names"] == ["dinops-download", "dinops-train", "dinops-serve", "dinops-client", "dinops-prometheus"]
    assert by_name["dinops-download"]["command"][:3] == ["dinops", "synth", "--out=/data/coco"]
    assert by_name["dinops-download"]["image"].startswith("dinops-train")
    train = by_name["dinops-train"]
    assert train["entrypoint"][4] == 'dinops data-ready --wait=0 && exec "$@"'
    assert train["env"]["DINO_MODEL"] == "tiny" and train["env"]["DINO_DATA_ROOT"] == "/data/coco"
    # The demo's own batch and loader settings win over the profile's defaults.
    assert train["env"]["DINO_NUM_WORKERS"] == "0"
    # Loopback unless the inventory publishes the client (dinops_publish_address, docs/security.md).
    assert by_name["dinops-client"]["published_ports"] == ["127.0.0.1:30000:8080"]
    assert by_name["dinops-client"]["env"]["DINO_API_URL"] == "http://dinops-serve:8000"
    assert "published_ports" not in by_name["dinops-serve"]
    # The training and API containers also answer to the headless Services Prometheus resolves.
    aliases = {"dinops-train": ["dinops-train-metrics"], "dinops-serve": ["dinops-serve-metrics"]}
    assert all(c["networks"] == [{"name": "dinops", "aliases": aliases.get(c["name"], [])}] for c in plan["containers"])
    # 2 vCPUs: everything that runs at once fits (facts/cluster.yml docker: 100m kept for the host).
    assert sum(c["cpu_shares"] for c in plan["containers"]) * 1000 // 1024 <= 1900
    assert plan["directories"] == [
        {"path": f"/var/lib/dinops/volumes/{claim}", "owner": 10001, "group": 10001, "mode": "02775"}
        for claim in ("dinops-dataset", "dinops-output", "dinops-prometheus-data")
    ]


def test_gpu_hosts_get_their_gpus_as_device_requests_and_proxies_reach_the_fetching_containers(layers):
    plan = DOCKER.docker_plan(layers["docker-gpu-train-2"], SETTINGS)
    by_name = {c["name"]: c for c in plan["containers"]}
    assert by_name["dinops-train"]["device_requests"] == [{"driver": "nvidia", "count": 2, "capabilities": [["gpu"]]}]
    assert "--nproc-per-node=2" in by_name["dinops-train"]["command"]
    # Exclusive sharing: inference moves to CPU while training holds the GPUs.
    assert "device_requests" not in by_name["dinops-serve"]
    assert by_name["dinops-serve"]["env"]["DINO_DEVICE"] == "cpu"
    assert by_name["dinops-checkpoint"]["env"]["HTTPS_PROXY"] == "http://proxy.example:3128"
    assert by_name["dinops-download"]["env"]["https_proxy"] == "http://proxy.example:3128"
    serve = DOCKER.docker_plan(layers["docker-gpu-serve"], SETTINGS)
    assert {c["name"]: c.get("device_requests") for c in serve["containers"]}["dinops-serve"][0]["count"] == 1


def test_a_changed_setting_changes_only_its_containers_template_label(layers):
    objects = copy.deepcopy(layers["docker-cpu-demo"])
    before = {
        c["name"]: c["labels"]["dinops.io/template-sha256"] for c in DOCKER.docker_plan(objects, SETTINGS)["containers"]
    }
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].startswith("dinops-serve-config"):
            obj["data"]["DINO_THRESHOLD"] = "0.5"
    after = {
        c["name"]: c["labels"]["dinops.io/template-sha256"] for c in DOCKER.docker_plan(objects, SETTINGS)["containers"]
    }
    assert [name for name in before if before[name] != after[name]] == ["dinops-serve"]


def _job(**pod_changes):
    container = {"name": "work", "image": "dinops-train:1", "args": ["dinops", "train"]}
    pod = {"containers": [container], "restartPolicy": "Never"}
    for key, value in pod_changes.items():
        if key.startswith("c_"):
            container[key[2:]] = value
        else:
            pod[key] = value
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "dinops-train"},
            "spec": {"backoffLimit": 2, "template": {"metadata": {"labels": {}}, "spec": pod}}}  # fmt: skip


@pytest.mark.parametrize(
    ("job", "message"),
    [
        (_job(c_workingDir="/x"), "does not translate ['work.workingDir']"),
        (_job(hostNetwork=True), "does not translate ['hostNetwork']"),
        (_job(c_env=[{"name": "A", "valueFrom": {"fieldRef": {}}}]), "env A uses valueFrom"),
        (_job(c_envFrom=[{"configMapRef": {"name": "missing"}}]), "ConfigMap 'missing' is not in the layer"),
        (_job(c_readinessProbe={"exec": {"command": ["true"]}}), "only httpGet probes"),
        (
            _job(initContainers=[{"name": "w", "image": "other:1", "args": ["x"]}]),
            "init container w needs the main image",
        ),
        (
            _job(
                initContainers=[
                    {"name": "w", "image": "dinops-train:1", "args": ["x"], "env": [{"name": "A", "value": "1"}]}
                ]
            ),
            "init container w sets ['A'] unlike the main container",
        ),
        (
            _job(
                c_volumeMounts=[{"name": "h", "mountPath": "/h"}], volumes=[{"name": "h", "hostPath": {"path": "/h"}}]
            ),
            "knows persistentVolumeClaim, emptyDir, configMap and secret",
        ),
        (_job(c_envFrom=[{"secretRef": {"name": "dinops-s3"}}]), "envFrom 'dinops-s3' is a Secret"),
        (
            _job(
                c_volumeMounts=[{"name": "s", "mountPath": "/s"}],
                volumes=[{"name": "s", "secret": {"secretName": "x"}}],
            ),
            "secret volume s needs runAsUser",
        ),
        (
            _job(
                securityContext={"runAsUser": 1},
                c_volumeMounts=[{"name": "s", "mountPath": "/s"}],
                volumes=[{"name": "s", "secret": {"secretName": "x", "items": [{"key": "a", "path": "b"}]}}],
            ),
            "secret volume s: items are not translated",
        ),
        (_job(c_readinessProbe={"httpGet": {"port": 1, "scheme": "TCP"}}), "probe scheme 'TCP'"),
        (_job(containers=[{"name": "a", "image": "i"}, {"name": "b", "image": "i"}]), "one container per workload"),
        (_job(c_resources={"limits": {"memory": "lots"}}), "not a memory quantity: 'lots'"),
        (_job(c_resources={"limits": {"cpu": "two"}}), "not a CPU quantity: 'two'"),
    ],
)
def test_what_docker_cannot_run_is_refused_by_name(job, message):
    with pytest.raises(
        DOCKER.DockerRuntimeError, match=".*" + message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
    ):
        DOCKER.docker_plan([job], SETTINGS)


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"data_dir": "relative", "network": "dinops"}, "absolute path"), ({"data_dir": "/d", "network": ""}, "network")],
)
def test_bad_settings_name_the_variable(settings, message):
    with pytest.raises(DOCKER.DockerRuntimeError, match=message):
        DOCKER.docker_plan([], settings)


def test_kinds_docker_cannot_run_are_refused():
    with pytest.raises(DOCKER.DockerRuntimeError, match="CronJob nightly: the Docker runtime cannot run"):
        DOCKER.docker_plan([{"kind": "CronJob", "metadata": {"name": "nightly"}}], SETTINGS)


# docker_container_info's answers (community.docker 4.8: {exists, container: docker inspect's object}), trimmed.
def _info(status: str, code: int, restarts: int = 0, hash_: str = "h" * 64, running: bool = False) -> dict:
    return {
        "exists": True,
        "container": {
            "Config": {"Labels": {"dinops.io/template-sha256": hash_}},
            "RestartCount": restarts,
            "State": {"Status": status, "Running": running, "Restarting": status == "restarting", "ExitCode": code},
        },
    }
    # fmt: skip


JOB = {"name": "dinops-download", "restart_retries": 4, "labels": {"dinops.io/template-sha256": "h" * 64}}


@pytest.mark.parametrize(
    ("info", "state"),
    [
        ({"exists": False, "container": None}, "missing"),
        (_info("exited", 0, hash_="x" * 64), "stale"),
        (_info("running", 0, running=True), "running"),
        (_info("restarting", 137, restarts=1), "restarting"),
        (_info("created", 0), "created"),
        (_info("exited", 0), "complete"),
        (_info("exited", 2, restarts=4), "failed"),
        (_info("exited", 143, restarts=1), "exited"),
    ],
)
def test_where_a_job_container_stands(info, state):
    got = STATE.docker_job_state(info, JOB)
    assert got["state"] == state, json.dumps(got)
    if state == "failed":
        assert "exit code 2 after 4 restart(s)" in got["message"] and "docker logs dinops-download" in got["message"]


def _secret_reader(name: str, uid: int) -> dict:
    job = _job(securityContext={"runAsUser": uid, "fsGroup": 10001},
               c_volumeMounts=[{"name": "s", "mountPath": "/run/secrets/dinops-s3", "readOnly": True}],
               volumes=[{"name": "s", "secret": {"secretName": "dinops-s3", "defaultMode": 0o440}}])  # fmt: skip
    job["metadata"]["name"] = name
    return job


def test_a_secret_volume_is_a_directory_of_its_readers_user_mounted_read_only():
    plan = DOCKER.docker_plan(
        [_secret_reader("dinops-train", 10001), _secret_reader("dinops-download", 10001)], SETTINGS
    )
    assert plan["secrets"] == [
        {"name": "dinops-s3", "path": "/var/lib/dinops/volumes/.secrets/dinops-s3", "owner": 10001}
    ]
    for container in plan["containers"]:
        assert container["mounts"] == [
            {"type": "bind", "source": "/var/lib/dinops/volumes/.secrets/dinops-s3", "target": "/run/secrets/dinops-s3",
             "read_only": True}
        ]  # fmt: skip
        assert container["groups"] == ["10001"]


def test_a_secret_read_by_two_users_is_refused():
    with pytest.raises(
        DOCKER.DockerRuntimeError,
        match="Job dinops-train: Secret dinops-s3 is read by users 0 and 10001; its files can be readable by one user",
    ):
        DOCKER.docker_plan([_secret_reader("dinops-train", 10001), _secret_reader("dinops-download", 0)], SETTINGS)


def test_an_https_probe_skips_verification_as_the_kubelet_does():
    job = _job(c_ports=[{"name": "http", "containerPort": 8080}],
               c_readinessProbe={"httpGet": {"path": "/readyz", "port": "http", "scheme": "HTTPS"}})  # fmt: skip
    (container,) = DOCKER.docker_plan([job], SETTINGS)["containers"]
    code = container["healthcheck"]["test"][-1]
    assert "'https://127.0.0.1:8080/readyz'" in code and "context=ssl._create_unverified_context()" in code


def test_the_derived_states_keep_nothing_of_the_inspect_output():
    secret_env = {"Config": {"Env": ["AWS_SECRET_ACCESS_KEY=s3cr3t"]}}
    running = _info("running", 0, running=True)
    running["container"]["Config"]["Env"] = secret_env["Config"]["Env"]
    states = STATE.docker_job_states([running], [JOB])
    assert states == {"dinops-download": {"state": "running", "message": "dinops-download is running (0 restart(s))"}}
    healthy = {"exists": True, "container": {**secret_env, "State": {"Status": "running", "Health": {
        "Status": "healthy", "Log": [{"Output": "ok\n"}]}}}}  # fmt: skip
    health = STATE.docker_health([healthy, {"exists": False, "container": None}], ["dinops-serve", "dinops-client"])
    assert health == [
        {"name": "dinops-serve", "healthy": True, "status": "running", "output": "ok"},
        {"name": "dinops-client", "healthy": False, "status": "missing", "output": "none"},
    ]
    assert "s3cr3t" not in json.dumps([states, health])


def test_a_public_client_reads_its_login_and_tls_from_files_and_probes_over_https(layers):
    plan = DOCKER.docker_plan(layers["docker-cpu-public"], {**SETTINGS, "publish_address": "0.0.0.0"})
    client = next(c for c in plan["containers"] if c["name"] == "dinops-client")
    assert client["env"]["CLIENT_PUBLIC"] == "true"
    assert client["env"]["CLIENT_TLS_CERT_FILE"] == "/run/secrets/dinops-client/tls.crt"
    store = "/var/lib/dinops/volumes/.secrets/dinops-client-auth"
    assert {"type": "bind", "source": store, "target": "/run/secrets/dinops-client", "read_only": True} in (
        client["mounts"]
    )
    assert plan["secrets"] == [{"name": "dinops-client-auth", "path": store, "owner": 10001}]
    assert client["groups"] == ["10001"]
    assert "'https://127.0.0.1:8080/readyz'" in client["healthcheck"]["test"][-1]
    assert client["published_ports"] == ["0.0.0.0:30000:8080"]

"""The Docker runtime (dinops_cluster: docker): the rendered Kubernetes objects of a host's layer, as containers.

One description of the workloads, two runtimes: the same kustomize layer that the Kubernetes runtime applies
(k8s/base, the overlay, the components, the host's generated layer with its profile) is rendered, and this module
translates its Jobs and Deployments into community.docker.docker_container parameters. Nothing about the apps is
written here: images, commands, DINO_* settings (the ConfigMaps), volumes, /dev/shm, resources, probes and gates all
come from the objects. tests/k8s/test_docker_runtime.py renders both from the same layer and fails when they drift.

``dinops_docker_plan(objects, settings)`` returns {network, directories, containers} (see ``docker_plan``).
Where the planned containers and directories stand on the host is docker_state.py's.

Sources of the Kubernetes and Docker semantics used below:
- Pod fields: https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/ (command is the
  entrypoint, args its arguments: https://kubernetes.io/docs/tasks/inject-data-application/
  define-command-argument-container/#notes).
- allowPrivilegeEscalation false sets no_new_privs: https://kubernetes.io/docs/tasks/configure-pod-container/
  security-context/ ; Docker's equivalent is --security-opt no-new-privileges
  (https://docs.docker.com/reference/cli/docker/container/run/#security-opt).
- CPU requests become cgroup shares as the kubelet computes them (milliCPU * 1024 / 1000):
  kubernetes pkg/kubelet/cm/helpers_linux.go MilliCPUToShares; Docker's --cpu-shares takes the same number.
- Restart policies: https://docs.docker.com/engine/containers/start-containers-automatically/ . A container that
  the daemon stopped while shutting down (a host reboot) is not "manually stopped" and is restarted by its policy
  on the next start; `docker stop`/`docker kill` by a user marks it manually stopped (moby daemon/kill.go:
  `if !daemon.IsShuttingDown() { container.HasBeenManuallyStopped = true }`).
- docker_container options: https://docs.ansible.com/ansible/latest/collections/community/docker/
  docker_container_module.html (community.docker 4.8).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shlex
from pathlib import Path
from typing import Any

# The quantities filter file, read by path as Ansible loads each plugin file on its own: one parser of Kubernetes
# quantities and one name of the GPU resource for both runtimes.
_SPEC = importlib.util.spec_from_file_location(
    "dinops_quantities_for_docker", Path(__file__).with_name("quantities.py")
)
quantities = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(quantities)

# The Kubernetes objects this runtime understands; anything else in the layer is refused by name.
WORKLOAD_KINDS = ("Job", "Deployment")
CONSUMED_KINDS = ("Namespace", "ConfigMap", "PersistentVolumeClaim", "Service", "PersistentVolume")
# Kinds that only mean something on a cluster (an Ingress needs an ingress controller; the NodePort is published; a
# NetworkPolicy needs a network plugin that enforces it: on Docker, the containers' bridge network is theirs alone and
# only the published port reaches them from the host, docs/security.md).
CLUSTER_ONLY_KINDS = ("Ingress", "NetworkPolicy")
# Kinds of the Kubeflow operators (k8s/components/{trainjob,pytorchjob,katib-experiment}) and the setting that asks
# for them: this runtime runs training as the batch Job's container only.
KUBEFLOW_KINDS = {
    "TrainJob": "workloads_train_kind",
    "TrainingRuntime": "workloads_train_kind",
    "PyTorchJob": "workloads_train_kind",
    "Experiment": "workloads_hpo",
}
# A ClusterIP Service of something without a login (Prometheus, k8s/components/monitoring): on a cluster users reach it
# with kubectl port-forward; here its one port is published on the host's loopback at the port this annotation names
# (settings loopback_ports may move it), never on publish_address, which may be a public one (docs/security.md).
LOOPBACK_ANNOTATION = "dinops.io/docker-loopback-port"
LOOPBACK = "127.0.0.1"
HASH_LABEL = "dinops.io/template-sha256"
KIND_LABEL = "dinops.io/kind"
RUNTIME_LABEL = "dinops.io/runtime"
# The image's entrypoint is tini (apps/images/*.Dockerfile); a gate runs in front of the main command under it.
TINI = ["/usr/bin/tini", "--"]
# Docker runs a health probe as a process inside the container (an interpreter start), not as the kubelet's direct
# HTTP GET, so a probe's timeout gets a floor.
PROBE_TIMEOUT_FLOOR_S = 5


# Every field of a pod and of a container the layer may hold: translated, or meaningful only to a scheduler. A field
# outside these lists is refused, so that a change to the manifests cannot be silently dropped by this runtime.
POD_FIELDS = {"containers", "initContainers", "volumes", "securityContext", "restartPolicy",
              "terminationGracePeriodSeconds"}  # fmt: skip
# automountServiceAccountToken: Docker mounts no Kubernetes token into a container in the first place.
SCHEDULER_POD_FIELDS = {"tolerations", "nodeSelector", "affinity", "runtimeClassName", "priorityClassName",
                        "automountServiceAccountToken"}  # fmt: skip
# Every field of a Job's and a Deployment's own spec the layer may hold, refused otherwise as the pod's are. A
# Deployment's selector means nothing to a container found by its name; its strategy is always Recreate here (one
# container of that name: the old one goes before the new one starts).
SPEC_FIELDS = {"Job": {"template", "backoffLimit", "podFailurePolicy"},
               "Deployment": {"template", "replicas", "selector", "strategy"}}  # fmt: skip
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports", "resources",
                    "securityContext", "volumeMounts", "readinessProbe", "livenessProbe", "startupProbe"}  # fmt: skip


class DockerRuntimeError(ValueError):
    """The layer holds something the Docker runtime cannot run; the message names the object."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise DockerRuntimeError(message)


def _memory_mi(value: Any, where: str) -> int:
    """A memory quantity in whole MiB (at least 1), by the rule the layer's sizing uses (quantities.quantity_mi)."""
    try:
        return max(quantities.quantity_mi(value), 1)
    except quantities.WorkloadsError as exc:
        raise DockerRuntimeError(f"{where}: {exc}") from None


def _cpu_m(value: Any, where: str) -> int:
    try:
        return quantities.cpu_m(value)
    except ValueError:
        raise DockerRuntimeError(f"{where}: not a CPU quantity: {value!r}") from None


def _env(container: dict[str, Any], config_maps: dict[str, dict[str, str]], where: str) -> dict[str, str]:
    """envFrom ConfigMaps first, then env entries (env wins, as in Kubernetes)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        # A Secret's values in the environment are in `docker inspect` (Config.Env) and in every module result
        # that returns it: Secrets reach containers as read-only files only (see _secret_volume).
        secret = (source.get("secretRef") or {}).get("name")
        _require("secretRef" not in source, f"{where}: envFrom {secret!r} is a Secret; the Docker runtime hands "
                 "Secrets over as files only: mount it as a secret volume")  # fmt: skip
        ref = source.get("configMapRef") or {}
        _require(bool(ref), f"{where}: envFrom supports configMapRef only, got {sorted(source)}")
        name = ref.get("name")
        _require(name in config_maps or ref.get("optional"), f"{where}: ConfigMap {name!r} is not in the layer")
        env.update(config_maps.get(name, {}))
    for item in container.get("env") or []:
        _require(
            "valueFrom" not in item, f"{where}: env {item.get('name')} uses valueFrom, which Docker cannot resolve"
        )
        env[str(item["name"])] = str(item.get("value", ""))
    return env


def _secret_volume(
    volume: dict[str, Any], uid: Any, index: dict[str, Any], settings: dict[str, Any], where: str
) -> str:
    """A secret volume is a host directory, data_dir/.secrets/<secret>/ with one file per key, that the role fills
    (no_log) and makes readable by the container's user only (directory 0500, files 0400, owner runAsUser); it is
    bind-mounted read-only at the mountPath, as the kubelet mounts a Secret
    (https://kubernetes.io/docs/concepts/configuration/secret/#using-secrets-as-files-from-a-pod). Only the path
    enters the plan: the values never reach the plan, the facts, `docker inspect` or a module's result."""
    ref = volume["secret"]
    name = ref.get("secretName")
    _require(bool(name), f"{where}: secret volume {volume['name']} names no secretName")
    _require(not ref.get("items"), f"{where}: secret volume {volume['name']}: items are not translated")
    _require(uid is not None, f"{where}: secret volume {volume['name']} needs runAsUser (the files' owner)")
    path = f"{settings['data_dir'].rstrip('/')}/.secrets/{name}"
    known = index["secrets"].setdefault(name, {"name": name, "path": path, "owner": int(uid)})
    _require(known["owner"] == int(uid), f"{where}: Secret {name} is read by users {known['owner']} and {uid}; "
             "its files can be readable by one user only")  # fmt: skip
    return path


def _get(probe: dict[str, Any], ports: dict[str, int], where: str) -> str:
    """One httpGet probe as a python3 statement (in every image; there is no curl)."""
    get = probe.get("httpGet")
    _require(bool(get), f"{where}: only httpGet probes translate to a Docker healthcheck")
    port = get.get("port")
    port = ports.get(port) if isinstance(port, str) else int(port)
    _require(port is not None, f"{where}: probe port {get.get('port')!r} is not a declared container port")
    timeout = max(int(probe.get("timeoutSeconds") or 1), PROBE_TIMEOUT_FLOOR_S)
    scheme = str(get.get("scheme") or "HTTP").upper()
    _require(scheme in ("HTTP", "HTTPS"), f"{where}: probe scheme {scheme!r} is not HTTP or HTTPS")
    url = f"{scheme.lower()}://127.0.0.1:{port}{get.get('path') or '/'}"
    if scheme == "HTTPS":
        # As the kubelet: "If scheme field is set to HTTPS, the kubelet sends an HTTPS request skipping the
        # certificate verification" (https://kubernetes.io/docs/tasks/configure-pod-container/
        # configure-liveness-readiness-startup-probes/#http-probes).
        return f"urllib.request.urlopen({url!r}, timeout={timeout}, context=ssl._create_unverified_context())"
    return f"urllib.request.urlopen({url!r}, timeout={timeout})"


def _health(main: dict[str, Any], ports: dict[str, int], where: str) -> dict[str, Any] | None:
    """The readiness and liveness probes as Docker's one healthcheck: healthy while every endpoint answers (each
    probe's GET in turn), at the readiness probe's period and failure threshold (else the liveness probe's).

    Docker only reports the status: it never restarts a container for being unhealthy (moby/moby#28400, open; a
    restart policy acts on exits only), so a hung server that the kubelet's liveness probe would restart stays up,
    reported unhealthy (the role's wait and the validator's docker section fail on it) (round2 audit, finding 9).
    """
    readiness, liveness = main.get("readinessProbe"), main.get("livenessProbe")
    probe = readiness or liveness
    if not probe:
        return None
    gets = list(dict.fromkeys(_get(p, ports, where) for p in (readiness, liveness) if p))
    code = ("import ssl, urllib.request; " if any("context=" in g for g in gets) else "import urllib.request; ") + (
        "; ".join(gets)
    )
    timeout = max(max(int(p.get("timeoutSeconds") or 1), PROBE_TIMEOUT_FLOOR_S) for p in (readiness, liveness) if p)
    # The startup probe's budget (period x failures) is the time a start may take before failures count.
    startup = main.get("startupProbe") or {}
    start = int(startup.get("periodSeconds") or 10) * int(startup.get("failureThreshold") or 0)
    check = {
        "test": ["CMD", "python3", "-c", code],
        "interval": f"{int(probe.get('periodSeconds') or 10)}s",
        # Each GET has its own timeout inside; the check as a whole may take them all.
        "timeout": f"{timeout * len(gets)}s",
        "retries": int(probe.get("failureThreshold") or 3),
    }
    # A start period of 0 means "the image's" to Docker (the images' HEALTHCHECK has its own), so at least 1 s.
    check["start_period"] = f"{max(start, 1)}s"
    return check


def _exit_code_rules(policy: dict[str, Any] | None, main: dict[str, Any], where: str) -> dict[str, list[int]]:
    """A Job's podFailurePolicy (https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-failure-policy)
    for its one container: {fail: the exit codes that fail the Job at once (FailJob, onExitCodes In), ignore: those
    retried without counting against backoffLimit (Ignore, onExitCodes In)}.

    docker_state.py reports a FailJob exit as failed at the first such exit instead of after the restart policy's
    retries. An Ignore exit is as far as Docker can take it: its restart policy restarts the container (on-failure
    restarts every non-zero exit) but counts the restart, as it counts every one (on-failure:N has no exit-code
    filter; https://docs.docker.com/engine/containers/start-containers-automatically/), so docker_state.py reports
    it as waiting for its storage while Docker restarts it, and failed, with what to do, once Docker gave up.
    Ignore rules on DisruptionTarget (eviction, preemption, drain) have nothing to match here: Docker has no
    disruptions, and a host's shutdown stops the container without counting a failure (the daemon restores it)."""
    codes: dict[str, list[int]] = {"fail": [], "ignore": []}
    for rule in (policy or {}).get("rules") or []:
        exits, conditions = rule.get("onExitCodes"), rule.get("onPodConditions") or []
        if rule.get("action") in ("FailJob", "Ignore") and exits and not conditions:
            _require(exits.get("operator") == "In", f"{where}: podFailurePolicy onExitCodes operator "
                     f"{exits.get('operator')!r} is not translated (In is)")  # fmt: skip
            _require(exits.get("containerName") in (None, main.get("name")), f"{where}: podFailurePolicy names "
                     f"container {exits.get('containerName')!r}, not {main.get('name')!r}")  # fmt: skip
            codes["fail" if rule["action"] == "FailJob" else "ignore"] += [int(c) for c in exits.get("values") or []]
        elif (
            rule.get("action") == "Ignore"
            and not exits
            and all(c.get("type") == "DisruptionTarget" for c in conditions)
        ):
            continue
        else:
            _require(False, f"{where}: podFailurePolicy rule {rule} is not translated (FailJob and Ignore onExitCodes "
                     "In, and Ignore DisruptionTarget are)")  # fmt: skip
    return {action: sorted(set(values)) for action, values in codes.items()}


def _gate(init: dict[str, Any], main: dict[str, Any], where: str) -> str:
    """An init container as a gate in front of the main command, in the same container (Docker has no init
    containers). Only when it can be the same process tree: same image, no command of its own."""
    name = init.get("name")
    _require(init.get("image") == main.get("image"), f"{where}: init container {name} needs the main image")
    _require(not init.get("command"), f"{where}: init container {name} sets a command; only args translate")
    mounts = {(m["name"], m["mountPath"]) for m in main.get("volumeMounts") or []}
    extra = [m["mountPath"] for m in init.get("volumeMounts") or [] if (m["name"], m["mountPath"]) not in mounts]
    _require(not extra, f"{where}: init container {name} mounts {extra}, which the main container does not")
    return shlex.join([str(a) for a in init.get("args") or []])


def _container(obj: dict[str, Any], index: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    kind, name = obj["kind"], obj["metadata"]["name"]
    where = f"{kind} {name}"
    template = obj["spec"]["template"]
    pod = template["spec"]
    containers = pod.get("containers") or []
    _require(
        len(containers) == 1, f"{where}: the Docker runtime runs one container per workload, got {len(containers)}"
    )
    main = containers[0]
    unknown = {f"spec.{field}" for field in set(obj["spec"]) - SPEC_FIELDS[kind]}
    unknown |= set(pod) - POD_FIELDS - SCHEDULER_POD_FIELDS
    for container in [main, *(pod.get("initContainers") or [])]:
        unknown |= {f"{container.get('name')}.{field}" for field in set(container) - CONTAINER_FIELDS}
    _require(not unknown, f"{where}: the Docker runtime does not translate {sorted(unknown)}; teach "
             "roles/workloads/filter_plugins/docker_runtime.py (and its test) what they mean")  # fmt: skip
    security = pod.get("securityContext") or {}
    csec = main.get("securityContext") or {}
    ports = {p["name"]: int(p["containerPort"]) for p in main.get("ports") or [] if p.get("name")}
    env = _env(main, index["config_maps"], where)
    inits = pod.get("initContainers") or []
    for init in inits:
        # The gate runs with the main container's environment: an init container that sees another one is refused.
        init_env = _env(init, index["config_maps"], f"{where} init container {init.get('name')}")
        differs = sorted(k for k, v in init_env.items() if env.get(k) != v)
        _require(not differs, f"{where}: init container {init.get('name')} sets {differs} unlike the main container")
    argv = [str(a) for a in main.get("args") or []]
    spec: dict[str, Any] = {"name": name, "kind": kind, "image": main["image"]}
    if inits:
        gates = " && ".join(_gate(init, main, where) for init in inits)
        spec["entrypoint"] = [*TINI, "sh", "-c", f'{gates} && exec "$@"', "sh", *(main.get("command") or [])]
        spec["command"] = argv
    else:
        if main.get("command"):
            spec["entrypoint"] = [str(c) for c in main["command"]]
        if argv:
            spec["command"] = argv
    spec["env"] = dict(sorted(env.items()))
    user = csec.get("runAsUser", security.get("runAsUser"))
    group = csec.get("runAsGroup", security.get("runAsGroup"))

    # Volumes: claims are host directories; a memory emptyDir at /dev/shm is the shm size, other memory emptyDirs
    # tmpfs, disk emptyDirs anonymous volumes.
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    mounts, shm = [], None
    for mount in main.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        _require(volume is not None, f"{where}: volumeMount {mount['name']} has no volume")
        target = mount["mountPath"]
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            _require(claim in index["claims"], f"{where}: claim {claim} is not in the layer")
            read_only = bool(mount.get("readOnly") or volume["persistentVolumeClaim"].get("readOnly"))
            source = f"{settings['data_dir'].rstrip('/')}/{claim}"
            mounts.append({"type": "bind", "source": source, "target": target, "read_only": read_only})
        elif "emptyDir" in volume:
            empty = volume["emptyDir"] or {}
            size = empty.get("sizeLimit")
            if target == "/dev/shm":
                _require(empty.get("medium") == "Memory", f"{where}: /dev/shm must be a Memory emptyDir")
                shm = f"{_memory_mi(size or '64Mi', where)}m"
                continue
            if empty.get("medium") != "Memory":
                # On a node an emptyDir is on its disk. A tmpfs would hold it in RAM, charged to the container's
                # memory limit (round2 audit, finding 10): an anonymous volume instead, on Docker's data root, new
                # with each container (the role creates and removes containers with keep_volumes false, so a
                # recreated container starts empty and the old volume goes), kept across restarts as a pod's. Its
                # sizeLimit is not enforced: Docker's local volumes have no size (the kubelet would evict the pod).
                mounts.append({"type": "volume", "target": target})
                continue
            tmpfs = {"type": "tmpfs", "target": target, "tmpfs_mode": "1777"}
            if size:
                tmpfs["tmpfs_size"] = f"{_memory_mi(size, where)}m"
            mounts.append(tmpfs)
        elif "configMap" in volume:
            # The ConfigMap's keys as files in a host directory named after it (kustomize's name carries a hash of
            # the content, so new content is a new directory and the container is recreated), mounted read-only.
            ref = volume["configMap"]
            _require(
                ref.get("name") in index["config_maps"], f"{where}: ConfigMap {ref.get('name')!r} is not in the layer"
            )
            _require(not ref.get("items"), f"{where}: configMap volume {mount['name']}: items are not translated")
            source = f"{settings['data_dir'].rstrip('/')}/.config/{ref['name']}"
            for key, content in sorted(index["config_maps"][ref["name"]].items()):
                index["files"][f"{source}/{key}"] = content
            mounts.append({"type": "bind", "source": source, "target": target, "read_only": True})
        elif "secret" in volume:
            source = _secret_volume(volume, user, index, settings, where)
            mounts.append({"type": "bind", "source": source, "target": target, "read_only": True})
        else:
            _require(False, f"{where}: volume {mount['name']} is {sorted(set(volume) - {'name'})}; the Docker "
                     "runtime knows persistentVolumeClaim, emptyDir, configMap and secret")  # fmt: skip
    spec["mounts"] = mounts
    if shm:
        spec["shm_size"] = shm

    # Resources: limits are the container's; requests are the cgroup weight and the memory reservation.
    resources = main.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    if "cpu" in limits:
        spec["cpus"] = _cpu_m(limits["cpu"], where) / 1000
    if "memory" in limits:
        spec["memory"] = f"{_memory_mi(limits['memory'], where)}m"
        # No swap beyond the limit, as on a kubelet node (swap off): memory_swap equal to memory.
        spec["memory_swap"] = spec["memory"]
    if "cpu" in requests:
        spec["cpu_shares"] = max(_cpu_m(requests["cpu"], where) * 1024 // 1000, 2)
    if "memory" in requests:
        spec["memory_reservation"] = f"{_memory_mi(requests['memory'], where)}m"
    gpus = int(limits.get(quantities.GPU_RESOURCE) or 0)
    if gpus:
        spec["device_requests"] = [{"driver": "nvidia", "count": gpus, "capabilities": [["gpu"]]}]

    # Who runs it and how locked down.
    if user is not None:
        spec["user"] = f"{user}:{group}" if group is not None else str(user)
    if security.get("fsGroup") is not None:
        spec["groups"] = [str(security["fsGroup"])]
    spec["read_only"] = bool(csec.get("readOnlyRootFilesystem"))
    drop = (csec.get("capabilities") or {}).get("drop") or []
    if drop:
        spec["cap_drop"] = [str(c) for c in drop]
    if csec.get("allowPrivilegeEscalation") is False:
        spec["security_opts"] = ["no-new-privileges"]

    # Kubernetes Jobs run to completion and are retried backoffLimit times; Deployments run for ever.
    if kind == "Job":
        spec["restart_policy"] = "on-failure"
        spec["restart_retries"] = int(obj["spec"].get("backoffLimit", 6))
        codes = _exit_code_rules(obj["spec"].get("podFailurePolicy"), main, where)
        if codes["fail"]:
            spec["fail_exit_codes"] = codes["fail"]
        if codes["ignore"]:
            spec["ignore_exit_codes"] = codes["ignore"]
    else:
        _require(int(obj["spec"].get("replicas", 1)) == 1, f"{where}: the Docker runtime runs one replica, "
                 f"got replicas {obj['spec'].get('replicas')}")  # fmt: skip
        spec["restart_policy"] = "unless-stopped"
    spec["stop_timeout"] = int(pod.get("terminationGracePeriodSeconds", 30))
    health = _health(main, ports, where)
    if health:
        spec["healthcheck"] = health

    # Services: the container answers on the network by each Service's name; a NodePort is published on the host.
    labels = template["metadata"].get("labels") or {}
    aliases, published = [], []
    for service in index["services"]:
        selector = service["spec"].get("selector") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            continue
        aliases.append(service["metadata"]["name"])
        loopback = _loopback_port(service, settings)  # its Service has exactly one port
        for port in service["spec"].get("ports") or []:
            target = port.get("targetPort", port["port"])
            target = ports.get(target) if isinstance(target, str) else int(target)
            _require(target is not None, f"Service {service['metadata']['name']}: targetPort is not a port of {name}")
            if service["spec"].get("type") == "NodePort" and port.get("nodePort"):
                host_port = int(settings.get("node_ports", {}).get(int(port["nodePort"]), port["nodePort"]))
                published.append(f"{settings.get('publish_address') or LOOPBACK}:{host_port}:{target}")
            if loopback:
                published.append(f"{LOOPBACK}:{loopback}:{target}")
    spec["networks"] = [{"name": settings["network"], "aliases": sorted(set(aliases) - {name})}]
    if published:
        spec["published_ports"] = published
    component = labels.get("app.kubernetes.io/component", name)
    spec["labels"] = {
        "app.kubernetes.io/part-of": "dinops",
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        RUNTIME_LABEL: "docker",
        KIND_LABEL: kind,
    }
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    spec["labels"][HASH_LABEL] = hashlib.sha256(canonical.encode()).hexdigest()
    return spec


def _loopback_port(service: dict[str, Any], settings: dict[str, Any]) -> int | None:
    """The host port a Service with LOOPBACK_ANNOTATION is published on (on 127.0.0.1 only), or None without it."""
    name = service["metadata"]["name"]
    value = ((service["metadata"].get("annotations") or {}).get(LOOPBACK_ANNOTATION) or "").strip()
    if not value:
        return None
    _require(value.isdigit() and 0 < int(value) < 65536, f"Service {name}: {LOOPBACK_ANNOTATION} must be a port "
             f"number, got {value!r}")  # fmt: skip
    _require(service["spec"].get("type", "ClusterIP") == "ClusterIP" and service["spec"].get("clusterIP") != "None",
             f"Service {name}: {LOOPBACK_ANNOTATION} is for a ClusterIP Service (a NodePort is published on "
             "publish_address, a headless Service has no port of its own)")  # fmt: skip
    _require(len(service["spec"].get("ports") or []) == 1, f"Service {name}: {LOOPBACK_ANNOTATION} publishes one "
             "port; the Service has several")  # fmt: skip
    port = int((settings.get("loopback_ports") or {}).get(int(value), value))
    _require(0 < port < 65536, f"Service {name}: its loopback host port must be 1-65535, got {port}")
    return port


# Seconds systemd gives dockerd beyond its longest container stop timeout at shutdown: dockerd adds a 5 s grace to the
# longest stop timeout (moby daemon.ShutdownTimeout) and then stops its own plugins and containerd's tasks.
SHUTDOWN_MARGIN_S = 30

# The order in which containers are created: data first, then training, then serving and the client that calls it,
# then Prometheus, which scrapes them.
ORDER = ("dinops-download", "dinops-checkpoint", "dinops-train", "dinops-serve", "dinops-client", "dinops-prometheus")


def docker_plan(objects: list[dict[str, Any]], settings: dict[str, Any]) -> dict[str, Any]:
    """The containers of a rendered layer.

    ``settings``: data_dir (the host directory that holds one directory per claim), network (the bridge network's
    name), publish_address (where NodePorts are published, default loopback only), node_ports ({nodePort: host
    port}, to move one), loopback_ports ({port of LOOPBACK_ANNOTATION: host port}, to move one; always on
    127.0.0.1), owner ({uid, gid} of the claims' directories, default the pods' runAsUser/fsGroup).
    Returns {network, directories: [{path, owner, group, mode}], files: [{path, content}] (configMap volumes),
    containers: [docker_container parameters], names: [container names in start order], secrets: [{name, path,
    owner} of the Secrets the containers mount: a directory per Secret, one file per key, see _secret_volume]}.
    """
    _require(bool(settings.get("data_dir")), "workloads_docker_data_dir must be a directory on the host")
    _require(str(settings["data_dir"]).startswith("/"), "workloads_docker_data_dir must be an absolute path")
    _require(bool(settings.get("network")), "workloads_docker_network must name a Docker network")
    index: dict[str, Any] = {"config_maps": {}, "claims": set(), "services": [], "files": {}, "secrets": {}}
    workloads = []
    for obj in objects:
        if not obj:
            continue
        kind = obj.get("kind")
        name = (obj.get("metadata") or {}).get("name")
        if kind == "ConfigMap":
            index["config_maps"][name] = {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
        elif kind == "PersistentVolumeClaim":
            index["claims"].add(name)
        elif kind == "Service":
            index["services"].append(obj)
        elif kind in WORKLOAD_KINDS:
            workloads.append(obj)
        else:
            _require(
                kind not in KUBEFLOW_KINDS,
                f"{kind} {name} comes from {KUBEFLOW_KINDS.get(kind)}, which needs a Kubernetes cluster with the "
                "Kubeflow operators (dinops_cluster minikube or k3s, dinops_platform: true): the Docker runtime "
                "runs training as one container; set workloads_train_kind: job and workloads_hpo: false",
            )
            _require(kind in CONSUMED_KINDS or kind in CLUSTER_ONLY_KINDS,
                     f"{kind} {name}: the Docker runtime cannot run this kind of object")  # fmt: skip
    workloads.sort(
        key=lambda o: (
            ORDER.index(o["metadata"]["name"]) if o["metadata"]["name"] in ORDER else len(ORDER),
            o["metadata"]["name"],
        )
    )
    containers = [_container(obj, index, settings) for obj in workloads]
    # The claims' directories, owned like the pods' fsGroup makes them on a cluster (group-writable, setgid).
    owners = {}
    for obj in workloads:
        pod = obj["spec"]["template"]["spec"]
        sec = pod.get("securityContext") or {}
        for volume in pod.get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if claim:
                owners.setdefault(claim, (sec.get("runAsUser", 0), sec.get("fsGroup", sec.get("runAsGroup", 0))))
    owner = settings.get("owner") or {}
    directories = [
        {
            "path": f"{settings['data_dir'].rstrip('/')}/{claim}",
            "owner": int(owner.get("uid", uid)),
            "group": int(owner.get("gid", gid)),
            "mode": "02775",
        }
        for claim, (uid, gid) in sorted(owners.items())
    ]
    # What dockerd needs before it starts at boot (the docker role's drop-in, docker_service_dropin.py): the claims'
    # directories mounted (an NFS export of nfs_client_mounts: bound before it lands, a container would see the empty
    # directory underneath for ever; audit finding 7), and the time to stop its longest-stopping container.
    service = {
        "requires_mounts_for": [d["path"] for d in directories] or [settings["data_dir"].rstrip("/") or "/"],
        "timeout_stop_s": max([c["stop_timeout"] for c in containers], default=0) + SHUTDOWN_MARGIN_S,
    }
    return {
        "network": settings["network"],
        "directories": directories,
        "service": service,
        # Files of configMap volumes: {path, content}, readable by the containers' user, written before they start.
        "files": [{"path": path, "content": content} for path, content in sorted(index["files"].items())],
        "containers": containers,
        "names": [c["name"] for c in containers],
        # Secret volumes the containers mount ({name, path, owner}): the role fills or checks them before the start.
        "secrets": [index["secrets"][name] for name in sorted(index["secrets"])],
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_docker_plan": docker_plan}

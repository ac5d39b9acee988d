"""Where the Docker runtime's workloads stand on the host, from what Ansible read there: which claim directories
the role creates or corrects (and which it cannot, on a root-squashed NFS export), where each Job's container
stands (complete, running, waiting for its storage, failed: as a Job's conditions would say), and the health of
the Deployments' containers. The containers themselves come from docker_runtime.py's plan, whose template hash
label says whether a container is the one planned.

``dinops_docker_job_state(info, container)``   where a Job's container stands, from docker_container_info.
``dinops_docker_job_states(results, containers)`` the same for a loop over containers, nothing else of the inspect.
``dinops_docker_health(results, names)``       the containers' health and their last check's output.
``dinops_docker_directory_actions(directories, stats, mounts)`` the claim directories to manage, or refused.

Restart policies and their counting: https://docs.docker.com/engine/containers/start-containers-automatically/ .
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

# The plan's vocabulary (its hash label, its refusal), read by path as Ansible loads each plugin file on its own.
_SPEC = importlib.util.spec_from_file_location(
    "dinops_docker_runtime_for_state", Path(__file__).with_name("docker_runtime.py")
)
_runtime = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_runtime)
DockerRuntimeError = _runtime.DockerRuntimeError
_require = _runtime._require
HASH_LABEL = _runtime.HASH_LABEL


# Filesystems where root is not root: an NFS export with root_squash (nfs_server's default, exports(5)) maps uid 0
# to the anonymous user, so chown and chmod by root on the client fail with EPERM (chmod(2)).
SQUASHING_FSTYPES = ("nfs", "nfs4")
# What the containers need of a claim's directory: owner and group as planned, read-write-search for both. The
# setgid bit that new directories get mimics fsGroup but adds nothing here: the containers' primary group is it.
NEEDED_MODE_BITS = 0o770


def _mount_of(path: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The mount that holds ``path``: the longest mount point that is ``path`` or one of its parents."""
    best: dict[str, Any] = {"mount": "/", "fstype": ""}
    for mount in mounts:
        point = str(mount.get("mount") or "")
        if point and (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best["mount"]):
            best = mount
    return best


def docker_directory_actions(
    directories: list[dict[str, Any]], stats: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> dict[str, list]:
    """Which claim directories the role creates or corrects, from an ansible.builtin.stat loop over them (its
    ``results``, in the same order) and the host's ``ansible_facts['mounts']``.

    A directory that exists with the planned owner and group and rwx for both is left alone: root's chown or chmod
    is never needed there, which is what makes a root-squashed NFS export (mounted at the directory by nfs_client,
    docs/data.md) work on the first run (round2 audit, finding 8). A directory that is missing or wrong on such an
    export cannot be fixed from this host: refused with what to run on the data server. Returns {manage: [the
    directories to give to ansible.builtin.file], refused: [messages]}.
    """
    _require(len(stats) == len(directories), "docker_directory_actions: one stat result per directory")
    manage, refused = [], []
    for directory, result in zip(directories, stats, strict=True):
        path, found = directory["path"], result.get("stat") or {}
        if found.get("exists") and not found.get("isdir"):
            refused.append(
                f"{path} exists and is not a directory: move it away; the containers mount a directory there"
            )
            continue
        mode = int(str(found.get("mode") or "0"), 8)
        if (
            found.get("exists")
            and int(found.get("uid", -1)) == int(directory["owner"])
            and int(found.get("gid", -1)) == int(directory["group"])
            and mode & NEEDED_MODE_BITS == NEEDED_MODE_BITS
        ):
            continue
        mount = _mount_of(path, mounts)
        if str(mount.get("fstype")) in SQUASHING_FSTYPES:
            now = (
                f"is owned {found.get('uid')}:{found.get('gid')} with mode {found.get('mode')}"
                if found.get("exists")
                else "does not exist"
            )
            refused.append(
                f"{path} {now} on the NFS mount {mount.get('device', '')} at {mount['mount']}, where root is squashed: "
                f"this host cannot create or change it. On the data server, run `install -d -o {directory['owner']} "
                f"-g {directory['group']} -m 2775 <the exported directory>` (the nfs_server role creates its exports "
                "owned and group-writable so), then run the workloads stage again"
            )
            continue
        manage.append(directory)
    return {"manage": manage, "refused": refused}


def _temporary_failure(name: str, code: int, restarts: int, retries: int, status: dict[str, Any]) -> dict | None:
    """An exit that the Job's podFailurePolicy ignores (Ignore onExitCodes: `dinops train`'s 75, EX_TEMPFAIL, its S3
    output unreachable beyond --s3-retry-minutes): waiting for its storage while Docker restarts it; failed once
    Docker's restart policy, which counts every non-zero exit, gave up (Kubernetes would go on without counting)."""
    what = (
        f"exit code {code} is a temporary failure (podFailurePolicy Ignore; dinops train: its S3 output, the storage, "
        "unreachable beyond --s3-retry-minutes)"
    )
    if status.get("Restarting") or (status.get("Status") == "exited" and restarts < retries):
        return {
            "state": "waiting-for-storage",
            "message": f"{name} is waiting for its storage: {what}; Docker restarts it and it resumes from its "
            f"checkpoint, but counts the restart ({restarts} of {retries}: on-failure counts every non-zero exit). Its "
            f"log: docker logs {name}",
        }
    if status.get("Status") == "exited":
        return {
            "state": "failed",
            "message": f"{name} failed: {what}, after {restarts} restart(s): Docker's restart policy counts every "
            f"non-zero exit and gave up (restart_retries {retries}) where Kubernetes would retry without counting. "
            f"Once the storage answers, run the workloads stage again: training resumes from its checkpoint. Its "
            f"log: docker logs {name}",
        }
    return None


def docker_job_state(info: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Where a Job's container stands, from community.docker.docker_container_info's result.

    state: missing (not created), stale (created from another template: recreate), complete (exited 0, same
    template: leave it, as Kubernetes leaves a finished Job), running, restarting, waiting-for-storage (exited with a
    code the Job's podFailurePolicy ignores, restarted by Docker: see _temporary_failure), failed (exited non-zero
    and its restart policy gave up, or exited with a FailJob code), created. message says why, with the exit code.
    """
    if not info.get("exists"):
        return {"state": "missing", "message": f"{container['name']} does not exist"}
    found = info.get("container") or {}
    labels = (found.get("Config") or {}).get("Labels") or {}
    if labels.get(HASH_LABEL) != container["labels"][HASH_LABEL]:
        return {"state": "stale", "message": f"{container['name']} was created from another template"}
    status = found.get("State") or {}
    code = int(status.get("ExitCode") or 0)
    restarts = int(found.get("RestartCount") or 0)
    if code in (container.get("fail_exit_codes") or []) and (
        status.get("Restarting") or status.get("Status") == "exited"
    ):
        return {
            "state": "failed",
            "message": f"{container['name']} failed: exit code {code} fails the Job at once (podFailurePolicy "
            "FailJob: a bad setting or dataset; Docker's restart policy retries it regardless). Its log: docker logs "
            f"{container['name']}",
        }
    retries = int(container.get("restart_retries") or 0)
    if code in (container.get("ignore_exit_codes") or []) and not status.get("Running"):
        tempfail = _temporary_failure(container["name"], code, restarts, retries, status)
        if tempfail:
            return tempfail
    if status.get("Restarting"):
        return {"state": "restarting", "message": f"{container['name']} is restarting after exit code {code}"}
    if status.get("Running"):
        return {"state": "running", "message": f"{container['name']} is running ({restarts} restart(s))"}
    if status.get("Status") == "created":
        return {"state": "created", "message": f"{container['name']} was created and never started"}
    if status.get("Status") == "exited" and code == 0:
        return {"state": "complete", "message": f"{container['name']} completed (exit 0)"}
    if status.get("Status") == "exited" and code != 0 and restarts >= retries:
        return {
            "state": "failed",
            "message": f"{container['name']} failed: exit code {code} after {restarts} restart(s) "
            f"(restart_retries {retries}). Its log: docker logs {container['name']}",
        }
    return {"state": "exited", "message": f"{container['name']} exited with code {code} ({restarts} restart(s))"}


def docker_job_states(results: list[dict[str, Any]], containers: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """{name: docker_job_state} of a docker_container_info loop over ``containers`` (its ``results``, in the same
    order): the only part of the inspect output the role keeps, so that no task loops over, or prints, the
    containers' Env (docker_container_info returns it)."""
    _require(len(results) == len(containers), "docker_job_states: one docker_container_info result per container")
    return {c["name"]: docker_job_state(r, c) for r, c in zip(results, containers, strict=True)}


def docker_health(results: list[dict[str, Any]], names: list[str]) -> list[dict[str, str]]:
    """[{name, healthy, status, output}] of a docker_container_info loop over container ``names``: the container's
    state, its health and the last health check's output (the probe's own words), nothing else of the inspect."""
    _require(len(results) == len(names), "docker_health: one docker_container_info result per container")
    health = []
    for result, name in zip(results, names, strict=True):
        found = result.get("container") or {} if result.get("exists") else {}
        state = found.get("State") or {}
        checks = (state.get("Health") or {}).get("Log") or []
        status = (state.get("Health") or {}).get("Status") or ""
        health.append({
            "name": name,
            "healthy": status == "healthy",
            "status": state.get("Status") or "missing",
            "output": str((checks[-1] if checks else {}).get("Output") or "none").strip(),
        })  # fmt: skip
    return health


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_docker_job_state": docker_job_state,
            "dinops_docker_job_states": docker_job_states,
            "dinops_docker_health": docker_health,
            "dinops_docker_directory_actions": docker_directory_actions,
        }

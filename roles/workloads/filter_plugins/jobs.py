"""The Jobs of the layer through their life: which are applied (training and download only when asked for), the
hash of what each runs stamped on it, which live ones must be replaced because that hash changed (their templates
are immutable), and where a Job stands from its status.

``dinops_prepare_objects``     the rendered objects to apply: training only when asked, Jobs stamped with a hash.
``dinops_jobs_to_replace``     Jobs (and TrainJobs, PyTorchJobs) whose stamped template hash changed (their
                               templates are immutable, so they are deleted and created again; training then
                               resumes from its checkpoint).
``dinops_job_outcome``         complete, failed (with Kubernetes' reason), running or missing.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

TEMPLATE_HASH_ANNOTATION = "dinops.io/template-sha256"
TRAIN_JOB = "dinops-train"
DOWNLOAD_JOB = "dinops-download"
CHECKPOINT_JOB = "dinops-checkpoint"


def content_hash(value: Any) -> str:
    """SHA-256 of a JSON value in canonical form (sorted keys, no blanks): the same content, the same hash."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def template_hash(job: dict[str, Any]) -> str:
    return content_hash(job["spec"]["template"])


def prepare_objects(objects: list[dict[str, Any]], train: bool, download: bool = True) -> list[dict[str, Any]]:
    """Keep the training and download Jobs only when asked for; stamp every Job with its template's hash."""
    left_out = ({TRAIN_JOB} if not train else set()) | ({DOWNLOAD_JOB} if not download else set())
    prepared = []
    for obj in objects:
        if obj is None:
            continue
        if obj.get("kind") == "Job" and obj["metadata"]["name"] in left_out:
            continue
        if obj.get("kind") == "Job":
            obj = json.loads(json.dumps(obj))
            annotations = obj["metadata"].setdefault("annotations", {})
            annotations[TEMPLATE_HASH_ANNOTATION] = template_hash(obj)
        prepared.append(obj)
    return prepared


# The kinds whose template the API server does not let change in place: the role stamps them with a hash of what
# they run and replaces them when it changes (TrainJob: CEL `self == oldSelf` on spec.trainer and spec.runtimeRef in
# the v2.3.0 CRD; a PyTorchJob's running pods do not follow a changed spec).
REPLACED_KINDS = ("Job", "TrainJob", "PyTorchJob")


def jobs_to_replace(desired: list[dict[str, Any]], live_jobs: list[dict[str, Any]]) -> list[str]:
    """Names of live Jobs (TrainJobs, PyTorchJobs) whose template differs from the desired one of the same kind (by
    the stamped hash). ``live_jobs``: what k8s_info returned, of one or several of REPLACED_KINDS (no kind: a Job)."""
    wanted = {
        (obj["kind"], obj["metadata"]["name"]): obj["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]
        for obj in desired
        if obj.get("kind") in REPLACED_KINDS
    }
    stale = []
    for job in live_jobs:
        key = (job.get("kind", "Job"), job["metadata"]["name"])
        if key not in wanted:
            continue
        live_hash = (job["metadata"].get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)
        if live_hash != wanted[key]:
            stale.append(key[1])
    return sorted(stale)


def job_outcome(resources: list[dict[str, Any]]) -> dict[str, str]:
    """Where a Job stands, from what k8s_info returned for it (``resources``, empty when it does not exist):
    ``state`` is complete, failed, running or missing; ``message`` says why.

    A Job that failed (backoffLimit reached, or a podFailurePolicy FailJob rule such as a bad setting) is reported
    at once, with the reason and message Kubernetes gives, instead of after the wait's timeout.
    """
    if not resources:
        return {"state": "missing", "message": "the Job does not exist"}
    job = resources[0]
    metadata = job.get("metadata", {})
    name = metadata.get("name", "?")
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    # FailureTarget comes before Failed while the last pods terminate; SuccessCriteriaMet before Complete.
    for kind in ("Failed", "FailureTarget"):
        if kind in conditions:
            reason = conditions[kind].get("reason") or "Failed"
            detail = conditions[kind].get("message") or "no message"
            namespace = metadata.get("namespace", "default")
            return {
                "state": "failed",
                "message": f"Job {name} failed ({reason}): {detail}. Its log: kubectl -n {namespace} logs job/{name}",
            }
    if "Complete" in conditions:
        return {"state": "complete", "message": f"Job {name} completed"}
    return {"state": "running", "message": f"Job {name} is running ({status.get('active', 0)} active pod(s))"}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_job_outcome": job_outcome,
            "dinops_prepare_objects": prepare_objects,
            "dinops_jobs_to_replace": jobs_to_replace,
        }

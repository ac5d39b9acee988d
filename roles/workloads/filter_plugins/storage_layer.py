"""Where the layer's data lives beyond the node's claims: both volumes on an NFS export (the PersistentVolumes'
patches and their names, derived from their immutable source) and checkpoints and results in S3 (the apps' settings
and the AWS credentials file of the Secret dinops-s3), each checked before it reaches a pod.

``dinops_aws_credentials_file`` the key `credentials` of the Secret dinops-s3 (an AWS shared credentials file).
"""

from __future__ import annotations

import hashlib
import importlib.util
import ipaddress
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def _sibling(stem: str) -> ModuleType:
    """A sibling filter file, read by path as Ansible loads each plugin file on its own, once per process and folder
    (kept in sys.modules): every workloads filter then raises the one WorkloadsError class its callers catch."""
    name = f"dinops_workloads_{stem}:{Path(__file__).resolve().parent}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{stem}.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


WorkloadsError = _sibling("workloads_error").WorkloadsError
_require = _sibling("workloads_error").require

# Both volumes on an NFS export (k8s/components/nfs-storage): the volumes the component adds, by claim.
NFS_COMPONENT = "components/nfs-storage"
NFS_VOLUMES = {"dataset": "dinops-dataset-nfs", "output": "dinops-output-nfs"}
# What a PV's nfs.server takes: a DNS name (RFC 1123 labels), or an address (IPv4, bracket-less IPv6) that
# ipaddress parses.
NFS_SERVER = re.compile(
    r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
NFS_OPTION = re.compile(r"^[A-Za-z0-9_.=:/-]+$")
# Checkpoints and results in S3 (dinops train --output-s3): the component giving the pods the Secret dinops-s3.
S3_COMPONENT = "components/s3-credentials"
# Egress to S3 for the API when it serves from a bucket (its NetworkPolicy otherwise allows DNS only).
S3_POLICY_COMPONENT = "components/network-policy-s3"
S3_SERVE_TMP = "4Gi"
# s3://bucket[/prefix]: bucket names are 3-63 lower-case letters, digits, dots and hyphens, starting and ending with
# a letter or digit (https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html).
S3_URL = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")


def s3_config(s3: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The apps' settings for checkpoints and results in S3: {app: {ENV: value}}.

    ``s3`` keys: output (workloads_s3_output: s3://bucket/prefix, empty = off), endpoint (workloads_s3_endpoint:
    http(s) URL of an S3-compatible service, empty = AWS), serve (workloads_s3_serve: inference loads the latest
    checkpoint published there instead of the output volume's), region (workloads_s3_region, optional) and secret
    (the pods get the Secret dinops-s3).
    """
    output = str(s3.get("output") or "").strip()
    endpoint = str(s3.get("endpoint") or "").strip()
    if not output:
        _require(not s3.get("serve"), "workloads_s3_serve needs workloads_s3_output (the s3:// prefix training writes)")
        return {}
    _require(
        bool(S3_URL.match(output)),
        f"workloads_s3_output must be s3://bucket or s3://bucket/prefix (bucket: 3-63 lower-case letters, digits, "
        f"dots, hyphens), got {output!r}",
    )
    _require(
        not endpoint or bool(re.match(r"^https?://[^\s/]+(/[^\s]*)?$", endpoint)),
        f"workloads_s3_endpoint must be an http:// or https:// URL (or empty for AWS), got {endpoint!r}",
    )
    prefix = output.rstrip("/")
    config = {"train": {"DINO_OUTPUT_S3": prefix}}
    if s3.get("serve"):
        # A prefix ending in / means the latest checkpoint training published there (its manifest).
        config["serve"] = {"DINO_CHECKPOINT": prefix + "/"}
    if endpoint:
        for values in config.values():
            values["DINO_S3_ENDPOINT"] = endpoint
    region = str(s3.get("region") or "").strip()
    if region:
        # Not a secret: the region is a setting (boto3's AWS_DEFAULT_REGION), the Secret holds the credentials only.
        _require(bool(re.match(r"^[a-z0-9-]+$", region)), f"workloads_s3_region must be a region name, got {region!r}")
        for values in config.values():
            values["AWS_DEFAULT_REGION"] = region
    return config


# The keys of an AWS shared credentials file the workloads role writes (botocore reads aws_access_key_id,
# aws_secret_access_key and aws_session_token from a profile of that file: https://docs.aws.amazon.com/sdkref/latest/
# guide/file-format.html and https://boto3.amazonaws.com/v1/documentation/api/latest/guide/credentials.html).
AWS_CREDENTIALS_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


def aws_credentials_file(values: dict[str, Any]) -> str:
    """The [default] profile of an AWS shared credentials file (INI): the key `credentials` of the Secret dinops-s3.
    Empty keys are left out; a value is one line without surrounding blanks. The values are never in messages."""
    lines = ["[default]"]
    for key, value in (values or {}).items():
        _require(
            key in AWS_CREDENTIALS_KEYS, f"AWS credentials: {key!r} is not one of {', '.join(AWS_CREDENTIALS_KEYS)}"
        )
        text = str(value or "")
        _require("\n" not in text and "\r" not in text and text == text.strip(),
                 f"AWS credentials: the value of {key} must be one line without surrounding blanks")  # fmt: skip
        if text:
            lines.append(f"{key} = {text}")
    _require(len(lines) > 1, "AWS credentials: no value given")
    return "\n".join(lines) + "\n"


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def nfs_patches(nfs: dict[str, Any]) -> list[dict[str, Any]]:
    """The generated layer's patches of the NFS volumes: name (nfs_volume_name), server, exported path per claim and
    mount options, and each claim's volumeName.

    ``nfs`` keys: server (workloads_nfs_server: DNS name or address, no scheme, no port: NFSv4 uses 2049/tcp),
    paths ({dataset, output}: absolute exported paths, workloads_nfs_paths) and mount_options (a list, one option
    each, workloads_nfs_mount_options). kubelet passes the options to mount.nfs as they are and does not check
    them (https://kubernetes.io/docs/concepts/storage/persistent-volumes/#mount-options), so they are checked here.
    """
    server = str(nfs.get("server") or "").strip()
    _require(
        bool(NFS_SERVER.match(server)) or _is_address(server),
        f"workloads_nfs_server must be a host name or an address (no scheme, no port, no path), got {server!r}",
    )
    paths = nfs.get("paths") or {}
    _require(
        isinstance(paths, dict) and set(paths) == set(NFS_VOLUMES),
        f"workloads_nfs_paths must give exactly {', '.join(NFS_VOLUMES)}, got {paths!r}",
    )
    for claim, path in paths.items():
        text = str(path)
        _require(
            text.startswith("/") and text != "/" and ".." not in text.split("/") and " " not in text,
            f"workloads_nfs_paths.{claim} must be an absolute exported path below /, got {path!r}",
        )
    _require(
        len({str(p).rstrip("/") for p in paths.values()}) == len(paths),
        f"workloads_nfs_paths: the dataset and the output need their own exports, got {paths!r}",
    )
    options = nfs.get("mount_options") or []
    _require(
        isinstance(options, list) and all(isinstance(o, str) and NFS_OPTION.match(o) for o in options),
        f"workloads_nfs_mount_options must be a list of single mount options such as 'nfsvers=4.2', got {options!r}",
    )
    patches = []
    for claim, volume in NFS_VOLUMES.items():
        name = nfs_volume_name(claim, server, str(paths[claim]), options)
        ops = [
            {"op": "replace", "path": "/metadata/name", "value": name},
            {"op": "replace", "path": "/spec/nfs/server", "value": server},
            {"op": "replace", "path": "/spec/nfs/path", "value": str(paths[claim])},
            {"op": "replace", "path": "/spec/mountOptions", "value": list(options)},
        ]
        if not options:
            ops[-1] = {"op": "remove", "path": "/spec/mountOptions"}
        patches.append({"target": {"kind": "PersistentVolume", "name": volume}, "patch": json.dumps(ops)})
        # The claim binds exactly this volume, never a leftover of the same labels (tasks/volumes.yml removes those).
        bind = [{"op": "add", "path": "/spec/volumeName", "value": name}]
        patches.append(
            {"target": {"kind": "PersistentVolumeClaim", "name": f"dinops-{claim}"}, "patch": json.dumps(bind)}
        )
    return patches


def nfs_volume_name(claim: str, server: str, path: str, options: list[str]) -> str:
    """The NFS volume's name, derived from what its source says: a PersistentVolume's source is immutable
    ("spec.persistentvolumesource is immutable after creation", Kubernetes ValidatePersistentVolumeUpdate), so a
    new server address (a replaced data server), path or mount options make a new volume, and the role re-binds the
    claim to it (tasks/volumes.yml) instead of failing the apply or leaving pods on the dead address."""
    source = "\n".join([server, path.rstrip("/") or "/", ",".join(options)])
    return f"{NFS_VOLUMES[claim]}-{hashlib.sha256(source.encode()).hexdigest()[:10]}"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_aws_credentials_file": aws_credentials_file}

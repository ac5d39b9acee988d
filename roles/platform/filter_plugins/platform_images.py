"""Image references in the operators' manifests: found, checked against the pinned list, rewritten to a mirror.

``dinops_platform_images``          every image reference the objects would make a node pull, sorted.
``dinops_platform_unlisted_images`` those that the pinned list (roles/platform/vars/main.yml) does not hold.
``dinops_platform_normalize_image`` one reference written out in full (registry, path, tag or digest).
``dinops_platform_mirror_image``    one reference on the mirror: the registry host replaced by the prefix.
``dinops_platform_mirror_objects``  the objects with every image reference rewritten to the mirror.
``dinops_platform_mirror_list``     ``source destination`` lines for copying the listed images to the mirror.

Where a reference can be (each one checked against the real manifests of the pinned releases, see README.md):

- ``image`` of every container, init container and ephemeral container, at any depth (Deployments, DaemonSets,
  the JobSet templates inside a ClusterTrainingRuntime);
- a container argument ``--<something>-image=<ref>``: cert-manager's controller names its ACME solver image so
  (``cert-manager/cert-manager@v1.17.0:deploy/charts/cert-manager/templates/deployment.yaml``,
  ``--acme-http01-solver-image``), and the role names the Training Operator's PyTorchJob init container image so
  (``kubeflow/trainer@v1.9.4:cmd/training-operator.v1/main.go``, ``--pytorch-init-container-image``);
- inside ConfigMaps whose values are YAML or JSON documents: ``image`` (and ``...Image``) keys, as in Katib's
  ``katib-config`` (metrics collectors, suggestions, early stopping) and KServe's ``inferenceservice-config``
  (storage initializer, agent, router, ``localModel.defaultJobImage``); an ``image`` without a tag next to
  ``defaultImageVersion`` (KServe's explainers) is that image at that version. Keys starting with ``_`` are
  documentation (KServe's ``_example``: "This block is not actually functional configuration") and skipped.

CustomResourceDefinitions only describe ``image`` fields and are not searched.

The reference grammar is Docker's (``github.com/distribution/reference@v0.6.0``: ``reference.go`` for
``name[:tag][@digest]``, ``normalize.go`` ``splitDockerDomain`` for the registry): the first path component is a
registry host when it contains ``.`` or ``:``, is ``localhost``, or has an upper-case letter; otherwise the image is
on ``docker.io``, and a one-component name there is ``library/<name>`` (``mysql:8.0.29`` is
``docker.io/library/mysql:8.0.29``).

Mirror rule: ``<prefix>/<path>[:tag][@digest]``, where ``<path>`` is the reference's path without its registry
host, ``library/`` made explicit for docker.io's one-component names. ``ghcr.io/kubeflow/katib/katib-ui:v0.19.0``
becomes ``registry.local:5000/mirror/kubeflow/katib/katib-ui:v0.19.0``, ``mysql:8.0.29`` becomes
``registry.local:5000/mirror/library/mysql:8.0.29``; a digest stays as it is (the mirror must keep the
manifests' digests: ``crane copy``/``skopeo copy --preserve-digests`` do). Two sources that would land on one
mirror path are refused.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

DOCKER_HUB = "docker.io"
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
IMAGE_ARG = re.compile(r"^(--[A-Za-z0-9.-]*image=)(\S+)$")
# Docker's reference grammar, simplified to what the checks need (distribution/reference@v0.6.0 regexp.go).
DIGEST = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$")
TAG = re.compile(r"^[\w][\w.-]{0,127}$")
PATH_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*$")
HOST = re.compile(r"^[A-Za-z0-9.-]+(?::[0-9]+)?$|^\[[0-9A-Fa-f:]+\](?::[0-9]+)?$")


class ImageError(ValueError):
    """A reference or a setting that is not what Docker or the role accepts; the message names it."""


def parse_image(reference: str) -> dict[str, str]:
    """{registry, path, tag, digest} of one reference, docker.io's defaults made explicit (no tag stays '')."""
    if not isinstance(reference, str) or not reference or reference != reference.strip():
        raise ImageError(f"not an image reference: {reference!r}")
    name, _, digest = reference.partition("@")
    if digest and not DIGEST.match(digest):
        raise ImageError(f"image reference {reference!r}: {digest!r} is not a digest (algorithm:hex)")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
        if not TAG.match(tag):
            raise ImageError(f"image reference {reference!r}: {tag!r} is not a tag")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost" or first.lower() != first):
        registry, path = first, rest
    else:
        registry, path = DOCKER_HUB, name
    if registry == "index.docker.io":
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not all(PATH_COMPONENT.match(part) for part in path.split("/")):
        raise ImageError(f"image reference {reference!r}: {path!r} is not a repository path")
    return {"registry": registry, "path": path, "tag": tag, "digest": digest}


def _suffix(parts: dict[str, str]) -> str:
    return (f":{parts['tag']}" if parts["tag"] else "") + (f"@{parts['digest']}" if parts["digest"] else "")


def normalize_image(reference: str) -> str:
    """The reference written out in full: ``mysql:8.0.29`` -> ``docker.io/library/mysql:8.0.29``."""
    parts = parse_image(reference)
    return f"{parts['registry']}/{parts['path']}{_suffix(parts)}"


def check_mirror(prefix: str) -> str:
    """The mirror prefix without a trailing slash; refused, naming platform_image_mirror, when Docker would not
    read its first component as a registry host (the images would then be looked up on docker.io)."""
    if not isinstance(prefix, str) or not prefix.strip():
        raise ImageError("platform_image_mirror is empty")
    value = prefix.strip().rstrip("/")
    if "://" in value:
        raise ImageError(f"platform_image_mirror {prefix!r}: a registry host and path, without a scheme")
    host, _, path = value.partition("/")
    if not HOST.match(host) or not ("." in host or ":" in host or host == "localhost"):
        raise ImageError(
            f"platform_image_mirror {prefix!r}: {host!r} is not a registry host (Docker reads a first component "
            "without '.' or ':' that is not localhost as a docker.io path); e.g. registry.local:5000/mirror"
        )
    if path and not all(PATH_COMPONENT.match(part) for part in path.split("/")):
        raise ImageError(f"platform_image_mirror {prefix!r}: {path!r} is not a repository path (lower case)")
    return value


def mirror_image(reference: str, prefix: str) -> str:
    """The reference on the mirror: ``<prefix>/<path>[:tag][@digest]``."""
    parts = parse_image(reference)
    return f"{check_mirror(prefix)}/{parts['path']}{_suffix(parts)}"


def _config_documents(config_map: dict[str, Any]) -> list[tuple[str, Any]]:
    """(key, parsed value) of a ConfigMap's YAML or JSON values; documentation keys (``_...``) and plain strings
    are left out."""
    parsed = []
    for key, value in sorted((config_map.get("data") or {}).items()):
        if key.startswith("_") or not isinstance(value, str):
            continue
        try:
            document = yaml.safe_load(value)
        except yaml.YAMLError:
            continue
        if isinstance(document, (dict, list)):
            parsed.append((key, document))
    return parsed


def _walk_images(node: Any, found: list[tuple[str, str]]) -> None:
    """Every image reference under ``node`` (containers, image arguments, ``image``/``...Image`` keys), as
    (written, pulled) pairs: they differ only for an ``image`` without a tag next to ``defaultImageVersion``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str) and (key == "image" or key.endswith("Image")):
                version = node.get("defaultImageVersion") if key == "image" else None
                tagless = "@" not in value and ":" not in value.rsplit("/", 1)[-1]
                pulled = f"{value}:{version}" if isinstance(version, str) and tagless else value
                found.append((value, pulled))
            elif key in ("args", "command") and isinstance(value, list):
                found.extend((m.group(2), m.group(2)) for m in (IMAGE_ARG.match(str(a)) for a in value) if m)
            else:
                _walk_images(value, found)
    elif isinstance(node, list):
        for item in node:
            _walk_images(item, found)


def _object_images(obj: dict[str, Any]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    if obj.get("kind") == "CustomResourceDefinition":
        return found
    if obj.get("kind") == "ConfigMap":
        for _, document in _config_documents(obj):
            _walk_images(document, found)
        return found
    _walk_images({key: value for key, value in obj.items() if key != "status"}, found)
    return found


def object_images(obj: dict[str, Any]) -> list[str]:
    """The image references one object makes a node pull (see the module's docstring for where they are)."""
    return [pulled for _, pulled in _object_images(obj)]


def images(objects: list[dict[str, Any]]) -> list[str]:
    """Every image reference of the objects, as written in them, sorted and unique."""
    found = set()
    for obj in objects or []:
        for reference in object_images(obj):
            parse_image(reference)
            found.add(reference)
    return sorted(found)


def unlisted_images(objects: list[dict[str, Any]], listed: list[str]) -> list[str]:
    """The references of the objects that the list does not hold (compared written out in full)."""
    known = {normalize_image(reference) for reference in listed or []}
    return [reference for reference in images(objects) if normalize_image(reference) not in known]


def _rewrite_text(text: str, mapping: dict[str, str]) -> str:
    """Each reference replaced where it stands as a whole word (quoted, after a space or ':', at a line's end),
    so that a ConfigMap's JSON or YAML keeps its layout and comments."""
    for source in sorted(mapping, key=len, reverse=True):
        pattern = re.compile(r"(?<![\w./:@-])" + re.escape(source) + r"(?![\w./:@-])")
        text = pattern.sub(lambda _m, target=mapping[source]: target, text)
    return text


def _rewrite(node: Any, mapping: dict[str, str]) -> Any:
    if isinstance(node, dict):
        result = {}
        for key, value in node.items():
            if isinstance(value, str) and (key == "image" or key.endswith("Image")) and value in mapping:
                result[key] = mapping[value]
            elif key in ("args", "command") and isinstance(value, list):
                result[key] = [_rewrite_arg(item, mapping) for item in value]
            else:
                result[key] = _rewrite(value, mapping)
        return result
    if isinstance(node, list):
        return [_rewrite(item, mapping) for item in node]
    return node


def _rewrite_arg(arg: Any, mapping: dict[str, str]) -> Any:
    match = IMAGE_ARG.match(str(arg)) if isinstance(arg, str) else None
    return f"{match.group(1)}{mapping[match.group(2)]}" if match and match.group(2) in mapping else arg


def mirror_mapping(references: list[str], prefix: str) -> dict[str, str]:
    """{source: destination} on the mirror; refused when two sources land on one destination."""
    mapping: dict[str, str] = {}
    seen: dict[str, str] = {}
    for reference in sorted(set(references)):
        target = mirror_image(reference, prefix)
        other = seen.get(target)
        if other is not None and normalize_image(other) != normalize_image(reference):
            raise ImageError(
                f"platform_image_mirror {prefix!r}: {other} and {reference} would both be {target} on the mirror "
                "(the registry host is replaced by the prefix)"
            )
        seen[target] = reference
        mapping[reference] = target
    return mapping


def mirror_objects(objects: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """The objects with every image reference on the mirror; unchanged when ``prefix`` is empty."""
    if not prefix:
        return list(objects or [])
    result = []
    for obj in objects or []:
        written = [reference for reference, _ in _object_images(obj)]
        if not written:
            result.append(obj)
            continue
        mapping = mirror_mapping(written, prefix)
        if obj.get("kind") == "ConfigMap":
            data = dict(obj.get("data") or {})
            for key, _ in _config_documents(obj):
                data[key] = _rewrite_text(data[key], mapping)
            result.append({**obj, "data": data})
        else:
            result.append(_rewrite(obj, mapping))
    return result


def mirror_list(listed: list[str], prefix: str = "") -> list[str]:
    """Lines for copying the listed images: ``<source in full>`` or, with a prefix, ``<source> <destination>``."""
    mapping = mirror_mapping(list(listed or []), prefix) if prefix else {}
    lines = []
    for reference in sorted(set(listed or []), key=normalize_image):
        source = normalize_image(reference)
        lines.append(f"{source} {mapping[reference]}" if prefix else source)
    return lines


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_platform_images": images,
            "dinops_platform_unlisted_images": unlisted_images,
            "dinops_platform_normalize_image": normalize_image,
            "dinops_platform_mirror_image": mirror_image,
            "dinops_platform_mirror_objects": mirror_objects,
            "dinops_platform_mirror_list": mirror_list,
        }

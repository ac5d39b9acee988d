"""Which images a cluster node lacks (pytest: tests/cluster/test_images_load_plan.py).

Both sides are ``docker image inspect`` output (a JSON array of objects with ``Id``, ``RepoTags`` and
``Config.Labels``): the host's Docker and the Docker inside the minikube node. An image is present in the node when
the node has the same tag with the same image ID; a tag pointing at another ID (a rebuilt image under the same tag)
is loaded again. ``docker save`` / ``docker load`` keep the image ID (the digest of the image configuration), so
after one load the IDs match and a second run loads nothing.

One exception: a host Docker with the containerd image store (Docker Engine 29's default for new installations)
reports the manifest's digest as ``Id``, while the node's classic store reports the configuration's digest. Then the
IDs can never match, and the image build's own identity decides: the ``org.dinops.content-hash`` label that
apps/images/build.py sets from the image's inputs (the same value on both sides means the same image).
"""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleFilterError

DEFAULT_PREFIXES = ("docker.io/library/", "docker.io/")
CONTENT_HASH = "org.dinops.content-hash"


def _normal(tag: str) -> str:
    for prefix in DEFAULT_PREFIXES:
        if tag.startswith(prefix):
            return tag[len(prefix) :]
    return tag


def _identity(image: dict[str, Any]) -> tuple[str | None, str | None]:
    labels = (image.get("Config") or {}).get("Labels") or {}
    return image.get("Id"), labels.get(CONTENT_HASH) or None


def _ids_by_tag(inspect: Any, what: str) -> dict[str, tuple[str | None, str | None]]:
    if isinstance(inspect, str):
        text = inspect.strip()
        try:
            inspect = json.loads(text) if text else []
        except ValueError as error:
            raise AnsibleFilterError(f"{what}: not the JSON of docker image inspect: {error}") from error
    if not isinstance(inspect, list):
        raise AnsibleFilterError(
            f"{what}: expected the JSON array of docker image inspect, got {type(inspect).__name__}"
        )
    ids = {}
    for image in inspect:
        if not isinstance(image, dict):
            raise AnsibleFilterError(f"{what}: expected objects in the docker image inspect array, got {image!r}")
        for tag in image.get("RepoTags") or []:
            ids[_normal(tag)] = _identity(image)
    return ids


def images_missing_in_node(local: dict[str, str], host_inspect: Any, node_inspect: Any) -> list[str]:
    """The references of ``local`` (name -> reference) that the node lacks or holds with another image ID."""
    if not isinstance(local, dict):
        raise AnsibleFilterError(f"the local images must be a mapping of name to reference, got {local!r}")
    host = _ids_by_tag(host_inspect, "the host's images")
    node = _ids_by_tag(node_inspect, "the node's images")
    missing = []
    for name, ref in sorted(local.items()):
        tag = _normal(str(ref))
        if tag not in host:
            raise AnsibleFilterError(f"image {name} ({ref}) is not in the host's Docker: build it first")
        host_id, host_hash = host[tag]
        node_id, node_hash = node.get(tag, (None, None))
        same = node_id is not None and (node_id == host_id or (host_hash is not None and node_hash == host_hash))
        if not same:
            missing.append(str(ref))
    return missing


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"images_missing_in_node": images_missing_in_node}

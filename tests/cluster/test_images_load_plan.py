"""Which images the minikube node lacks: tag and image ID compared with the host's Docker (finding 5)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from dinops_testing import REPO

LOCAL = {"serve": "dinops-serve:0.1.0-aaaa", "train": "dinops-train:0.1.0-bbbb"}


@pytest.fixture(scope="module")
def images_load():
    """The role's filter plugin, loaded from its file as Ansible does (it is not an importable package)."""
    path = REPO / "roles/images/filter_plugins/images_load.py"
    spec = importlib.util.spec_from_file_location("dinops_images_images_load", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inspect(*images, labels=None):
    """`docker image inspect` output: one object per image, with its ID, tags and labels."""
    return json.dumps(
        [{"Id": image_id, "RepoTags": list(tags), "Config": {"Labels": labels}} for image_id, *tags in images]
    )


HOST = inspect(("sha256:1", "dinops-serve:0.1.0-aaaa"), ("sha256:2", "dinops-train:0.1.0-bbbb", "other:x"))


def test_an_empty_node_gets_every_image(images_load):
    # The node's `docker image inspect` exits 1 and prints [] when none of the images exists.
    assert images_load.images_missing_in_node(LOCAL, HOST, "[]") == sorted(LOCAL.values())
    assert images_load.images_missing_in_node(LOCAL, HOST, "") == sorted(LOCAL.values())


def test_images_present_with_the_same_id_are_not_loaded_again(images_load):
    node = inspect(("sha256:1", "dinops-serve:0.1.0-aaaa"), ("sha256:2", "docker.io/library/dinops-train:0.1.0-bbbb"))
    assert images_load.images_missing_in_node(LOCAL, HOST, node) == []


def test_a_tag_with_another_image_id_is_loaded_again(images_load):
    node = inspect(("sha256:1", "dinops-serve:0.1.0-aaaa"), ("sha256:old", "dinops-train:0.1.0-bbbb"))
    assert images_load.images_missing_in_node(LOCAL, HOST, node) == ["dinops-train:0.1.0-bbbb"]


def test_an_image_missing_on_the_host_is_an_error(images_load):
    with pytest.raises(images_load.AnsibleFilterError, match=r"image train \(dinops-train:0.1.0-bbbb\) is not in"):
        images_load.images_missing_in_node(LOCAL, inspect(("sha256:1", "dinops-serve:0.1.0-aaaa")), "[]")


def test_the_content_hash_decides_when_the_stores_report_different_ids(images_load):
    """A host on the containerd image store reports the manifest digest, the node's classic store the config's."""
    host = inspect(("sha256:manifest", "dinops-serve:0.1.0-aaaa"), labels={"org.dinops.content-hash": "aaaa"})
    same = inspect(("sha256:config", "dinops-serve:0.1.0-aaaa"), labels={"org.dinops.content-hash": "aaaa"})
    other = inspect(("sha256:config", "dinops-serve:0.1.0-aaaa"), labels={"org.dinops.content-hash": "zzzz"})
    unlabelled = inspect(("sha256:config", "dinops-serve:0.1.0-aaaa"))
    serve = {"serve": "dinops-serve:0.1.0-aaaa"}
    assert images_load.images_missing_in_node(serve, host, same) == []
    assert images_load.images_missing_in_node(serve, host, other) == ["dinops-serve:0.1.0-aaaa"]
    assert images_load.images_missing_in_node(serve, host, unlabelled) == ["dinops-serve:0.1.0-aaaa"]


@pytest.mark.parametrize("bad", ["{not json", '{"Id": "x"}', "[1]"])
def test_unreadable_inspect_output_is_an_error(images_load, bad):
    with pytest.raises(images_load.AnsibleFilterError, match="the node's images"):
        images_load.images_missing_in_node(LOCAL, HOST, bad)

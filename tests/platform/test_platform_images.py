"""Image references: Docker's normalisation, the mirror rule, the check against the pinned list, and where in the
operators' manifests references are found (containers, --*-image= arguments, ConfigMaps holding YAML or JSON)."""

from __future__ import annotations

import json

import pytest
import yaml

DIGEST = "sha256:" + "ab" * 32
MIRROR = "registry.local:5000/mirror"


@pytest.mark.parametrize(
    ("reference", "full"),
    [
        # docker.io short names: one component is library/<name> (distribution/reference normalize.go).
        ("mysql:8.0.29", "docker.io/library/mysql:8.0.29"),
        ("alpine", "docker.io/library/alpine"),
        ("docker.io/alpine:3.21", "docker.io/library/alpine:3.21"),
        ("index.docker.io/library/alpine:3.21", "docker.io/library/alpine:3.21"),
        ("pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime", "docker.io/pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"),
        ("ghcr.io/kubeflow/katib/katib-ui:v0.19.0", "ghcr.io/kubeflow/katib/katib-ui:v0.19.0"),
        ("localhost/app:1", "localhost/app:1"),
        ("registry.local:5000/team/app:1", "registry.local:5000/team/app:1"),
        # An upper-case first component is a host, not a docker.io path.
        ("Registry/app:1", "Registry/app:1"),
        (f"quay.io/brancz/kube-rbac-proxy@{DIGEST}", f"quay.io/brancz/kube-rbac-proxy@{DIGEST}"),
        (f"mysql:8.0.29@{DIGEST}", f"docker.io/library/mysql:8.0.29@{DIGEST}"),
    ],
)
def test_references_are_written_out_as_docker_reads_them(images_plugin, reference, full):
    assert images_plugin.normalize_image(reference) == full


@pytest.mark.parametrize("reference", ["", " mysql", "MySQL:8", "mysql:bad tag", "app@sha256:xyz", "a//b"])
def test_a_reference_docker_would_refuse_is_refused(images_plugin, reference):
    with pytest.raises(images_plugin.ImageError):
        images_plugin.parse_image(reference)


@pytest.mark.parametrize(
    ("reference", "mirrored"),
    [
        ("mysql:8.0.29", f"{MIRROR}/library/mysql:8.0.29"),
        ("alpine:3.10", f"{MIRROR}/library/alpine:3.10"),
        ("pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime", f"{MIRROR}/pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"),
        ("ghcr.io/kubeflow/katib/katib-ui:v0.19.0", f"{MIRROR}/kubeflow/katib/katib-ui:v0.19.0"),
        ("registry.k8s.io/jobset/jobset:v0.12.0", f"{MIRROR}/jobset/jobset:v0.12.0"),
        # Digests stay: the mirror must keep the manifest's digest.
        (f"quay.io/brancz/kube-rbac-proxy@{DIGEST}", f"{MIRROR}/brancz/kube-rbac-proxy@{DIGEST}"),
        (f"mysql:8.0.29@{DIGEST}", f"{MIRROR}/library/mysql:8.0.29@{DIGEST}"),
        ("kserve/art-explainer", f"{MIRROR}/kserve/art-explainer"),
    ],
)
def test_the_mirror_replaces_the_registry_host_and_keeps_path_tag_and_digest(images_plugin, reference, mirrored):
    assert images_plugin.mirror_image(reference, MIRROR) == mirrored
    assert images_plugin.mirror_image(reference, MIRROR + "/") == mirrored


@pytest.mark.parametrize(
    ("prefix", "said"),
    [
        ("mirror", "not a registry host"),
        ("https://registry.local/mirror", "without a scheme"),
        ("registry.local/Mirror", "not a repository path"),
        ("", "is empty"),
    ],
)
def test_a_mirror_docker_would_read_as_a_docker_hub_path_is_refused(images_plugin, prefix, said):
    with pytest.raises(images_plugin.ImageError, match=said) as raised:
        images_plugin.mirror_image("mysql:8.0.29", prefix)
    assert "platform_image_mirror" in str(raised.value)


def test_two_images_landing_on_one_mirror_path_are_refused(images_plugin):
    with pytest.raises(images_plugin.ImageError, match="would both be"):
        images_plugin.mirror_mapping(["quay.io/team/app:1", "ghcr.io/team/app:1"], MIRROR)
    # The same image written two ways is one image.
    assert (
        len(set(images_plugin.mirror_mapping(["alpine:3.10", "docker.io/library/alpine:3.10"], MIRROR).values())) == 1
    )


def test_images_are_found_in_containers_arguments_and_configuration(images_plugin, helpers):
    manifests = helpers.upstream_manifests()
    objects = [obj for files in manifests.values() for objs in files.values() for obj in objs]
    found = images_plugin.images(objects)
    # cert-manager's ACME solver is only an argument of its controller.
    assert "quay.io/jetstack/cert-manager-acmesolver:v1.17.0" in found
    # Katib's collectors and suggestions only live in katib-config.
    assert "ghcr.io/kubeflow/katib/suggestion-hyperopt:v0.19.0" in found
    # KServe's: a JSON value; the explainer's tag comes from defaultImageVersion; _example is documentation.
    assert "kserve/storage-initializer:v0.20.0" in found
    assert "kserve/art-explainer:latest" in found
    assert "kserve/agent:latest" not in found
    # The JobSet template inside a ClusterTrainingRuntime.
    assert "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime" in found
    # CRDs describe an image field; they reference none.
    assert not [ref for ref in found if "string" in ref]


def test_unlisted_images_are_named_and_listed_ones_match_however_written(images_plugin, helpers):
    container = {"name": "c", "image": "docker.io/library/mysql:8.0.29"}
    objects = [
        helpers.deployment("a", "ns", [container]),
        helpers.deployment("b", "ns", [{"name": "c", "image": "mysql:8.0.30"}]),
    ]
    assert images_plugin.unlisted_images(objects, ["mysql:8.0.29"]) == ["mysql:8.0.30"]


def test_mirroring_rewrites_every_reference_and_keeps_configuration_layout(images_plugin, helpers):
    manifests = helpers.upstream_manifests()
    objects = [obj for files in manifests.values() for objs in files.values() for obj in objs]
    mirrored = images_plugin.mirror_objects(objects, MIRROR)
    assert all(ref.startswith(MIRROR + "/") for ref in images_plugin.images(mirrored))
    assert len(images_plugin.images(mirrored)) == len(images_plugin.images(objects))
    controller = next(o for o in mirrored if o["kind"] == "Deployment" and o["metadata"]["name"] == "cert-manager")
    args = controller["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["--v=2", f"--acme-http01-solver-image={MIRROR}/jetstack/cert-manager-acmesolver:v1.17.0"]
    config = next(o for o in mirrored if o["metadata"]["name"] == "inferenceservice-config")["data"]
    # Only the reference changed: spacing of the JSON as it was, the Go template untouched, _example untouched.
    assert config["agent"] == '{\n    "image" : "' + MIRROR + '/kserve/agent:v0.20.0",\n    "memoryRequest": "100Mi"\n}'
    assert json.loads(config["explainers"])["art"] == {
        "image": f"{MIRROR}/kserve/art-explainer",
        "defaultImageVersion": "latest",
    }
    assert "kserve/agent:latest" in config["_example"]
    katib = next(o for o in mirrored if o["metadata"]["name"] == "katib-config")["data"]["katib-config.yaml"]
    assert yaml.safe_load(katib)["runtime"]["suggestions"][0]["image"] == (
        f"{MIRROR}/kubeflow/katib/suggestion-hyperopt:v0.19.0"
    )
    # Without a prefix nothing changes.
    assert images_plugin.mirror_objects(objects, "") == objects


def test_a_reference_is_replaced_only_as_a_whole(images_plugin):
    text = 'a: "kserve/agent:v0.20.0"\nb: kserve/agent:v0.20.0-rc1\nc: x/kserve/agent:v0.20.0\n'
    rewritten = images_plugin._rewrite_text(text, {"kserve/agent:v0.20.0": "m.io/kserve/agent:v0.20.0"})
    assert rewritten == 'a: "m.io/kserve/agent:v0.20.0"\nb: kserve/agent:v0.20.0-rc1\nc: x/kserve/agent:v0.20.0\n'


def test_the_mirror_list_gives_full_sources_and_destinations(images_plugin):
    assert images_plugin.mirror_list(["mysql:8.0.29", "ghcr.io/a/b:1"]) == [
        "docker.io/library/mysql:8.0.29",
        "ghcr.io/a/b:1",
    ]
    assert images_plugin.mirror_list(["mysql:8.0.29"], MIRROR) == [
        f"docker.io/library/mysql:8.0.29 {MIRROR}/library/mysql:8.0.29"
    ]

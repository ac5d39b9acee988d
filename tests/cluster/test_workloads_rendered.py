"""The rendered layer as plain data (roles/workloads/filter_plugins/rendered.py), through ansible-core's own templar.

The reason for the filter is a fact about the installed ansible-core (2.19 tags every scalar its YAML loader reads
with its origin, and hands filters lazy containers): test_from_yaml_all_tags_every_scalar keeps that fact checked,
so that the day it stops holding, the filter can go.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml
from ansible.module_utils._internal._datatag import AnsibleTagHelper
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from cluster.conftest import load_plugin
from k8s.k8s_render import K8S, kustomize, render_site

rendered = load_plugin("workloads", "rendered")
train_kinds = load_plugin("workloads", "train_kinds")
inference_service = load_plugin("workloads", "inference_service")
jobs = load_plugin("workloads", "jobs")

DOCUMENTS = "kind: A\nmetadata: {name: a, labels: {x: 'y'}}\nspec: {n: [1, 2.5, true, null, text]}\n---\n---\nkind: B\n"
FILTERS = {
    **rendered.FilterModule().filters(),
    **train_kinds.FilterModule().filters(),
    **inference_service.FilterModule().filters(),
    **jobs.FilterModule().filters(),
}


def template(expression: str, **variables):
    """``expression`` rendered by ansible-core's templar with the workloads filters, as a task's argument is."""
    templar = Templar(loader=DataLoader(), variables=variables)
    templar.environment.filters.update(FILTERS)
    return templar.template(trust_as_template(expression))


def scalars(value):
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from scalars(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from scalars(item)
    else:
        yield value


def assert_plain(value) -> None:
    """Builtin containers and scalars only (keys included), none of them tagged: one walk of the value."""
    if isinstance(value, dict):
        assert type(value) is dict, type(value)
        for key, item in value.items():
            assert_plain(key)
            assert_plain(item)
    elif isinstance(value, list | tuple):
        assert type(value) in (list, tuple), type(value)
        for item in value:
            assert_plain(item)
    else:
        assert type(value) in (str, int, float, bool, type(None)), (type(value), value)
        assert not AnsibleTagHelper.tags(value), (value, AnsibleTagHelper.tags(value))


def test_from_yaml_all_tags_every_scalar():
    """The fact the filter exists for: every string from_yaml_all reads carries its origin."""
    objects = template("{{ text | from_yaml_all | list }}", text=DOCUMENTS)
    strings = [s for s in scalars(objects) if isinstance(s, str)]
    assert strings and all("Origin" in {type(t).__name__ for t in AnsibleTagHelper.tags(s)} for s in strings)


def test_the_documents_come_back_as_plain_data_without_the_empty_ones():
    objects = template("{{ text | dinops_rendered_objects }}", text=DOCUMENTS)
    assert objects == [
        {"kind": "A", "metadata": {"name": "a", "labels": {"x": "y"}}, "spec": {"n": [1, 2.5, True, None, "text"]}},
        {"kind": "B"},
    ]
    assert_plain(objects)


def test_the_layer_kustomize_renders_reads_as_from_yaml_all_reads_it(tmp_path):
    """The same objects as Ansible's loader gives, on a real render of every overlay and a site layer."""
    sites = [K8S / "overlays" / name for name in ("cpu", "minikube-gpu", "k3s-gpu", "docker-gpu")]
    render_site(tmp_path, "site", {"overlay": "cpu", "train": True, "shm_size": "1G"})
    sites.append(tmp_path / "site" / "k8s" / "site")
    for directory in sites:
        text = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True)
        ours = template("{{ text | dinops_rendered_objects }}", text=text.stdout)
        assert ours == template("{{ text | from_yaml_all | reject('none') | list }}", text=text.stdout)
        assert ours == kustomize(directory)
        assert_plain(ours)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: A\n---\n- a list\n", "document 2 of the rendered layer is a list, not an object"),
        ("just text\n", "document 1 of the rendered layer is a str, not an object"),
    ],
)
def test_a_document_that_is_not_an_object_is_refused_by_number(text, message):
    with pytest.raises(TypeError, match=message):
        rendered.rendered_objects(text)


def test_only_text_is_taken():
    with pytest.raises(TypeError, match="takes kustomize's output as text, got list"):
        rendered.rendered_objects([{"kind": "A"}])


def test_bad_yaml_is_reported_by_the_loader():
    with pytest.raises(yaml.YAMLError, match="mapping values are not allowed"):
        rendered.rendered_objects("kind: A\n  bad: indent: here\n")


def test_plain_copies_and_strips_lazy_containers_and_tags():
    tagged = template("{{ text | from_yaml_all | list }}", text=DOCUMENTS)
    copy = rendered.plain(tagged)
    assert copy == tagged
    assert_plain(copy)
    copy[0]["metadata"]["labels"]["x"] = "changed"
    assert tagged[0]["metadata"]["labels"]["x"] == "y"
    assert rendered.plain((1, "a")) == (1, "a")


def test_plain_refuses_what_is_not_json_like():
    with pytest.raises(TypeError, match="not JSON-like data: set"):
        rendered.plain({"a": {1, 2}})


def test_the_folds_hand_on_plain_data_from_tagged_input(tmp_path):
    """What the role's render task chains (tasks/render.yml), given from_yaml_all's tagged objects: the training
    fold and the InferenceService fold copy their input as plain data (a deep copy of tagged values was 8.9 s of
    the role's 23 s)."""
    site = render_site(tmp_path, "site", {"overlay": "cpu", "train": True, "shm_size": "1G"})
    text = yaml.safe_dump_all(site)
    settings = {"kind": "job", "nodes": 1, "processes": 1, "gpus": 0, "cluster_nodes": 1, "hpo": {"enabled": False}}
    for fold in (
        "{{ text | from_yaml_all | list | dinops_train_kinds(settings) }}",
        "{{ text | from_yaml_all | list | dinops_inference_service(false) }}",
    ):
        objects = template(fold, text=text, settings=settings)
        assert objects == site
        assert_plain(objects)

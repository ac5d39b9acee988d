"""The role's settings stay documented where users read them, and the pinned releases stay those of the shared
contract (the platform contract: Trainer v2.3.0 with JobSet v0.12.0, Katib v0.19.0, Training Operator
v1.9.4, KServe v0.20.0 with cert-manager v1.17.0)."""

from __future__ import annotations

import re

import yaml

from dinops_testing import REPO

ROLE = REPO / "roles/platform"


def defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults/main.yml").read_text())


def test_every_default_is_in_the_argument_specs_and_the_readme():
    specs = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]
    readme = (ROLE / "README.md").read_text()
    block = re.search(r"## Role variables.*?```yaml\n(.*?)```", readme, re.S).group(1)
    assert yaml.safe_load(block) == defaults()
    assert sorted(defaults()) == sorted(specs["main"]["options"])
    # The bundle entry point takes the inputs that shape a bundle.
    assert set(specs["bundle"]["options"]) <= set(defaults())
    for name, option in specs["main"]["options"].items():
        if "default" in option:
            assert option["default"] == defaults()[name], name


def test_the_pinned_releases_are_the_contracts(releases):
    assert {name: release["version"] for name, release in releases.items()} == {
        "cert_manager": "v1.17.0",
        "trainer": "v2.3.0",
        "katib": "v0.19.0",
        "training_operator": "v1.9.4",
        "kserve": "v0.20.0",
    }
    assert releases["trainer"]["bundled"] == {"jobset": "v0.12.0"}
    assert releases["trainer"]["crds"]["trainjobs.trainer.kubeflow.org"] == "v1alpha1"
    assert releases["katib"]["crds"]["experiments.kubeflow.org"] == "v1beta1"
    assert releases["training_operator"]["crds"]["pytorchjobs.kubeflow.org"] == "v1"
    assert releases["kserve"]["crds"]["inferenceservices.serving.kserve.io"] == "v1beta1"


def test_every_source_names_its_release_and_no_image_is_listed_twice(releases, images_plugin):
    for name, release in releases.items():
        for source in release["sources"]:
            target = source.get("kustomize") or source.get("url")
            assert release["version"] in target, (name, target)
        listed = release["images"] + release["images_on_demand"]
        assert len({images_plugin.normalize_image(ref) for ref in listed}) == len(listed), name


def test_the_bundle_playbook_and_the_stage_use_the_role():
    stage = yaml.safe_load((REPO / "playbooks/platform.yml").read_text())
    assert stage[0]["roles"][0]["role"] == "platform"
    assert "dinops_platform" in stage[0]["roles"][0]["when"]
    bundle = yaml.safe_load((REPO / "playbooks/platform_bundle.yml").read_text())
    assert bundle[0]["hosts"] == "localhost"
    assert bundle[0]["tasks"][0]["ansible.builtin.import_role"] == {"name": "platform", "tasks_from": "bundle"}
    teardown = yaml.safe_load((REPO / "playbooks/teardown.yml").read_text())
    platform = [play for play in teardown if any(r.get("role") == "platform" for r in play.get("roles", []))]
    assert platform and platform[0]["roles"][0]["vars"] == {"platform_state": "absent"}
    workloads = next(
        i for i, play in enumerate(teardown) if any(r.get("role") == "workloads" for r in play.get("roles", []))
    )
    assert teardown.index(platform[0]) > workloads

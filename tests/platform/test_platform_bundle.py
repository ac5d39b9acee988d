"""The bundle: bundle.json written from the fetched files, and the check that refuses a bundle of other versions,
a changed file or a missing component, with the reason and what to do."""

from __future__ import annotations

import json

import pytest

ALL = ["cert_manager", "trainer", "katib", "training_operator", "kserve"]


def test_the_switches_give_the_components_in_installation_order(bundle_plugin, releases):
    switches = {"kserve": True, "katib": True, "cert_manager": True, "trainer": False, "training_operator": True}
    assert bundle_plugin.components(releases, switches) == ["cert_manager", "training_operator", "katib", "kserve"]
    with pytest.raises(bundle_plugin.BundleError, match="no pinned release for mlflow"):
        bundle_plugin.components(releases, {"mlflow": True})


def test_katib_comes_after_every_operator_whose_kind_it_runs_as_a_trial(bundle_plugin, releases):
    """katib-controller watches a trial kind only when that kind's CRD is served at its start; a missing one is
    logged and skipped until a restart (kubeflow/katib@v0.19.0:pkg/controller.v1beta1/trial/trial_controller.go
    "CRD might be missing. Please install CRD and restart katib-controller"): its trials would never finish."""
    order = bundle_plugin.components(releases, dict.fromkeys(releases, True))
    assert order.index("katib") > order.index("trainer")
    assert order.index("katib") > order.index("training_operator")
    assert order.index("cert_manager") < order.index("kserve")


def test_the_sources_are_the_pinned_files(bundle_plugin, releases):
    sources = bundle_plugin.sources(releases, ["trainer", "kserve"])
    assert [s["path"] for s in sources] == ["trainer/manager.yaml", "trainer/runtimes.yaml", "kserve/kserve.yaml"]
    assert sources[0]["kustomize"] == "https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0"
    assert sources[2]["url"] == "https://github.com/kserve/kserve/releases/download/v0.20.0/kserve.yaml"


def test_a_bundle_of_the_pinned_versions_is_accepted(bundle_plugin, releases, bundle_dir):
    assert bundle_plugin.bundle_check(str(bundle_dir), releases, ALL) == []


def test_bundle_json_describes_each_file(bundle_plugin, releases, bundle_dir):
    manifest = bundle_plugin.bundle_manifest(str(bundle_dir), releases, ["trainer"])
    assert manifest["format"] == 1
    assert [(f["component"], f["version"], f["bundled"], f["path"]) for f in manifest["files"]] == [
        ("trainer", "v2.3.0", {"jobset": "v0.12.0"}, "trainer/manager.yaml"),
        ("trainer", "v2.3.0", {"jobset": "v0.12.0"}, "trainer/runtimes.yaml"),
    ]
    written = json.loads((bundle_dir / "bundle.json").read_text())
    assert manifest["files"][0]["sha256"] == next(
        f["sha256"] for f in written["files"] if f["path"] == "trainer/manager.yaml"
    )
    with pytest.raises(bundle_plugin.BundleError, match="lacks katib/katib-standalone.yaml"):
        (bundle_dir / "katib" / "katib-standalone.yaml").unlink()
        bundle_plugin.bundle_manifest(str(bundle_dir), releases, ["katib"])


def test_a_bundle_of_another_version_is_refused_with_the_pin(bundle_plugin, releases, bundle_dir):
    manifest = json.loads((bundle_dir / "bundle.json").read_text())
    for entry in manifest["files"]:
        if entry["component"] == "katib":
            entry["version"] = "v0.18.0"
    (bundle_dir / "bundle.json").write_text(json.dumps(manifest))
    problems = bundle_plugin.bundle_check(str(bundle_dir), releases, ALL)
    assert len(problems) == 1
    assert "holds katib v0.18.0, this role pins v0.19.0" in problems[0]
    assert "playbooks/platform_bundle.yml" in problems[0]
    # A bundle serves the components it holds at the pins: without Katib the same bundle is fine.
    assert bundle_plugin.bundle_check(str(bundle_dir), releases, ["trainer"]) == []


def test_a_bundle_with_another_jobset_is_refused(bundle_plugin, releases, bundle_dir):
    manifest = json.loads((bundle_dir / "bundle.json").read_text())
    for entry in manifest["files"]:
        if entry["component"] == "trainer":
            entry["bundled"] = {"jobset": "v0.11.0"}
    (bundle_dir / "bundle.json").write_text(json.dumps(manifest))
    problems = bundle_plugin.bundle_check(str(bundle_dir), releases, ["trainer"])
    assert problems and all('{"jobset": "v0.11.0"}' in p and '{"jobset": "v0.12.0"}' in p for p in problems)


def test_a_changed_or_missing_file_is_refused(bundle_plugin, releases, bundle_dir):
    with (bundle_dir / "kserve" / "kserve.yaml").open("a") as handle:
        handle.write("# edited\n")
    (bundle_dir / "katib" / "katib-standalone.yaml").unlink()
    problems = bundle_plugin.bundle_check(str(bundle_dir), releases, ALL)
    assert any("kserve.yaml does not match its sha256" in p for p in problems)
    assert any("katib-standalone.yaml is listed" in p and "missing" in p for p in problems)


def test_a_missing_component_or_description_is_refused(bundle_plugin, releases, bundle_dir, tmp_path):
    manifest = json.loads((bundle_dir / "bundle.json").read_text())
    manifest["files"] = [f for f in manifest["files"] if f["component"] != "kserve"]
    (bundle_dir / "bundle.json").write_text(json.dumps(manifest))
    assert bundle_plugin.bundle_check(str(bundle_dir), releases, ["kserve"]) == [
        f"the bundle in {bundle_dir} holds no kserve (it was made without it): make a bundle of the pinned versions "
        "with playbooks/platform_bundle.yml on a connected machine"
    ]
    (bundle_dir / "bundle.json").write_text("not json")
    assert "is not JSON" in bundle_plugin.bundle_check(str(bundle_dir), releases, ["trainer"])[0]
    (bundle_dir / "bundle.json").write_text(json.dumps({"format": 2, "files": []}))
    assert "not a bundle.json of format 1" in bundle_plugin.bundle_check(str(bundle_dir), releases, ["trainer"])[0]
    assert "is not a directory" in bundle_plugin.bundle_check(str(tmp_path / "none"), releases, ["trainer"])[0]
    (bundle_dir / "bundle.json").unlink()
    assert "bundle.json does not exist" in bundle_plugin.bundle_check(str(bundle_dir), releases, ["trainer"])[0]
    assert bundle_plugin.bundle_check("", releases, ["trainer"]) == ["platform_bundle_dir is empty"]


def test_files_are_read_at_their_pinned_paths_only(bundle_plugin, releases, bundle_dir):
    manifest = json.loads((bundle_dir / "bundle.json").read_text())
    manifest["files"] = [
        {**f, "path": "../../etc/passwd"} if f["component"] == "katib" else f for f in manifest["files"]
    ]
    (bundle_dir / "bundle.json").write_text(json.dumps(manifest))
    problems = bundle_plugin.bundle_check(str(bundle_dir), releases, ["katib"])
    assert problems == [
        f"the bundle in {bundle_dir} lists no katib/katib-standalone.yaml (https://github.com/kubeflow/katib.git/"
        "manifests/v1beta1/installs/katib-standalone?ref=v0.19.0): make a bundle of the pinned versions with "
        "playbooks/platform_bundle.yml on a connected machine"
    ]

"""The platform role run for real by ansible-playbook on this machine, as far as no cluster is needed
(platform_cluster_enabled false): a bundle made by the test (synthetic manifests shaped like the upstream ones) is
checked, rendered, mirrored and storage-patched, and the files the role would apply are read back from the
controller. playbooks/platform_bundle.yml runs with its sources pointed at local kustomize directories and file://
assets (no network here): kubectl kustomize, the downloads, bundle.json and images.txt are real."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

MIRROR = "registry.local:5000/mirror"
REFUSED = 2  # ansible-playbook's exit status when a task failed


def play(tmp, bundle, **extra) -> list:
    return [
        {
            "name": "Render the platform without a cluster",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {
                "platform_bundle_dir": str(bundle),
                "platform_cluster_enabled": False,
                "platform_render_dir": str(tmp / "rendered"),
                "platform_training_operator": True,
                "platform_kserve": True,
                **extra,
            },
            "roles": ["platform"],
        }
    ]


@pytest.fixture(scope="module")
def rendered_by_the_role(tmp_path_factory, releases, helpers):
    tmp = tmp_path_factory.mktemp("platform-role")
    bundle = helpers.write_bundle(tmp / "bundle", releases)
    settings = {"platform_image_mirror": MIRROR, "platform_katib_storage_class": "local-path"}
    first = helpers.run_playbook(tmp, play(tmp, bundle, **settings))
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    second = helpers.run_playbook(tmp, play(tmp, bundle, **settings))
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-2000:]
    return tmp / "rendered", helpers.changed_tasks(first), helpers.changed_tasks(second)


def test_the_role_writes_one_file_of_crds_and_one_of_operators_per_component(rendered_by_the_role):
    rendered, first, _ = rendered_by_the_role
    assert sorted(p.name for p in rendered.iterdir()) == [
        "01-cert_manager-crds-namespaces.yaml",
        "01-cert_manager-objects.yaml",
        "02-trainer-crds-namespaces.yaml",
        "02-trainer-objects.yaml",
        "03-training_operator-crds-namespaces.yaml",
        "03-training_operator-objects.yaml",
        "04-katib-crds-namespaces.yaml",
        "04-katib-objects.yaml",
        "05-kserve-crds-namespaces.yaml",
        "05-kserve-objects.yaml",
        "images-mirror.txt",
        "images.txt",
    ]
    assert "platform : render | Write the rendered manifests and the image lists on the controller" in first


def test_the_rendered_manifests_are_mirrored_and_storage_patched(rendered_by_the_role, helpers):
    rendered, _, _ = rendered_by_the_role
    katib = helpers.load_stream(rendered / "04-katib-objects.yaml")
    claim = next(d for d in katib if d["kind"] == "PersistentVolumeClaim")
    assert claim["spec"]["storageClassName"] == "local-path"
    mysql = next(d for d in katib if d["kind"] == "Deployment" and d["metadata"]["name"] == "katib-mysql")
    assert mysql["spec"]["template"]["spec"]["containers"][0]["image"] == f"{MIRROR}/library/mysql:8.0.29"
    config = yaml.safe_load(
        next(d for d in katib if d["metadata"]["name"] == "katib-config")["data"]["katib-config.yaml"]
    )
    assert (
        config["runtime"]["metricsCollectors"][0]["image"] == f"{MIRROR}/kubeflow/katib/file-metrics-collector:v0.19.0"
    )
    kserve = helpers.load_stream(rendered / "05-kserve-objects.yaml")
    isvc_config = next(d for d in kserve if d["kind"] == "ConfigMap")["data"]
    assert json.loads(isvc_config["deploy"]) == {"defaultDeploymentMode": "Standard"}
    # KServe's Go template went through Ansible untouched.
    assert json.loads(isvc_config["ingress"])["domainTemplate"] == "{{ .Name }}-{{ .Namespace }}.{{ .IngressDomain }}"
    assert helpers.load_stream(rendered / "05-kserve-crds-namespaces.yaml")[0]["metadata"]["name"] == "kserve"
    trainer = helpers.load_stream(rendered / "02-trainer-objects.yaml")
    assert [d["metadata"]["name"] for d in trainer if d["kind"] == "ClusterTrainingRuntime"] == ["torch-distributed"]
    crds = helpers.load_stream(rendered / "02-trainer-crds-namespaces.yaml")
    assert [d["kind"] for d in crds] == ["Namespace"] + ["CustomResourceDefinition"] * 4


def test_the_image_lists_hold_every_image_in_full_and_on_the_mirror(rendered_by_the_role):
    rendered, _, _ = rendered_by_the_role
    images = (rendered / "images.txt").read_text().splitlines()
    assert "docker.io/library/mysql:8.0.29" in images
    assert "docker.io/library/alpine:3.10" in images
    assert "quay.io/jetstack/cert-manager-acmesolver:v1.17.0" in images
    assert "docker.io/kserve/art-explainer:latest" in images
    assert not [line for line in images if "deepspeed" in line]
    pairs = dict(line.split(" ") for line in (rendered / "images-mirror.txt").read_text().splitlines())
    assert pairs["registry.k8s.io/jobset/jobset:v0.12.0"] == f"{MIRROR}/jobset/jobset:v0.12.0"
    assert sorted(pairs) == images


def test_a_second_run_changes_nothing(rendered_by_the_role):
    _, _, second = rendered_by_the_role
    assert second == []


def test_a_bundle_of_another_version_is_refused_with_a_message(tmp_path, releases, helpers):
    bundle = helpers.write_bundle(tmp_path / "bundle", releases)
    manifest = json.loads((bundle / "bundle.json").read_text())
    for entry in manifest["files"]:
        if entry["component"] == "trainer":
            entry["version"] = "v2.2.1"
    (bundle / "bundle.json").write_text(json.dumps(manifest))
    result = helpers.run_playbook(tmp_path, play(tmp_path, bundle))
    assert result.returncode == REFUSED
    said = helpers.failure_messages(result)
    assert f"platform_bundle_dir {bundle} cannot be used" in said
    assert "holds trainer v2.2.1, this role pins v2.3.0 (roles/platform/vars/main.yml)" in said
    assert not (tmp_path / "rendered").exists()


def test_an_image_missing_from_the_pinned_list_stops_the_run_naming_it(tmp_path, releases, helpers):
    manifests = helpers.upstream_manifests()
    ui = helpers.deployment(
        "katib-ui", "kubeflow", [{"name": "katib-ui", "image": "ghcr.io/kubeflow/katib/katib-ui:v0.19.1"}]
    )
    manifests["katib"]["katib-standalone.yaml"].append(ui)
    bundle = helpers.write_bundle(tmp_path / "bundle", releases, manifests)
    result = helpers.run_playbook(tmp_path, play(tmp_path, bundle))
    assert result.returncode == REFUSED
    said = helpers.failure_messages(result)
    assert "would miss them: ghcr.io/kubeflow/katib/katib-ui:v0.19.1 (katib)" in said


def local_releases(releases: dict, sources, tmp) -> dict:
    """The pinned releases with their sources pointed at local copies: a kustomize directory per kustomize target
    (a kustomization.yaml listing the file), a file:// URL per release asset."""
    local = json.loads(json.dumps(releases))
    for component, release in local.items():
        for source in release["sources"]:
            path = sources / component / source["file"]
            if "kustomize" in source:
                target = tmp / "kustomize" / component / source["file"].removesuffix(".yaml")
                target.mkdir(parents=True)
                shutil.copy(path, target / "resources.yaml")
                (target / "kustomization.yaml").write_text("resources:\n  - resources.yaml\n")
                source["kustomize"] = str(target)
            else:
                source["url"] = path.as_uri()
    return local


def test_the_bundle_playbook_fetches_describes_and_lists_the_images(tmp_path, releases, helpers, bundle_plugin):
    if shutil.which("kubectl") is None or shutil.which("git") is None:
        pytest.fail("kubectl and git must be on PATH: the bundle is rendered with kubectl kustomize")
    sources = helpers.write_bundle(tmp_path / "sources", releases)
    local = local_releases(releases, sources, tmp_path)
    extra = {
        "platform_releases": local,
        "platform_bundle_dest": str(tmp_path / "made"),
        "platform_kserve": True,
        "platform_image_mirror": MIRROR,
    }
    from dinops_testing import REPO

    first = helpers.run_playbook(tmp_path, extra=extra, playbook=REPO / "playbooks/platform_bundle.yml")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    made = tmp_path / "made"
    manifest = json.loads((made / "bundle.json").read_text())
    assert [(f["component"], f["version"], f["path"]) for f in manifest["files"]] == [
        ("cert_manager", "v1.17.0", "cert_manager/cert-manager.yaml"),
        ("trainer", "v2.3.0", "trainer/manager.yaml"),
        ("trainer", "v2.3.0", "trainer/runtimes.yaml"),
        ("katib", "v0.19.0", "katib/katib-standalone.yaml"),
        ("kserve", "v0.20.0", "kserve/kserve.yaml"),
    ]
    assert manifest["files"][0]["source"] == (sources / "cert_manager" / "cert-manager.yaml").as_uri()
    # kustomize's output is the same objects; the pinned releases accept the bundle.
    assert helpers.load_stream(made / "katib" / "katib-standalone.yaml") == helpers.load_stream(
        sources / "katib" / "katib-standalone.yaml"
    )
    assert bundle_plugin.bundle_check(str(made), local, ["cert_manager", "trainer", "katib", "kserve"]) == []
    images = (made / "images.txt").read_text().splitlines()
    assert "docker.io/library/mysql:8.0.29" in images
    assert (made / "images-mirror.txt").read_text().splitlines()[0].split(" ")[1].startswith(MIRROR + "/")
    second = helpers.run_playbook(tmp_path, extra=extra, playbook=REPO / "playbooks/platform_bundle.yml")
    assert second.returncode == 0, second.stdout[-4000:]
    assert helpers.changed_tasks(second) == []


def test_an_online_bundle_without_kustomize_or_git_on_the_controller_says_what_to_install(tmp_path, helpers):
    from dinops_testing import REPO

    extra = {
        "platform_bundle_dest": str(tmp_path / "made"),
        "platform_kustomize_command": ["/nonexistent/kubectl", "kustomize"],
    }
    result = helpers.run_playbook(tmp_path, extra=extra, playbook=REPO / "playbooks/platform_bundle.yml")
    assert result.returncode == REFUSED
    said = helpers.failure_messages(result)
    assert "Building the platform bundle needs /nonexistent/kubectl on the controller" in said
    assert "kustomize clones its remote targets" in said and "platform_bundle_dir" in said
    assert not (tmp_path / "made").exists()

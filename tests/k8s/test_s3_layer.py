"""Checkpoints and results in S3 (issue 16): the generated layer hands training its --output-s3 and inference its
s3:// checkpoint through the apps' own settings (DINO_OUTPUT_S3, DINO_CHECKPOINT, DINO_S3_ENDPOINT: the apps'
settings tables, which a test of the apps keeps), and every pod that talks to S3 the Secret dinops-s3; on the Docker
runtime the Secret is a root-only env file. The schema and Docker drift tests cover the cpu-s3-output variant too.
"""

from __future__ import annotations

import pytest
from k8s.k8s_render import SITE_VARIANTS, container_env, find, load_workloads_filters, pod_spec

from dinops.serve.settings import SETTINGS as SERVE_SETTINGS
from dinops.train.settings import SETTINGS as TRAIN_SETTINGS

filters = load_workloads_filters()
docker = load_workloads_filters("docker_runtime")
S3 = SITE_VARIANTS["cpu-s3-output"]["s3"]


def test_training_and_inference_get_the_bucket_and_the_credentials(rendered_sites):
    objects = rendered_sites["cpu-s3-output"]
    train = pod_spec(find(objects, "Job", "dinops-train"))["containers"][0]
    serve = pod_spec(find(objects, "Deployment", "dinops-serve"))["containers"][0]
    train_env, serve_env = container_env(objects, train), container_env(objects, serve)
    assert train_env["DINO_OUTPUT_S3"] == "s3://dinops-runs/coco/run-1"
    assert serve_env["DINO_CHECKPOINT"] == "s3://dinops-runs/coco/run-1/"  # the latest published there
    assert train_env["DINO_S3_ENDPOINT"] == serve_env["DINO_S3_ENDPOINT"] == "http://10.0.1.5:9000"
    for container in (train, serve, pod_spec(find(objects, "Job", "dinops-download"))["containers"][0]):
        # Appended: the ConfigMap stays first, the Secret is added (a strategic merge would have replaced the list).
        assert container["envFrom"][0]["configMapRef"]["name"].startswith("dinops-")
        assert container["envFrom"][-1] == {"secretRef": {"name": "dinops-s3"}}
    assert "secretRef" not in str(pod_spec(find(objects, "Deployment", "dinops-client")))
    # Room in /tmp for the checkpoint in use and the one a reload downloads.
    volumes = {v["name"]: v for v in pod_spec(find(objects, "Deployment", "dinops-serve"))["volumes"]}
    assert volumes["tmp"]["emptyDir"]["sizeLimit"] == "4Gi"


def test_the_names_are_the_apps_settings():
    train = {s.env for s in TRAIN_SETTINGS}
    serve = {s.env for s in SERVE_SETTINGS}
    for app, values in filters.s3_config(S3).items():
        assert set(values) <= (train if app == "train" else serve), (app, values)


def test_no_secret_means_no_envfrom():
    layer = filters.site_kustomization({**SITE_VARIANTS["cpu-s3-output"], "s3": {**S3, "secret": False}})
    assert not any("s3-credentials" in c for c in layer.get("components", []))


@pytest.mark.parametrize(
    ("s3", "message"),
    [
        ({"output": "https://bucket/x"}, "workloads_s3_output must be s3://bucket"),
        ({"output": "s3://My_Bucket/x"}, "workloads_s3_output must be s3://bucket"),
        ({"output": "s3://ab"}, "workloads_s3_output must be s3://bucket"),
        ({"output": "s3://bucket", "endpoint": "10.0.1.5:9000"}, "workloads_s3_endpoint must be an http"),
        ({"output": "", "serve": True}, "workloads_s3_serve needs workloads_s3_output"),
    ],
)
def test_bad_s3_settings_name_the_variable(s3, message):
    with pytest.raises(filters.WorkloadsError, match=message):
        filters.s3_config(s3)


def test_a_pretrained_checkpoint_and_s3_serving_exclude_each_other():
    settings = {
        **SITE_VARIANTS["cpu-s3-output"],
        "train": False,
        "checkpoint_url": "https://mirror.example/dino/c.pth",
        "checkpoint_sha256": "ab" * 32,
    }
    with pytest.raises(filters.WorkloadsError, match="workloads_checkpoint_url and workloads_s3_serve"):
        filters.site_kustomization(settings)


def test_env_file_lines_and_refusals():
    assert filters.env_file({"B": "2", "AWS_ACCESS_KEY_ID": "AKIA x"}) == "AWS_ACCESS_KEY_ID=AKIA x\nB=2\n"
    assert filters.env_file({}) == ""
    with pytest.raises(filters.WorkloadsError, match="not a variable name") as error:
        filters.env_file({"aws-key": "s3cr3t"})
    assert "s3cr3t" not in str(error.value)
    with pytest.raises(filters.WorkloadsError, match="one line") as error:
        filters.env_file({"AWS_SECRET_ACCESS_KEY": "s3cr3t\nEVIL=1"})
    assert "s3cr3t" not in str(error.value)


def test_docker_runtime_reads_the_secret_from_a_root_only_env_file(rendered_sites):
    objects = filters.prepare_objects(rendered_sites["cpu-s3-output"], True, True)
    plan = docker.docker_plan(objects, {"data_dir": "/var/lib/dinops/volumes", "network": "dinops"})
    by_name = {c["name"]: c for c in plan["containers"]}
    path = "/var/lib/dinops/volumes/.secrets/dinops-s3.env"
    assert plan["secrets"] == [path]
    for name in ("dinops-train", "dinops-serve", "dinops-download"):
        assert by_name[name]["env_file"] == path
        assert "AWS_SECRET_ACCESS_KEY" not in by_name[name]["env"]
    assert "env_file" not in by_name["dinops-client"]

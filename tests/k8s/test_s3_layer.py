"""Checkpoints and results in S3 (issue 16): the generated layer hands training its --output-s3 and inference its
s3:// checkpoint through the apps' own settings (DINO_OUTPUT_S3, DINO_CHECKPOINT, DINO_S3_ENDPOINT: the apps'
settings tables, which a test of the apps keeps), and every pod that talks to S3 the Secret dinops-s3 as a read-only
AWS shared credentials file (AWS_SHARED_CREDENTIALS_FILE), never as environment variables; on the Docker runtime the
Secret is a directory readable by the containers' user only. The schema and Docker drift tests cover the
cpu-s3-output variant too.
"""

from __future__ import annotations

import pytest
from k8s.k8s_render import SITE_VARIANTS, container_env, find, load_workloads_filters, pod_spec

from dinops.serve.settings import SETTINGS as SERVE_SETTINGS
from dinops.train.settings import SETTINGS as TRAIN_SETTINGS

filters = load_workloads_filters()
jobs = load_workloads_filters("jobs")
storage_layer = load_workloads_filters("storage_layer")
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
    for obj in (find(objects, "Job", "dinops-train"), find(objects, "Deployment", "dinops-serve"),
                find(objects, "Job", "dinops-download")):  # fmt: skip
        pod = pod_spec(obj)
        container = pod["containers"][0]
        # Appended: the app's ConfigMap stays first (a strategic merge would have replaced the list).
        assert container["envFrom"][0]["configMapRef"]["name"].startswith("dinops-")
        assert container_env(objects, container)["AWS_SHARED_CREDENTIALS_FILE"] == "/run/secrets/dinops-s3/credentials"
        assert not any("secretRef" in source for source in container["envFrom"])
        assert {"name": "s3-credentials", "secret": {"secretName": "dinops-s3", "defaultMode": 0o440}} in pod["volumes"]
        mount = {"name": "s3-credentials", "mountPath": "/run/secrets/dinops-s3", "readOnly": True}
        assert mount in container["volumeMounts"]
        assert pod["securityContext"]["fsGroup"] == 10001  # the group the files' mode lets read them
    assert "dinops-s3" not in str(pod_spec(find(objects, "Deployment", "dinops-client")))
    # Room in /tmp for the checkpoint in use and the one a reload downloads.
    volumes = {v["name"]: v for v in pod_spec(find(objects, "Deployment", "dinops-serve"))["volumes"]}
    assert volumes["tmp"]["emptyDir"]["sizeLimit"] == "4Gi"


def test_the_names_are_the_apps_settings():
    train = {s.env for s in TRAIN_SETTINGS}
    serve = {s.env for s in SERVE_SETTINGS}
    for app, values in storage_layer.s3_config(S3).items():
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
        storage_layer.s3_config(s3)


def test_a_pretrained_checkpoint_and_s3_serving_exclude_each_other():
    settings = {
        **SITE_VARIANTS["cpu-s3-output"],
        "train": False,
        "checkpoint_url": "https://mirror.example/dino/c.pth",
        "checkpoint_sha256": "ab" * 32,
    }
    with pytest.raises(filters.WorkloadsError, match="workloads_checkpoint_url and workloads_s3_serve"):
        filters.site_kustomization(settings)


def test_the_credentials_file_and_its_refusals():
    text = storage_layer.aws_credentials_file(
        {"aws_access_key_id": "AKIAX", "aws_secret_access_key": "s3cr3t/+=", "aws_session_token": ""}
    )
    assert text == "[default]\naws_access_key_id = AKIAX\naws_secret_access_key = s3cr3t/+=\n"
    with pytest.raises(filters.WorkloadsError, match="not one of") as error:
        storage_layer.aws_credentials_file({"AWS_SECRET_ACCESS_KEY": "s3cr3t"})
    assert "s3cr3t" not in str(error.value)
    with pytest.raises(filters.WorkloadsError, match="one line") as error:
        storage_layer.aws_credentials_file({"aws_secret_access_key": "s3cr3t\n[evil]"})
    assert "s3cr3t" not in str(error.value)
    with pytest.raises(filters.WorkloadsError, match="no value"):
        storage_layer.aws_credentials_file({"aws_access_key_id": ""})


def test_the_region_is_a_setting_not_a_secret():
    config = storage_layer.s3_config({**S3, "region": "eu-west-1"})
    assert config["train"]["AWS_DEFAULT_REGION"] == config["serve"]["AWS_DEFAULT_REGION"] == "eu-west-1"
    with pytest.raises(filters.WorkloadsError, match="workloads_s3_region"):
        storage_layer.s3_config({**S3, "region": "EU West"})


def test_docker_runtime_mounts_the_secret_readable_by_the_containers_user_only(rendered_sites):
    objects = jobs.prepare_objects(rendered_sites["cpu-s3-output"], True, True)
    plan = docker.docker_plan(objects, {"data_dir": "/var/lib/dinops/volumes", "network": "dinops"})
    by_name = {c["name"]: c for c in plan["containers"]}
    path = "/var/lib/dinops/volumes/.secrets/dinops-s3"
    assert plan["secrets"] == [{"name": "dinops-s3", "path": path, "owner": 10001}]
    for name in ("dinops-train", "dinops-serve", "dinops-download"):
        assert {"type": "bind", "source": path, "target": "/run/secrets/dinops-s3", "read_only": True} in (
            by_name[name]["mounts"]
        )
        assert by_name[name]["env"]["AWS_SHARED_CREDENTIALS_FILE"] == "/run/secrets/dinops-s3/credentials"
        assert "env_file" not in by_name[name]
        assert not any(key.startswith("AWS_SECRET") for key in by_name[name]["env"])
    assert not any(m.get("source") == path for m in by_name["dinops-client"]["mounts"])

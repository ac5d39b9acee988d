"""EBS volumes at rest: the root and data volumes cloud_up creates are encrypted, with the account's default key or
the one cloud_aws_kms_key_id names (amazon.aws 10.1.2: ec2_vol's encrypted and kms_key_id, ec2_instance's
volumes[].ebs.encrypted and kms_key_id, passed to RunInstances' BlockDeviceMapping as Encrypted and KmsKeyId)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from cloud.cloud_helpers import aws_env, base_vars, deployment_instances, run_playbook

KEY = "arn:aws:kms:us-east-1:123456789012:key/0b5e6c6e-0000-4000-8000-000000000001"


def volumes_of(moto, deployment: str) -> dict[str, dict]:
    """The root and data volume of each instance of the deployment, by "<machine>-root" / "<machine>-data"."""
    ec2 = moto.client()
    found = {}
    for instance in deployment_instances(moto, deployment):
        machine = {t["Key"]: t["Value"] for t in instance["Tags"]}["Machine"]
        for mapping in instance["BlockDeviceMappings"]:
            (volume,) = ec2.describe_volumes(VolumeIds=[mapping["Ebs"]["VolumeId"]])["Volumes"]
            kind = "root" if mapping["DeviceName"] == "/dev/sda1" else "data"
            found[f"{machine}-{kind}"] = volume
    return found


@contextlib.contextmanager
def launched(moto, variables: dict, deployment: str, tmp_path) -> Iterator[None]:
    """cloud_up with ``variables``, then cloud_down deleting the data, which must leave no instance."""
    try:
        result = run_playbook("cloud_up.yml", variables, aws_env(moto), tmp_path)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        yield
    finally:
        down = run_playbook(
            "cloud_down.yml",
            {**variables, "cloud_aws_down_confirmed": True, "cloud_aws_down_delete_data": True},
            aws_env(moto),
            tmp_path,
        )
        assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
        assert deployment_instances(moto, deployment) == []


# Two deployments cover each setting on and off: the defaults (the account's key, no instance role), and a KMS key
# with an instance role. They are launched once for the module (a cloud_up and a cloud_down each take most of a
# minute against moto) and checked by each test.
PROFILE = "dinops-s3"
VARIANTS = {
    "encrypted": {},
    "encrypted-kms-role": {"cloud_aws_kms_key_id": KEY, "cloud_aws_instance_profile": PROFILE},
}


@pytest.fixture(scope="module")
def deployments(moto, public_key, tmp_path_factory) -> Iterator[dict[str, dict]]:
    """Each variant's deployment up, as ``{deployment: its extra variables}``; both torn down at the end."""
    moto.client("iam").create_instance_profile(InstanceProfileName=PROFILE)
    with contextlib.ExitStack() as stack:
        for deployment, extra in VARIANTS.items():
            variables = {
                **base_vars(moto, public_key, deployment),
                "cloud_machines_list": [{"name": "infer", "profile": "t4", "data_volume_gb": 20}],
                **extra,
            }
            stack.enter_context(launched(moto, variables, deployment, tmp_path_factory.mktemp(deployment)))
        yield VARIANTS


@pytest.mark.parametrize("deployment", sorted(VARIANTS))
def test_root_and_data_volumes_are_encrypted(moto, deployments, deployment):
    key = deployments[deployment].get("cloud_aws_kms_key_id")
    volumes = volumes_of(moto, deployment)
    assert sorted(volumes) == ["infer-data", "infer-root"]
    for name, volume in volumes.items():
        assert volume["Encrypted"] is True, name
        if key:
            assert volume["KmsKeyId"] == key, name
        else:  # the account's default key (moto's stands in for it), not the one the other deployment names
            assert volume.get("KmsKeyId") != KEY, name


@pytest.mark.parametrize("deployment", sorted(VARIANTS))
def test_imdsv2_reaches_the_docker_runtimes_containers_only_with_an_instance_role(moto, deployments, deployment):
    """round2-data-runtime-security finding 23: containers on the Docker bridge are a hop further than the host, so
    with an instance role the token's hop limit is 2 (IMDSv2 still required); without one it stays 1."""
    role = deployments[deployment].get("cloud_aws_instance_profile")
    (instance,) = deployment_instances(moto, deployment)
    options = instance["MetadataOptions"]
    assert options["HttpTokens"] == "required"
    assert options["HttpPutResponseHopLimit"] == (2 if role else 1)

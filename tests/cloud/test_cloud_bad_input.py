"""Bad input to cloud_up: each run stops with a clear message and leaves nothing behind in the account."""

from __future__ import annotations

import pytest
from cloud.cloud_helpers import aws_env, base_vars, deployment_instances, run_playbook

T4 = {"name": "infer", "profile": "t4"}

CASES = {
    "unknown-profile": (
        {"cloud_machines_list": [{"name": "infer", "profile": "v100"}]},
        "machine 'infer': unknown GPU profile 'v100'; known profiles: a100, a10g, h100, l4, rtx3060ti, rtx3090, t4",
    ),
    "profile-not-offered-by-aws": (
        {"cloud_machines_list": [{"name": "train", "profile": "rtx3090"}]},
        "machine 'train': GPU profile 'rtx3090' has no instance type for aws in us-east-1",
    ),
    "profile-not-in-region-table": (
        {"cloud_machines_list": [{"name": "train", "profile": "h100"}], "cloud_machines_region": "eu-west-1"},
        "machine 'train': GPU profile 'h100' has no instance type for aws in eu-west-1; "
        "offered there: a100 (p4d.24xlarge), a10g (g5.xlarge), t4 (g4dn.xlarge)",
    ),
    "type-outside-the-allowed-list": (
        {"cloud_machines_list": [{"name": "train", "profile": "a100"}]},
        "instance type p4d.24xlarge (profile a100) is not in cloud_machines_allowed_instance_types",
    ),
    "cap-exceeded": (
        {"cloud_machines_list": [{"name": f"infer{n}", "profile": "t4"} for n in range(5)]},
        "5 machines requested but cloud_machines_max_instances is 4: nothing was created",
    ),
    # One run, one error listing every problem of the data server (never a spot instance: it is always on).
    "data-server-spot-typo-and-type": (
        {
            "cloud_machines_list": [T4],
            "cloud_machines_data_server": {
                "enabled": True,
                "market": "spot",
                "disk_gb": 50,
                "instance_type": "p5.4xlarge",
            },
        },
        "- cloud_machines_data_server: unknown keys ['disk_gb']; allowed: ['data_volume_gb', 'enabled', "
        "'instance_type', 'market', 'name', 'root_volume_gb'] - cloud_machines_data_server: instance type "
        "'p5.4xlarge' is not in cloud_machines_data_server_allowed_instance_types ['t3.medium', 't3.large', "
        "'m6i.large', 'm7i.large']; add it there if you really mean to pay for it around the clock - "
        "cloud_machines_data_server: market spot is refused: the data server is always on and AWS may reclaim a spot "
        "instance at any time, cutting every GPU machine off its data; use on-demand",
    ),
    "missing-public-key": (
        {"cloud_machines_list": [T4], "cloud_aws_ssh_public_key_file": "/nonexistent/id_ed25519.pub"},
        "SSH public key file /nonexistent/id_ed25519.pub not found",
    ),
    "ssh-open-to-the-world-refused-without-cidr": (
        {"cloud_machines_list": [T4], "cloud_aws_ssh_cidr": ""},
        "cloud_aws_ssh_cidr must be the IPv4 CIDR allowed to reach SSH",
    ),
    # SSH from (nearly) everywhere only when asked for in so many words.
    "ssh-open-to-the-world-refused": (
        {"cloud_machines_list": [T4], "cloud_aws_ssh_cidr": "0.0.0.0/0"},
        "cloud_aws_ssh_cidr 0.0.0.0/0 opens SSH to 4294967296 addresses (a prefix shorter than /8)",
    ),
    "ssh-open-to-a-seventh-of-the-internet-refused": (
        {"cloud_machines_list": [T4], "cloud_aws_ssh_cidr": "64.0.0.0/7"},
        "cloud_aws_ssh_cidr 64.0.0.0/7 opens SSH to 33554432 addresses (a prefix shorter than /8): give the "
        "address you connect from (e.g. 203.0.113.7/32), or set cloud_aws_ssh_open_world: true",
    ),
    "missing-credentials": (
        {"cloud_machines_list": [T4]},
        "Set AWS_PROFILE (after aws configure or aws sso login) or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_before_anything_is_created(case, moto, public_key, tmp_path):
    overrides, message = CASES[case]
    deployment = f"bad-{case}"[:32].rstrip("-")
    variables = {**base_vars(moto, public_key, deployment), **overrides}
    result = run_playbook("cloud_up.yml", variables, aws_env(moto, credentials=case != "missing-credentials"), tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert message in " ".join(output.split()), output
    ec2 = moto.client()
    deployment_filter = [{"Name": "tag:Deployment", "Values": [deployment]}]
    assert deployment_instances(moto, deployment, ("pending", "running", "stopping", "stopped")) == []
    assert ec2.describe_security_groups(Filters=deployment_filter)["SecurityGroups"] == []
    assert ec2.describe_key_pairs(Filters=deployment_filter)["KeyPairs"] == []
    assert ec2.describe_volumes(Filters=deployment_filter)["Volumes"] == []

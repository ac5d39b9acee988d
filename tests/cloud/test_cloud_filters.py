"""The decision logic of cloud_machines and cloud_aws (filter plugins), checked without any cloud."""

from __future__ import annotations

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from dinops_testing import REPO, load_plugin

machines_plugin = load_plugin("roles/cloud_machines/filter_plugins/cloud_machines.py")
aws_plugin = load_plugin("roles/cloud_aws/filter_plugins/cloud_aws.py")
DEFAULTS = yaml.safe_load((REPO / "roles/cloud_machines/defaults/main.yml").read_text())


def settings(**overrides) -> dict:
    """The role's defaults without the cloud_machines_ prefix, as tasks/main.yml passes them."""
    values = {key.removeprefix("cloud_machines_"): value for key, value in DEFAULTS.items()}
    values.update({"owner": "alice", **overrides})
    return values


def test_plan_resolves_instance_types_defaults_and_tags():
    plan = machines_plugin.cloud_machines_plan(
        [
            {"name": "train", "profile": "a10g", "market": "spot"},
            {"name": "serve", "profile": "l4", "data_volume_gb": 0},
        ],
        settings(),
    )
    assert plan["tags"] == {"Project": "dinops", "Deployment": "dinops", "Owner": "alice"}
    assert [(m["name"], m["instance_type"], m["market"], m["data_volume_gb"]) for m in plan["machines"]] == [
        ("train", "g5.xlarge", "spot", 200),
        ("serve", "g6.xlarge", "on-demand", 0),
    ]
    assert plan["machines"][0]["workloads"] == ["download", "train", "inference", "client"]


def test_plan_reports_every_problem_at_once():
    machines = [
        {"name": "Bad_Name", "profile": "t4"},
        {"name": "a", "profile": "t4", "market": "reserved", "root_volume_gb": 10, "gpus": 2},
        {"name": "dup", "profile": "t4", "workloads": ["mine"]},
        {"name": "dup", "profile": "t4", "data_volume_gb": 999999},
    ]
    with pytest.raises(AnsibleFilterError) as error:
        machines_plugin.cloud_machines_plan(machines, settings(owner=" "))
    lines = str(error.value).splitlines()[1:]
    assert lines == [
        "- cloud_machines_owner is empty: set it to who pays for these machines (it becomes the Owner tag)",
        "- machine 'Bad_Name': name must be 2-32 lower-case letters, digits or dashes, starting with a letter",
        "- machine 'a': unknown keys ['gpus']; allowed: "
        "['data_volume_gb', 'market', 'name', 'profile', 'root_volume_gb', 'workloads']",
        "- machine 'a': name must be 2-32 lower-case letters, digits or dashes, starting with a letter",
        "- machine 'a': root_volume_gb 10 is too small for the driver and images (>= 30)",
        "- machine 'a': market must be one of on-demand, spot, got 'reserved'",
        "- machine 'dup': workloads must be a list of ['download', 'train', 'inference', 'client'], got ['mine']",
        "- machine 'dup': data_volume_gb 999999 is outside 0..2000 (cloud_machines_max_volume_gb)",
        "- machine names must be unique; repeated: dup",
    ]


def test_plan_without_list_checks_only_the_identity():
    plan = machines_plugin.cloud_machines_plan([{"name": "x", "profile": "nope"}], settings(), check_list=False)
    assert plan["machines"] == [] and plan["deployment"] == "dinops"


def test_plan_refuses_an_unknown_region_and_an_empty_list():
    with pytest.raises(AnsibleFilterError, match="no instance types for aws in region 'mars-1'") as error:
        machines_plugin.cloud_machines_plan([], settings(region="mars-1"))
    assert "cloud_machines_list is empty" in str(error.value)


def _instance(machine: str, profile: str, instance_type: str, instance_id: str) -> dict:
    return {
        "instance_id": instance_id,
        "instance_type": instance_type,
        "tags": {"Machine": machine, "GpuProfile": profile},
    }


def test_outdated_and_unplanned_instances():
    planned = [
        {"name": "train", "profile": "l4", "instance_type": "g6.xlarge"},
        {"name": "serve", "profile": "t4", "instance_type": "g4dn.xlarge"},
    ]
    instances = [
        _instance("train", "a10g", "g5.xlarge", "i-1"),
        _instance("serve", "t4", "g4dn.xlarge", "i-2"),
        _instance("old", "t4", "g4dn.xlarge", "i-3"),
    ]
    assert aws_plugin.cloud_aws_outdated_instances(instances, planned) == [
        {"machine": "train", "instance_id": "i-1", "reason": "profile a10g -> l4, instance type g5.xlarge -> g6.xlarge"}
    ]
    assert aws_plugin.cloud_aws_unplanned_instances(instances, planned) == [{"machine": "old", "instance_id": "i-3"}]


def test_data_device_is_the_nvme_by_id_path():
    assert (
        aws_plugin.cloud_aws_data_device("vol-0123456789abcdef0")
        == "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"
    )
    with pytest.raises(ValueError, match="not an EBS volume id"):
        aws_plugin.cloud_aws_data_device("snap-1")


def test_launched_entries_pick_up_attached_and_new_volumes():
    machine = {"name": "train"}
    results = [
        {
            "__cloud_aws_machine": machine,
            "instances": [
                {
                    "instance_id": "i-1",
                    "private_ip_address": "10.0.0.5",
                    "block_device_mappings": [{"device_name": "/dev/sda1", "ebs": {"volume_id": "vol-root"}}],
                }
            ],
        }
    ]
    launched = aws_plugin.cloud_aws_launched(results, "/dev/sdf")
    assert launched == [{"machine": machine, "instance_id": "i-1", "address": "10.0.0.5", "data_volume_id": None}]
    volume_results = [{"__cloud_aws_launch": launched[0], "volume_id": "vol-data"}]
    assert aws_plugin.cloud_aws_with_volumes(launched, volume_results)[0]["data_volume_id"] == "vol-data"


def test_default_region_table_lists_only_types_offered_in_each_region(moto):
    """moto ships AWS's published instance type offerings per region: every default mapping must be among them."""
    for region, profiles in DEFAULTS["cloud_machines_instance_types"]["aws"].items():
        ec2 = moto.client(region=region)
        offered = {
            offer["InstanceType"]
            for page in ec2.get_paginator("describe_instance_type_offerings").paginate(
                LocationType="region", Filters=[{"Name": "location", "Values": [region]}]
            )
            for offer in page["InstanceTypeOfferings"]
        }
        assert set(profiles.values()) <= offered, region
        assert not {"rtx3060ti", "rtx3090"} & set(profiles), region

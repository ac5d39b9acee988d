"""The decision logic of cloud_machines and cloud_aws (filter plugins), checked without any cloud."""

from __future__ import annotations

import re

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
    assert aws_plugin.cloud_aws_unplanned_instances(instances, planned) == [
        {"machine": "old", "instance_id": "i-3", "data_server": False}
    ]


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
                    "public_ip_address": "198.51.100.5",
                    "block_device_mappings": [{"device_name": "/dev/sda1", "ebs": {"volume_id": "vol-root"}}],
                }
            ],
        }
    ]
    launched = aws_plugin.cloud_aws_launched(results, "/dev/sdf")
    assert launched == [
        {
            "machine": machine,
            "instance_id": "i-1",
            "address": "198.51.100.5",
            "private_address": "10.0.0.5",
            "data_volume_id": None,
        }
    ]
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


DATA_SERVER = {"name": "data", "instance_type": "t3.medium", "root_volume_gb": 30, "data_volume_gb": 500}


def test_data_server_is_planned_apart_from_the_gpu_machines():
    plan = machines_plugin.cloud_machines_plan([{"name": "train", "profile": "a10g"}], settings())
    assert plan["data_server"] is None
    plan = machines_plugin.cloud_machines_plan(
        [{"name": "train", "profile": "a10g"}], settings(data_server={"enabled": True, "instance_type": "m6i.large"})
    )
    assert [m["name"] for m in plan["machines"]] == ["train"]
    assert plan["data_server"] == {
        **DATA_SERVER,
        "instance_type": "m6i.large",
        "role": "data-server",
        "profile": None,
        "market": "on-demand",
        "workloads": [],
    }


def test_data_server_alone_needs_no_gpu_machine_and_teardown_plans_none():
    plan = machines_plugin.cloud_machines_plan([], settings(data_server={"enabled": True}))
    assert (plan["machines"], plan["data_server"]["name"]) == ([], "data")
    plan = machines_plugin.cloud_machines_plan([], settings(data_server={"enabled": True}), check_list=False)
    assert plan["data_server"] is None


def test_data_server_reports_every_problem_at_once():
    data_server = {
        "enabled": True,
        "name": "train",
        "instance_type": "g5.xlarge",
        "market": "spot",
        "root_volume_gb": 10,
        "data_volume_gb": 0,
        "profile": "t4",
    }
    with pytest.raises(AnsibleFilterError) as error:
        machines_plugin.cloud_machines_plan([{"name": "train", "profile": "t4"}], settings(data_server=data_server))
    assert str(error.value).splitlines()[1:] == [
        "- cloud_machines_data_server: unknown keys ['profile']; allowed: "
        "['data_volume_gb', 'enabled', 'instance_type', 'market', 'name', 'root_volume_gb']",
        "- cloud_machines_data_server: name 'train' is also a machine of cloud_machines_list; names must be unique",
        "- cloud_machines_data_server: instance type 'g5.xlarge' is not in "
        "cloud_machines_data_server_allowed_instance_types ['t3.medium', 't3.large', 'm6i.large', 'm7i.large']; "
        "add it there if you really mean to pay for it around the clock",
        "- cloud_machines_data_server: root_volume_gb 10 is too small for the OS (>= 20)",
        "- cloud_machines_data_server: data_volume_gb must be at least 1: the data server exists to serve its "
        "data volume",
        "- cloud_machines_data_server: market spot is refused: the data server is always on and AWS may reclaim a "
        "spot instance at any time, cutting every GPU machine off its data; use on-demand",
    ]


@pytest.mark.parametrize(
    ("data_server", "message"),
    [
        ("yes", "cloud_machines_data_server must be a dict with enabled and optionally"),
        ({"enabled": "yes"}, "cloud_machines_data_server: enabled must be true or false, got 'yes'"),
        ({"enabled": False, "typo": 1}, "cloud_machines_data_server: unknown keys ['typo']"),
        ({"enabled": True, "market": "reserved"}, "cloud_machines_data_server: market must be on-demand, got"),
        ({"enabled": True, "data_volume_gb": 5000}, "data_volume_gb 5000 is outside 0..2000"),
    ],
)
def test_data_server_bad_values(data_server, message):
    with pytest.raises(AnsibleFilterError, match=re.escape(message)):
        machines_plugin.cloud_machines_plan([{"name": "train", "profile": "t4"}], settings(data_server=data_server))


def test_data_server_instance_tags_and_groups_carry_a_role_not_a_profile():
    plan = machines_plugin.cloud_machines_plan(
        [{"name": "train", "profile": "a10g"}], settings(data_server={"enabled": True})
    )
    common = {"Project": "dinops", "Deployment": "dinops", "Owner": "alice"}
    machines = aws_plugin.cloud_aws_planned_machines(plan)
    assert [m["name"] for m in machines] == ["train", "data"]
    assert aws_plugin.cloud_aws_instance_tags(machines[1], common) == {
        **common,
        "Machine": "data",
        "Role": "data-server",
    }
    assert "Role" not in aws_plugin.cloud_aws_instance_tags(machines[0], common)
    assert aws_plugin.cloud_aws_host_groups(machines[0]) == ["cloud_aws_launched", "gpu_hosts", "a10g"]
    assert aws_plugin.cloud_aws_host_groups(machines[1]) == ["cloud_aws_launched", "data_servers"]


def test_data_server_type_change_replaces_it_and_a_disabled_one_is_reported_as_such():
    data = {"name": "data", "role": "data-server", "profile": None, "instance_type": "m6i.large"}
    kept = {"instance_id": "i-9", "instance_type": "t3.medium", "tags": {"Machine": "data", "Role": "data-server"}}
    assert aws_plugin.cloud_aws_outdated_instances([kept], [data]) == [
        {"machine": "data", "instance_id": "i-9", "reason": "instance type t3.medium -> m6i.large"}
    ]
    gpu_named_data = _instance("data", "t4", "m6i.large", "i-8")
    assert aws_plugin.cloud_aws_outdated_instances([gpu_named_data], [data])[0]["reason"] == (
        "GPU machine -> data server"
    )
    assert aws_plugin.cloud_aws_unplanned_instances([kept], []) == [
        {"machine": "data", "instance_id": "i-9", "data_server": True}
    ]


def _volume(volume_id: str, machine: str) -> dict:
    return {"id": volume_id, "tags": {"Machine": machine, "Role": "data"}}


@pytest.mark.parametrize(
    ("down_data_server", "delete_data", "terminated", "kept", "deleted", "kept_volumes"),
    [
        (False, False, ["i-1"], ["i-9"], [], ["vol-d", "vol-t"]),
        (False, True, ["i-1"], ["i-9"], ["vol-t"], ["vol-d"]),
        (True, False, ["i-1", "i-9"], [], [], ["vol-t", "vol-d"]),
        (True, True, ["i-1", "i-9"], [], ["vol-t", "vol-d"], []),
    ],
)
def test_down_keeps_the_data_server_its_volume_and_the_shared_resources_unless_told(
    down_data_server, delete_data, terminated, kept, deleted, kept_volumes
):
    instances = [
        _instance("train", "t4", "g4dn.xlarge", "i-1"),
        {"instance_id": "i-9", "instance_type": "t3.medium", "tags": {"Machine": "data", "Role": "data-server"}},
    ]
    volumes = [_volume("vol-t", "train"), _volume("vol-d", "data")]
    selection = aws_plugin.cloud_aws_down_selection(instances, volumes, down_data_server, delete_data)
    assert [e["instance_id"] for e in selection["terminate"]] == terminated
    assert [e["instance_id"] for e in selection["keep"]] == kept
    assert (selection["delete_volumes"], selection["keep_volumes"]) == (deleted, kept_volumes)
    assert selection["keep_shared"] is (not down_data_server)
    if kept:
        assert selection["keep"][0]["label"] == "i-9 (data)"


def test_data_server_types_are_offered_in_every_region_of_the_table(moto):
    """An always-allowed data server type must exist wherever the GPU machines can be (moto ships AWS's offerings)."""
    for region in DEFAULTS["cloud_machines_instance_types"]["aws"]:
        offered = {
            offer["InstanceType"]
            for page in moto.client(region=region)
            .get_paginator("describe_instance_type_offerings")
            .paginate(LocationType="region", Filters=[{"Name": "location", "Values": [region]}])
            for offer in page["InstanceTypeOfferings"]
        }
        assert set(DEFAULTS["cloud_machines_data_server_allowed_instance_types"]) <= offered, region
        assert DEFAULTS["cloud_machines_data_server_defaults"]["instance_type"] in offered, region


@pytest.mark.parametrize("role", ["cloud_machines", "cloud_aws"])
def test_every_default_is_documented_in_the_argument_specs_with_the_same_value(role):
    defaults = yaml.safe_load((REPO / f"roles/{role}/defaults/main.yml").read_text())
    spec = yaml.safe_load((REPO / f"roles/{role}/meta/argument_specs.yml").read_text())["argument_specs"]
    options = {name: option for entry in spec.values() for name, option in entry["options"].items()}
    assert set(options) == set(defaults)
    for name, option in options.items():
        if "default" in option:
            assert option["default"] == defaults[name], name


# --- SSH source --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cidr", ["203.0.113.7/32", "10.0.0.0/8", "198.51.100.0/24"])
def test_ssh_cidr_of_a_prefix_of_8_or_longer_is_accepted(cidr):
    assert aws_plugin.cloud_aws_ssh_cidr_problem(cidr, False) == ""


@pytest.mark.parametrize(("cidr", "addresses"), [("0.0.0.0/0", 2**32), ("64.0.0.0/7", 2**25), ("128.0.0.0/1", 2**31)])
def test_ssh_cidr_wider_than_8_is_refused_unless_open_world(cidr, addresses):
    problem = aws_plugin.cloud_aws_ssh_cidr_problem(cidr, False)
    assert f"cloud_aws_ssh_cidr {cidr} opens SSH to {addresses} addresses (a prefix shorter than /8)" in problem
    assert "cloud_aws_ssh_open_world: true" in problem
    assert aws_plugin.cloud_aws_ssh_cidr_problem(cidr, True) == ""


@pytest.mark.parametrize("cidr", ["", "203.0.113.7", "203.0.113.300/32", "2001:db8::/64", "any", None])
def test_ssh_cidr_that_is_no_ipv4_cidr_is_refused_even_open_world(cidr):
    problem = aws_plugin.cloud_aws_ssh_cidr_problem(cidr, True)
    assert problem.startswith("cloud_aws_ssh_cidr must be the IPv4 CIDR allowed to reach SSH, e.g. 203.0.113.7/32")

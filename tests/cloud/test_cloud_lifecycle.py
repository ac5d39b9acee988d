"""cloud_up, the dynamic inventory, a profile change and cloud_down, run for real against moto.

The playbook runs are expensive, so one module-scoped chain of fixtures brings a deployment of two GPU machines and
the always-on data server up (twice), changes one machine's profile, tears the GPU machines down while the data
server stays, brings them up again next to the same data server, and finally removes the data server too; each
test asserts one part of the resulting state through boto3.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from cloud.cloud_helpers import (
    REPO,
    SECRET_KEY,
    SSH_CIDR,
    VENV_BIN,
    aws_env,
    base_vars,
    deployment_instances,
    play_recap,
    run_playbook,
    tags_of,
)

DEPLOYMENT = "lifecycle"
MACHINES = [
    {"name": "infer", "profile": "t4", "data_volume_gb": 50, "workloads": ["inference", "client"]},
    {"name": "train", "profile": "a10g", "root_volume_gb": 120, "market": "spot"},
]
REPLACED = [MACHINES[0], {**MACHINES[1], "profile": "l4"}]
# Defaults otherwise: t3.medium, root volume 30 GB, on-demand.
DATA_SERVER = {"enabled": True, "data_volume_gb": 100}
ALL_STATES = ("pending", "running", "stopping", "stopped")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lifecycle")


@pytest.fixture(scope="module")
def up(moto, public_key, workdir) -> dict:
    """cloud_up from nothing (verbose, to check what is logged), then once more with the JSON callback, whose
    document holds the in-memory inventory cloud_up builds (add_host results) and the recap."""
    variables = {
        **base_vars(moto, public_key, DEPLOYMENT),
        "cloud_machines_list": MACHINES,
        "cloud_machines_data_server": DATA_SERVER,
    }
    first = run_playbook("cloud_up.yml", variables, aws_env(moto), workdir, "-vvv")
    assert first.returncode == 0, first.stdout + first.stderr
    state = {"first": first, "instances": _instances(moto)}
    json_env = {**aws_env(moto), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}
    second = run_playbook("cloud_up.yml", variables, json_env, workdir)
    assert second.returncode == 0, second.stdout + second.stderr
    # The project's timing callbacks print around the JSON document.
    document, _ = json.JSONDecoder().raw_decode(second.stdout[second.stdout.index("{") :])
    (add_host,) = [
        task["hosts"]["localhost"]["results"]
        for play in document["plays"]
        for task in play["tasks"]
        if task["task"]["name"].endswith("hosts | Add each instance to the in-memory inventory")
    ]
    added = {result["add_host"]["host_name"]: result["add_host"] for result in add_host}
    return {**state, "second_stats": document["stats"], "added": added, "variables": variables}


def _instances(moto) -> dict[str, dict]:
    return {tags_of(i)["Machine"]: i for i in deployment_instances(moto, DEPLOYMENT)}


@pytest.fixture(scope="module")
def inventory(moto, up, bystanders) -> dict:
    env = aws_env(moto)
    command = [str(VENV_BIN / "ansible-inventory"), "-i", "inventories/aws"]
    graph = subprocess.run([*command, "--graph"], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    listing = subprocess.run([*command, "--list"], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    # ansible-inventory does not template; the debug action resolves the variables without connecting.
    resolved = subprocess.run(
        [
            str(VENV_BIN / "ansible"),
            "-i",
            "inventories/aws",
            f"{DEPLOYMENT}-train:{DEPLOYMENT}-data",
            "-m",
            "ansible.builtin.debug",
            "-a",
            "msg={{ [nvidia_driver_branch | default(none), docker_default_shm_size | default(none), ansible_become,"
            " nfs_server_clients | default(none)] }}",
        ],
        cwd=REPO,
        env={**env, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    # The project's timing callbacks print around the JSON document.
    document, _ = json.JSONDecoder().raw_decode(resolved.stdout[resolved.stdout.index("{") :])
    resolved_hosts = document["plays"][0]["tasks"][0]["hosts"]
    return {
        "graph": graph.stdout,
        "list": _plain(json.loads(listing.stdout)),
        "train_vars": resolved_hosts[f"{DEPLOYMENT}-train"]["msg"],
        "data_vars": resolved_hosts[f"{DEPLOYMENT}-data"]["msg"],
    }


def _plain(value):
    """ansible-inventory --list marks values from the cloud as unsafe ({"__ansible_unsafe": ...}): unwrap them."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


@pytest.fixture(scope="module")
def replaced(moto, up, bystanders, inventory, workdir) -> dict:
    variables = {**up["variables"], "cloud_machines_list": REPLACED}
    result = run_playbook("cloud_up.yml", variables, aws_env(moto), workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    return {"result": result, "instances": _instances(moto)}


@pytest.fixture(scope="module")
def bystanders(moto, up) -> dict[str, str]:
    """Instances cloud_down must not touch: one untagged, one of another deployment of the same project."""
    ec2 = moto.client()
    image = ec2.describe_images(Owners=["self"])["Images"][0]["ImageId"]

    def launch(tags: list[dict]) -> str:
        spec = [{"ResourceType": "instance", "Tags": tags}] if tags else []
        return ec2.run_instances(
            ImageId=image, MinCount=1, MaxCount=1, InstanceType="t3.micro", TagSpecifications=spec
        )["Instances"][0]["InstanceId"]

    other = [{"Key": "Project", "Value": "dinops"}, {"Key": "Deployment", "Value": "someone-else"}]
    return {"untagged": launch([]), "other_deployment": launch(other)}


@pytest.fixture(scope="module")
def other_data_volume(moto, up) -> str:
    """Another deployment's data volume: teardown with data deletion must leave it alone."""
    tags = [
        {"Key": "Project", "Value": "dinops"},
        {"Key": "Deployment", "Value": "someone-else"},
        {"Key": "Role", "Value": "data"},
    ]
    return moto.client().create_volume(
        AvailabilityZone="us-east-1a", Size=10, TagSpecifications=[{"ResourceType": "volume", "Tags": tags}]
    )["VolumeId"]


@pytest.fixture(scope="module")
def down(moto, up, replaced, bystanders, workdir) -> dict:
    variables = {**up["variables"], "cloud_machines_list": REPLACED}
    # Unconfirmed, and asked to delete data too: the message must still keep the data server's volume.
    told = {**variables, "cloud_aws_down_delete_data": True}
    unconfirmed = run_playbook("cloud_down.yml", told, aws_env(moto), workdir)
    running_after_unconfirmed = len(deployment_instances(moto, DEPLOYMENT))
    volumes_after_unconfirmed = _data_volumes(moto)
    confirmed = run_playbook("cloud_down.yml", {**variables, "cloud_aws_down_confirmed": True}, aws_env(moto), workdir)
    assert confirmed.returncode == 0, confirmed.stdout + confirmed.stderr
    return {
        "unconfirmed": unconfirmed,
        "confirmed": confirmed,
        "running_after_unconfirmed": running_after_unconfirmed,
        "kept_volume_ids": {name: v["VolumeId"] for name, v in _data_volumes(moto).items()},
        "volumes_after_unconfirmed": sorted(v["VolumeId"] for v in volumes_after_unconfirmed.values()),
    }


def _data_volumes(moto) -> dict[str, dict]:
    volumes = moto.client().describe_volumes(
        Filters=[{"Name": "tag:Deployment", "Values": [DEPLOYMENT]}, {"Name": "tag:Role", "Values": ["data"]}]
    )["Volumes"]
    return {tags_of(v)["Machine"]: v for v in volumes}


def test_up_launches_one_tagged_instance_per_machine(up):
    instances = up["instances"]
    assert sorted(instances) == ["data", "infer", "train"]
    assert instances["infer"]["InstanceType"] == "g4dn.xlarge"
    assert instances["train"]["InstanceType"] == "g5.xlarge"
    infer_tags = tags_of(instances["infer"])
    assert infer_tags == {
        "Name": f"{DEPLOYMENT}-infer",
        "Project": "dinops",
        "Deployment": DEPLOYMENT,
        "Owner": "pytest",
        "Machine": "infer",
        "GpuProfile": "t4",
        "Workloads": "inference,client",
    }
    assert tags_of(instances["train"])["Workloads"] == "download,train,inference,client"
    # The data server: a CPU machine with a Role tag instead of a GPU profile.
    assert instances["data"]["InstanceType"] == "t3.medium"
    assert tags_of(instances["data"]) == {
        "Name": f"{DEPLOYMENT}-data",
        "Project": "dinops",
        "Deployment": DEPLOYMENT,
        "Owner": "pytest",
        "Machine": "data",
        "Role": "data-server",
    }
    assert {i["KeyName"] for i in instances.values()} == {DEPLOYMENT}
    assert {i["Placement"]["AvailabilityZone"] for i in instances.values()} == {"us-east-1a"}


def test_up_uses_the_image_found_by_owner_and_name(moto, up):
    image = moto.client().describe_images(ImageIds=[up["instances"]["infer"]["ImageId"]])["Images"][0]
    assert image["Name"].startswith("ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-")


def test_up_opens_ssh_to_the_given_cidr_and_nfs_between_the_machines_only(moto, up):
    groups = moto.client().describe_security_groups(Filters=[{"Name": "tag:Deployment", "Values": [DEPLOYMENT]}])[
        "SecurityGroups"
    ]
    assert [g["GroupName"] for g in groups] == [f"{DEPLOYMENT}-machines"]
    rules = sorted(
        (
            p["IpProtocol"],
            p["FromPort"],
            p["ToPort"],
            [r["CidrIp"] for r in p["IpRanges"]],
            [g["GroupId"] for g in p["UserIdGroupPairs"]],
        )
        for p in groups[0]["IpPermissions"]
    )
    # NFSv4 to the data server from the group itself; nothing from outside but SSH.
    assert rules == [("tcp", 22, 22, [SSH_CIDR], []), ("tcp", 2049, 2049, [], [groups[0]["GroupId"]])]
    assert tags_of(groups[0])["Owner"] == "pytest"
    instance_groups = {g["GroupId"] for i in up["instances"].values() for g in i["SecurityGroups"]}
    assert groups[0]["GroupId"] in instance_groups


def test_up_imports_the_key_pair_with_tags(moto, up):
    pairs = moto.client().describe_key_pairs(KeyNames=[DEPLOYMENT])["KeyPairs"]
    assert tags_of(pairs[0]) == {"Project": "dinops", "Deployment": DEPLOYMENT, "Owner": "pytest"}


def test_up_attaches_a_kept_data_volume_and_sizes_the_root_volume(moto, up):
    volumes = _data_volumes(moto)
    assert {name: v["Size"] for name, v in volumes.items()} == {"data": 100, "infer": 50, "train": 200}
    for name, volume in volumes.items():
        (attachment,) = volume["Attachments"]
        assert attachment["InstanceId"] == up["instances"][name]["InstanceId"]
        assert attachment["Device"] == "/dev/sdf"
        (mapping,) = [m for m in up["instances"][name]["BlockDeviceMappings"] if m["DeviceName"] == "/dev/sdf"]
        assert (mapping["Ebs"]["VolumeId"], mapping["Ebs"]["DeleteOnTermination"]) == (volume["VolumeId"], False)
        assert volume["VolumeType"] == "gp3"
        assert tags_of(volume)["Name"] == f"{DEPLOYMENT}-{name}-data"
    root_ids = {
        name: next(m["Ebs"]["VolumeId"] for m in i["BlockDeviceMappings"] if m["DeviceName"] == "/dev/sda1")
        for name, i in up["instances"].items()
    }
    roots = {name: moto.client().describe_volumes(VolumeIds=[vid])["Volumes"][0] for name, vid in root_ids.items()}
    assert {name: v["Size"] for name, v in roots.items()} == {"data": 30, "infer": 100, "train": 120}
    assert {tags_of(v)["Deployment"] for v in roots.values()} == {DEPLOYMENT}


def test_up_launches_spot_machines_from_the_spot_template(moto, up):
    ec2 = moto.client()
    (template,) = ec2.describe_launch_templates(Filters=[{"Name": "tag:Deployment", "Values": [DEPLOYMENT]}])[
        "LaunchTemplates"
    ]
    data = ec2.describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"])[
        "LaunchTemplateVersions"
    ][0]["LaunchTemplateData"]
    assert data["InstanceMarketOptions"]["MarketType"] == "spot"
    assert tags_of(up["instances"]["train"])["aws:ec2launchtemplate:id"] == template["LaunchTemplateId"]
    assert "aws:ec2launchtemplate:id" not in tags_of(up["instances"]["infer"])


def test_second_up_changes_nothing(up):
    stats = up["second_stats"]
    assert stats["localhost"]["failures"] == 0
    assert {host: counts["changed"] for host, counts in stats.items()} == dict.fromkeys(stats, 0)
    assert play_recap(up["first"].stdout)["localhost"]["changed"] > 0


def test_up_adds_the_data_server_to_data_servers_with_its_private_address(up):
    data, train = up["added"][f"{DEPLOYMENT}-data"], up["added"][f"{DEPLOYMENT}-train"]
    assert sorted(data["groups"]) == ["cloud_aws_launched", "data_servers"]
    assert sorted(train["groups"]) == ["a10g", "cloud_aws_launched", "gpu_hosts"]
    private = up["instances"]["data"]["PrivateIpAddress"]
    assert data["host_vars"]["dinops_private_address"] == private
    assert data["host_vars"]["ansible_host"] == up["instances"]["data"]["PublicIpAddress"] != private


def test_credentials_never_appear_in_the_output(up):
    output = up["first"].stdout + up["first"].stderr
    assert "secret_key" in output  # -vvv shows the module arguments, so the secret would be visible if logged
    assert SECRET_KEY not in output


def test_inventory_groups_hosts_by_gpu_profile(inventory):
    groups = inventory["list"]
    assert sorted(groups["t4"]["hosts"]) == [f"{DEPLOYMENT}-infer"]
    assert sorted(groups["a10g"]["hosts"]) == [f"{DEPLOYMENT}-train"]
    assert {"t4", "a10g"} <= set(groups["gpu_hosts"]["children"])
    assert f"{DEPLOYMENT}-infer" in groups[f"deployment_{DEPLOYMENT}"]["hosts"]
    assert "@t4:" in inventory["graph"] and "@a10g:" in inventory["graph"]
    # Only instances cloud_up launched: neither the untagged one nor another deployment's one without a Machine tag.
    assert sorted(inventory["list"]["_meta"]["hostvars"]) == [
        f"{DEPLOYMENT}-data",
        f"{DEPLOYMENT}-infer",
        f"{DEPLOYMENT}-train",
    ]


def test_inventory_lists_the_data_server_in_data_servers_and_in_no_gpu_group(inventory, up):
    groups, host = inventory["list"], f"{DEPLOYMENT}-data"
    assert groups["data_servers"]["hosts"] == [host]
    assert all(host not in groups[profile].get("hosts", []) for profile in groups["gpu_hosts"]["children"])
    assert "hosts" not in groups["gpu_hosts"]
    hostvars = groups["_meta"]["hostvars"][host]
    assert hostvars["dinops_private_address"] == up["instances"]["data"]["PrivateIpAddress"]
    assert (hostvars["ansible_user"], hostvars["ansible_become"], hostvars["dinops_workloads"]) == ("ubuntu", True, [])
    assert "gpu_profile" not in hostvars and "docker_data_root" not in hostvars
    # The GPU stages' inputs are not set; the NFS exports go to the current GPU machines' private addresses.
    gpu_addresses = sorted(up["instances"][name]["PrivateIpAddress"] for name in ("infer", "train"))
    assert inventory["data_vars"][:3] == [None, None, True]
    assert sorted(inventory["data_vars"][3]) == gpu_addresses


def test_inventory_resolves_each_hosts_profile_variables(inventory, up):
    hostvars = inventory["list"]["_meta"]["hostvars"]
    infer, train = hostvars[f"{DEPLOYMENT}-infer"], hostvars[f"{DEPLOYMENT}-train"]
    assert (infer["gpu_profile"]["name"], infer["gpu_profile"]["gpu_memory_gb"]) == ("t4", 16)
    assert (train["gpu_profile"]["name"], train["gpu_profile"]["gpu_memory_gb"]) == ("a10g", 24)
    # gpu_hosts' group_vars turn the profile into the roles' inputs, as in the example inventory.
    # branch, shm (a10g: 2G, see tests/k8s/test_fit.py), become, no NFS exports of its own
    assert inventory["train_vars"] == ["580", "2G", True, None]
    assert infer["ansible_host"] == up["instances"]["infer"]["PublicIpAddress"]
    assert infer["ansible_user"] == "ubuntu"
    assert infer["dinops_workloads"] == ["inference", "client"]


def test_profile_change_replaces_exactly_that_machine(moto, up, replaced):
    before, after = up["instances"], replaced["instances"]
    assert after["infer"]["InstanceId"] == before["infer"]["InstanceId"]
    assert after["data"]["InstanceId"] == before["data"]["InstanceId"]
    assert after["train"]["InstanceId"] != before["train"]["InstanceId"]
    assert (after["train"]["InstanceType"], tags_of(after["train"])["GpuProfile"]) == ("g6.xlarge", "l4")
    old = moto.client().describe_instances(InstanceIds=[before["train"]["InstanceId"]])["Reservations"][0]["Instances"]
    assert old[0]["State"]["Name"] == "terminated"
    assert (
        "Replacing machine train: profile a10g -> l4, instance type g5.xlarge -> g6.xlarge" in replaced["result"].stdout
    )


def test_profile_change_reattaches_the_same_data_volume(moto, up, replaced):
    volumes = _data_volumes(moto)
    assert sorted(volumes) == ["data", "infer", "train"]
    assert volumes["train"]["Attachments"][0]["InstanceId"] == replaced["instances"]["train"]["InstanceId"]


def test_down_without_confirmation_lists_and_changes_nothing(down, replaced):
    unconfirmed = down["unconfirmed"]
    message = " ".join(unconfirmed.stdout.split())
    instances, volumes = replaced["instances"], down["kept_volume_ids"]
    assert unconfirmed.returncode != 0
    assert "cloud_down would terminate 2 instance(s) of deployment lifecycle in us-east-1: " in message
    assert f"{instances['infer']['InstanceId']} (infer)" in message.split("; keep")[0]
    assert (
        f"keep 1 data server(s): {instances['data']['InstanceId']} (data) "
        "(-e cloud_aws_down_data_server=true terminates it too); DELETE data volumes: "
    ) in message
    deleted = message.split("DELETE data volumes: ")[1].split(";")[0]
    assert sorted(deleted.split(", ")) == sorted([volumes["infer"], volumes["train"]])
    assert f"; keep data volumes: {volumes['data']}; keep the security group and key pair." in message
    assert "-e cloud_aws_down_confirmed=true" in unconfirmed.stdout
    assert down["running_after_unconfirmed"] == 3
    assert down["volumes_after_unconfirmed"] == sorted(volumes.values())


def test_down_terminates_only_this_deployments_gpu_machines(moto, down, bystanders, replaced):
    (data_server,) = deployment_instances(moto, DEPLOYMENT, ALL_STATES)
    assert data_server["InstanceId"] == replaced["instances"]["data"]["InstanceId"]
    states = {
        i["InstanceId"]: i["State"]["Name"]
        for r in moto.client().describe_instances(InstanceIds=list(bystanders.values()))["Reservations"]
        for i in r["Instances"]
    }
    assert states == dict.fromkeys(bystanders.values(), "running")


def test_down_keeps_the_data_volumes_and_what_the_data_server_uses(moto, down):
    volumes = _data_volumes(moto)
    states = {name: v["State"] for name, v in volumes.items()}
    assert states == {"data": "in-use", "infer": "available", "train": "available"}
    groups, keys = _shared_resources(moto)
    assert ([g["GroupName"] for g in groups], [k["KeyName"] for k in keys]) == (
        [f"{DEPLOYMENT}-machines"],
        [DEPLOYMENT],
    )
    deployment_filter = [{"Name": "tag:Deployment", "Values": [DEPLOYMENT]}]
    assert moto.client().describe_launch_templates(Filters=deployment_filter)["LaunchTemplates"] == []
    confirmed = " ".join(down["confirmed"].stdout.split())
    assert f"Keeping security group {DEPLOYMENT}-machines and key pair {DEPLOYMENT}: the data server" in confirmed


def _shared_resources(moto) -> tuple[list, list]:
    ec2, deployment_filter = moto.client(), [{"Name": "tag:Deployment", "Values": [DEPLOYMENT]}]
    return (
        ec2.describe_security_groups(Filters=deployment_filter)["SecurityGroups"],
        ec2.describe_key_pairs(Filters=deployment_filter)["KeyPairs"],
    )


@pytest.fixture(scope="module")
def up_again(moto, up, down, workdir) -> dict:
    result = run_playbook("cloud_up.yml", up["variables"], aws_env(moto), workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    return {"instances": _instances(moto), "volumes": _data_volumes(moto)}


def test_next_up_launches_only_the_gpu_machines_next_to_the_same_data_server(up, replaced, down, up_again):
    before, after = replaced["instances"], up_again["instances"]
    assert sorted(after) == ["data", "infer", "train"]
    assert after["data"]["InstanceId"] == before["data"]["InstanceId"]
    assert after["infer"]["InstanceId"] != before["infer"]["InstanceId"]
    # Every kept volume is attached again: the GPU machines' to their new instances, the data server's stays.
    volumes = up_again["volumes"]
    assert {name: v["VolumeId"] for name, v in volumes.items()} == down["kept_volume_ids"]
    assert {name: v["Attachments"][0]["InstanceId"] for name, v in volumes.items()} == {
        name: after[name]["InstanceId"] for name in ("data", "infer", "train")
    }


@pytest.fixture(scope="module")
def down_all(moto, up, up_again, other_data_volume, workdir) -> subprocess.CompletedProcess[str]:
    variables = {
        **up["variables"],
        "cloud_aws_down_confirmed": True,
        "cloud_aws_down_data_server": True,
        "cloud_aws_down_delete_data": True,
    }
    result = run_playbook("cloud_down.yml", variables, aws_env(moto), workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_down_told_so_removes_the_data_server_and_what_it_used(moto, down_all, bystanders):
    assert deployment_instances(moto, DEPLOYMENT, ALL_STATES) == []
    assert _shared_resources(moto) == ([], [])
    bystander_ids = list(bystanders.values())
    reservations = moto.client().describe_instances(InstanceIds=bystander_ids)["Reservations"]
    assert {i["State"]["Name"] for r in reservations for i in r["Instances"]} == {"running"}


def test_down_deletes_the_data_volumes_only_when_told_and_only_this_deployments(moto, down_all, other_data_volume):
    assert _data_volumes(moto) == {}
    (other,) = moto.client().describe_volumes(VolumeIds=[other_data_volume])["Volumes"]
    assert other["State"] == "available"

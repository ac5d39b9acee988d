"""cloud_up, the dynamic inventory, a profile change and cloud_down, run for real against moto.

The playbook runs are expensive, so one module-scoped chain of fixtures brings a deployment up (twice), changes
one machine's profile, and tears it down; each test asserts one part of the resulting state through boto3.
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


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lifecycle")


@pytest.fixture(scope="module")
def up(moto, public_key, workdir) -> dict:
    """cloud_up from nothing (verbose, to check what is logged), then once more."""
    variables = {**base_vars(moto, public_key, DEPLOYMENT), "cloud_machines_list": MACHINES}
    first = run_playbook("cloud_up.yml", variables, aws_env(moto), workdir, "-vvv")
    assert first.returncode == 0, first.stdout + first.stderr
    state = {"first": first, "instances": {tags_of(i)["Machine"]: i for i in deployment_instances(moto, DEPLOYMENT)}}
    second = run_playbook("cloud_up.yml", variables, aws_env(moto), workdir)
    assert second.returncode == 0, second.stdout + second.stderr
    return {**state, "second": second, "variables": variables}


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
            f"{DEPLOYMENT}-train",
            "-m",
            "ansible.builtin.debug",
            "-a",
            "msg={{ [nvidia_driver_branch, docker_default_shm_size, ansible_become] }}",
        ],
        cwd=REPO,
        env={**env, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    # The project's timing callbacks print around the JSON document.
    document, _ = json.JSONDecoder().raw_decode(resolved.stdout[resolved.stdout.index("{") :])
    train_vars = document["plays"][0]["tasks"][0]["hosts"][f"{DEPLOYMENT}-train"]["msg"]
    return {"graph": graph.stdout, "list": _plain(json.loads(listing.stdout)), "train_vars": train_vars}


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
    return {"result": result, "instances": {tags_of(i)["Machine"]: i for i in deployment_instances(moto, DEPLOYMENT)}}


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
    unconfirmed = run_playbook("cloud_down.yml", variables, aws_env(moto), workdir)
    running_after_unconfirmed = len(deployment_instances(moto, DEPLOYMENT))
    confirmed = run_playbook("cloud_down.yml", {**variables, "cloud_aws_down_confirmed": True}, aws_env(moto), workdir)
    assert confirmed.returncode == 0, confirmed.stdout + confirmed.stderr
    return {
        "unconfirmed": unconfirmed,
        "running_after_unconfirmed": running_after_unconfirmed,
        "kept_volume_ids": {name: v["VolumeId"] for name, v in _data_volumes(moto).items()},
    }


def _data_volumes(moto) -> dict[str, dict]:
    volumes = moto.client().describe_volumes(
        Filters=[{"Name": "tag:Deployment", "Values": [DEPLOYMENT]}, {"Name": "tag:Role", "Values": ["data"]}]
    )["Volumes"]
    return {tags_of(v)["Machine"]: v for v in volumes}


def test_up_launches_one_tagged_instance_per_machine(up):
    instances = up["instances"]
    assert sorted(instances) == ["infer", "train"]
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
    assert {i["KeyName"] for i in instances.values()} == {DEPLOYMENT}
    assert {i["Placement"]["AvailabilityZone"] for i in instances.values()} == {"us-east-1a"}


def test_up_uses_the_image_found_by_owner_and_name(moto, up):
    image = moto.client().describe_images(ImageIds=[up["instances"]["infer"]["ImageId"]])["Images"][0]
    assert image["Name"].startswith("ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-")


def test_up_opens_ssh_to_the_given_cidr_only(moto, up):
    groups = moto.client().describe_security_groups(Filters=[{"Name": "tag:Deployment", "Values": [DEPLOYMENT]}])[
        "SecurityGroups"
    ]
    assert [g["GroupName"] for g in groups] == [f"{DEPLOYMENT}-machines"]
    rules = [
        (p["IpProtocol"], p["FromPort"], p["ToPort"], [r["CidrIp"] for r in p["IpRanges"]])
        for p in groups[0]["IpPermissions"]
    ]
    assert rules == [("tcp", 22, 22, [SSH_CIDR])]
    assert tags_of(groups[0])["Owner"] == "pytest"
    instance_groups = {g["GroupId"] for i in up["instances"].values() for g in i["SecurityGroups"]}
    assert groups[0]["GroupId"] in instance_groups


def test_up_imports_the_key_pair_with_tags(moto, up):
    pairs = moto.client().describe_key_pairs(KeyNames=[DEPLOYMENT])["KeyPairs"]
    assert tags_of(pairs[0]) == {"Project": "dinops", "Deployment": DEPLOYMENT, "Owner": "pytest"}


def test_up_attaches_a_kept_data_volume_and_sizes_the_root_volume(moto, up):
    volumes = _data_volumes(moto)
    assert {name: v["Size"] for name, v in volumes.items()} == {"infer": 50, "train": 200}
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
    assert {name: v["Size"] for name, v in roots.items()} == {"infer": 100, "train": 120}
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
    recap = play_recap(up["second"].stdout)
    assert recap["localhost"]["failed"] == 0
    assert {host: counts["changed"] for host, counts in recap.items()} == dict.fromkeys(recap, 0)
    assert play_recap(up["first"].stdout)["localhost"]["changed"] > 0


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
    # Only instances cloud_up launched: neither the untagged one nor another deployment's untagged-profile one.
    assert sorted(inventory["list"]["_meta"]["hostvars"]) == [f"{DEPLOYMENT}-infer", f"{DEPLOYMENT}-train"]


def test_inventory_resolves_each_hosts_profile_variables(inventory, up):
    hostvars = inventory["list"]["_meta"]["hostvars"]
    infer, train = hostvars[f"{DEPLOYMENT}-infer"], hostvars[f"{DEPLOYMENT}-train"]
    assert (infer["gpu_profile"]["name"], infer["gpu_profile"]["gpu_memory_gb"]) == ("t4", 16)
    assert (train["gpu_profile"]["name"], train["gpu_profile"]["gpu_memory_gb"]) == ("a10g", 24)
    # gpu_hosts' group_vars turn the profile into the roles' inputs, as in the example inventory.
    assert inventory["train_vars"] == ["580", "2G", True]  # branch, shm (a10g: 2G, see tests/k8s/test_fit.py), GPU
    assert infer["ansible_host"] == up["instances"]["infer"]["PublicIpAddress"]
    assert infer["ansible_user"] == "ubuntu"
    assert infer["dinops_workloads"] == ["inference", "client"]


def test_profile_change_replaces_exactly_that_machine(moto, up, replaced):
    before, after = up["instances"], replaced["instances"]
    assert after["infer"]["InstanceId"] == before["infer"]["InstanceId"]
    assert after["train"]["InstanceId"] != before["train"]["InstanceId"]
    assert (after["train"]["InstanceType"], tags_of(after["train"])["GpuProfile"]) == ("g6.xlarge", "l4")
    old = moto.client().describe_instances(InstanceIds=[before["train"]["InstanceId"]])["Reservations"][0]["Instances"]
    assert old[0]["State"]["Name"] == "terminated"
    assert (
        "Replacing machine train: profile a10g -> l4, instance type g5.xlarge -> g6.xlarge" in replaced["result"].stdout
    )


def test_profile_change_reattaches_the_same_data_volume(moto, up, replaced):
    volumes = _data_volumes(moto)
    assert sorted(volumes) == ["infer", "train"]
    assert volumes["train"]["Attachments"][0]["InstanceId"] == replaced["instances"]["train"]["InstanceId"]


def test_down_without_confirmation_lists_and_changes_nothing(down):
    unconfirmed = down["unconfirmed"]
    assert unconfirmed.returncode != 0
    assert "cloud_down would terminate 2 instance(s) of deployment lifecycle" in unconfirmed.stdout
    assert "-e cloud_aws_down_confirmed=true" in unconfirmed.stdout
    assert down["running_after_unconfirmed"] == 2


def test_down_terminates_only_this_deployments_instances(moto, down, bystanders):
    assert deployment_instances(moto, DEPLOYMENT, ("pending", "running", "stopping", "stopped")) == []
    states = {
        i["InstanceId"]: i["State"]["Name"]
        for r in moto.client().describe_instances(InstanceIds=list(bystanders.values()))["Reservations"]
        for i in r["Instances"]
    }
    assert states == dict.fromkeys(bystanders.values(), "running")


def test_down_keeps_the_data_volumes_and_removes_the_rest(moto, down):
    volumes = _data_volumes(moto)
    assert {name: v["State"] for name, v in volumes.items()} == {"infer": "available", "train": "available"}
    ec2 = moto.client()
    deployment_filter = [{"Name": "tag:Deployment", "Values": [DEPLOYMENT]}]
    assert ec2.describe_security_groups(Filters=deployment_filter)["SecurityGroups"] == []
    assert ec2.describe_key_pairs(Filters=deployment_filter)["KeyPairs"] == []
    assert ec2.describe_launch_templates(Filters=deployment_filter)["LaunchTemplates"] == []


@pytest.fixture(scope="module")
def down_deleting_data(moto, up, down, other_data_volume, workdir) -> subprocess.CompletedProcess[str]:
    variables = {**up["variables"], "cloud_aws_down_confirmed": True, "cloud_aws_down_delete_data": True}
    result = run_playbook("cloud_down.yml", variables, aws_env(moto), workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_down_deletes_the_data_volumes_only_when_told_and_only_this_deployments(
    moto, down, down_deleting_data, other_data_volume
):
    assert _data_volumes(moto) == {}
    (other,) = moto.client().describe_volumes(VolumeIds=[other_data_volume])["Volumes"]
    assert other["State"] == "available"

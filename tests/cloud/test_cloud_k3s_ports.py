"""k3s across cloud machines: the security group lets the machines of one deployment reach each other on the ports
k3s needs (https://docs.k3s.io/installation/requirements#networking: 6443/tcp to the server, 8472/udp flannel
VXLAN and 10250/tcp kubelet between all nodes), from the group itself only, never from a CIDR."""

from __future__ import annotations

from cloud.cloud_helpers import aws_env, base_vars, deployment_instances, run_playbook


def test_k3s_ports_open_between_the_machines_only(moto, public_key, tmp_path):
    deployment = "k3sports"
    variables = {
        **base_vars(moto, public_key, deployment),
        "cloud_machines_list": [{"name": "train", "profile": "a10g"}, {"name": "infer", "profile": "t4"}],
        "dinops_cluster": "k3s",
    }
    try:
        for _ in range(2):  # the second run finds the rules and adds nothing
            result = run_playbook("cloud_up.yml", variables, aws_env(moto), tmp_path)
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        groups = moto.client().describe_security_groups(Filters=[{"Name": "tag:Deployment", "Values": [deployment]}])
        group = groups["SecurityGroups"][0]
        rules = sorted(
            (
                p["IpProtocol"],
                p["FromPort"],
                [r["CidrIp"] for r in p["IpRanges"]],
                [g["GroupId"] for g in p["UserIdGroupPairs"]],
            )
            for p in group["IpPermissions"]
        )
        own = group["GroupId"]
        assert ("tcp", 6443, [], [own]) in rules
        assert ("udp", 8472, [], [own]) in rules
        assert ("tcp", 10250, [], [own]) in rules
        assert len(rules) == 4, rules  # SSH from the configured CIDR, and these three
    finally:
        # The moto server is shared by the session: leave no running machine for the other cloud tests' inventories.
        down = run_playbook("cloud_down.yml", {**variables, "cloud_aws_down_confirmed": True}, aws_env(moto), tmp_path)
        assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
        assert deployment_instances(moto, deployment) == []

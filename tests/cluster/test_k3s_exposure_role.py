"""The k3s role's exposure wiring, evaluated by ansible-playbook from the role's own defaults and vars: the
config.yaml each node gets (disable, kube-proxy-arg), whether the host firewall is on, and its sources.

Both hosts of the inventory are this machine (local connection, real network facts); their private addresses
(dinops_private_address, as cloud_up and inventories/aws give them) are documentation addresses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "k3s"
INVENTORY = {
    "all": {
        "hosts": {
            "server-1": {"dinops_private_address": "198.51.100.10"},
            "agent-1": {"dinops_private_address": "198.51.100.20"},
        },
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "children": {"k3s_server": {"hosts": {"server-1": {}}}, "k3s_agent": {"hosts": {"agent-1": {}}}},
    }
}


def evaluate(tmp: Path, extra: dict) -> dict[str, dict]:
    out = tmp / "out"
    out.mkdir()
    play = [
        {
            "name": "Evaluate the k3s role's exposure settings",
            "hosts": "all",
            "gather_facts": True,
            "gather_subset": ["!all", "!min", "network"],
            "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
            "vars": {"gpu_profile": {"workloads": ["train"]}},
            "tasks": [
                {
                    "name": "Keep what the role would write",
                    "ansible.builtin.copy": {
                        "content": (
                            "{{ {'config': __k3s_config, 'firewall': k3s_host_firewall | bool,"
                            " 'sources': __k3s_firewall_sources,"
                            " 'ruleset': __k3s_firewall_sources | dinops_k3s_nftables_ruleset(__k3s_firewall_ports)}"
                            " | to_json }}"
                        ),
                        "dest": str(out / "{{ inventory_hostname }}.json"),
                        "mode": "0644",
                    },
                }
            ],
        }
    ]
    (tmp / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    (tmp / "hosts.yml").write_text(yaml.safe_dump(INVENTORY))
    config = tmp / "ansible.cfg"
    config.write_text(f"[defaults]\nfilter_plugins = {ROLE / 'filter_plugins'}\n")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp / "hosts.yml"), str(tmp / "play.yml"),
         "-e", json.dumps(extra)],
        capture_output=True, text=True, env={**os.environ, "ANSIBLE_CONFIG": str(config)}, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {path.stem: json.loads(path.read_text()) for path in out.glob("*.json")}


def test_defaults_disable_the_edge_and_serve_nodeports_on_loopback(tmp_path):
    hosts = evaluate(tmp_path, {})
    server, agent = hosts["server-1"], hosts["agent-1"]
    assert server["config"]["disable"] == ["servicelb", "traefik"]
    assert "disable" not in agent["config"]  # a server flag
    for host in (server, agent):
        assert host["config"]["kube-proxy-arg"] == ["nodeport-addresses=127.0.0.0/8"]
        assert host["firewall"] is True
        assert "198.51.100.10/32" in host["sources"]["ipv4"]
        assert "198.51.100.20/32" in host["sources"]["ipv4"]
        assert "10.42.0.0/15" in host["sources"]["ipv4"]
        assert "udp dport { 8472 } ip saddr != @nodes_v4 drop" in host["ruleset"]


def test_an_ingress_keeps_traefik_and_a_public_address_all_nodeports(tmp_path):
    hosts = evaluate(
        tmp_path,
        {
            "workloads_ingress": True,
            "dinops_publish_address": "0.0.0.0",
            "k3s_server_config": {"disable": ["metrics-server"], "kube-proxy-arg": ["v=2"]},
        },
    )
    assert hosts["server-1"]["config"]["disable"] == ["metrics-server"]
    assert hosts["server-1"]["config"]["kube-proxy-arg"] == ["v=2"]
    assert "kube-proxy-arg" not in hosts["agent-1"]["config"]


def test_a_node_address_as_publish_address_and_extra_sources(tmp_path):
    hosts = evaluate(
        tmp_path, {"dinops_publish_address": "198.51.100.10", "k3s_firewall_allowed_sources": ["203.0.113.0/24"]}
    )
    assert hosts["agent-1"]["config"]["kube-proxy-arg"] == ["nodeport-addresses=198.51.100.10/32"]
    assert "203.0.113.0/24" in hosts["agent-1"]["sources"]["ipv4"]


@pytest.mark.parametrize("machine", ["train"])
def test_cloud_aws_machines_leave_the_firewall_to_the_security_group(tmp_path, machine):
    hosts = evaluate(tmp_path, {"dinops_machine": machine})
    assert hosts["server-1"]["firewall"] is False

"""What a k3s node exposes: packaged edge components, NodePort addresses and the host firewall of cluster ports."""

from __future__ import annotations

import pytest
from cluster.conftest import load_plugin

k3s_exposure = load_plugin("k3s", "k3s_exposure")


# --- Packaged Traefik and ServiceLB ----------------------------------------------------------------------------------


def test_traefik_and_servicelb_are_disabled_without_an_ingress():
    assert k3s_exposure.disabled_components(False) == ["servicelb", "traefik"]


def test_an_ingress_keeps_them():
    assert k3s_exposure.disabled_components(True) == []


def test_the_users_own_disable_list_is_kept():
    assert k3s_exposure.disabled_components(False, ["local-storage", "traefik"]) == [
        "local-storage",
        "servicelb",
        "traefik",
    ]
    assert k3s_exposure.disabled_components(True, ["metrics-server"]) == ["metrics-server"]


# --- NodePort addresses ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("publish", "args"),
    [
        ("127.0.0.1", ["nodeport-addresses=127.0.0.0/8"]),
        ("127.0.1.1", ["nodeport-addresses=127.0.0.0/8"]),
        ("0.0.0.0", []),
        ("::", []),
        ("192.0.2.7", ["nodeport-addresses=192.0.2.7/32"]),
        ("2001:db8::7", ["nodeport-addresses=2001:db8::7/128"]),
    ],
)
def test_nodeports_follow_the_publish_address(publish, args):
    assert k3s_exposure.kube_proxy_args(publish) == args


@pytest.mark.parametrize(
    ("publish", "message"),
    [
        ("::1", "IPv6 loopback"),
        ("client.example", "an IP address"),
        ("", "an IP address"),
    ],
)
def test_a_publish_address_kube_proxy_cannot_serve_is_refused(publish, message):
    with pytest.raises(k3s_exposure.K3sExposureError, match=f"dinops_publish_address.*{message}"):
        k3s_exposure.kube_proxy_args(publish)


# --- Host firewall ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ufw_status", "backend"),
    [
        ("Status: active\n\nTo  Action  From\n", "ufw"),
        ("Status: inactive\n", "nftables"),
        (None, "nftables"),
        ("", "nftables"),
    ],
)
def test_ufw_is_used_only_when_active(ufw_status, backend):
    assert k3s_exposure.firewall_backend(ufw_status) == backend


def test_sources_are_the_nodes_and_the_cluster_ranges_once():
    sources = k3s_exposure.firewall_sources(
        ["10.0.0.5", "10.0.0.6", "", "10.0.0.5", "2001:db8::5", "server.example"], ["10.42.0.0/16", "10.43.0.0/16"]
    )
    assert sources == {
        # k3s' pod and service ranges are adjacent: one /15.
        "ipv4": ["10.0.0.5/32", "10.0.0.6/32", "10.42.0.0/15"],
        "ipv6": ["2001:db8::5/128"],
    }


def test_overlapping_sources_are_merged_for_the_nftables_interval_set():
    sources = k3s_exposure.firewall_sources(["10.42.3.4", "10.0.0.4", "10.0.0.5"], ["10.42.0.0/16"], ["10.0.0.4/31"])
    assert sources == {"ipv4": ["10.0.0.4/31", "10.42.0.0/16"], "ipv6": []}


def test_a_bad_extra_source_is_refused_naming_the_variable():
    with pytest.raises(k3s_exposure.K3sExposureError, match="k3s_firewall_allowed_sources.*10.0.0.300"):
        k3s_exposure.firewall_sources(["10.0.0.5"], [], ["10.0.0.300"])


def test_ports_are_the_k3s_networking_table():
    assert k3s_exposure.cluster_ports(6443) == [
        {"port": 6443, "proto": "tcp"},
        {"port": 8472, "proto": "udp"},
        {"port": 10250, "proto": "tcp"},
    ]
    assert k3s_exposure.cluster_ports(7443)[0] == {"port": 7443, "proto": "tcp"}


def test_nftables_ruleset_drops_cluster_ports_from_everyone_else_and_never_touches_ssh():
    sources = k3s_exposure.firewall_sources(["10.0.0.5", "2001:db8::5"], ["10.42.0.0/16"])
    ruleset = k3s_exposure.nftables_ruleset(sources, k3s_exposure.cluster_ports(6443))
    lines = [line.strip() for line in ruleset.splitlines()]
    # Re-applying replaces the table as a whole (idempotent): declared, deleted, declared again.
    assert lines[:3] == ["table inet dinops_k3s", "delete table inet dinops_k3s", "table inet dinops_k3s {"]
    assert "elements = { 10.0.0.5/32, 10.42.0.0/16 }" in lines
    assert "elements = { 2001:db8::5/128 }" in lines
    assert "type filter hook input priority filter - 1; policy accept;" in lines
    assert 'iifname "lo" accept' in lines
    assert "tcp dport { 6443, 10250 } ip saddr != @nodes_v4 drop" in lines
    assert "udp dport { 8472 } ip saddr != @nodes_v4 drop" in lines
    assert "tcp dport { 6443, 10250 } ip6 saddr != @nodes_v6 drop" in lines
    assert "udp dport { 8472 } ip6 saddr != @nodes_v6 drop" in lines
    assert "22" not in ruleset.replace("2001:db8", "")
    assert " accept" not in ruleset.replace('iifname "lo" accept', "").replace("policy accept", "")


def test_nftables_ruleset_without_ipv6_nodes_drops_all_ipv6_to_cluster_ports():
    sources = k3s_exposure.firewall_sources(["10.0.0.5"], [])
    ruleset = k3s_exposure.nftables_ruleset(sources, k3s_exposure.cluster_ports(6443))
    assert "@nodes_v6" not in ruleset
    assert "meta nfproto ipv6 tcp dport { 6443, 10250 } drop" in ruleset
    assert "meta nfproto ipv6 udp dport { 8472 } drop" in ruleset


def test_ufw_rules_allow_each_source_ahead_of_the_deny_of_the_port():
    sources = k3s_exposure.firewall_sources(["10.0.0.5", "2001:db8::5"], ["10.42.0.0/16"])
    rules = k3s_exposure.ufw_rules(sources, [{"port": 8472, "proto": "udp"}])
    # ufw stops at the first matching rule: allows are inserted at the top of their family (a node added later
    # still lands above the deny), the deny is appended.
    allow = {"rule": "allow", "to_port": "8472", "proto": "udp"}
    assert rules == [
        {**allow, "from_ip": "10.0.0.5/32", "insert_relative_to": "first-ipv4"},
        {**allow, "from_ip": "10.42.0.0/16", "insert_relative_to": "first-ipv4"},
        {**allow, "from_ip": "2001:db8::5/128", "insert_relative_to": "first-ipv6"},
        {"rule": "deny", "from_ip": "any", "to_port": "8472", "proto": "udp", "insert_relative_to": None},
    ]

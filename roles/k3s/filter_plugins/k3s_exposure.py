"""What a k3s node exposes beyond the cluster: the one place that decides it.

- Packaged edge components. k3s deploys Traefik and its ServiceLB load balancer (which binds 80/443 on every node)
  unless config.yaml's ``disable`` list names them
  (https://docs.k3s.io/installation/packaged-components#packaged-components, k3s v1.33). dinops needs them only for
  ``workloads_ingress``.
- NodePorts. kube-proxy's ``--nodeport-addresses`` at Kubernetes v1.33 takes "a list of CIDR ranges that contain
  valid node IPs, or alternatively, the single string 'primary'"; unset, "NodePort connections will be accepted on
  all local IPs"
  (https://v1-33.docs.kubernetes.io/docs/reference/command-line-tools-reference/kube-proxy/). Loopback NodePorts
  work only in iptables mode and for IPv4 (``--iptables-localhost-nodeports``, default true: "localhost NodePorts
  are never allowed with other proxy modes or with IPv6"); k3s runs kube-proxy in iptables mode.
- Cluster ports. k3s' Requirements → Networking (https://docs.k3s.io/installation/requirements#networking, k3s
  v1.33): 6443/tcp (supervisor and API server), 8472/udp (Flannel VXLAN: "should not be exposed to the world as it
  opens up your cluster network to be accessed by anyone"), 10250/tcp (kubelet). Outside a cloud security group the
  host firewall lets only the cluster's node addresses, its pod and service ranges and loopback reach them.
"""

from __future__ import annotations

import ipaddress
from typing import Any

PACKAGED_EDGE = ("servicelb", "traefik")
VXLAN_PORT = 8472
KUBELET_PORT = 10250
TABLE = "dinops_k3s"


class K3sExposureError(ValueError):
    """A setting that cannot give a safe exposure; the message names the variable."""


def disabled_components(ingress: Any, configured: Any = None) -> list[str]:
    """config.yaml ``disable``: the user's list, plus Traefik and ServiceLB unless an ingress uses them."""
    wanted = [str(item) for item in configured or []]
    if not ingress:
        wanted += [item for item in PACKAGED_EDGE if item not in wanted]
    return sorted(set(wanted))


def nodeport_cidrs(publish_address: Any) -> list[str]:
    """The ``--nodeport-addresses`` CIDRs serving ``dinops_publish_address``; [] (every address) for 0.0.0.0 or ::."""
    try:
        address = ipaddress.ip_address(str(publish_address).strip())
    except ValueError:
        raise K3sExposureError(
            f"dinops_publish_address must be an IP address (127.0.0.1, 0.0.0.0 or one of the node's), "
            f"got {publish_address!r}"
        ) from None
    if address.is_unspecified:
        return []
    if address.is_loopback:
        if address.version == 6:
            raise K3sExposureError(
                "dinops_publish_address ::1: kube-proxy never serves NodePorts on the IPv6 loopback; use 127.0.0.1"
            )
        return ["127.0.0.0/8"]
    return [f"{address}/{address.max_prefixlen}"]


def kube_proxy_args(publish_address: Any) -> list[str]:
    """k3s ``kube-proxy-arg`` entries that make NodePorts answer only on the publish address."""
    cidrs = nodeport_cidrs(publish_address)
    return [f"nodeport-addresses={','.join(cidrs)}"] if cidrs else []


def firewall_backend(ufw_status: Any) -> str:
    """'ufw' when ``ufw status`` says it is active (its rules are the host's), else 'nftables'."""
    return "ufw" if ufw_status and "Status: active" in str(ufw_status) else "nftables"


def _network(value: Any, variable: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(str(value).strip(), strict=False)
    except ValueError:
        raise K3sExposureError(f"{variable} must hold addresses or CIDRs, got {value!r}") from None


def firewall_sources(node_addresses: Any, cluster_cidrs: Any, extra: Any = None) -> dict[str, list[str]]:
    """Sources allowed to the cluster ports, by family: node addresses (host names, which the inventory may give as
    ansible_host, are left out: the nodes' facts give their addresses), the pod and service ranges, and
    ``k3s_firewall_allowed_sources``."""
    networks = []
    for value in node_addresses or []:
        try:
            networks.append(ipaddress.ip_network(str(value).strip(), strict=False))
        except ValueError:
            continue
    networks += [_network(value, "k3s_firewall_cluster_cidrs") for value in cluster_cidrs or []]
    networks += [_network(value, "k3s_firewall_allowed_sources") for value in extra or []]
    # Overlapping elements of an nftables interval set are an error ("conflicting intervals"): merge them.
    return {
        "ipv4": [str(n) for n in ipaddress.collapse_addresses(n for n in networks if n.version == 4)],
        "ipv6": [str(n) for n in ipaddress.collapse_addresses(n for n in networks if n.version == 6)],
    }


def cluster_ports(api_port: Any) -> list[dict[str, Any]]:
    """The ports of k3s' inbound rules table that dinops uses (no HA etcd, no WireGuard, no Spegel)."""
    return [
        {"port": int(api_port), "proto": "tcp"},
        {"port": VXLAN_PORT, "proto": "udp"},
        {"port": KUBELET_PORT, "proto": "tcp"},
    ]


def _ports_by_proto(ports: list[dict[str, Any]]) -> dict[str, str]:
    by_proto: dict[str, list[int]] = {}
    for item in ports:
        by_proto.setdefault(item["proto"], []).append(int(item["port"]))
    return {proto: ", ".join(str(p) for p in sorted(set(numbers))) for proto, numbers in sorted(by_proto.items())}


def nftables_ruleset(sources: dict[str, list[str]], ports: list[dict[str, Any]]) -> str:
    """An ``nft -f`` file: a table of its own whose input chain drops the cluster ports from any other source.

    The table is declared, deleted and declared again, so that applying the file twice gives the same rules
    (https://wiki.nftables.org/wiki-nftables/index.php/Atomic_rule_replacement). The chain accepts by default and
    only drops: a drop in any base chain is final, so other tables (k3s' own, the host's) keep working, and nothing
    but the listed ports (never SSH) is ever affected.
    """
    lines = [f"table inet {TABLE}", f"delete table inet {TABLE}", f"table inet {TABLE} {{"]
    for family in ("ipv4", "ipv6"):
        if sources.get(family):
            lines += [
                f"  set nodes_{family[-2:]} {{",
                f"    type {family}_addr",
                "    flags interval",
                f"    elements = {{ {', '.join(sources[family])} }}",
                "  }",
            ]
    lines += [
        "  chain input {",
        "    type filter hook input priority filter - 1; policy accept;",
        '    iifname "lo" accept',
    ]
    for proto, numbers in _ports_by_proto(ports).items():
        for family, match in (("ipv4", "ip"), ("ipv6", "ip6")):
            if sources.get(family):
                lines.append(f"    {proto} dport {{ {numbers} }} {match} saddr != @nodes_{family[-2:]} drop")
            else:
                lines.append(f"    meta nfproto {family} {proto} dport {{ {numbers} }} drop")
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


def ufw_rules(sources: dict[str, list[str]], ports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """community.general.ufw rules: allow each source, then deny the port from anywhere.

    ufw applies the first rule that matches, so allows go to the top of their family's rules
    (``insert: 0`` relative to ``first-ipv4``/``first-ipv6``) and the deny is appended; ufw skips a rule it already
    has, so the loop is idempotent.
    """
    rules = []
    for item in ports:
        port, proto = str(item["port"]), item["proto"]
        for family, relative in (("ipv4", "first-ipv4"), ("ipv6", "first-ipv6")):
            rules += [
                {"rule": "allow", "from_ip": source, "to_port": port, "proto": proto, "insert_relative_to": relative}
                for source in sources.get(family, [])
            ]
        rules.append({"rule": "deny", "from_ip": "any", "to_port": port, "proto": proto, "insert_relative_to": None})
    return rules


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "dinops_k3s_disabled_components": disabled_components,
            "dinops_k3s_kube_proxy_args": kube_proxy_args,
            "dinops_k3s_firewall_backend": firewall_backend,
            "dinops_k3s_firewall_sources": firewall_sources,
            "dinops_k3s_cluster_ports": cluster_ports,
            "dinops_k3s_nftables_ruleset": nftables_ruleset,
            "dinops_k3s_ufw_rules": ufw_rules,
        }

"""The k3s role's proxy environment (k3s.service.env): NO_PROXY keeps node and cluster traffic off the proxy."""

from __future__ import annotations

import pytest
from cluster.conftest import load_plugin

k3s_nodes = load_plugin("k3s", "k3s_nodes")
CLUSTER = "127.0.0.1,localhost,10.42.0.0/16,10.43.0.0/16,.svc,.cluster.local"


def test_no_proxy_gains_nodes_and_cluster_ranges_once():
    env = k3s_nodes.proxy_environment(
        {"http_proxy": "http://proxy:3128", "HTTPS_PROXY": "http://proxy:3128", "no_proxy": "corp.example, 10.0.0.5"},
        ["10.0.0.5", "10.0.0.6", "", "10.0.0.6"],
    )
    assert env == {
        "HTTPS_PROXY": "http://proxy:3128",
        "HTTP_PROXY": "http://proxy:3128",
        "NO_PROXY": f"corp.example,10.0.0.5,10.0.0.6,{CLUSTER}",
    }


@pytest.mark.parametrize("proxy_env", [None, {}, {"no_proxy": "corp.example"}])
def test_without_a_proxy_nothing_is_written(proxy_env):
    assert k3s_nodes.proxy_environment(proxy_env, ["10.0.0.5"]) == {}


@pytest.mark.parametrize(
    ("proxy_env", "message"),
    [
        ("http://proxy:3128", "must be a dict"),
        ({"ftp_proxy": "x"}, "unknown key 'ftp_proxy'"),
        ({"http_proxy": "http://a\nEVIL=1"}, "one line"),
    ],
)
def test_bad_proxy_env_is_refused_naming_the_variable(proxy_env, message):
    with pytest.raises(k3s_nodes.K3sNodesError, match=f"proxy_env.*{message}"):
        k3s_nodes.proxy_environment(proxy_env, [])

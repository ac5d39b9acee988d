"""Who reaches the web client (docs/security.md): loopback by default with the SSH tunnel printed, and a public
address only with a login and TLS (k8s/components/client-auth); what the stage prints never holds a password."""

from __future__ import annotations

import pytest
from cluster.conftest import load_plugin
from k8s.k8s_render import SITE_VARIANTS

access = load_plugin("workloads", "client_access")

TUNNEL = {"public_address": "10.0.0.5", "port": 30000, "ssh_host": "gpu1.example", "ssh_user": "ubuntu",
          "password_file": "/etc/dinops/client-password"}  # fmt: skip


@pytest.mark.parametrize(
    ("address", "public"),
    [("127.0.0.1", False), ("127.0.1.1", False), ("::1", False), ("0.0.0.0", True), ("::", True),
     ("192.0.2.7", True), ("2001:db8::7", True)],
)  # fmt: skip
def test_only_loopback_keeps_the_client_private(address, public):
    assert access.publish_public(address) is public


@pytest.mark.parametrize("address", ["", "localhost", "client.example", "127.0.0.1:30000"])
def test_a_publish_address_that_is_not_an_ip_is_refused(address):
    with pytest.raises(access.ClientAccessError, match="dinops_publish_address must be an IP address"):
        access.publish_public(address)


def test_loopback_prints_the_tunnel_a_user_runs():
    lines = access.client_access({**TUNNEL, "publish_address": "127.0.0.1"})
    assert lines[0].startswith("Web client: http://127.0.0.1:30000/ on this host only")
    assert "ssh -N -L 30000:127.0.0.1:30000 ubuntu@gpu1.example, then open http://127.0.0.1:30000/" in lines[1]


def test_loopback_without_an_ssh_user_names_the_host_only():
    lines = access.client_access({**TUNNEL, "publish_address": "127.0.0.1", "ssh_user": "", "port": 30999})
    assert "ssh -N -L 30999:127.0.0.1:30999 gpu1.example," in lines[1]


@pytest.mark.parametrize(
    ("publish", "url"),
    [("0.0.0.0", "https://10.0.0.5:30000/"), ("192.0.2.7", "https://192.0.2.7:30000/"),
     ("2001:db8::7", "https://[2001:db8::7]:30000/")],
)  # fmt: skip
def test_public_prints_https_and_where_the_password_is(publish, url):
    (line,) = access.client_access({**TUNNEL, "publish_address": publish})
    assert line.startswith(f"Web client: {url} ")
    assert "sudo cat /etc/dinops/client-password" in line


def test_a_password_from_the_inventory_is_named_not_printed():
    (line,) = access.client_access({**TUNNEL, "publish_address": "0.0.0.0", "password_file": ""})
    assert "the inventory's workloads_client_password" in line


def test_a_public_client_gets_the_login_and_tls_component():
    workloads = load_plugin("workloads", "workloads")
    settings = next(v for v in SITE_VARIANTS.values() if v.get("overlay") == "cpu" and not v.get("s3"))
    public = workloads.site_kustomization({**settings, "client_public": True})
    private = workloads.site_kustomization({**settings, "client_public": False})
    assert any(c.endswith("/components/client-auth") for c in public["components"])
    assert not any(c.endswith("/components/client-auth") for c in private.get("components", []))

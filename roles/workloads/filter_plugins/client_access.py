"""Who can reach the web client, and what the stage tells the user about it (docs/security.md).

``dinops_publish_public(address)``: whether dinops_publish_address publishes the client beyond this host (any address
but loopback), which makes a login and TLS mandatory (k8s/components/client-auth).
``dinops_client_access(settings)``: the lines the stage prints: the URL, and for a loopback client the SSH tunnel a
user runs from their own machine; for a public one where the password is, never the password.
"""

from __future__ import annotations

import ipaddress
from typing import Any

# The login name the client asks for (apps/src/dinops/client/settings.py, CLIENT_USER's default).
CLIENT_USER = "dinops"


class ClientAccessError(ValueError):
    """dinops_publish_address is not an address the client can be published on; the message names the variable."""


def _address(text: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(str(text).strip())
    except ValueError:
        raise ClientAccessError(
            f"dinops_publish_address must be an IP address (127.0.0.1, 0.0.0.0 or one of the host's), got {text!r}"
        ) from None


def publish_public(address: Any) -> bool:
    """True unless the address is a loopback one (127.0.0.0/8, ::1): reachable from other machines."""
    return not _address(address).is_loopback


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def client_access(settings: dict[str, Any]) -> list[str]:
    """The lines about the client. ``settings``: publish_address (dinops_publish_address), public_address (the host's
    address or name for a URL when the client is published on every address), port (the host port), ssh_host and
    ssh_user (where a user's SSH reaches this host), password_file (where a generated password is kept, '' when the
    inventory gave it)."""
    publish = str(settings["publish_address"]).strip()
    address = _address(publish)
    port = int(settings["port"])
    if address.is_loopback:
        user = settings.get("ssh_user")
        target = f"{user}@{settings['ssh_host']}" if user else str(settings["ssh_host"])
        local = f"http://{_url_host(publish)}:{port}/"
        return [
            f"Web client: {local} on this host only (dinops_publish_address {publish}: no login, no TLS, nothing "
            "published beyond loopback).",
            f"From your own machine: ssh -N -L {port}:{_url_host(publish)}:{port} {target}, then open "
            f"http://127.0.0.1:{port}/ (docs/security.md).",
        ]
    host = str(settings["public_address"]) if address.is_unspecified else publish
    where = (
        f"sudo cat {settings['password_file']} on the host"
        if settings.get("password_file")
        else "the inventory's workloads_client_password"
    )
    return [
        f"Web client: https://{_url_host(host)}:{port}/ (public: log in as {CLIENT_USER}, password: {where}; "
        "a generated certificate is self-signed, see docs/security.md). The client serves HTTPS only.",
    ]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_publish_public": publish_public, "dinops_client_access": client_access}

"""Who can reach the web client, and what the stage tells the user about it (docs/security.md).

``dinops_publish_public(address)``: whether dinops_publish_address publishes the client beyond this host (any address
but loopback), which makes a login and TLS mandatory (k8s/components/client-auth).
``dinops_client_access(settings)``: the lines the stage prints: the URL, and for a loopback client the SSH tunnel a
user runs from their own machine; for a public one where the password is, never the password. Behind the ingress
(workloads_ingress, k8s/components/ingress) the client is public whatever the publish address (the controller listens
on every node's 443): the ingress URL over https, where the password is, and where the API's token is.
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


def _password_where(settings: dict[str, Any]) -> str:
    if settings.get("password_file"):
        return f"sudo cat {settings['password_file']} on the host"
    return "the inventory's workloads_client_password"


def _ingress_access(settings: dict[str, Any], address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[str]:
    """Behind the ingress: HTTPS on 443 only, the login always, the API under /v1 with its token."""
    host = str(settings["public_address"]) if address.is_loopback or address.is_unspecified else str(address)
    url = f"https://{_url_host(host)}/"
    token = (
        f"sudo cat {settings['api_token_file']} on the host"
        if settings.get("api_token_file")
        else "the key api-token of the Secret dinops-client-auth"
    )
    return [
        f"Web client: {url} through the ingress (log in as {CLIENT_USER}, password: {_password_where(settings)}; "
        "TLS with the client's certificate, self-signed when generated, see docs/security.md). HTTPS only.",
        f"Inference API through the ingress: {url}v1/ with the header 'Authorization: Bearer <token>' (token: "
        f"{token}).",
    ]


def client_access(settings: dict[str, Any]) -> list[str]:
    """The lines about the client. ``settings``: publish_address (dinops_publish_address), public_address (the host's
    address or name for a URL when the client is published on every address), port (the host port), ssh_host and
    ssh_user (where a user's SSH reaches this host), password_file (where a generated password is kept, '' when the
    inventory gave it), ingress (workloads_ingress: the client and the API behind the cluster's ingress controller) and
    api_token_file (where the API's generated token is kept)."""
    publish = str(settings["publish_address"]).strip()
    address = _address(publish)
    if settings.get("ingress"):
        return _ingress_access(settings, address)
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
    return [
        f"Web client: https://{_url_host(host)}:{port}/ (public: log in as {CLIENT_USER}, password: "
        f"{_password_where(settings)}; "
        "a generated certificate is self-signed, see docs/security.md). The client serves HTTPS only.",
    ]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"dinops_publish_public": publish_public, "dinops_client_access": client_access}

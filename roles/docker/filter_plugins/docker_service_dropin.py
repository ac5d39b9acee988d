"""Drop-ins of docker.service that dinops writes: the mounts dockerd needs before it starts, and its stop time.

At boot dockerd restores its containers (restart policies) as soon as it starts, and the packaged unit is ordered
after network-online.target only (Debian 12's docker.io 20.10.24: `After=network-online.target docker.socket
firewalld.service containerd.service`; moby's contrib/init/systemd/docker.service the same), not after the mounts a
container binds or the data root. A bind mount set up before its NFS mount lands binds the empty local directory,
and with Docker's default rprivate propagation the container never sees the later mount (round2 audit, finding 7).

``RequiresMountsFor=`` (systemd.unit(5)) adds Requires= and After= on the mount units of every listed path and of
each of its parents, as far as they exist (fstab entries become mount units through systemd-fstab-generator): a
path on the root filesystem costs nothing; a network mount (``_netdev``) that fails to mount makes docker.service
fail with "dependency" instead of starting on empty directories. ``TimeoutStopSec=`` (systemd.service(5)): the
packaged unit sets only TimeoutStartSec=0, so systemd's default stop timeout (DefaultTimeoutStopSec, 90 s) would cut
a container's longer stop timeout (training's 300 s to write its checkpoint) short at every reboot.

``dinops_docker_service_dropin(name, requires_mounts_for, timeout_stop_s)`` returns {path, state, content}:
state ``absent`` when there is nothing to say, so that a setting withdrawn removes its file.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from ansible.errors import AnsibleFilterError

DROPIN_DIR = "/etc/systemd/system/docker.service.d"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# RequiresMountsFor= is a space-separated list that systemd unquotes and expands specifiers (%) in: only paths that
# need neither quoting nor escaping are written.
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")


def _paths(value: Any, name: str) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise AnsibleFilterError(f"docker drop-in {name}: requires_mounts_for must be a list of paths, got {value!r}")
    paths = []
    for path in value:
        if not isinstance(path, str) or not SAFE_PATH.match(path) or posixpath.normpath(path) != path:
            raise AnsibleFilterError(
                f"docker drop-in {name}: {path!r} is not a normalised absolute path of letters, digits and ._/+- "
                "(systemd's RequiresMountsFor= would need it quoted or escaped)"
            )
        if path not in paths:
            paths.append(path)
    return sorted(paths)


def dinops_docker_service_dropin(name: Any, requires_mounts_for: Any = (), timeout_stop_s: Any = 0) -> dict[str, str]:
    """The drop-in ``<DROPIN_DIR>/dinops-<name>.conf``: its path, state (present/absent) and body."""
    if not isinstance(name, str) or not NAME.match(name):
        raise AnsibleFilterError(f"docker drop-in name must be lower-case letters, digits and '-', got {name!r}")
    paths = _paths(requires_mounts_for, name)
    try:
        timeout = int(timeout_stop_s)
    except (TypeError, ValueError):
        raise AnsibleFilterError(
            f"docker drop-in {name}: timeout_stop_s must be seconds, got {timeout_stop_s!r}"
        ) from None
    if timeout < 0 or isinstance(timeout_stop_s, bool):
        raise AnsibleFilterError(
            f"docker drop-in {name}: timeout_stop_s must be 0 (unset) or more, got {timeout_stop_s!r}"
        )
    path = f"{DROPIN_DIR}/dinops-{name}.conf"
    if not paths and not timeout:
        return {"path": path, "state": "absent", "content": ""}
    lines = []
    if paths:
        lines += ["[Unit]", f"RequiresMountsFor={' '.join(paths)}"]
    if timeout:
        lines += [*([""] if lines else []), "[Service]", f"TimeoutStopSec={timeout}"]
    return {"path": path, "state": "present", "content": "\n".join(lines) + "\n"}


class FilterModule:
    """docker.service drop-in filters."""

    def filters(self):
        return {"dinops_docker_service_dropin": dinops_docker_service_dropin}

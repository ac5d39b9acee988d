#!/usr/bin/env bash
# The Molecule platform: Debian 12 with systemd as PID 1 and Python for Ansible, built from Debian's archive.
# Users with registry access can skip this and set MOLECULE_IMAGE to any systemd image (see README).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/debian-image.sh" "${MOLECULE_IMAGE:-dinops-molecule:debian12}" \
  python3 python3-apt systemd systemd-sysv dbus sudo ca-certificates iproute2 procps pciutils kmod udev

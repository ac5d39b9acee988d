#!/usr/bin/env bash
# Build a Docker base image from Debian's package archive, without any registry.
#
#   scripts/debian-image.sh NAME[:TAG] [PACKAGE ...]
#
# debootstrap (minbase) writes a root filesystem with the given packages and `docker import` turns it into an
# image. The image is labelled with a hash of everything that decides its content (suite, mirror, packages,
# this script); when an image of that name already carries the same hash, nothing is built. This is how the
# Molecule platform and the air-gapped application base images are made; it works behind a proxy (apt's usual
# environment variables) and against a local mirror (DEBIAN_MIRROR).
set -euo pipefail

name=${1:?usage: debian-image.sh NAME[:TAG] [PACKAGE ...]}
shift
suite=${DEBIAN_SUITE:-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The Release file's signature is checked against Debian's archive keyring, always: with an explicit mirror and no
# keyring debootstrap only warns and installs unverified packages fetched over plain HTTP (debootstrap's
# `functions`, keyring(): the warning branch when USER_MIRROR is set), which is what Ubuntu's debootstrap does,
# since it recommends ubuntu-keyring rather than debian-archive-keyring (round2-hosts-cluster F8).
keyring=${DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
components=${DEBIAN_COMPONENTS:-main}
packages=$(printf '%s\n' "$@" | sort -u | paste -sd, -)

hash=$( { echo "$suite $mirror $components $packages"; cat "$0"; } | sha256sum | cut -c1-16)
current=$(docker image inspect --format '{{ index .Config.Labels "org.dinops.content-hash" }}' "$name" 2>/dev/null || true)
if [ "$current" = "$hash" ]; then
  echo "$name is up to date (content hash $hash)"
  exit 0
fi

command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install -y debootstrap" >&2; exit 2; }
[ -r "$keyring" ] || {
  echo "Debian's archive keyring $keyring is missing: apt-get install -y debian-archive-keyring (universe on Ubuntu)," \
    "or DEBIAN_KEYRING=<a keyring with Debian's archive keys>; the base is never built unverified" >&2
  exit 2
}
rootfs=$(mktemp -d /var/tmp/dinops-rootfs.XXXXXX)
chmod 755 "$rootfs"  # mktemp makes it 0700: the image root must be readable by non-root users
trap 'rm -rf "$rootfs"' EXIT
echo "building $name from $mirror $suite (packages: ${packages:-none})"
debootstrap --variant=minbase --keyring="$keyring" --components="$components" ${packages:+--include="$packages"} \
  "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || { tail -n 30 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"
# Leave apt usable inside the image and keep it small.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/*
echo "deb $mirror $suite $components" >"$rootfs/etc/apt/sources.list"
tar -C "$rootfs" -c . | docker import \
  --change "LABEL org.dinops.content-hash=$hash" \
  --change "LABEL org.opencontainers.image.base.name=debian:$suite" \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  - "$name" >/dev/null
echo "built $name (content hash $hash)"

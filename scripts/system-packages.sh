#!/usr/bin/env bash
# Install the Debian/Ubuntu packages that the given purpose needs, only those missing (no apt-get update when
# nothing is missing). Purposes: controller (make up), test (make test), bench (make bench: hey, the HTTP load generator).
set -euo pipefail
purpose=${1:?usage: system-packages.sh controller|test|bench}
case $purpose in
  controller) wanted=(python3-venv git) ;;
  test) wanted=(python3-venv git docker.io debootstrap debian-archive-keyring gnupg chromium openssh-client rsync prometheus) ;;
  bench) wanted=(hey) ;;
  *) echo "unknown purpose $purpose" >&2; exit 2 ;;
esac
missing=()
# Installed whatever the selection state: `make up`'s docker role holds docker.io ("hold ok installed"), which a match
# on "install ok installed" took for missing, so every later `make test` ran apt-get update and install again.
for pkg in "${wanted[@]}"; do
  [ "$(dpkg-query -W -f '${db:Status-Status}' "$pkg" 2>/dev/null)" = installed ] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=$([ "$(id -u)" -eq 0 ] && echo "" || echo sudo)
echo "installing system packages: ${missing[*]}"
$sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

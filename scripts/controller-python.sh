#!/usr/bin/env bash
# Print the path of a Python >= 3.11 for the Ansible controller venv, providing one where the host has none.
#
#   scripts/controller-python.sh [PYTHON]
#
# ansible-core 2.19 runs on Python 3.11 to 3.13 on the controller and manages targets with Python 3.8 to 3.13
# (https://docs.ansible.com/ansible/latest/reference_appendices/release_and_maintenance.html#ansible-core-support-matrix).
# Debian 12 (3.11) and Ubuntu 24.04 (3.12) have one; Ubuntu 20.04 (3.8) and 22.04 (3.10) do not. Taken in order:
#   1. PYTHON, when given (make up PYTHON=/path/to/python3.12); it must be >= 3.11;
#   2. python3.13, python3.12, python3.11, python3 on PATH;
#   3. CPython 3.11 managed by uv (https://docs.astral.sh/uv/guides/install-python/), installed when missing: the
#      host's python3 (uv's wheel needs >= 3.8) installs the pinned uv from PyPI into .cache/controller-uv, and
#      `uv python install` downloads python-build-standalone's CPython (from releases.astral.sh, else github.com),
#      checks it against the SHA-256 built into that uv release and keeps it in uv's Python directory
#      (~/.local/share/uv/python; UV_PYTHON_INSTALL_DIR).
#      3.11 is the Python that `make test` runs the pinned apps/constraints.txt on (Debian 12).
# Where those downloads are out of reach, UV_PYTHON_INSTALL_MIRROR names a copy of the python-build-standalone
# releases, https:// or file:// holding <release>/<file> (https://docs.astral.sh/uv/reference/environment/).
# UV=/path/to/uv uses that uv instead of installing one. A Python that cannot create a venv (no ensurepip: Debian's
# python3.X-venv missing) does not count. When nothing works, one message says what to run; exit 2.
set -euo pipefail

uv_version=0.13.9
managed_python=3.11
repo=$(cd "$(dirname "$0")/.." && pwd)

say() { echo "controller-python: $*" >&2; }

# Stop with what failed ($1), the fix for that failure ($2, optional) and the other ways out.
fail() {
  say "$1"
  {
    echo "The Ansible controller needs Python >= 3.11 (ansible-core 2.19). Do one of these, then run make up again:"
    [ -z "${2:-}" ] || echo "  $2"
    echo "  make up PYTHON=/path/to/python3.11   (one you have; Ubuntu 22.04: apt install python3.11 python3.11-venv)"
    echo "  make up INVENTORY=inventories/<yours> on a machine with Python >= 3.11, this host in that inventory"
    echo "  (over SSH a target needs only Python >= 3.8; README.md, \"Hosts with an older Python\")"
  } >&2
  exit 2
}

# Print the interpreter's own path when it is Python >= 3.11 with venv support (any Python 3 can run the test).
new_enough() {
  "$1" -c 'import ensurepip, sys; sys.exit(1) if sys.version_info < (3, 11) else print(sys.executable)' 2>/dev/null
}

if [ -n "${1:-}" ]; then
  new_enough "$1" || fail "PYTHON=$1 is not a Python >= 3.11 that can create a venv"
  exit 0
fi
for candidate in python3.13 python3.12 python3.11 python3; do
  command -v "$candidate" >/dev/null && new_enough "$candidate" && exit 0
done

mirror_fix="make up UV_PYTHON_INSTALL_MIRROR=<https:// or file:// copy of the python-build-standalone releases>"
uv=${UV:-}
if [ -n "$uv" ]; then
  command -v "$uv" >/dev/null || fail "UV=$uv is not an executable"
else
  tools=$repo/.cache/controller-uv
  uv=$tools/bin/uv
  if [[ "$("$uv" --version 2>/dev/null)" != "uv $uv_version "* ]]; then  # "uv 0.13.9 (x86_64-unknown-linux-gnu)"
    host_python=$(command -v python3) || fail "no python3 to install uv with" "apt install python3 python3-venv"
    say "no Python >= 3.11 on PATH; installing uv $uv_version from PyPI with $host_python into $tools"
    [ -x "$tools/bin/python" ] || "$host_python" -m venv "$tools" >&2 ||
      fail "$host_python -m venv $tools failed" "apt install python3-venv"
    "$tools/bin/python" -m pip install -q "uv==$uv_version" >&2 || fail "pip could not install uv==$uv_version" \
      "make up UV=/path/to/uv   (or point pip at your package index: PIP_INDEX_URL=...)"
  fi
fi

if ! found=$("$uv" python find --system --managed-python --no-python-downloads "$managed_python" 2>/dev/null); then
  say "installing CPython $managed_python with $uv${UV_PYTHON_INSTALL_MIRROR:+ from $UV_PYTHON_INSTALL_MIRROR}"
  "$uv" python install --no-bin "$managed_python" >&2 ||
    fail "uv could not install CPython $managed_python (above: what it tried)" "$mirror_fix"
  found=$("$uv" python find --system --managed-python --no-python-downloads "$managed_python") ||
    fail "uv installed CPython $managed_python but cannot find it" "$mirror_fix"
fi
new_enough "$found" || fail "$found (from uv) is not a Python >= 3.11 that can create a venv" "$mirror_fix"

#!/usr/bin/env bash
# Prepare the wheelhouse for air-gapped image builds: every wheel the images install, pinned by
# apps/constraints.txt, downloaded once on the controller (which can reach PyPI or a mirror).
#
#   scripts/wheelhouse.sh [DIR]          default DIR: build/wheelhouse
#
# The image builds then install with `pip install --no-index --find-links` from this directory, served to the
# build over HTTP on the build host's loopback (apps/images/build.py), so the multi-GB PyTorch wheels never enter
# a build context or an image layer. Wheels are chosen for the images' platform, not the controller's:
# WHEELHOUSE_ARCH (default x86_64; aarch64 for Grace hosts), WHEELHOUSE_GLIBC (default 2.36, Debian 12's: every
# manylinux tag up to it is accepted) and WHEELHOUSE_PYTHON (default 3.11). A stamp file holds a hash of the inputs: a second run with the same
# constraints and extras downloads nothing.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$here/build/wheelhouse}
arch=${WHEELHOUSE_ARCH:-x86_64}
glibc=${WHEELHOUSE_GLIBC:-2.36}
python_version=${WHEELHOUSE_PYTHON:-3.11}
pip=${PIP:-$here/.venv/bin/pip}
[ -x "$pip" ] || pip="python3 -m pip"
constraints=$here/apps/constraints.txt
pyproject=$here/apps/pyproject.toml
[ -f "$constraints" ] || { echo "wheelhouse: $constraints is missing" >&2; exit 2; }

# The requirements of every image extra, read from pyproject.toml, plus the build backend of dinops itself.
extras=${WHEELHOUSE_EXTRAS:-model train serve client download}
requirements=$(python3 - "$pyproject" "$extras" <<'EOF'
import re
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    pyproject = tomllib.load(f)
extras = pyproject["project"]["optional-dependencies"]
build = pyproject["build-system"]["requires"]
wanted = set()
for extra in sys.argv[2].split():
    if extra not in extras:
        sys.exit(f"wheelhouse: apps/pyproject.toml has no extra {extra!r}")
    wanted.update(r for r in extras[extra] if not re.match(r"dinops\b", r))
print("\n".join(sorted(wanted) + build))
EOF
)

stamp="$dest/.inputs-sha256"
hash=$( { echo "$arch $glibc $python_version"; echo "$requirements"; cat "$constraints" "$0"; } | sha256sum | cut -c1-64)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
  echo "wheelhouse $dest is up to date ($(find "$dest" -name '*.whl' | wc -l) wheels)"
  exit 0
fi

mapfile -t packages <<<"$requirements"
# pip does not widen a manylinux_2_N tag to older glibc versions by itself: list every tag the image accepts.
platforms=(--platform "manylinux2014_$arch")
for minor in $(seq 17 "${glibc#2.}"); do platforms+=(--platform "manylinux_2_${minor}_$arch"); done
mkdir -p "$dest"
echo "downloading wheels for python $python_version on $arch (glibc $glibc) into $dest"
# --only-binary: the images have no compilers, so every package must come as a wheel.
# $pip may be "python3 -m pip": split on purpose.
# shellcheck disable=SC2086
$pip download --quiet --dest "$dest" --constraint "$constraints" \
  --only-binary=:all: "${platforms[@]}" --python-version "$python_version" \
  --implementation cp --abi "cp${python_version/./}" "${packages[@]}"
echo "$hash" >"$stamp"
echo "wheelhouse $dest: $(find "$dest" -name '*.whl' | wc -l) wheels, $(du -sh "$dest" | cut -f1)"

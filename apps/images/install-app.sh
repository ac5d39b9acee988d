#!/bin/sh
# install-app.sh EXTRA: the build stage of every application image.
#
# Installs dinops[EXTRA] from /src into /opt/venv, pinned by /src/constraints.txt, from the wheelhouse at
# $WHEELHOUSE_URL when it is set (air-gapped builds: --no-index) or from the package index otherwise. Then it copies
# only the files this install added to /stage, which the final stage copies onto the same parent image: the
# parent's layers (PyTorch: gigabytes) are shared, never duplicated. A package of the parent that the install would
# upgrade or downgrade fails the build instead of silently forking the shared layer. When the parent's venv has no
# pip (dinops-runtime), the pip bundled with Python is used for this stage only and does not reach the image. The
# complete package set of the final image is recorded in /stage/usr/share/dinops/installed.txt.
set -eu
export HOME=/root  # root's cache, not the app user's home (pip is told not to cache anyway)
extra=${1:?usage: install-app.sh EXTRA}
venv=/opt/venv
work=$(mktemp -d)

list_files() { find "$venv" \( -type f -o -type l \) | sort; }
list_files >"$work/files-before"

borrowed=""
if [ ! -x "$venv/bin/pip" ]; then
  python3 -m venv "$venv"  # adds the bundled pip (and setuptools) to the existing venv
  borrowed=$(pip freeze --all | sed 's/==.*//')
fi
pip freeze --all | sort >"$work/freeze-before"

set --
if [ -n "${WHEELHOUSE_URL:-}" ]; then
  set -- --no-index --find-links "$WHEELHOUSE_URL"
fi
pip install --no-cache-dir "$@" --constraint /src/constraints.txt "/src[$extra]"

pip freeze --all | sort >"$work/freeze-after"
changed=$(comm -23 "$work/freeze-before" "$work/freeze-after")
if [ -n "$changed" ]; then
  echo "install-app.sh: installing dinops[$extra] would change packages of the parent image:" >&2
  echo "$changed" >&2
  exit 1
fi

for package in $borrowed; do
  [ "$package" = pip ] || pip uninstall --yes --quiet "$package"
done
pip check  # fails when a package needed one of the borrowed tools at run time
mkdir -p /stage/usr/share/dinops
pip freeze --all | grep -v '^dinops @ ' | { if [ -n "$borrowed" ]; then grep -v '^pip=='; else cat; fi; } \
  >/stage/usr/share/dinops/installed.txt
pip show dinops | sed -n 's/^Version: /dinops==/p' >>/stage/usr/share/dinops/installed.txt
if [ -n "$borrowed" ]; then
  python3 -m pip uninstall --yes --quiet pip
fi

list_files | comm -13 "$work/files-before" - | sed "s|^/||" >"$work/files-new"
tar -C / -cf - -T "$work/files-new" | tar -C /stage -xf -
echo "staged $(wc -l <"$work/files-new") new files of dinops[$extra]"
rm -rf "$work"

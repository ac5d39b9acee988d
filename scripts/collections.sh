#!/usr/bin/env bash
# Make the collections pinned in requirements.yml available. The pinned `ansible` bundle in .venv already carries
# them; only when a pinned version is missing is Ansible Galaxy asked (into ./collections), so air-gapped hosts and
# machines where Galaxy never answers work as long as the bundle matches.
set -euo pipefail
venv=${VENV:-.venv}
installed=$("$venv/bin/ansible-galaxy" collection list --format json 2>/dev/null)
missing=$("$venv/bin/python" - "$installed" <<'PY'
import json, sys, yaml
installed = json.loads(sys.argv[1])
have = {(name, info["version"]) for path in installed.values() for name, info in path.items()}
wanted = yaml.safe_load(open("requirements.yml"))["collections"]
print(" ".join(f"{c['name']}:{c['version']}" for c in wanted if (c["name"], c["version"]) not in have))
PY
)
if [ -z "$missing" ]; then
  echo "collections: every pinned collection is present"
  exit 0
fi
echo "collections: missing $missing; asking Ansible Galaxy"
timeout 300 "$venv/bin/ansible-galaxy" collection install -r requirements.yml -p ./collections || {
  echo "Ansible Galaxy did not answer and these pinned collections are missing: $missing." >&2
  echo "Install the pinned ansible bundle (make venv) or copy the collections into ./collections." >&2
  exit 2
}

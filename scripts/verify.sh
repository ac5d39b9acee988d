#!/usr/bin/env bash
# The validator with the project's exit contract (deepops'): one human line per check (default) or one JSON object
# (--json); exit 0 when every check passed or was skipped, 1 when a check failed, 2 for a usage or environment
# error (no verdict could be made: bad arguments, unreachable hosts, a broken playbook).
#   scripts/verify.sh [--json] [-i INVENTORY] [ansible-playbook options ...]
set -uo pipefail
cd "$(dirname "$0")/.."
json=false
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --json) json=true ;;
    -h | --help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --*=* | -i | --inventory | -l | --limit | -e | --extra-vars | -t | --tags | -v*) args+=("$1") ;;
    -*) echo "verify: unknown option $1" >&2; exit 2 ;;
    *) args+=("$1") ;;
  esac
  shift
done
command -v ansible-playbook >/dev/null || { echo "verify: ansible-playbook is not on PATH (make venv)" >&2; exit 2; }
report=$(mktemp)
trap 'rm -f "$report"' EXIT
log=$(mktemp)
ansible-playbook playbooks/verify.yml -e "validate_report_path=$report" "${args[@]}" >"$log" 2>&1
status=$?
if [ ! -s "$report" ]; then
  cat "$log" >&2
  echo "verify: no verdict (ansible-playbook exit $status): see the output above" >&2
  rm -f "$log"
  exit 2
fi
if $json; then
  cat "$report"
else
  # The lines from the report itself: a detail may contain quotes (Docker's `driver ""` errors).
  python3 - "$report" <<'PY'
import json, sys
seen = set()
for results in json.load(open(sys.argv[1]))["hosts"].values():
    for r in results:
        name = f"{r.get('section', '?')}/{r.get('check', '?')}"
        line = f"{r['status'].upper()} {name}: {r.get('detail', '')}"
        if line not in seen:
            seen.add(line)
            print(line)
PY
fi
rm -f "$log"
python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["passed"] else 1)' "$report"

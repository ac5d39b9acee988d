#!/usr/bin/env bash
# Run Molecule scenarios, MOLECULE_JOBS at a time (default 3: most of a scenario's time is apt and container
# start-up, not CPU). Each scenario logs to artifacts/molecule/<scenario>.log and prints its timing line; a failed
# scenario's log tail is printed. Exit status 1 when any scenario failed.
#   scripts/molecule-all.sh [SCENARIO ...]     (default: every molecule/*/molecule.yml)
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=${MOLECULE_JOBS:-3}
logs=artifacts/molecule
mkdir -p "$logs"
# The longest scenarios start first, so that the stage ends when they do rather than after them (images builds the
# downloader image inside Docker-in-Docker: about 9 minutes under load; docker and nvidia_container_toolkit next).
longest_first=(images nvidia_container_toolkit docker)
if [ $# -eq 0 ]; then
  set -- $( (printf '%s\n' "${longest_first[@]}"; for f in molecule/*/molecule.yml; do basename "$(dirname "$f")"; done) |
    awk '!seen[$0]++' | while read -r s; do [ -f "molecule/$s/molecule.yml" ] && echo "$s"; done)
fi

run_one() {
  local scenario=$1 start status
  start=$(date +%s)
  molecule test -s "$scenario" >"artifacts/molecule/$scenario.log" 2>&1
  status=$?
  if [ $status -eq 0 ]; then
    echo "stage molecule-$scenario: passed in $(($(date +%s) - start))s"
  else
    echo "stage molecule-$scenario: FAILED (exit $status) in $(($(date +%s) - start))s"
    # The failed task itself first (with its assertion and message), then the end of the log.
    echo "  [$scenario] failed tasks:"
    grep -E -B 2 -A 14 '(fatal|failed): \['  "artifacts/molecule/$scenario.log" | cut -c 1-400 | head -n 80 |
      sed "s/^/  [$scenario] /"
    echo "  [$scenario] last lines of its log:"
    tail -n 25 "artifacts/molecule/$scenario.log" | cut -c 1-400 | sed "s/^/  [$scenario] /"
  fi
  return $status
}
export -f run_one

printf '%s\n' "$@" | xargs -P "$jobs" -I{} bash -c 'run_one "$@"' _ {} | tee -a "${DINOPS_TIMINGS:-/dev/null}"
status=${PIPESTATUS[1]}
[ "$status" -eq 0 ] || { echo "some Molecule scenarios failed (logs in $logs/)"; exit 1; }

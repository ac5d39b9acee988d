#!/usr/bin/env bash
# `make test`: every stage, one timing line each (scripts/stage.sh), every stage run even after a failure.
#   set-up first (everything the others need); then two lanes side by side, because one is mostly CPU-bound (lint,
#   the Python tests, then the GPU rehearsal) while the other mostly waits on apt, dpkg and containers (Molecule, the
#   image builds, then Chromium); in the last CI run they ended within two minutes of each other. The newcomer stage
#   last and alone, since it stops this machine's Docker daemon.
# While the lanes run, each stage writes to artifacts/stages/<stage>.log; the logs are printed whole, in stage order,
# once both lanes are done (a failed stage's log last, so that its end is what a reader sees first).
#   scripts/test-all.sh            (TEST_LANES=1 runs the same stages one after another, output as it comes)
set -uo pipefail
cd "$(dirname "$0")/.."
logs=artifacts/stages
lane_cpu=(lint:lint python-tests:pytest gpu-rehearsal:gpu-rehearsal)
lane_docker=(molecule:molecule images:images browser:browser)
failed=()

stage() { # stage NAME TARGET: run one make target as a stage, its output on stdout
  scripts/stage.sh "$1" "${MAKE:-make}" --no-print-directory "$2"
}

lane() { # lane NAME:TARGET...: one stage after another, each into its log; prints the failed stages' names,
  # and each stage's timing line on stderr as it ends, so that a long run shows progress
  local entry name
  for entry in "$@"; do
    name=${entry%%:*}
    stage "$name" "${entry##*:}" >"$logs/$name.log" 2>&1 || echo "$name"
    tail -n 1 "$logs/$name.log" >&2
  done
}

stage set-up setup || failed+=(set-up)
mkdir -p "$logs"
if [ "${TEST_LANES:-2}" = 1 ]; then
  for entry in "${lane_cpu[@]}" "${lane_docker[@]}"; do
    stage "${entry%%:*}" "${entry##*:}" || failed+=("${entry%%:*}")
  done
else
  echo "=== two lanes: ${lane_cpu[*]%%:*} | ${lane_docker[*]%%:*} (logs in $logs/, printed when both are done)"
  lane "${lane_cpu[@]}" >"$logs/.lane-cpu" &
  cpu=$!
  lane "${lane_docker[@]}" >"$logs/.lane-docker" &
  docker=$!
  wait "$cpu" "$docker"
  mapfile -t lane_failed < <(cat "$logs/.lane-cpu" "$logs/.lane-docker")
  for entry in "${lane_cpu[@]}" "${lane_docker[@]}"; do
    name=${entry%%:*}
    [[ " ${lane_failed[*]} " == *" $name "* ]] || cat "$logs/$name.log"
  done
  for name in "${lane_failed[@]}"; do
    cat "$logs/$name.log"
    failed+=("$name")
  done
fi
stage newcomer newcomer || failed+=(newcomer)

if [ ${#failed[@]} -gt 0 ]; then
  echo "make test: failed stages: ${failed[*]}"
  exit 1
fi
echo "make test: all stages passed"

#!/usr/bin/env bash
# `make test`: every stage, one timing line each (scripts/stage.sh), every stage run even after a failure.
#   set-up first (everything the others need); then two lanes side by side that take the stages from one queue in
#   its order, each lane its next stage when its last one ends: molecule (the longest, mostly waiting on apt, dpkg
#   and containers) on one, lint then python-tests (mostly CPU) on the other, and whichever lane is free first takes
#   images, gpu-rehearsal, cpu-rehearsal and browser (cpu-rehearsal needs the images: it waits for the images
#   stage's build under one lock, tests/images/imagetools.py). A fixed split of the last ones left one lane idle
#   for minutes whenever a stage took longer or shorter than the run before. The newcomer stage last and alone, since it stops this machine's
#   Docker daemon.
# While the lanes run, each stage writes to artifacts/stages/<stage>.log; the logs are printed whole, in queue
# order, once both lanes are done (a failed stage's log last, so that its end is what a reader sees first).
#   scripts/test-all.sh            (TEST_LANES=1 runs the same stages one after another, output as it comes)
set -uo pipefail
cd "$(dirname "$0")/.."
logs=artifacts/stages
queue=(molecule:molecule lint:lint python-tests:pytest images:images gpu-rehearsal:gpu-rehearsal
  cpu-rehearsal:cpu-rehearsal browser:browser)
failed=()

stage() { # stage NAME TARGET: run one make target as a stage, its output on stdout
  scripts/stage.sh "$1" "${MAKE:-make}" --no-print-directory "$2"
}

next_stage() { # next_stage: the queue's next NAME:TARGET, taken off it under a lock; nothing when it is empty
  (
    flock 9
    entry=$(head -n 1 "$logs/.queue")
    [ -z "$entry" ] || sed -i 1d "$logs/.queue"
    echo "$entry"
  ) 9>"$logs/.queue.lock"
}

lane() { # lane: stages from the queue until it is empty, each into its log; prints the failed stages' names,
  # and each stage's timing line on stderr as it ends, so that a long run shows progress
  local entry name
  while entry=$(next_stage) && [ -n "$entry" ]; do
    name=${entry%%:*}
    stage "$name" "${entry##*:}" >"$logs/$name.log" 2>&1 || echo "$name"
    tail -n 1 "$logs/$name.log" >&2
  done
}

stage set-up setup || failed+=(set-up)
mkdir -p "$logs"
if [ "${TEST_LANES:-2}" = 1 ]; then
  for entry in "${queue[@]}"; do
    stage "${entry%%:*}" "${entry##*:}" || failed+=("${entry%%:*}")
  done
else
  echo "=== two lanes over one queue: ${queue[*]%%:*} (logs in $logs/, printed when both are done)"
  printf '%s\n' "${queue[@]}" >"$logs/.queue"
  lane >"$logs/.lane-1" &
  first=$!
  lane >"$logs/.lane-2" &
  second=$!
  wait "$first" "$second"
  mapfile -t lane_failed < <(cat "$logs/.lane-1" "$logs/.lane-2")
  for entry in "${queue[@]}"; do
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

#!/usr/bin/env bash
# Run one stage of `make test` and print its timing line: "stage <name>: <status> in <seconds>s (cpu <p>% busy)".
# The share is the whole machine's (every core, from /proc/stat) while the stage ran, whatever ran beside it: near
# 100% in the lanes means a faster stage needs less CPU work, not more parallelism.
set -uo pipefail
cpu_ticks() { # cpu_ticks: "busy total" clock ticks of every core since boot (the first line of /proc/stat)
  awk '/^cpu / { total = 0; for (i = 2; i <= NF; i++) total += $i; print total - $5 - $6, total }' /proc/stat
}
name=$1
shift
start=$(date +%s)
read -r busy_before total_before < <(cpu_ticks)
echo "=== stage $name: $*"
"$@"
status=$?
elapsed=$(($(date +%s) - start))
read -r busy_after total_after < <(cpu_ticks)
busy=$(((busy_after - busy_before) * 100 / (total_after - total_before > 0 ? total_after - total_before : 1)))
result=$([ $status -eq 0 ] && echo passed || echo "FAILED (exit $status)")
echo "stage $name: $result in ${elapsed}s (cpu ${busy}% busy)" | tee -a "${DINOPS_TIMINGS:-/dev/null}"
exit $status

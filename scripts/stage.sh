#!/usr/bin/env bash
# Run one stage of `make test` and print its timing line: "stage <name>: <status> in <seconds>s".
set -uo pipefail
name=$1
shift
start=$(date +%s)
echo "=== stage $name: $*"
"$@"
status=$?
elapsed=$(($(date +%s) - start))
result=$([ $status -eq 0 ] && echo passed || echo "FAILED (exit $status)")
echo "stage $name: $result in ${elapsed}s" | tee -a "${DINOPS_TIMINGS:-/dev/null}"
exit $status

#!/bin/sh
# timed.sh LABEL COMMAND...: runs COMMAND and says how long it took, as `make test` does for
# each of its phases, so a run's log shows where its time went. Exits with COMMAND's status.
label=$1
shift
start=$(date +%s)
"$@"
rc=$?
echo "timed: $label: $(($(date +%s) - start)) s$([ "$rc" -eq 0 ] || echo " (failed, exit $rc)")"
exit "$rc"

#!/usr/bin/env bash
# `make openstack-cluster` (and `make test`'s subset): brings this machine's all-in-one
# OpenStack up (reusing services already running), runs the cluster through it
# (target/debug/openstack-cluster ARGS...), and stops, by PID, the services this run
# started. One run at a time per machine (a lock), as there is one cloud.
#
#   OPENSTACK_KEEP=1   leave the services running afterwards (a later run reuses them)
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/openstack/lib.sh
[ "$(id -u)" -eq 0 ] || die "run.sh must run as root (it starts system services)"
mkdir -p "$OS_STATE"
exec 9>"$OS_STATE/run.lock"
flock -n 9 || { log "another run holds $OS_STATE/run.lock; waiting for it"; flock 9; }

# Services another run (or `up.sh` by hand) left running stay running; only what this run
# starts is stopped at the end.
if [ -s "$OS_STATE/started" ]; then
  mv "$OS_STATE/started" "$OS_STATE/started.before-$$"
fi
# What the run was doing, and where openstack-cluster leaves its table and verdict: both are
# said again after the stop below, whose twenty lines would otherwise be all that a log's tail
# (CI's) shows of a failed run.
stage="bringing the cloud up (scripts/openstack/up.sh)"
# Exported, so that openstack-cluster writes where this script reads.
export OPENSTACK_CLUSTER_WORK=${OPENSTACK_CLUSTER_WORK:-target/openstack-cluster}
summary=$OPENSTACK_CLUSTER_WORK/summary.txt
finish() {
  local rc=$?
  if [ "${OPENSTACK_KEEP:-}" = 1 ]; then
    log "OPENSTACK_KEEP=1: the services stay up; scripts/openstack/down.sh stops them"
    [ -e "$OS_STATE/started.before-$$" ] && cat "$OS_STATE/started.before-$$" >> "$OS_STATE/started"
  else
    if ! scripts/openstack/down.sh && [ "$rc" -eq 0 ]; then
      rc=1 stage="stopping the cloud (scripts/openstack/down.sh)"
    fi
    [ -e "$OS_STATE/started.before-$$" ] && mv "$OS_STATE/started.before-$$" "$OS_STATE/started"
  fi
  rm -f "$OS_STATE/started.before-$$"
  if [ "$rc" -ne 0 ]; then
    log "FAILED (exit $rc) while $stage"
    if [ "$stage" = "running the cluster" ] && [ -s "$summary" ]; then
      log "what openstack-cluster said at the end ($summary; all of it is above):"
      sed 's/^/  /' "$summary" >&2
    fi
  fi
  exit $rc
}
trap finish EXIT
t=$SECONDS
# Not the lock's descriptor: every service up.sh starts would inherit it and hold the lock for
# as long as it runs, so a run reusing services left up (OPENSTACK_KEEP=1) waited forever.
scripts/openstack/up.sh 9>&-
log "the cloud was up after $((SECONDS - t)) s"
stage="running the cluster"
target/debug/openstack-cluster "$@"

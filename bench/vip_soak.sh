#!/usr/bin/env bash
# Does the API VIP stay put when nothing is dead? keelson (the defaults `keelson build`
# writes) against OpenShift's keepalived + haproxy (today's settings, ocp-2024; any era with
# STACKS), on the topology of bench/lib/stacks.sh, under two conditions, each for SECS seconds:
#
#  slow   the VIP holder's apiserver is slow but alive — its /readyz answers after 1, 2, 3 s
#         in turn — and both cores are saturated (`stress-ng --cpu <cores>`);
#  netem  10% packet loss and 50 ms jitter (`tc qdisc ... netem delay 50ms 50ms loss 10%`)
#         on every master's link (each packet between masters crosses one of them); on a
#         kernel without sch_netem the same in user space, bench/lib/jitter.py between
#         each master's veth and the bridge (the result line says which);
#  freeze the VIP holder's load balancer stack frozen (SIGSTOP) for 300 ms every 10 s, as a
#         starved or descheduled process is: keelson's agent (VRRP and proxy in one
#         process), OpenShift's keepalived and haproxy (every process of both). The node's
#         kernel runs on.
#
# Counted while the condition lasts: how often the VIP moved (the holder changed), samples
# with two holders or none (polled every 200 ms), and the requests of a client opening a new
# TLS connection through VIP:6443 every 50 ms that failed. Then, in the same run, the
# holder's apiserver is killed: how long until the VIP left it (keelson moves it; OpenShift's
# keepalived checks only haproxy, so there it stays, by design).
#
# Usage (root): bench/vip_soak.sh [secs=600] [conditions="slow netem freeze"]
#   KEELSON_AGENT, KEELSON, KUBE_STANDIN: binaries (as bench/api_outage.sh), STACKS
#   (default "keelson ocp-2024"), one after the other in each condition; KEEP=DIR keeps each
#   run's logs and samples (with the moves' times, ms into the soak, in moved_at_ms).
set -euo pipefail

SECS=${1:-600}
CONDITIONS=${2:-"slow netem freeze"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STACKS=${STACKS:-"keelson ocp-2024"}
P=kso$$
WORK=$(mktemp -d)
# shellcheck source=bench/lib/stacks.sh
. "$ROOT/bench/lib/stacks.sh"
require_bench stress-ng tc

STRESS=""
NETEM="tc netem delay 50ms 50ms loss 10%"
# The jitter.py relays' pids (one_soak runs in a subshell: a file, so cleanup sees them).
stop_relays() {
    local pid
    [ -f "$WORK/relays" ] || return 0
    for pid in $(cat "$WORK/relays"); do
        kill "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    done
    rm -f "$WORK/relays"
}
# The freeze loop's pid (one_soak runs in a subshell: a file, so cleanup sees it).
stop_freezer() {
    [ -f "$WORK/freezer" ] || return 0
    local pid m
    pid=$(cat "$WORK/freezer")
    kill "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    rm -f "$WORK/freezer"
    # Nothing stays stopped.
    for m in "${MASTERS[@]}"; do
        for p in $(lb_procs "$m"); do kill -CONT "$p" 2>/dev/null || true; done
    done
}
# The load balancer stack's processes of master $1: keelson-agent, or keepalived (parent
# and children) and haproxy.
lb_procs() {
    local pid
    for pid in $(ip netns pids "$(ns "$1")" 2>/dev/null); do
        case $(cat "/proc/$pid/comm" 2>/dev/null) in
            keelson-agent | keepalived | haproxy) echo "$pid" ;;
        esac
    done
}
# Every 10 s: the holder's stack stopped for 300 ms, then continued.
freezer() {
    local h pids
    while true; do
        sleep 10
        h=$(holder)
        [ "$h" != none ] || continue
        pids=$(lb_procs "$h")
        [ -n "$pids" ] || continue
        # shellcheck disable=SC2086
        kill -STOP $pids 2>/dev/null || true
        sleep 0.3
        # shellcheck disable=SC2086
        kill -CONT $pids 2>/dev/null || true
    done
}
cleanup() {
    [ -z "$STRESS" ] || kill "$STRESS" 2>/dev/null || true
    stop_freezer
    stop_relays
    teardown
    rm -rf "$WORK"
}
trap cleanup EXIT

# All holders now, as "0", "0 2" or "" (none).
holders() {
    local m out=""
    for m in "${MASTERS[@]}"; do
        if [[ $(ip -n "$(ns "$m")" -o addr show dev eth0) == *" $VIP/"* ]]; then out+="$m "; fi
    done
    echo "${out% }"
}

one_soak() { # stack condition -> one JSON line
    local stack=$1 cond=$2 h t0 moves=0 dual=0 none=0 samples=0 last cur moved_at=""
    setup
    start_stack "$stack"
    settle || { tail -n 20 "$WORK"/run/*/*.log >&2; return 1; }
    sleep 12
    h=$(holder)
    [ "$h" != none ] || { echo "no VIP holder" >&2; return 1; }
    case $cond in
        slow)
            touch "$WORK/run/slow-$h"
            stress-ng --cpu "$(nproc)" --timeout "${SECS}s" >/dev/null 2>&1 &
            STRESS=$!
            ;;
        netem)
            for m in "${MASTERS[@]}"; do
                if ! ip netns exec "$(ns "$m")" tc qdisc add dev eth0 root netem delay 50ms 50ms loss 10% 2>/dev/null; then
                    # A kernel without sch_netem (CONFIG_NET_SCH_NETEM unset): the same
                    # delay, jitter and loss on everything the node sends, in user space.
                    ip netns exec $BR python3 "$ROOT/bench/lib/jitter.py" "${P}v$m" "${P}j$m" 50 50 10 \
                        >/dev/null 2>>"$WORK/jitter.log" &
                    echo $! >>"$WORK/relays"
                    NETEM="bench/lib/jitter.py delay 50ms 50ms loss 10% (no sch_netem in this kernel)"
                fi
            done
            ;;
        freeze)
            freezer >/dev/null 2>&1 &
            echo $! >"$WORK/freezer"
            ;;
    esac
    ip netns exec $C $CLIENT new $VIP 6443 "$WORK/run/new.txt" &
    local cnew=$!
    t0=$(now_ms)
    last=$h
    local load_sum=0 load_n=0
    while [ $(($(now_ms) - t0)) -lt $((SECS * 1000)) ]; do
        cur=$(holders)
        samples=$((samples + 1))
        case $cur in
            "") none=$((none + 1)) ;;
            *" "*) dual=$((dual + 1)) ;;
            *) if [ "$cur" != "$last" ]; then moves=$((moves + 1)); moved_at+="$(($(now_ms) - t0)) "; last=$cur; fi ;;
        esac
        if ((samples % 50 == 0)); then
            load_sum=$(awk -v a="$load_sum" -v b="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN{print a+b}')
            load_n=$((load_n + 1))
        fi
        sleep 0.2
    done
    kill -TERM $cnew 2>/dev/null || true
    wait $cnew 2>/dev/null || true
    stop_freezer
    local report
    report=$($CLIENT report "$t0" "$WORK/run/new.txt" /dev/null "m$h")
    [ -z "$STRESS" ] || { kill "$STRESS" 2>/dev/null || true; wait "$STRESS" 2>/dev/null || true; STRESS=""; }
    # In the same run: the holder's apiserver dies, the node lives. (Under netem the
    # condition stays on; under `slow` the stress has ended, under `freeze` the freezing.)
    local holder_now dead_ms=null t1
    holder_now=$(holder)
    if [ "$holder_now" != none ]; then
        kill_standin "$holder_now"
        t1=$(now_ms)
        while [ $(($(now_ms) - t1)) -lt 30000 ]; do
            cur=$(holders)
            if [ -n "$cur" ] && [[ " $cur " != *" $holder_now "* ]]; then dead_ms=$(($(now_ms) - t1)); break; fi
            sleep 0.1
        done
    fi
    stop_relays
    if [ -n "${KEEP:-}" ]; then # the agents' and load balancers' logs, the client's samples
        mkdir -p "$KEEP/$cond-$stack" && cp -r "$WORK"/run/. "$KEEP/$cond-$stack/"
        echo "$moved_at" >"$KEEP/$cond-$stack/moved_at_ms"
    fi
    local load
    load=$(awk -v a="$load_sum" -v n="$load_n" 'BEGIN{ if (n) printf "%.1f", a/n; else print "null" }')
    echo "{\"stack\":\"$stack\",\"condition\":\"$cond\",\"netem\":\"$([ "$cond" = netem ] && echo "$NETEM")\",\"secs\":$SECS,\"moves\":$moves,\"moved_at_ms\":\"${moved_at% }\",\"dual_samples\":$dual,\"none_samples\":$none,\"samples\":$samples,\"requests\":$(echo "$report" | jq .requests),\"failed\":$(echo "$report" | jq .failed),\"dead_apiserver_moved_ms\":$dead_ms,\"mean_load\":$load}"
}

echo "VIP soak: $CONDITIONS, ${SECS} s each, stacks $STACKS; $(date -u +%FT%TZ)"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $(keepalived -v 2>&1 | head -1); $(haproxy -v | head -1); $(stress-ng --version 2>&1 | head -1)"
keelson_build
print_configs $STACKS
for cond in $CONDITIONS; do
    for stack in $STACKS; do
        line=$(one_soak "$stack" "$cond")
        echo "$line" | jq -r '"  \(.condition) \(.stack|.+"          "|.[0:9]): \(if .netem != "" then "(" + .netem + ") " else "" end)VIP moved \(.moves) times\(if .moved_at_ms != "" then " (at " + .moved_at_ms + " ms)" else "" end) in \(.secs) s (two holders in \(.dual_samples), none in \(.none_samples) of \(.samples) samples); \(.failed)/\(.requests) requests failed; then the holder'"'"'s apiserver killed: VIP left it after \(.dead_apiserver_moved_ms // "no move within 30 000") ms; mean load \(.mean_load)"'
    done
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"

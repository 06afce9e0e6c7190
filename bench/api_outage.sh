#!/usr/bin/env bash
# The API outage a client sees when the API VIP's holder (or its apiserver) goes: keelson
# with the defaults `keelson build` writes against OpenShift's on-prem stack (keepalived +
# haproxy) at each haproxy setting it really shipped, side by side in one run, rounds
# alternating. The stacks and the topology are in bench/lib/stacks.sh.
#
# Two clients through VIP:6443, as `bench/api_client.py` describes: a new TLS connection
# every 50 ms with a 1 s timeout (like `oc`), and one keep-alive connection asking every
# 200 ms (like a watch) that reconnects on a failure.
#
# Cases: `kill` — the holder's link is cut on the bridge side and every process in its
# namespace stopped and killed (no goodbye); `apiserver` — the holder's apiserver is killed
# (SIGKILL) while the node and its load balancer live; `stop` — a clean stop: the holder's
# load balancer stack gets SIGTERM (keelson: the agent; OpenShift: keepalived and haproxy)
# and is waited for, then its apiserver stops as kube-apiserver does on SIGTERM (new
# connections refused, 1 s for requests in flight, then it exits: `stop_standin`), then its
# link is cut, as in a reboot; `roll` — a rolling restart
# of the load balancer stack on every master, one at a time, the backups first and the VIP's
# holder last (docs/operations.md, "Upgrading the agent"): SIGTERM, wait until it is gone,
# start it again (keelson: `$KEELSON_AGENT_NEW`, an upgrade, when set), wait until the VIP
# answers steadily, next. Requests are counted from the first stop to $AFTER s after the
# last start.
#
# Printed per run: requests sent after the event, how many failed, when the VIP answered
# again (the first request after the event that succeeded), the last failure, failures of
# requests sent after the VIP answered again, when the long-lived client was served by a
# live master again, and whether the VIP moved. Then medians and spreads (min-max) per case
# and stack, and keelson's ratios against the best OpenShift era and today's (ocp-2024).
#
# Usage (root): bench/api_outage.sh [rounds=3] [cases="kill apiserver stop"]
#   KEELSON_AGENT, KEELSON, KUBE_STANDIN: binaries (default: the static release ones of
#   `make agent` / `make build`), STACKS (default "keelson ocp-4.2 ocp-2020 ocp-2024"),
#   AFTER (seconds watched, 30), KEEP=DIR (keep each run's samples),
#   KEELSON_AGENT_NEW: the binary `roll` restarts keelson with (default: KEELSON_AGENT),
#   PLATFORM: the install-config's platform keelson builds for (default baremetal: the
#   namespaces are a bridge; openstack turns the connection hand-back off, docs/vrrp.md)
set -euo pipefail

ROUNDS=${1:-3}
CASES=${2:-"kill apiserver stop"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
AFTER=${AFTER:-30}   # seconds watched after the event
STACKS=${STACKS:-"keelson ocp-4.2 ocp-2020 ocp-2024"}
P=kao$$
WORK=$(mktemp -d)
# shellcheck source=bench/lib/stacks.sh
. "$ROOT/bench/lib/stacks.sh"
require_bench

trap 'teardown; rm -rf "$WORK"' EXIT

one_run() { # stack case -> one JSON line
    local stack=$1 case=$2 h t0 report
    setup
    start_stack "$stack"
    settle || { tail -n 20 "$WORK"/run/*/*.log >&2; return 1; }
    # Let every check pass everywhere (haproxy rise 3 x 3 s in 4.2, keepalived rise 3 x 2 s,
    # keelson's local-apiserver rise 3 x 2 s) and the holder settle.
    sleep 12
    ip netns exec $C $CLIENT new $VIP 6443 "$WORK/run/new.txt" &
    local cnew=$!
    ip netns exec $C $CLIENT long $VIP 6443 "$WORK/run/long.txt" &
    local clong=$!
    sleep 3
    h=$(holder)
    [ "$h" != none ] || { echo "no VIP holder before the $case" >&2; return 1; }
    local n d
    n=$(ns "$h")
    d="$WORK/run/$n"
    if [ "$case" = roll ]; then
        t0=$(now_ms)
        local order=() m
        for m in "${MASTERS[@]}"; do [ "$m" = "$h" ] || order+=("$m"); done
        order+=("$h")
        for m in "${order[@]}"; do
            restart_lb "$stack" "$m" "${KEELSON_AGENT_NEW:-$AGENT}"
            settle >/dev/null || { tail -n 20 "$WORK"/run/*/*.log >&2; return 1; }
            # Every check passing everywhere again before the next one goes (as above).
            sleep 12
        done
        echo "  roll: $stack restarted $(printf 'm%s ' "${order[@]}")(holder m$h last) in $((($(now_ms) - t0) / 1000)) s" >&2
    elif [ "$case" = kill ]; then
        ip -n $BR link set "${P}v$h" down
        # The clock starts once the link is cut (forking ip takes tens of ms under load).
        t0=$(now_ms)
        kill_ns "$n"
    elif [ "$case" = apiserver ]; then
        t0=$(now_ms)
        kill_standin "$h"
    else
        t0=$(now_ms)
        # A clean stop of the load balancer stack (SIGTERM, as systemd stops a unit), then
        # the apiserver stops as kube-apiserver does (new connections refused, requests in
        # flight finished), then the rest of the node goes away.
        kill -TERM $(cat "$d/lb.pids") 2>/dev/null || true
        for pid in $(cat "$d/lb.pids"); do
            while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
        done
        stop_standin "$h"
        kill_ns "$n"
        ip -n $BR link set "${P}v$h" down
    fi
    sleep "$AFTER"
    local after
    case $case in
        apiserver | roll) after=$(holder) ;;
        *) after=$(holder_except "$h") ;;
    esac
    kill -TERM $cnew $clong
    wait $cnew $clong 2>/dev/null || true
    report=$($CLIENT report "$t0" "$WORK/run/new.txt" "$WORK/run/long.txt" "m$h")
    if [ -n "${KEEP:-}" ]; then # keep the raw samples and logs of every run
        mkdir -p "$KEEP/$stack-$case-$t0" && cp -r "$WORK"/run/. "$KEEP/$stack-$case-$t0/"
        echo "$t0" >"$KEEP/$stack-$case-$t0/kill_ms"
    fi
    echo "{\"stack\":\"$stack\",\"case\":\"$case\",\"holder\":\"m$h\",\"holder_after\":\"m$after\",${report#\{}"
}

echo "API outage through VIP:6443 when the holder goes ($CASES); rounds=$ROUNDS; $(date -u +%FT%TZ)"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $(keepalived -v 2>&1 | head -1); $(haproxy -v | head -1)"
keelson_build
print_configs $STACKS
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
for case in $CASES; do
    for r in $(seq 1 "$ROUNDS"); do
        # Rounds alternate the order, so no stack always runs first (or right after another).
        order=$STACKS
        ((r % 2)) || order=$(echo "$STACKS" | tr ' ' '\n' | tac | paste -sd' ')
        for stack in $order; do
            line=$(one_run "$stack" "$case")
            echo "$line" >>"$RESULTS"
            echo "$line" | jq -r --arg r "$r" --arg load "$(cut -d' ' -f1 /proc/loadavg)" '"  \(.case) round \($r) \(.stack|.+"          "|.[0:9]): \(.failed)/\(.requests) failed, VIP back \(.vip_back_ms) ms, last failure \(.last_failure_ms) ms, failed after VIP back \(.failed_after_vip_back), long-lived served again \(.long_reconnect_ms) ms (\(.long_failed) failed), VIP \(.holder) -> \(.holder_after); load \($load)\(if (.failures|length) > 0 and .failed < 10 then "; failed: \(.failures|map("\(.[0]) ms \(.[1])")|join(", "))" else "" end)"'
        done
    done
done
echo
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "medians [min-max]:"
printf '%-9s %-9s %14s %18s %18s %10s %18s\n' case stack failed "VIP back ms" "last fail ms" "fail>VIP" "long-lived ms"
for case in $CASES; do
    for stack in $STACKS; do
        sel() { jq -r --arg s "$stack" --arg c "$case" "select(.stack==\$s and .case==\$c) | $1" "$RESULTS"; }
        [ -n "$(sel .failed)" ] || continue
        col() { echo "$(sel "$1" | median) [$(sel "$1" | spread)]"; }
        printf '%-9s %-9s %14s %18s %18s %10s %18s\n' "$case" "$stack" "$(col .failed)" \
            "$(col .vip_back_ms)" "$(col .last_failure_ms)" "$(col .failed_after_vip_back)" "$(col .long_reconnect_ms)"
    done
done
echo
for case in $CASES; do
    med() { jq -r --arg s "$1" --arg c "$case" 'select(.stack==$s and .case==$c) | .last_failure_ms' "$RESULTS" | median; }
    kl=$(med keelson)
    best=- best_stack=-
    for stack in $STACKS; do
        [[ $stack == ocp-* ]] || continue
        v=$(med "$stack")
        [ "$v" != - ] || continue
        if [ "$best" = - ] || awk "BEGIN{exit !($v < $best)}"; then best=$v best_stack=$stack; fi
    done
    today=$(med ocp-2024)
    if [ "$kl" != - ] && [ "$best" != - ] && [ "$today" != - ]; then
        echo "$case: keelson's last failure $kl ms; / best OpenShift ($best_stack, $best ms) = $(awk "BEGIN{ if ($best>0) printf \"%.2f\", $kl/$best; else print \"n/a (0 ms)\" }") (goal <= 1.0); / ocp-2024 ($today ms) = $(awk "BEGIN{ if ($today>0) printf \"%.2f\", $kl/$today; else print \"n/a (0 ms)\" }") (goal <= 0.35)"
    fi
done
for case in $CASES; do
    back() { jq -r --arg s "$1" --arg c "$case" 'select(.stack==$s and .case==$c) | .vip_back_ms' "$RESULTS" | median; }
    kb=$(back keelson)
    best=- best_stack=-
    for stack in $STACKS; do
        [[ $stack == ocp-* ]] || continue
        v=$(back "$stack")
        [ "$v" != - ] || continue
        if [ "$best" = - ] || awk "BEGIN{exit !($v < $best)}"; then best=$v best_stack=$stack; fi
    done
    [ "$kb" = - ] || echo "$case: keelson's API back after $kb ms (median, VIP answering again); best OpenShift ($best_stack) $best ms"
done
# What detection costs at the defaults (docs/vrrp.md, "Fast failover without flapping"):
# keelson's backups claim a silent master's VIP once its death is confirmed, the later of
# Master_Down (3 adverts + skew) and the ARP round's least wait (1.3 adverts + 150 ms);
# keepalived's at Master_Down. Counted from the dead master's last advert, so up to an interval earlier
# after the kill; a request sent just before the VIP moved fails after its 1 s timeout, so
# the last failure comes about a second after the VIP is back.
adv=$(jq -r '.vrrp.instances[] | select(.name=="api") | .advertIntervalMs' "$WORK/build/out/cluster.json")
echo "VRRP floor: keelson backups at 120, ${adv} ms adverts: $(awk -v a="$adv" 'BEGIN{md=3*a+(256-120)*a/256; c=1.3*a+150; printf "%.0f", (md>c?md:c)}') ms (confirmed death); keepalived backups at 65 (40+20+5), 1 s adverts: $(awk 'BEGIN{printf "%.0f", 3000 + (256-65)*1000/256}') ms (Master_Down)"

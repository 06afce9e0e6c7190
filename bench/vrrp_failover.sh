#!/usr/bin/env bash
# Failover time after node death, keelson-agent vs keepalived, side by side in one run.
#
# Topology: two namespaces on a bridge (a third namespace). Node A holds the VIP
# (priority 250), node B is the backup (priority 200); VRRPv3 multicast, same advert
# interval for both implementations. A "dies": its link is cut on the bridge side, then
# every process in its namespace is stopped and killed (so no priority-0 advert escapes:
# keepalived's VRRP child would otherwise catch its parent's death and send one), and B
# must wait Master_Down = 3 * interval + skew. We time from the cut until the VIP is on
# B's eth0 (polling `ip addr`, a few ms per poll).
# Rounds alternate keelson / keepalived; we print every run and the medians.
#
# Usage (root): bench/vrrp_failover.sh [runs=5] [intervals_ms="1000 100"]
#   KEELSON_AGENT=path/to/keelson-agent (default: the static release agent of `make agent`)
set -euo pipefail

RUNS=${1:-5}
INTERVALS=${2:-"1000 100"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
AGENT=${KEELSON_AGENT:-$ROOT/target/x86_64-unknown-linux-gnu/release/keelson-agent}
P=kvr-b
BR=$P-br
A=$P-a
B=$P-b
VIP=10.69.0.100
WORK=$(mktemp -d)

[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
[ -x "$AGENT" ] || { echo "build first: make agent ($AGENT)" >&2; exit 1; }
command -v keepalived >/dev/null || { echo "keepalived not installed" >&2; exit 1; }

kill_ns() { # every process in namespace $1: stop all first, so none reacts to another's death
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [ -z "$pids" ] || kill -STOP $pids 2>/dev/null || true
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
}
cleanup() {
    for ns in $A $B; do kill_ns $ns; done
    for ns in $A $B $BR; do ip netns del $ns 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
cleanup_ns() { for ns in $A $B $BR; do kill_ns $ns; ip netns del $ns 2>/dev/null || true; done; }

setup() {
    cleanup_ns
    # keepalived refuses to start while its pid files name a live process (pids recycle).
    rm -f "$WORK"/*.pid "$WORK"/log-*
    ip netns add $BR
    ip -n $BR link add br0 type bridge
    ip -n $BR link set br0 up
    local i=10
    for ns in $A $B; do
        ip netns add $ns
        ip -n $BR link add ${P}$i type veth peer name eth0 netns $ns
        ip -n $BR link set ${P}$i master br0 up
        ip -n $ns addr add 10.69.0.$i/24 dev eth0
        ip -n $ns link set eth0 up
        ip -n $ns link set lo up
        i=$((i + 1))
    done
}

holds() { ip -n "$1" -o addr show dev eth0 | grep -q " $VIP/"; }

now_ms() { echo $(($(date +%s%N) / 1000000)); }

start_keelson() { # ns role ip interval_ms
    cat >"$WORK/cluster-$1.json" <<EOF
{"version":1,"name":"kvr","baseDomain":"example.com","machineNetworks":["10.69.0.0/24"],
 "apiVips":[],"ingressVips":[],
 "vrrp":{"instances":[{"name":"api","vip":"$VIP","vrid":69,"version":"3","advertIntervalMs":$4,
   "transport":"multicast","preempt":true,"garpRefreshSecs":60,
   "priorities":{"bootstrap":250,"master":200}}]},
 "api":{"frontendPort":9445,"vipPort":6443,"backendPort":6443,"monitorPort":50936,"check":"tcp",
   "checkIntervalMs":1000,"fall":3,"rise":2,"connectTimeoutMs":1000,"idleTimeoutSecs":60,"maxConnections":1000},
 "dns":{"port":53,"ttl":60,"manageResolvConf":false},
 "ignition":{"tlsPort":22623,"plainPort":22624,"allowedNetworks":[],"spec":"3.2.0"},
 "members":{"transport":"mdns","renewIntervalSecs":2,"expirySecs":6}}
EOF
    echo "{\"name\":\"$1\",\"role\":\"$2\",\"interface\":\"eth0\",\"addresses\":[\"$3/24\"]}" >"$WORK/node-$1.json"
    ip netns exec "$1" "$AGENT" vrrp --cluster "$WORK/cluster-$1.json" --node "$WORK/node-$1.json" \
        >/dev/null 2>"$WORK/log-$1" &
}

start_keepalived() { # ns prio interval_ms
    local adv
    adv=$(awk "BEGIN{print $3/1000}")
    cat >"$WORK/ka-$1.conf" <<EOF
global_defs {
    router_id $1
    vrrp_garp_master_delay 0
}
vrrp_instance api {
    state BACKUP
    interface eth0
    version 3
    virtual_router_id 69
    priority $2
    advert_int $adv
    virtual_ipaddress {
        $VIP/32 dev eth0
    }
}
EOF
    ip netns exec "$1" keepalived -n -P -f "$WORK/ka-$1.conf" -p "$WORK/ka-$1.pid" \
        -r "$WORK/vrrp-$1.pid" -c "$WORK/chk-$1.pid" >/dev/null 2>"$WORK/log-$1" &
}

one_run() { # impl interval_ms -> prints failover ms
    local impl=$1 iv=$2 t0 t1 deadline
    setup
    if [ "$impl" = keelson ]; then
        start_keelson $A bootstrap 10.69.0.10 "$iv"
        start_keelson $B master 10.69.0.11 "$iv"
    else
        start_keepalived $A 250 "$iv"
        start_keepalived $B 200 "$iv"
    fi
    deadline=$(($(now_ms) + 20 * iv + 5000))
    until holds $A && ! holds $B; do
        [ "$(now_ms)" -lt $deadline ] || { echo "$impl: A never became sole master" >&2; cat "$WORK"/log-* >&2; ip -n $A addr >&2; ip -n $B addr >&2; return 1; }
        sleep 0.02
    done
    # Let B hear a few adverts from A (so it runs on A's Master_Down timer).
    sleep "$(awk "BEGIN{print 5*$iv/1000}")"
    t0=$(now_ms)
    ip -n $BR link set ${P}10 down
    kill_ns $A
    until holds $B; do :; done
    t1=$(now_ms)
    echo $((t1 - t0))
}

# shellcheck source=bench/lib/stats.sh
. "$ROOT/bench/lib/stats.sh"

echo "failover after node death (ms): VRRPv3, holder prio 250, backup prio 200; runs=$RUNS"
echo "agent: $AGENT; $(keepalived -v 2>&1 | head -1)"
for iv in $INTERVALS; do
    kl=()
    ka=()
    for r in $(seq 1 "$RUNS"); do
        kl+=("$(one_run keelson "$iv")")
        ka+=("$(one_run keepalived "$iv")")
        echo "  interval ${iv} ms run $r: keelson ${kl[-1]} ms, keepalived ${ka[-1]} ms"
    done
    md=$(awk "BEGIN{print 3*$iv + (256-200)*$iv/256}")
    printf 'interval %5s ms: keelson median %6s ms | keepalived median %6s ms | Master_Down %s ms\n' \
        "$iv" "$(printf '%s\n' "${kl[@]}" | median)" "$(printf '%s\n' "${ka[@]}" | median)" "$md"
done

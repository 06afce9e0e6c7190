#!/usr/bin/env bash
# The reconnect storm after a failover (docs/proxy.md): N long-lived clients hold connections
# through VIP:6443 when the VIP's holder dies; every one of them reconnects through the new
# holder at once. keelson (`keelson-agent run --only members,vrrp,proxy`) against OpenShift's
# on-prem stack (keepalived + haproxy), side by side, rounds alternating.
#
# Topology (as bench/api_outage.sh): three masters in namespaces on one bridge
# (10.86.0.10-12) and a client namespace (10.86.0.100); the API VIP is 10.86.0.5, and VIP:6443
# reaches the holder's load balancer on :9445 through an nftables redirect. Each master runs a
# backend on :6443 (`storm.py serve`) that greets every connection with its name at once, so
# the first byte through the VIP proves a live backend was reached and which one.
#
# haproxy gets the settings OpenShift ships (machine-config-operator,
# templates/master/00-master/on-prem/files/haproxy-haproxy.yaml): maxconn 40000, mode tcp,
# retries 3, timeout connect 10s, client/server 1m, tunnel 5m, client-fin/server-fin 1s,
# roundrobin, `inter 5s fall 3 rise 1`, without the log and stats sockets; keepalived as
# bench/api_outage.sh (OpenShift's chk_ocp_lb script, advert 1 s). One change for both
# stacks: the backend check is a TCP connect (haproxy `check`, keelson `"check": "tcp"`)
# instead of TLS GET /readyz, since these backends speak first and no TLS; both at 5 s.
# haproxy's tunnel timeout (5 m) is longer than any run, so it closes nothing here.
#
# Per run: N clients (`storm.py clients`: connect + greeting, TCP keepalive 1 s,
# dial timeout 10 s, immediate reconnect then jittered back-off 100 ms .. 2 s) are opened; the load balancer's
# resident memory is read on the holder before and with N connections open; then the holder's
# link is cut and everything in it killed. Printed: when the first and the last client were
# served again (ms after the kill), the storm (last - first), failed attempts, and memory.
#
# Usage (root): bench/reconnect_storm.sh [rounds=3] [clients=5000]
#   KEELSON_AGENT (default: the static release one of `make agent`), STACKS (default
#   "keelson openshift"), AFTER (seconds to wait for every client to be back, default 60)
set -euo pipefail

ROUNDS=${1:-3}
N=${2:-5000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
AGENT=${KEELSON_AGENT:-$ROOT/target/x86_64-unknown-linux-gnu/release/keelson-agent}
STORM="python3 $ROOT/bench/storm.py"
STACKS=${STACKS:-"keelson openshift"}
AFTER=${AFTER:-60}
P=kst$$
BR=$P-br
C=$P-c
VIP=10.86.0.5
MASTERS=(0 1 2)
WORK=$(mktemp -d)

[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
[ -x "$AGENT" ] || { echo "build first: make agent ($AGENT)" >&2; exit 1; }
for c in keepalived haproxy nft curl python3 jq; do command -v $c >/dev/null || { echo "$c not installed (scripts/setup.sh)" >&2; exit 1; }; done

ns() { echo "$P-m$1"; }
ip_of() { echo "10.86.0.$((10 + $1))"; }

kill_ns() {
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [ -z "$pids" ] || kill -STOP $pids 2>/dev/null || true
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
}
teardown() {
    for m in "${MASTERS[@]}"; do kill_ns "$(ns $m)"; done
    kill_ns $C
    for n in $(for m in "${MASTERS[@]}"; do ns $m; done) $C $BR; do ip netns del "$n" 2>/dev/null || true; done
}
trap 'teardown; rm -rf "$WORK"' EXIT

setup() {
    teardown
    rm -rf "${WORK:?}"/run && mkdir -p "$WORK/run"
    ip netns add $BR
    ip -n $BR link add br0 type bridge
    ip -n $BR link set br0 up
    for m in "${MASTERS[@]}" c; do
        local n addr
        if [ "$m" = c ]; then n=$C; addr=10.86.0.100; else n=$(ns "$m"); addr=$(ip_of "$m"); fi
        ip netns add "$n"
        ip -n $BR link add "${P}v$m" type veth peer name eth0 netns "$n"
        ip -n $BR link set "${P}v$m" master br0 up
        ip -n "$n" addr add "$addr/24" dev eth0
        ip -n "$n" link set eth0 up
        ip -n "$n" link set lo up
        # 5,000 clients come back at once: room for them in the SYN and accept queues.
        ip netns exec "$n" sysctl -qw net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=8192
    done
    for m in "${MASTERS[@]}"; do
        ip netns exec "$(ns "$m")" $STORM serve 6443 "m$m" >/dev/null 2>"$WORK/run/backend-$m.log" &
    done
}

start_openshift() {
    for m in "${MASTERS[@]}"; do
        local n d servers=""
        n=$(ns "$m")
        d="$WORK/run/$n"
        mkdir -p "$d"
        for s in "${MASTERS[@]}"; do
            servers+="   server m$s $(ip_of "$s"):6443 weight 1 check inter 5s fall 3 rise 1"$'\n'
        done
        cat >"$d/haproxy.cfg" <<EOF
$(grep -v '^#' "$ROOT/testdata/openshift-haproxy-defaults.cfg")
frontend  main
  bind :::9445 v4v6
  default_backend masters
listen health_check_http_url
  bind :::9444 v4v6
  mode http
  monitor-uri /haproxy_ready
  option dontlognull
backend masters
   timeout check 10s
   balance roundrobin
$servers
EOF
        cat >"$d/keepalived.conf" <<EOF
global_defs {
    router_id $n
    enable_script_security
    script_user root
}
vrrp_script chk_ocp_lb {
    script "/usr/bin/timeout 0.9 /usr/bin/curl -o /dev/null -sf http://localhost:9444/haproxy_ready"
    interval 1
    weight 20
    rise 3
    fall 2
}
vrrp_instance api {
    state BACKUP
    interface eth0
    virtual_router_id 86
    priority 40
    advert_int 1
    authentication {
        auth_type PASS
        auth_pass kst_pass
    }
    virtual_ipaddress {
        $VIP/32
    }
    track_script {
        chk_ocp_lb
    }
}
EOF
        ip netns exec "$n" nft -f - <<EOF
table ip kst_nat {
    chain prerouting { type nat hook prerouting priority dstnat; ip daddr $VIP tcp dport 6443 redirect to :9445; }
}
EOF
        ip netns exec "$n" haproxy -db -f "$d/haproxy.cfg" >/dev/null 2>"$d/haproxy.log" &
        echo $! >"$d/lb.pids"
        ip netns exec "$n" keepalived -n -l -P -f "$d/keepalived.conf" -p "$d/ka.pid" \
            -r "$d/vrrp.pid" -c "$d/chk.pid" >/dev/null 2>"$d/keepalived.log" &
        echo $! >>"$d/lb.pids"
    done
}

start_keelson() {
    cat >"$WORK/run/cluster.json" <<EOF
{"version":1,"name":"kst","baseDomain":"example.com","machineNetworks":["10.86.0.0/24"],
 "apiVips":["$VIP"],"ingressVips":[],
 "vrrp":{"instances":[{"name":"api","vip":"$VIP","vrid":86,"version":"3","advertIntervalMs":1000,
   "transport":"multicast","preempt":true,"garpRefreshSecs":60,
   "priorities":{"bootstrap":70,"master":40},
   "checks":[{"name":"api-proxy","check":{"type":"proxyHealthyBackend"},"intervalMs":1000,"rise":1,"fall":3,"weight":50}]}]},
 "api":{"frontendPort":9445,"vipPort":6443,"backendPort":6443,"monitorPort":50936,"check":"tcp",
   "checkIntervalMs":5000,"fall":3,"rise":1,"fastCheckIntervalMs":1000,"slowstartMs":10000,"shutdownSessions":true,
   "connectTimeoutMs":10000,"idleTimeoutSecs":86400,"maxConnections":20000},
 "dns":{"port":53,"ttl":60,"manageResolvConf":false},
 "ignition":{"tlsPort":22623,"plainPort":22624,"allowedNetworks":[],"spec":"3.2.0"},
 "members":{"transport":"mdns","renewIntervalSecs":10,"expirySecs":35},
 "metrics":{"port":22625}}
EOF
    for m in "${MASTERS[@]}"; do
        local n d
        n=$(ns "$m")
        d="$WORK/run/$n"
        mkdir -p "$d"
        echo "{\"name\":\"master-$m\",\"role\":\"master\",\"interface\":\"eth0\",\"addresses\":[\"$(ip_of "$m")/24\"]}" >"$d/node.json"
        ip netns exec "$n" "$AGENT" run --cluster "$WORK/run/cluster.json" --node "$d/node.json" \
            --only members,vrrp,proxy --status-socket "$d/agent.sock" >/dev/null 2>"$d/agent.log" &
        echo $! >"$d/lb.pids"
    done
}

holder() {
    for m in "${MASTERS[@]}"; do
        if [[ $(ip -n "$(ns "$m")" -o addr show dev eth0) == *" $VIP/"* ]]; then echo "$m"; return; fi
    done
    echo none
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# Waits for a holder whose VIP:6443 greets (a live backend through the proxy), 60 s at most.
settle() {
    local t0 ok=0
    t0=$(now_ms)
    while [ $(($(now_ms) - t0)) -lt 60000 ]; do
        if [ "$(holder)" != none ] &&
            ip netns exec $C timeout 1 bash -c "exec 3<>/dev/tcp/$VIP/6443 && head -c1 <&3" 2>/dev/null | grep -q m; then
            ok=$((ok + 1))
            [ $ok -ge 6 ] && return 0
        else
            ok=0
        fi
        sleep 0.5
    done
    echo "no steady state within 60 s" >&2
    return 1
}

one_run() { # stack -> one JSON line
    local stack=$1 h t0 lb idle loaded report
    setup
    case $stack in
        keelson) start_keelson ;;
        openshift) start_openshift ;;
    esac
    settle || { tail -n 20 "$WORK"/run/*/*.log >&2; return 1; }
    sleep 6 # every backend's checks settled (rise 1, 5 s)
    h=$(holder)
    lb=$(head -1 "$WORK/run/$(ns "$h")/lb.pids")
    idle=$(rss_kib "$lb")
    ip netns exec $C $STORM clients $VIP 6443 "$N" "$WORK/run/events" 2>"$WORK/run/clients.log" &
    local clients=$!
    local t=0
    until [ -e "$WORK/run/events.ready" ]; do
        sleep 0.5
        t=$((t + 1))
        [ $t -lt 240 ] || { echo "$stack: $N clients not up within 120 s" >&2; tail "$WORK/run/clients.log" >&2; kill $clients; return 1; }
    done
    sleep 2
    [ "$(holder)" = "$h" ] || { echo "$stack: the VIP moved while clients opened" >&2; kill $clients; return 1; }
    loaded=$(rss_kib "$lb")
    ip -n $BR link set "${P}v$h" down
    t0=$(now_ms)
    kill_ns "$(ns "$h")"
    local deadline=$(($(now_ms) + AFTER * 1000))
    while [ "$(now_ms)" -lt $deadline ]; do
        sleep 1
        report=$($STORM report "$t0" "$N" "$WORK/run/events")
        [ "$(jq .reestablished <<<"$report")" -ge "$N" ] && break
    done
    sleep 1
    kill -TERM $clients
    wait $clients 2>/dev/null || true
    report=$($STORM report "$t0" "$N" "$WORK/run/events")
    local nh nlb nrss=0
    nh=$(holder)
    if [ "$nh" != none ]; then
        nlb=$(head -1 "$WORK/run/$(ns "$nh")/lb.pids")
        nrss=$(rss_kib "$nlb" 2>/dev/null || echo 0)
    fi
    echo "{\"stack\":\"$stack\",\"holder\":\"m$h\",\"rss_idle_kib\":$idle,\"rss_loaded_kib\":$loaded,\"new_holder_rss_kib\":$nrss,${report#\{}"
}

# shellcheck source=bench/lib/stats.sh
. "$ROOT/bench/lib/stats.sh"

echo "reconnect storm: $N clients through VIP:6443, holder killed; rounds=$ROUNDS; $(date -u +%FT%TZ)"
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg); $(keepalived -v 2>&1 | head -1); $(haproxy -v | head -1); keelson: $AGENT"
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
for r in $(seq 1 "$ROUNDS"); do
    if ((r % 2)); then order=$STACKS; else order=$(tr ' ' '\n' <<<"$STACKS" | tac | tr '\n' ' '); fi
    for stack in $order; do
        line=$(one_run "$stack") || { echo "round $r $stack: failed" >&2; continue; }
        echo "$line" >>"$RESULTS"
        echo "$line" | jq -r --arg r "$r" --arg load "$(cut -d' ' -f1 /proc/loadavg)" '"  round \($r) \(.stack|.+"          "|.[0:10]): broken \(.broken), back \(.reestablished), first back \(.first_back_ms) ms, all back \(.all_back_ms) ms, storm \(.storm_ms) ms, failed attempts \(.failed_attempts) \(.fail_reasons), rss idle \(.rss_idle_kib) KiB, with clients \(.rss_loaded_kib) KiB (load \($load))"'
    done
done
echo
printf '%-10s %11s %11s %9s %9s %12s\n' stack "first ms" "all ms" "storm ms" failed "B/conn"
for stack in $STACKS; do
    sel() { jq -r --arg s $stack "select(.stack==\$s) | $1" "$RESULTS"; }
    [ -n "$(sel .broken)" ] || continue
    printf '%-10s %11s %11s %9s %9s %12s\n' $stack "$(sel .first_back_ms | median)" "$(sel .all_back_ms | median)" \
        "$(sel .storm_ms | median)" "$(sel .failed_attempts | median)" \
        "$(sel "(.rss_loaded_kib - .rss_idle_kib) * 1024 / .clients | floor" | median)"
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"

# The proxy's goals against OpenShift's haproxy, printed (not an exit status: the
# figures swing with the machine's load, and the first-back time includes each stack's
# VRRP failover).
med() { jq -r --arg s "$1" "select(.stack==\$s) | $2" "$RESULTS" | median; }
goal() { # description keelson-value openshift-value awk-condition-on-k-and-o
    local verdict=FAIL
    [ "$2" = - ] || [ "$3" = - ] || [ "$2" = null ] || [ "$3" = null ] && verdict="not measured"
    [ "$verdict" = FAIL ] && awk -v k="$2" -v o="$3" "BEGIN {exit !($4)}" && verdict=PASS
    echo "goal $1: keelson $2, openshift $3: $verdict"
}
if [[ " $STACKS " == *" keelson "* && " $STACKS " == *" openshift "* ]]; then
    goal "all back <= 0.8 x haproxy's time (ms)" "$(med keelson .all_back_ms)" "$(med openshift .all_back_ms)" "k <= 0.8 * o"
    goal "failed attempts <= haproxy's" "$(med keelson .failed_attempts)" "$(med openshift .failed_attempts)" "k <= o"
    goal "memory per open connection <= haproxy's (B)" \
        "$(med keelson "(.rss_loaded_kib - .rss_idle_kib) * 1024 / .clients | floor")" \
        "$(med openshift "(.rss_loaded_kib - .rss_idle_kib) * 1024 / .clients | floor")" "k <= o"
fi

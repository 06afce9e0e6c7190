#!/usr/bin/env bash
# The API outage a client sees when the API VIP's holder dies: OpenShift's on-prem stack
# (keepalived + haproxy, at its newest and at its older haproxy settings) against keelson
# (vrrp + members + proxy, defaults), side by side in one run, rounds alternating.
#
# Topology: three masters in namespaces on one bridge (10.85.0.10-12), each with a stand-in
# kube-apiserver (`kube-standin`, TLS, `/readyz`) on *:6443, and a client namespace
# (10.85.0.100). The API VIP is 10.85.0.5; VIP:6443 reaches the holder's load balancer
# through an nftables redirect to :9445 (OpenShift's haproxy-monitor does this with
# iptables; keelson's proxy writes its own rule while it holds the VIP).
#
#  openshift-new  keepalived (VRRPv2, auth PASS, priority 40, advert 1 s, a check of
#                 haproxy's /haproxy_ready monitor on :9444 every 1 s, weight 20, rise 3
#                 fall 2) + haproxy (TCP, `option httpchk GET /readyz`, `check check-ssl
#                 verify none`, $NEW_SETTINGS)
#  openshift-old  the same with $OLD_SETTINGS
#  keelson        `keelson-agent run --only members,vrrp,proxy` with the defaults
#                 `keelson build` writes (VRRPv3, advert 1 s, TLS /readyz checks every 5 s,
#                 fall 3, rise 1, fast interval 1 s, slowstart 10 s, shutdown-sessions)
#
# Two clients through VIP:6443, as `bench/api_client.py` describes: a new TLS connection
# every 50 ms with a 1 s timeout (like `oc`), and one keep-alive connection asking every
# 200 ms (like a watch) that reconnects on a failure.
#
# Cases: `kill` — the holder's link is cut on the bridge side and every process in its
# namespace stopped and killed (no goodbye); `stop` — a clean stop: the holder's load
# balancer stack gets SIGTERM (keelson: the agent; OpenShift: keepalived and haproxy), then
# its apiserver is stopped and its link cut, as in a reboot; `roll` — a rolling restart
# of the load balancer stack on every master, one at a time, the backups first and the
# VIP's holder last (docs/operations.md, "Upgrading the agent"): SIGTERM, wait until it is
# gone, start it again (keelson: `$KEELSON_AGENT_NEW`, an upgrade, when set), wait until
# the VIP answers steadily, next. Requests are counted from the first stop to $AFTER s
# after the last start.
#
# Printed per run: requests sent after the event, how many failed, when the VIP answered
# again (the first request after the event that succeeded), the last failure, failures of
# requests sent after the VIP answered again, and when the long-lived client was served
# by a live master again. Then the medians and keelson's ratios.
#
# Usage (root): bench/api_outage.sh [rounds=3] [cases="kill stop"]
#   KEELSON_AGENT, KUBE_STANDIN: binaries (default: the static release ones of `make agent`)
#   KEELSON_AGENT_NEW: the binary `roll` restarts keelson with (default: KEELSON_AGENT)
#   BENCH_PREFIX: the namespaces' prefix (default kao; two runs at once need two)
#   STACKS (default "keelson openshift-new openshift-old"), AFTER (seconds watched, 35),
#   NEW_SETTINGS / OLD_SETTINGS (haproxy server lines), KEEP=DIR (keep each run's samples)
set -euo pipefail

ROUNDS=${1:-3}
CASES=${2:-"kill stop"}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
AGENT=${KEELSON_AGENT:-$ROOT/target/x86_64-unknown-linux-gnu/release/keelson-agent}
AGENT_NEW=${KEELSON_AGENT_NEW:-$AGENT}
STANDIN=${KUBE_STANDIN:-$ROOT/target/x86_64-unknown-linux-gnu/release/kube-standin}
CLIENT="python3 $ROOT/bench/api_client.py"
NEW_SETTINGS=${NEW_SETTINGS:-"inter 5s fastinter 2s fall 2 rise 3 on-marked-down shutdown-sessions slowstart 10s"}
OLD_SETTINGS=${OLD_SETTINGS:-"inter 5s fall 3 rise 1"}
AFTER=${AFTER:-35}   # seconds watched after the event
STACKS=${STACKS:-"keelson openshift-new openshift-old"}
P=${BENCH_PREFIX:-kao}   # namespace prefix: two runs at once need different ones
BR=$P-br
C=$P-c
VIP=10.85.0.5
MASTERS=(0 1 2)
WORK=$(mktemp -d)

[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
for b in "$AGENT" "$STANDIN"; do [ -x "$b" ] || { echo "build first: make agent ($b)" >&2; exit 1; }; done
for c in keepalived haproxy nft curl python3; do command -v $c >/dev/null || { echo "$c not installed (scripts/setup.sh)" >&2; exit 1; }; done

# OpenShift sets maxconn 20000; haproxy needs ~2 descriptors per connection and will not
# start when it cannot raise RLIMIT_NOFILE that far (containers often cap it at 20000):
# then a lower maxconn (a handful of connections are open here either way).
HARD_NOFILE=$(ulimit -Hn)
if [[ $HARD_NOFILE == unlimited ]] || ((HARD_NOFILE >= 40100)); then MAXCONN=20000; else MAXCONN=$(((HARD_NOFILE - 100) / 2)); fi

ns() { echo "$P-m$1"; }
ip_of() { echo "10.85.0.$((10 + $1))"; }

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
        if [ "$m" = c ]; then n=$C; addr=10.85.0.100; else n=$(ns "$m"); addr=$(ip_of "$m"); fi
        ip netns add "$n"
        ip -n $BR link add "${P}v$m" type veth peer name eth0 netns "$n"
        ip -n $BR link set "${P}v$m" master br0 up
        ip -n "$n" addr add "$addr/24" dev eth0
        ip -n "$n" link set eth0 up
        ip -n "$n" link set lo up
    done
    for m in "${MASTERS[@]}"; do
        ip netns exec "$(ns "$m")" "$STANDIN" --listen 0.0.0.0:6443 --name "m$m" \
            >/dev/null 2>"$WORK/run/standin-$m.log" &
    done
}

start_openshift() { # settings
    for m in "${MASTERS[@]}"; do
        local n d servers=""
        n=$(ns "$m")
        d="$WORK/run/$n"
        mkdir -p "$d"
        for s in "${MASTERS[@]}"; do
            servers+="   server m$s $(ip_of "$s"):6443 weight 1 verify none check check-ssl $1"$'\n'
        done
        cat >"$d/haproxy.cfg" <<EOF
global
  maxconn $MAXCONN
defaults
  maxconn $MAXCONN
  mode    tcp
  option  dontlognull
  retries 3
  timeout http-request 30s
  timeout queue        1m
  timeout connect      10s
  timeout client       86400s
  timeout server       86400s
  timeout tunnel       86400s
frontend  main
  bind :::9445 v4v6
  default_backend masters
listen health_check_http_url
  bind :::9444 v4v6
  mode http
  monitor-uri /haproxy_ready
  option dontlognull
backend masters
   option  httpchk GET /readyz HTTP/1.0
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
    virtual_router_id 85
    priority 40
    advert_int 1
    authentication {
        auth_type PASS
        auth_pass kao_pass
    }
    virtual_ipaddress {
        $VIP/32
    }
    track_script {
        chk_ocp_lb
    }
}
EOF
        # haproxy-monitor's redirect, present on every master: only the VIP's holder gets
        # packets for the VIP.
        ip netns exec "$n" nft -f - <<EOF
table ip kao_nat {
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
{"version":1,"name":"kao","baseDomain":"example.com","machineNetworks":["10.85.0.0/24"],
 "apiVips":["$VIP"],"ingressVips":[],
 "vrrp":{"instances":[{"name":"api","vip":"$VIP","vrid":85,"version":"3","advertIntervalMs":1000,
   "transport":"multicast","preempt":true,"garpRefreshSecs":60,
   "priorities":{"bootstrap":70,"master":40},
   "checks":[{"name":"api-proxy","check":{"type":"proxyHealthyBackend"},"intervalMs":1000,"rise":1,"fall":3,"weight":50},
             {"name":"ignition-server","check":{"type":"ignitionServer"},"intervalMs":1000,"rise":1,"fall":3,"weight":10}]}]},
 "api":{"frontendPort":9445,"vipPort":6443,"backendPort":6443,"monitorPort":50936,"check":"tls-readyz",
   "checkIntervalMs":5000,"fall":3,"rise":1,"fastCheckIntervalMs":1000,"slowstartMs":10000,"shutdownSessions":true,
   "connectTimeoutMs":10000,"idleTimeoutSecs":86400,"maxConnections":20000},
 "dns":{"port":53,"ttl":60,"manageResolvConf":false},
 "ignition":{"tlsPort":22623,"plainPort":22624,"allowedNetworks":[],"spec":"3.2.0"},
 "members":{"transport":"mdns","renewIntervalSecs":10,"expirySecs":35},
 "metrics":{"port":22625}}
EOF
    for m in "${MASTERS[@]}"; do start_keelson_node "$m" "$AGENT"; done
}

start_keelson_node() { # master binary
    local n d
    n=$(ns "$1")
    d="$WORK/run/$n"
    mkdir -p "$d"
    echo "{\"name\":\"master-$1\",\"role\":\"master\",\"interface\":\"eth0\",\"addresses\":[\"$(ip_of "$1")/24\"]}" >"$d/node.json"
    ip netns exec "$n" "$2" run --cluster "$WORK/run/cluster.json" --node "$d/node.json" \
        --only members,vrrp,proxy --status-socket "$d/agent.sock" >/dev/null 2>>"$d/agent.log" &
    echo $! >"$d/lb.pids"
}

# SIGTERM to master $2's load balancer stack, waits until it is gone, starts it again.
restart_lb() { # stack master
    local n d
    n=$(ns "$2")
    d="$WORK/run/$n"
    kill -TERM $(cat "$d/lb.pids") 2>/dev/null || true
    for pid in $(cat "$d/lb.pids"); do
        while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    done
    case $1 in
        keelson) start_keelson_node "$2" "$AGENT_NEW" ;;
        *)
            ip netns exec "$n" haproxy -db -f "$d/haproxy.cfg" >/dev/null 2>>"$d/haproxy.log" &
            echo $! >"$d/lb.pids"
            ip netns exec "$n" keepalived -n -l -P -f "$d/keepalived.conf" -p "$d/ka.pid" \
                -r "$d/vrrp.pid" -c "$d/chk.pid" >/dev/null 2>>"$d/keepalived.log" &
            echo $! >>"$d/lb.pids"
            ;;
    esac
}

holder() {
    for m in "${MASTERS[@]}"; do
        # Not `| grep -q`: with pipefail, ip dying of SIGPIPE would read as "not held".
        if [[ $(ip -n "$(ns "$m")" -o addr show dev eth0) == *" $VIP/"* ]]; then echo "$m"; return; fi
    done
    echo none
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Waits for one holder and 5 s of answers in a row through the VIP (at most 60 s).
settle() {
    local t0 ok=0
    t0=$(now_ms)
    while [ $(($(now_ms) - t0)) -lt 60000 ]; do
        if [ "$(holder)" != none ] && ip netns exec $C curl -skf --max-time 1 -o /dev/null "https://$VIP:6443/readyz"; then
            ok=$((ok + 1))
            [ $ok -ge 10 ] && return 0
        else
            ok=0
        fi
        sleep 0.5
    done
    echo "no steady state within 60 s" >&2
    return 1
}

one_run() { # stack case -> one JSON line
    local stack=$1 case=$2 h t0 report
    setup
    case $stack in
        keelson) start_keelson ;;
        openshift-new) start_openshift "$NEW_SETTINGS" ;;
        openshift-old) start_openshift "$OLD_SETTINGS" ;;
    esac
    settle || { tail -n 20 "$WORK"/run/*/*.log >&2; return 1; }
    # Let every backend be up everywhere (rise 3 x 5 s at the newest settings).
    sleep 16
    setsid ip netns exec $C $CLIENT new $VIP 6443 "$WORK/run/new.txt" &
    local cnew=$!
    setsid ip netns exec $C $CLIENT long $VIP 6443 "$WORK/run/long.txt" &
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
            restart_lb "$stack" "$m"
            settle >/dev/null || { tail -n 20 "$WORK"/run/*/*.log >&2; return 1; }
            # Every backend up everywhere again before the next one goes (rise 3 x 5 s
            # at OpenShift's newest settings; keelson's slowstart 10 s).
            sleep 16
        done
        echo "  roll: $stack restarted $(printf 'm%s ' "${order[@]}")(holder m$h last) in $((($(now_ms) - t0) / 1000)) s" >&2
    elif [ "$case" = kill ]; then
        ip -n $BR link set "${P}v$h" down
        # The clock starts once the link is cut (forking ip takes tens of ms under load).
        t0=$(now_ms)
        kill_ns "$n"
    else
        t0=$(now_ms)
        # A clean stop of the load balancer stack, then the rest of the node goes away.
        kill -TERM $(cat "$d/lb.pids") 2>/dev/null || true
        for pid in $(cat "$d/lb.pids"); do
            while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
        done
        kill_ns "$n"
        ip -n $BR link set "${P}v$h" down
    fi
    sleep "$AFTER"
    kill -TERM $cnew $clong
    wait $cnew $clong 2>/dev/null || true
    report=$($CLIENT report "$t0" "$WORK/run/new.txt" "$WORK/run/long.txt" "m$h")
    if [ -n "${KEEP:-}" ]; then # keep the raw samples and logs of every run
        mkdir -p "$KEEP/$stack-$case-$t0" && cp -r "$WORK"/run/. "$KEEP/$stack-$case-$t0/"
        echo "$t0" >"$KEEP/$stack-$case-$t0/kill_ms"
    fi
    echo "{\"stack\":\"$stack\",\"case\":\"$case\",\"holder\":\"m$h\",${report#\{}"
}

median() { sort -n | awk '{a[NR]=$1} END{ if (NR==0) print "-"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2 }'; }

echo "API outage through VIP:6443 when the holder goes ($CASES); rounds=$ROUNDS; $(date -u +%FT%TZ)"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); $(keepalived -v 2>&1 | head -1); $(haproxy -v | head -1)"
echo "openshift-new: $NEW_SETTINGS"
echo "openshift-old: $OLD_SETTINGS"
echo "keelson: $AGENT"
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
for case in $CASES; do
    for r in $(seq 1 "$ROUNDS"); do
        for stack in $STACKS; do
            # The old settings take the longest and add nothing to the clean-stop case.
            [ "$case" != kill ] && [ "$stack" = openshift-old ] && continue
            line=$(one_run $stack "$case")
            echo "$line" >>"$RESULTS"
            echo "$line" | jq -r --arg r "$r" '"  \(.case) round \($r) \(.stack|.+"             "|.[0:13]): \(.failed)/\(.requests) failed, VIP back \(.vip_back_ms) ms, last failure \(.last_failure_ms) ms, failed after VIP back \(.failed_after_vip_back), long-lived served again \(.long_reconnect_ms) ms (\(.long_failed) failed)"'
        done
    done
done
echo
printf '%-5s %-14s %9s %12s %14s %13s %16s\n' case stack failed "VIP back ms" "last fail ms" "fail>VIP" "long-lived ms"
for case in $CASES; do
    for stack in keelson openshift-new openshift-old; do
        sel() { jq -r --arg s $stack --arg c "$case" "select(.stack==\$s and .case==\$c) | $1" "$RESULTS"; }
        [ -n "$(sel .failed)" ] || continue
        printf '%-5s %-14s %9s %12s %14s %13s %16s\n' "$case" $stack "$(sel .failed | median)" \
            "$(sel .vip_back_ms | median)" "$(sel .last_failure_ms | median)" \
            "$(sel .failed_after_vip_back | median)" "$(sel .long_reconnect_ms | median)"
    done
done
kl=$(jq -r 'select(.stack=="keelson" and .case=="kill") | .last_failure_ms' "$RESULTS" | median)
on=$(jq -r 'select(.stack=="openshift-new" and .case=="kill") | .last_failure_ms' "$RESULTS" | median)
oo=$(jq -r 'select(.stack=="openshift-old" and .case=="kill") | .last_failure_ms' "$RESULTS" | median)
if [ "$kl" != - ] && [ "$on" != - ]; then
    echo "kill: keelson's last failure / openshift-new's = $(awk "BEGIN{printf \"%.2f\", $kl/$on}") (bar <= 0.30); / openshift-old's = $(awk "BEGIN{printf \"%.2f\", $kl/$oo}")"
fi

#!/usr/bin/env bash
# Queries/s with dnsperf against the cluster zone: keelson-agent dns vs NSD, side by side,
# both on one server thread (keelson: --single-thread, a current-thread runtime; NSD:
# server-count 1), NSD with response-rate limiting off. Loopback only.
#
# Usage: bench/dns_vs_nsd.sh [seconds] [clients]
# Env: KEELSON_AGENT_BIN (default target/release/keelson-agent).
set -euo pipefail

SECS=${1:-10}
CLIENTS=${2:-4}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${KEELSON_AGENT_BIN:-$ROOT/target/release/keelson-agent}
[[ -x $BIN ]] || BIN=$ROOT/target/release/keelson-agent
for tool in dnsperf nsd; do
    command -v $tool >/dev/null || { echo "missing $tool (scripts/setup.sh installs it)"; exit 1; }
done
[[ -x $BIN ]] || { echo "missing $BIN: cargo build --release -p keelson-agent"; exit 1; }

WORK=$(mktemp -d /tmp/kd-bench.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

ZONE=ocp4.example.com
KPORT=15353
NPORT=15354

# The cluster: 3 masters, 3 workers.
cat > "$WORK/cluster.json" <<EOF
{
  "version": 1, "name": "ocp4", "baseDomain": "example.com",
  "machineNetworks": ["10.0.0.0/24"], "apiVips": ["10.0.0.5"], "ingressVips": ["10.0.0.7"],
  "vrrp": { "instances": [] },
  "api": { "frontendPort": 9445, "vipPort": 6443, "backendPort": 6443, "monitorPort": 50936,
    "check": "tcp", "checkIntervalMs": 1000, "fall": 3, "rise": 2, "connectTimeoutMs": 1000,
    "idleTimeoutSecs": 60, "maxConnections": 1000 },
  "dns": { "port": 53, "ttl": 60, "manageResolvConf": false },
  "ignition": { "tlsPort": 22623, "plainPort": 22624, "allowedNetworks": ["10.0.0.0/24"], "spec": "3.2.0" },
  "members": { "transport": "mdns", "renewIntervalSecs": 10, "expirySecs": 30 }
}
EOF
NODES=(master-0 master-1 master-2 worker-0 worker-1 worker-2)
{
    echo "["
    i=10
    for n in "${NODES[@]}"; do
        role=${n%-*}
        sep=$([[ $n == worker-2 ]] && echo "" || echo ",")
        echo "{\"name\":\"$n\",\"role\":\"$role\",\"addresses\":[\"10.0.0.$i\"],\"version\":\"bench\"}$sep"
        i=$((i + 1))
    done
    echo "]"
} > "$WORK/members.json"

# The same zone for NSD.
{
    echo "\$ORIGIN $ZONE."
    echo "\$TTL 60"
    echo "@ IN SOA ns.$ZONE. hostmaster.$ZONE. 1 3600 600 86400 60"
    echo "@ IN NS ns"
    echo "ns IN A 10.0.0.5"
    echo "api IN A 10.0.0.5"
    echo "api-int IN A 10.0.0.5"
    echo "*.apps IN A 10.0.0.7"
    i=10
    for n in "${NODES[@]}"; do echo "$n IN A 10.0.0.$i"; i=$((i + 1)); done
} > "$WORK/zone"
cat > "$WORK/nsd.conf" <<EOF
server:
    server-count: 1
    ip-address: 127.0.0.1
    port: $NPORT
    username: ""
    chroot: ""
    zonesdir: "$WORK"
    database: ""
    pidfile: "$WORK/nsd.pid"
    xfrdfile: "$WORK/xfrd.state"
    zonelistfile: "$WORK/zone.list"
    logfile: "$WORK/nsd.log"
    verbosity: 0
    hide-version: yes
    rrl-ratelimit: 0
    rrl-whitelist-ratelimit: 0
remote-control:
    control-enable: no
zone:
    name: $ZONE
    zonefile: "$WORK/zone"
EOF

# The query mix: api, api-int, apps names at several depths, node FQDNs, one AAAA (NODATA)
# and one NXDOMAIN, as a cluster asks them.
{
    echo "api.$ZONE A"
    echo "api-int.$ZONE A"
    echo "console-openshift-console.apps.$ZONE A"
    echo "oauth-openshift.apps.$ZONE A"
    echo "a.b.apps.$ZONE A"
    for n in "${NODES[@]}"; do echo "$n.$ZONE A"; done
    echo "api.$ZONE AAAA"
    echo "nothere.$ZONE A"
} > "$WORK/queries"

"$BIN" dns --single-thread --cluster "$WORK/cluster.json" --members "$WORK/members.json" \
    --listen 127.0.0.1:$KPORT > "$WORK/keelson.out" 2> "$WORK/keelson.err" &
PIDS+=($!)
nsd -d -c "$WORK/nsd.conf" 2> "$WORK/nsd.err" &
PIDS+=($!)

for port in $KPORT $NPORT; do
    for _ in $(seq 50); do
        dig @127.0.0.1 -p $port +time=1 +tries=1 +short api.$ZONE A 2>/dev/null | grep -q 10.0.0.5 && break
        sleep 0.1
    done
    dig @127.0.0.1 -p $port +time=1 +tries=1 +short api.$ZONE A | grep -q 10.0.0.5 \
        || { echo "server on port $port does not answer"; cat "$WORK"/*.err; exit 1; }
done

qps() {
    dnsperf -s 127.0.0.1 -p "$1" -d "$WORK/queries" -l "$SECS" -c "$CLIENTS" -q 500 2>&1 \
        | tee "$WORK/perf.$1" | awk '/Queries per second/ {print $4}'
}
lost() { awk '/Queries lost/ {print $3}' "$WORK/perf.$1"; }

# Alternate the order so neither server always runs on a warmer machine.
K1=$(qps $KPORT); N1=$(qps $NPORT)
N2=$(qps $NPORT); K2=$(qps $KPORT)
K=$(echo "($K1 + $K2) / 2" | bc -l)
N=$(echo "($N1 + $N2) / 2" | bc -l)
RATIO=$(echo "$K / $N" | bc -l)

printf '\n%-22s %14s %14s %14s\n' "server (1 thread)" "run 1 q/s" "run 2 q/s" "mean q/s"
printf '%-22s %14.0f %14.0f %14.0f\n' "keelson-agent dns" "$K1" "$K2" "$K"
printf '%-22s %14.0f %14.0f %14.0f\n' "nsd $(nsd -v 2>&1 | head -1 | awk '{print $3}')" "$N1" "$N2" "$N"
printf '%-22s %14.2f   (bar: >= 0.50)\n' "ratio keelson/nsd" "$RATIO"
echo "dnsperf -l $SECS -c $CLIENTS -q 500, $(wc -l < "$WORK/queries") query names, lost: keelson $(lost $KPORT), nsd $(lost $NPORT)"
if (( $(echo "$RATIO < 0.5" | bc -l) )); then
    echo "FAIL: keelson below 0.5 x NSD"
    exit 1
fi

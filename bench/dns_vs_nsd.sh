#!/usr/bin/env bash
# Queries/s with dnsperf against the cluster zone: keelson-agent dns vs NSD, side by side,
# both on ONE server thread (keelson: --single-thread, a current-thread runtime; NSD:
# server-count 1), NSD with response-rate limiting off, the same records on both sides
# (api, api-int, *.apps, six nodes, the etcd names and their SRV sets). Loopback only.
#
# The two servers run alternately (keelson, NSD, NSD, keelson, keelson, NSD, ...) so that
# neither always gets the quieter moments of a shared machine. The run count should be even:
# on the development machine the first server of a round was often the faster one (seen both
# ways round), so with an odd count the server that opens one more round gains from it; the
# script warns when the count is odd. For each server it prints
# the median queries/s of its runs with the lowest and highest, and the median server CPU
# time per answered query (from /proc: user + system time of the server's processes during
# the run, divided by the queries dnsperf saw answered). The ratio is of the medians.
#
# dnsperf runs with two threads (-T 2): one dnsperf thread spends more CPU per query than
# either server (about 9 us against 5-7 us, measured on the development machine), so with
# one thread the client would be the bottleneck and both servers would show its rate.
#
# Usage: bench/dns_vs_nsd.sh [seconds per run] [dnsperf clients] [runs per server]
#        (defaults 10 4 6)
# Env:   KEELSON_AGENT_BIN  the agent to measure (default: the static release agent
#                           `make agent` builds, else target/release/keelson-agent)
#        PROFILE=1          after the runs, one more run per server under perf: system
#                           calls per answered query (raw_syscalls:sys_enter) for both, and
#                           keelson's hottest functions (perf record; needs a binary with
#                           symbols, e.g. CARGO_PROFILE_RELEASE_STRIP=false make agent)
#        BAR                the ratio below which the script fails (default 1.0)
#        CLIENT_THREADS     dnsperf threads (-T, default 2)
set -euo pipefail

SECS=${1:-10}
CLIENTS=${2:-4}
RUNS=${3:-6}
(( RUNS % 2 == 0 )) || echo "note: $RUNS runs is odd: keelson opens one round more than NSD" >&2
BAR=${BAR:-1.0}
CLIENT_THREADS=${CLIENT_THREADS:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${KEELSON_AGENT_BIN:-$ROOT/target/x86_64-unknown-linux-gnu/release/keelson-agent}
[[ -x $BIN ]] || BIN=$ROOT/target/release/keelson-agent
for tool in dnsperf nsd dig bc; do
    command -v $tool >/dev/null || { echo "missing $tool (scripts/setup.sh installs it)"; exit 1; }
done
[[ -x $BIN ]] || { echo "missing $BIN: make agent"; exit 1; }
if [[ ${PROFILE:-0} == 1 ]]; then
    command -v perf >/dev/null || { echo "PROFILE=1 needs perf (scripts/setup.sh installs it)"; exit 1; }
fi

WORK=$(mktemp -d /tmp/kd-bench.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

ZONE=ocp4.example.com
# Ports picked by the kernel (UDP and TCP free), so that concurrent runs never collide.
free_port() {
    python3 -c 'import socket
while True:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
    port = u.getsockname()[1]
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", port)); print(port); break
    except OSError:
        pass'
}
KPORT=$(free_port)
NPORT=$(free_port)
while [[ $NPORT == "$KPORT" ]]; do NPORT=$(free_port); done

# The cluster: 3 masters, 3 workers; the etcd names on (as for a spec 2.2 payload).
cat > "$WORK/cluster.json" <<EOF
{
  "version": 1, "name": "ocp4", "baseDomain": "example.com",
  "machineNetworks": ["10.0.0.0/24"], "apiVips": ["10.0.0.5"], "ingressVips": ["10.0.0.7"],
  "vrrp": { "instances": [] },
  "api": { "frontendPort": 9445, "vipPort": 6443, "backendPort": 6443, "monitorPort": 50936,
    "check": "tcp", "checkIntervalMs": 1000, "fall": 3, "rise": 2, "connectTimeoutMs": 1000,
    "idleTimeoutSecs": 60, "maxConnections": 1000 },
  "dns": { "port": 53, "ttl": 60, "manageResolvConf": false,
    "etcd": { "enabled": true, "masters": 3 } },
  "ignition": { "tlsPort": 22623, "plainPort": 22624, "allowedNetworks": ["10.0.0.0/24"], "spec": "2.2.0" },
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
    for m in 0 1 2; do
        echo "etcd-$m IN A 10.0.0.$((10 + m))"
        echo "_etcd-server-ssl._tcp IN SRV 0 10 2380 etcd-$m.$ZONE."
        echo "_etcd-client-ssl._tcp IN SRV 0 10 2379 etcd-$m.$ZONE."
    done
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

# The query mix: what a 4.2-era cluster asks: api, api-int, routes under apps at several
# depths, node names, the etcd SRV sets and names, one AAAA (NODATA), one NXDOMAIN.
{
    echo "api.$ZONE A"
    echo "api-int.$ZONE A"
    echo "console-openshift-console.apps.$ZONE A"
    echo "oauth-openshift.apps.$ZONE A"
    echo "a.b.apps.$ZONE A"
    for n in "${NODES[@]}"; do echo "$n.$ZONE A"; done
    echo "_etcd-server-ssl._tcp.$ZONE SRV"
    echo "_etcd-client-ssl._tcp.$ZONE SRV"
    echo "etcd-0.$ZONE A"
    echo "etcd-2.$ZONE A"
    echo "api.$ZONE AAAA"
    echo "nothere.$ZONE A"
} > "$WORK/queries"

"$BIN" dns --single-thread --cluster "$WORK/cluster.json" --members "$WORK/members.json" \
    --listen 127.0.0.1:$KPORT > "$WORK/keelson.out" 2> "$WORK/keelson.err" &
KPID=$!
PIDS+=("$KPID")
nsd -d -c "$WORK/nsd.conf" 2> "$WORK/nsd.err" &
NPID=$!
PIDS+=("$NPID")

for port in $KPORT $NPORT; do
    for _ in $(seq 50); do
        dig @127.0.0.1 -p $port +time=1 +tries=1 +short api.$ZONE A 2>/dev/null | grep -q 10.0.0.5 && break
        sleep 0.1
    done
    dig @127.0.0.1 -p $port +time=1 +tries=1 +short api.$ZONE A | grep -q 10.0.0.5 \
        || { echo "server on port $port does not answer"; cat "$WORK"/*.err; exit 1; }
    # Both serve the whole SRV set before anything is measured.
    srv=$(dig @127.0.0.1 -p $port +time=1 +tries=1 +short _etcd-server-ssl._tcp.$ZONE SRV | wc -l)
    [[ $srv == 3 ]] || { echo "server on port $port: $srv SRV records, expected 3"; exit 1; }
done

# The processes that answer: keelson's one process; NSD's whole tree (`nsd -d` stays as
# xfrd, its child is the main process, whose child serves).
tree() { local p; echo "$1"; for p in $(pgrep -P "$1"); do tree "$p"; done; }
server_pids() {
    if [[ $1 == "$KPORT" ]]; then echo "$KPID"; else tree "$NPID" | tr '\n' ' '; fi
}
# User + system clock ticks of the server's processes.
cpu_ticks() {
    local t=0 p
    for p in $(server_pids "$1"); do
        # utime and stime, counted after the command name (which may hold spaces).
        [[ -r /proc/$p/stat ]] && t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
    done
    echo "$t"
}
HZ=$(getconf CLK_TCK)

# One run against port $1: prints "qps completed lost cpu_us_per_query".
run() {
    local before after out
    before=$(cpu_ticks "$1")
    out=$(dnsperf -s 127.0.0.1 -p "$1" -d "$WORK/queries" -l "$SECS" -c "$CLIENTS" \
        -T "$CLIENT_THREADS" -q 500 2>&1)
    after=$(cpu_ticks "$1")
    local qps completed lost
    qps=$(awk '/Queries per second/ {print $4}' <<< "$out")
    completed=$(awk '/Queries completed/ {print $3}' <<< "$out")
    lost=$(awk '/Queries lost/ {print $3}' <<< "$out")
    echo "$qps $completed $lost $(echo "($after - $before) * 1000000 / $HZ / $completed" | bc -l)"
}

# shellcheck source=bench/lib/stats.sh
. "$ROOT/bench/lib/stats.sh"

: > "$WORK/k.runs"
: > "$WORK/n.runs"
for r in $(seq "$RUNS"); do
    if (( r % 2 )); then order="$KPORT $NPORT"; else order="$NPORT $KPORT"; fi
    for port in $order; do
        line=$(run "$port")
        if [[ $port == "$KPORT" ]]; then echo "$line" >> "$WORK/k.runs"; who=keelson; else echo "$line" >> "$WORK/n.runs"; who=nsd; fi
        printf 'run %d %-8s %10.0f q/s  %s lost  %.2f us CPU/query\n' "$r" "$who" \
            "$(cut -d' ' -f1 <<< "$line")" "$(cut -d' ' -f3 <<< "$line")" "$(cut -d' ' -f4 <<< "$line")"
    done
done

stats() { # file column -> "median min max"
    local col=$2
    echo "$(cut -d' ' -f"$col" "$1" | median) $(cut -d' ' -f"$col" "$1" | sort -g | head -1) $(cut -d' ' -f"$col" "$1" | sort -g | tail -1)"
}
read -r KQ KMIN KMAX <<< "$(stats "$WORK/k.runs" 1)"
read -r NQ NMIN NMAX <<< "$(stats "$WORK/n.runs" 1)"
KCPU=$(cut -d' ' -f4 "$WORK/k.runs" | median)
NCPU=$(cut -d' ' -f4 "$WORK/n.runs" | median)
KLOST=$(awk '{s += $3} END {print s}' "$WORK/k.runs")
NLOST=$(awk '{s += $3} END {print s}' "$WORK/n.runs")
RATIO=$(echo "$KQ / $NQ" | bc -l)
# Round by round (each round runs both back to back, so slow drifts in the machine's load
# cancel): keelson / NSD.
paste -d' ' <(cut -d' ' -f1 "$WORK/k.runs") <(cut -d' ' -f1 "$WORK/n.runs") \
    | awk '{printf "%.3f\n", $1 / $2}' > "$WORK/pairs"
PAIRS=$(sort -g "$WORK/pairs" | tr '\n' ' ')
PMED=$(median < "$WORK/pairs")
NSDV=$( (nsd -v 2>&1 || true) | head -1 | awk '{print $3}')

echo
echo "dnsperf -l $SECS -c $CLIENTS -T $CLIENT_THREADS -q 500 -d <$(wc -l < "$WORK/queries") names: A, AAAA, SRV>, $RUNS runs per server, alternating; one server thread each"
printf '%-22s %12s %12s %12s %16s %8s\n' "server" "median q/s" "lowest" "highest" "CPU us/query" "lost"
printf '%-22s %12.0f %12.0f %12.0f %16.2f %8s\n' "keelson-agent dns" "$KQ" "$KMIN" "$KMAX" "$KCPU" "$KLOST"
printf '%-22s %12.0f %12.0f %12.0f %16.2f %8s\n' "nsd $NSDV" "$NQ" "$NMIN" "$NMAX" "$NCPU" "$NLOST"
printf '%-22s %12.2f   (bar: >= %s; CPU per query nsd/keelson: %.2f)\n' "ratio keelson/nsd" "$RATIO" "$BAR" "$(echo "$NCPU / $KCPU" | bc -l)"
printf '%-22s %12.2f   (each round: %s)\n' "round by round, median" "$PMED" "$PAIRS"

if [[ ${PROFILE:-0} == 1 ]]; then
    echo
    echo "== system calls per answered query (perf stat -e raw_syscalls:sys_enter, one $SECS s run each)"
    for port in $KPORT $NPORT; do
        pids=$(server_pids "$port" | tr ' ' ',' | sed 's/,*$//')
        perf stat -x, -e raw_syscalls:sys_enter -p "$pids" -o "$WORK/stat.$port" -- sleep "$((SECS + 1))" &
        spid=$!
        sleep 0.5
        completed=$(run "$port" | cut -d' ' -f2)
        wait "$spid" || true
        calls=$(awk -F, '/raw_syscalls/ {print $1}' "$WORK/stat.$port")
        who=$([[ $port == "$KPORT" ]] && echo keelson || echo nsd)
        printf '%-8s %12s calls / %10s queries = %.3f per query\n' "$who" "$calls" "$completed" "$(echo "$calls / $completed" | bc -l)"
    done
    echo
    echo "== keelson: where its CPU goes (perf record -g, one $SECS s run; self time, >= 1.5%)"
    perf record -q -g -p "$KPID" -o "$WORK/perf.data" -- sleep "$((SECS + 1))" 2>/dev/null &
    rpid=$!
    sleep 0.5
    run "$KPORT" > /dev/null
    wait "$rpid" || true
    perf report -i "$WORK/perf.data" --no-children --stdio -g none --sort dso 2>/dev/null \
        | grep -v '^#' | grep -v '^$' | head -5 | awk '{printf "%s %s   ", $1, $2} END {print ""}'
    perf report -i "$WORK/perf.data" --no-children --percent-limit 1.5 --stdio -g none \
        --sort dso,symbol 2>/dev/null | grep -v '^#' | grep -v '^$' \
        | awk '{$NF=""; $(NF-1)=""; print}' | head -40
    file -L "$BIN" | grep -q 'not stripped' \
        || echo "(the binary is stripped: rebuild with CARGO_PROFILE_RELEASE_STRIP=false for names)"
fi

if (( $(echo "$RATIO < $BAR" | bc -l) )); then
    echo "FAIL: keelson below $BAR x NSD"
    exit 1
fi

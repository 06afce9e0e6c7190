#!/usr/bin/env bash
# keelson at the size of real clusters (docs/scale.md): three real master agents and one
# real worker agent in network namespaces, run on the cluster.json `keelson build` writes,
# and MEMBERS simulated members (agent/examples/member_load.rs: the agent's own member
# code — signed registrations from each member's own address to the API VIP and every
# master, renewal, goodbye, expiry) joining in bursts of BURST, as machine sets add nodes.
#
# Topology: a bridge namespace; masters 10.86.0.10-12, the worker 10.86.0.20, a client
# 10.86.0.100, the members from 10.86.1.0 on, all in 10.86.0.0/16 (the machine network);
# API VIP 10.86.0.5, ingress VIP 10.86.0.7.
#
# Measured:
#  - convergence: from the last burst until every master's member list (`keelson_members`)
#    and DNS zone (`keelson_dns_zone_nodes`) hold every member; then every member's name
#    asked of every master's DNS with dig (`dns_missing`: the names a master does not
#    answer);
#  - each master agent's RSS and CPU while the members join and at rest (REST_SECS after
#    a renewal interval of settling), from /proc;
#  - member traffic on the wire (the members' interface, both ways) and registrations/s;
#  - the ingress VRRP instance of the real worker with every member eligible: its unicast
#    destinations and adverts/s (its /metrics, and as received at the members' addresses);
#  - DNS queries/s with that many names: dnsperf against master 0's DNS and NSD serving the
#    same zone in the same namespace (two server threads each);
#  - goodbye (LEAVE members leave) and expiry (the same number stop silently): the time
#    until every master dropped them;
#  - a member flood from one address (FLOOD registrations of new names, signed, from one
#    member's address): what the masters refused and counted, the members list unharmed;
#  - a boot storm: STORM clients fetch the worker config and the agent binary through
#    VIP:22623 at once, against nginx serving the same bytes with the same certificate
#    from the VIP holder's namespace; ROUNDS alternating rounds, the medians.
#
# Usage (root): bench/scale.sh [MEMBERS] (default 1000)
# Env: BURST (100), BURST_GAP seconds between bursts (3), REST_SECS (30), LEAVE (100),
#      FLOOD (300), STORM (100), ROUNDS (3), CONVERGE_TIMEOUT seconds (300),
#      KEELSON_AGENT (default the static release agent of `make agent`; the agent of
#        `make agent AGENT_PROFILE=ci-release`, target/x86_64-unknown-linux-gnu/ci-release/
#        keelson-agent, measures the same code without LTO),
#      KEELSON (default target/release/keelson, else target/debug/keelson),
#      MEMBER_LOAD (default: built here beside the agent, same target and RUSTFLAGS as
#        `make agent`, so it reuses that build's dependencies: ci-release --example member_load).
# Needs: root, ip (iproute2), dig (bind9-dnsutils), dnsperf, nsd, nginx, curl, jq, bc,
# python3 (the stand-in router: Debian packages of the same names).
# The neighbour table is one for all namespaces of a host: the script raises the host's
# net.ipv4.neigh.default.gc_thresh1/2/3 to OpenShift's node values (8192/32768/65536) while
# it runs when they are lower, and puts them back.
# Last line: scale: members=N converged_s=X master_rss_mib=Y master_cpu_pct=Z dns_missing=M storm_vs_nginx=R
set -euo pipefail

MEMBERS=${1:-1000}
BURST=${BURST:-100}
BURST_GAP=${BURST_GAP:-3}
REST_SECS=${REST_SECS:-30}
LEAVE=${LEAVE:-100}
FLOOD=${FLOOD:-300}
STORM=${STORM:-100}
ROUNDS=${ROUNDS:-3}
CONVERGE_TIMEOUT=${CONVERGE_TIMEOUT:-300}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
AGENT=${KEELSON_AGENT:-$ROOT/target/x86_64-unknown-linux-gnu/release/keelson-agent}
if [[ -z ${KEELSON:-} ]]; then
    KEELSON=$ROOT/target/release/keelson
    [[ -x $KEELSON ]] || KEELSON=$ROOT/target/debug/keelson
fi
P=ksc$$
BR=$P-br
LOAD=$P-l
CLI=$P-c
WORKER=$P-w
VIP=10.86.0.5
ZONE=scale.example.com
WORK=$(mktemp -d /tmp/keelson-scale.XXXXXX)
chmod 755 "$WORK"
HZ=$(getconf CLK_TCK)

[[ $(id -u) == 0 ]] || { echo "needs root" >&2; exit 1; }
[[ -x $AGENT ]] || { echo "build first: make agent ($AGENT)" >&2; exit 1; }
[[ -x $KEELSON ]] || { echo "build first: cargo build -p keelson ($KEELSON)" >&2; exit 1; }
for c in ip dig dnsperf nsd nginx curl jq bc python3 mkfifo shuf; do
    command -v $c >/dev/null || { echo "$c not installed (scripts/setup.sh; Debian: apt-get install dnsperf nsd nginx bind9-dnsutils jq bc python3)" >&2; exit 1; }
done
((MEMBERS <= 60000)) || { echo "at most 60000 members (addresses 10.86.1.0 on)" >&2; exit 1; }
if [[ -z ${MEMBER_LOAD:-} ]]; then
    (cd "$ROOT" && RUSTFLAGS="-C target-feature=+crt-static" nice cargo build -q --profile ci-release \
        --target x86_64-unknown-linux-gnu -p keelson-agent --example member_load)
    MEMBER_LOAD=$ROOT/target/x86_64-unknown-linux-gnu/ci-release/examples/member_load
fi

ns_m() { echo "$P-m$1"; }
ip_m() { echo "10.86.0.$((10 + $1))"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

THRESH_SAVED=()
kill_ns() {
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
}
cleanup() {
    exec 7>&- 2>/dev/null || true
    for n in $(ns_m 0) $(ns_m 1) $(ns_m 2) $WORKER $LOAD $CLI; do kill_ns "$n"; done
    for n in $(ns_m 0) $(ns_m 1) $(ns_m 2) $WORKER $LOAD $CLI $BR; do ip netns del "$n" 2>/dev/null || true; done
    local i=1
    for v in "${THRESH_SAVED[@]}"; do sysctl -qw "net.ipv4.neigh.default.gc_thresh$i=$v"; i=$((i + 1)); done
    [[ -n ${KEEP_WORK:-} ]] && echo "work directory kept: $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT

# --- the host's neighbour table: one for every namespace ------------------------------
WANT=(8192 32768 65536)
for i in 1 2 3; do
    cur=$(sysctl -n net.ipv4.neigh.default.gc_thresh$i)
    THRESH_SAVED+=("$cur")
    ((cur >= WANT[i - 1])) || sysctl -qw "net.ipv4.neigh.default.gc_thresh$i=${WANT[i - 1]}"
done
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# --- keelson build for this network -------------------------------------------------
# A machine pool holds at most 1000 replicas (keelson build's install-config check), so the
# workers come in pools of 1000.
mkdir -p "$WORK/build"
cat >"$WORK/build/install-config.yaml" <<EOF
apiVersion: v1
baseDomain: example.com
metadata:
  name: scale
controlPlane:
  name: master
  replicas: 3
compute:
$(for ((left = MEMBERS, pool = 0; left > 0; left -= 1000, pool++)); do
    printf -- '- name: worker%d\n  replicas: %d\n' "$pool" $((left < 1000 ? left : 1000))
done)
networking:
  networkType: OVNKubernetes
  clusterNetwork:
  - cidr: 10.128.0.0/14
    hostPrefix: 23
  serviceNetwork:
  - 172.30.0.0/16
  machineNetwork:
  - cidr: 10.86.0.0/16
platform:
  baremetal:
    apiVIPs:
    - $VIP
    ingressVIPs:
    - 10.86.0.7
pullSecret: '{"auths":{"example.invalid":{"auth":"a2VlbHNvbjpleGFtcGxl"}}}'
sshKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKeelsonExampleKeyOnlyForTheDocs0000000000 core@example
EOF
"$KEELSON" build --config "$WORK/build/install-config.yaml" --out "$WORK/build/out" \
    --no-image --agent "$AGENT" >"$WORK/build/build.log" 2>&1 ||
    { cat "$WORK/build/build.log" >&2; exit 1; }
OUT=$WORK/build/out
RENEW=$(jq .members.renewIntervalSecs "$OUT/cluster.json")
EXPIRY=$(jq .members.expirySecs "$OUT/cluster.json")

# --- the segment ----------------------------------------------------------------------
ip netns add $BR
ip -n $BR link add br0 type bridge
ip -n $BR link set br0 up
attach() { # namespace address
    ip netns add "$1"
    ip -n $BR link add "v${1#"$P"-}$P" type veth peer name eth0 netns "$1"
    ip -n $BR link set "v${1#"$P"-}$P" master br0 up
    ip -n "$1" addr add "$2/16" dev eth0
    ip -n "$1" link set eth0 up
    ip -n "$1" link set lo up
}
for m in 0 1 2; do attach "$(ns_m $m)" "$(ip_m $m)"; done
attach $WORKER 10.86.0.20
attach $CLI 10.86.0.100
attach $LOAD 10.86.1.0
member_ip() { local i=$((256 + $1)); echo "10.86.$((i / 256)).$((i % 256))"; }
for ((i = 1; i < MEMBERS; i++)); do echo "addr add $(member_ip $i)/16 dev eth0"; done >"$WORK/addrs"
ip -n $LOAD -batch "$WORK/addrs"

# --- the agents -----------------------------------------------------------------------
start_agent() { # namespace name role address only
    local d=$WORK/run/$1
    mkdir -p "$d"
    echo "{\"name\":\"$2\",\"role\":\"$3\",\"interface\":\"eth0\",\"addresses\":[\"$4/16\"]}" >"$d/node.json"
    ip netns exec "$1" "$AGENT" run --cluster "$OUT/cluster.json" --node "$d/node.json" \
        --tls-dir "$OUT/tls" --state-dir "$d/state" --only "$5" \
        --status-socket "$d/agent.sock" >/dev/null 2>"$d/agent.log" &
    echo $! >"$d/pid"
}
for m in 0 1 2; do start_agent "$(ns_m $m)" "master-$m" master "$(ip_m $m)" members,ignition,dns,vrrp,proxy; done
# The ingress instance takes part only while the node's router answers its readiness
# (requiredChecks, docs/vrrp.md "Ingress follows the routers"): a stand-in router on the
# real worker, so that it runs the instance with every member eligible.
mkdir -p "$WORK/router/healthz"
: >"$WORK/router/healthz/ready"
ip netns exec $WORKER python3 -m http.server --bind 127.0.0.1 --directory "$WORK/router" 1936 \
    >/dev/null 2>"$WORK/router.log" &
start_agent $WORKER worker-real worker 10.86.0.20 members,dns,vrrp
MPIDS=()
for m in 0 1 2; do MPIDS+=("$(cat "$WORK/run/$(ns_m $m)/pid")"); done
WPID=$(cat "$WORK/run/$WORKER/pid")

metrics() { ip netns exec $CLI curl -s --max-time 5 "http://$1:22625/metrics"; }
metric_sum() { # address regex -> the sum of the samples of the families matching
    metrics "$1" | awk -v re="$2" '$1 ~ re {s += $2} END {printf "%d\n", s}'
}
holder() {
    for m in 0 1 2; do
        if [[ $(ip -n "$(ns_m $m)" -o addr show dev eth0) == *" $VIP/"* ]]; then echo "$m"; return; fi
    done
    echo none
}
ticks() { sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
hwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }

echo "waiting for the masters: one API VIP holder, every master listing the others"
t0=$(now_ms)
until [[ $(holder) != none ]] && (($(metric_sum "$(ip_m 0)" '^keelson_members\\{') >= 4)); do
    (($(now_ms) - t0 < 120000)) || { echo "no cluster within 120 s" >&2; tail "$WORK"/run/*/agent.log >&2; exit 1; }
    sleep 1
done
H=$(holder)
echo "API VIP held by master-$H"
sleep "$RENEW"
IDLE_TICKS=(); for p in "${MPIDS[@]}"; do IDLE_TICKS+=("$(ticks "$p")"); done
sleep 10
IDLE_CPU=()
for i in 0 1 2; do IDLE_CPU+=("$(echo "scale=2; ($(ticks "${MPIDS[$i]}") - ${IDLE_TICKS[$i]}) * 100 / $HZ / 10" | bc)"); done
IDLE_RSS=(); for p in "${MPIDS[@]}"; do IDLE_RSS+=("$(($(rss_kib "$p") / 1024))"); done
echo "masters with no members: CPU ${IDLE_CPU[*]} % of a core, RSS ${IDLE_RSS[*]} MiB"

# --- the members join -------------------------------------------------------------------
mkfifo "$WORK/load.in"
ip netns exec $LOAD "$MEMBER_LOAD" --cluster "$OUT/cluster.json" --tls-dir "$OUT/tls" \
    --first 10.86.1.0 <"$WORK/load.in" >"$WORK/load.out" 2>"$WORK/load.err" &
LPID=$!
exec 7>"$WORK/load.in"
cmd() { echo "$*" >&7; }
EXPECTED=$((MEMBERS + 4))
members_at() { metric_sum "$1" '^keelson_members\\{'; }
zone_at() { metric_sum "$1" '^keelson_dns_zone_nodes$'; }

echo "joining: $MEMBERS members in bursts of $BURST every ${BURST_GAP} s"
JOIN_TICKS=(); for p in "${MPIDS[@]}"; do JOIN_TICKS+=("$(ticks "$p")"); done
tj=$(now_ms)
PEAK_CPU=(0 0 0)
sample_cpu() { # one second of each master's CPU: keeps the peak
    local before=() i now
    for p in "${MPIDS[@]}"; do before+=("$(ticks "$p")"); done
    sleep 1
    for i in 0 1 2; do
        now=$(echo "scale=1; ($(ticks "${MPIDS[$i]}") - ${before[$i]}) * 100 / $HZ" | bc)
        if (($(echo "$now > ${PEAK_CPU[$i]}" | bc))); then PEAK_CPU[$i]=$now; fi
    done
}
joined=0
while ((joined < MEMBERS)); do
    k=$((MEMBERS - joined < BURST ? MEMBERS - joined : BURST))
    cmd join "$k"
    joined=$((joined + k))
    tl=$(now_ms)
    ((joined < MEMBERS)) || break
    for ((s = 0; s < BURST_GAP; s++)); do sample_cpu; done
done
echo "last burst sent $(((tl - tj) / 1000)) s after the first; waiting for every master's list and DNS zone"
CONVERGED=""
while :; do
    done_all=1
    for m in 0 1 2; do
        [[ $(members_at "$(ip_m $m)") == "$EXPECTED" && $(zone_at "$(ip_m $m)") == "$EXPECTED" ]] || { done_all=0; break; }
    done
    if ((done_all)); then CONVERGED=$(echo "scale=1; ($(now_ms) - $tl) / 1000" | bc); break; fi
    if (($(now_ms) - tl > CONVERGE_TIMEOUT * 1000)); then break; fi
    sample_cpu
done
JOIN_SECS=$(echo "scale=2; ($(now_ms) - $tj) / 1000" | bc)
JOIN_CPU=()
for i in 0 1 2; do JOIN_CPU+=("$(echo "scale=1; ($(ticks "${MPIDS[$i]}") - ${JOIN_TICKS[$i]}) * 100 / $HZ / $JOIN_SECS" | bc)"); done
for m in 0 1 2; do echo "  master-$m: $(members_at "$(ip_m $m)") members, $(zone_at "$(ip_m $m)") names (expected $EXPECTED)"; done
if [[ -z $CONVERGED ]]; then
    echo "NOT converged within ${CONVERGE_TIMEOUT} s of the last burst"
    CONVERGED=never
else
    echo "converged ${CONVERGED} s after the last burst"
fi

# --- at rest ----------------------------------------------------------------------------
sleep "$RENEW"
REST_TICKS=(); for p in "${MPIDS[@]}"; do REST_TICKS+=("$(ticks "$p")"); done
W_TICKS=$(ticks "$WPID")
LOAD_TICKS=$(ticks "$LPID")
read -r RX0 TX0 < <(ip netns exec $LOAD cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes | paste -sd' ')
read -r RXP0 TXP0 < <(ip netns exec $LOAD cat /sys/class/net/eth0/statistics/rx_packets /sys/class/net/eth0/statistics/tx_packets | paste -sd' ')
ADV0=$(metric_sum 10.86.0.20 '^keelson_vrrp_adverts_sent_total\\{vrrp_instance="ingress"')
stats_from=$(wc -l <"$WORK/load.out")
sleep "$REST_SECS"
read -r RX1 TX1 < <(ip netns exec $LOAD cat /sys/class/net/eth0/statistics/rx_bytes /sys/class/net/eth0/statistics/tx_bytes | paste -sd' ')
read -r RXP1 TXP1 < <(ip netns exec $LOAD cat /sys/class/net/eth0/statistics/rx_packets /sys/class/net/eth0/statistics/tx_packets | paste -sd' ')
ADV1=$(metric_sum 10.86.0.20 '^keelson_vrrp_adverts_sent_total\\{vrrp_instance="ingress"')
REST_CPU=(); REST_RSS=(); REST_HWM=()
for i in 0 1 2; do
    REST_CPU+=("$(echo "scale=2; ($(ticks "${MPIDS[$i]}") - ${REST_TICKS[$i]}) * 100 / $HZ / $REST_SECS" | bc)")
    REST_RSS+=("$(echo "scale=1; $(rss_kib "${MPIDS[$i]}") / 1024" | bc)")
    REST_HWM+=("$(echo "scale=1; $(hwm_kib "${MPIDS[$i]}") / 1024" | bc)")
done
W_CPU=$(echo "scale=2; ($(ticks "$WPID") - $W_TICKS) * 100 / $HZ / $REST_SECS" | bc)
W_RSS=$(echo "scale=1; $(rss_kib "$WPID") / 1024" | bc)
L_CPU=$(echo "scale=1; ($(ticks "$LPID") - $LOAD_TICKS) * 100 / $HZ / $REST_SECS" | bc)
WIRE_KBS=$(echo "scale=1; ($RX1 - $RX0 + $TX1 - $TX0) / 1024 / $REST_SECS" | bc)
WIRE_PPS=$(echo "scale=0; ($RXP1 - $RXP0 + $TXP1 - $TXP0) / $REST_SECS" | bc)
REST_STATS=$(tail -n +"$((stats_from + 1))" "$WORK/load.out" | grep '^stats' | tail -n "$REST_SECS")
REGS_S=$(awk '{for (i = 1; i <= NF; i++) if ($i ~ /^ok=/) {split($i, a, "="); s += a[2]}} END {printf "%.0f", s / NR}' <<<"$REST_STATS")
FAILED_S=$(awk '{for (i = 1; i <= NF; i++) if ($i ~ /^(failed|refused)=/) {split($i, a, "="); s += a[2]}} END {printf "%.1f", s / NR}' <<<"$REST_STATS")
P99=$(awk '{for (i = 1; i <= NF; i++) if ($i ~ /^p99_ms=/) {split($i, a, "="); print a[2]}}' <<<"$REST_STATS" | sort -n | tail -1)
VIEW_MIN=$(tail -1 <<<"$REST_STATS" | grep -o 'view_min=[0-9]*' | cut -d= -f2)
ADV_RX=$(awk '{for (i = 1; i <= NF; i++) if ($i ~ /^adverts=/) {split($i, a, "="); s += a[2]}} END {printf "%.0f", s / NR}' <<<"$REST_STATS")
ADV_DSTS=$(tail -1 <<<"$REST_STATS" | grep -o 'advert_dsts=[0-9]*' | cut -d= -f2)
ADV_S=$(echo "scale=0; ($ADV1 - $ADV0) / $REST_SECS" | bc)
INGRESS_DSTS=$(metric_sum 10.86.0.20 '^keelson_vrrp_advert_destinations\\{vrrp_instance="ingress"')
INGRESS_STATE=$(metrics 10.86.0.20 | awk '/^keelson_vrrp_state\{vrrp_instance="ingress",state="master"\}/ {print ($2 == 1) ? "master" : "backup"}')
INGRESS_STATE=${INGRESS_STATE:-"not taking part"}

# --- DNS: every member's name, every master ---------------------------------------------
DNS_MISSING=0
for ((i = 0; i < MEMBERS; i++)); do printf 'worker-%05d.%s A\n' "$i" "$ZONE"; done >"$WORK/names"
for m in 0 1 2; do
    answered=$(ip netns exec $CLI dig @"$(ip_m $m)" +tries=2 +time=2 +noall +answer -f "$WORK/names" | awk '$4 == "A"' | wc -l)
    missing=$((MEMBERS - answered))
    echo "  master-$m DNS: $answered of $MEMBERS member names answered"
    ((missing > DNS_MISSING)) && DNS_MISSING=$missing
done

# dnsperf: master 0's DNS and NSD with the same zone, side by side in master 0's namespace.
M0=$(ns_m 0)
{
    echo "\$ORIGIN $ZONE."
    echo "\$TTL 60"
    echo "@ IN SOA ns.$ZONE. hostmaster.$ZONE. 1 3600 600 86400 60"
    echo "@ IN NS ns"
    echo "ns IN A $VIP"
    echo "api IN A $VIP"
    echo "api-int IN A $VIP"
    echo "*.apps IN A 10.86.0.7"
    for m in 0 1 2; do echo "master-$m IN A $(ip_m $m)"; done
    echo "worker-real IN A 10.86.0.20"
    for ((i = 0; i < MEMBERS; i++)); do printf 'worker-%05d IN A %s\n' "$i" "$(member_ip $i)"; done
} >"$WORK/zone"
cat >"$WORK/nsd.conf" <<EOF
server:
    server-count: 2
    ip-address: $(ip_m 0)@5300
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
ip netns exec "$M0" nsd -d -c "$WORK/nsd.conf" 2>"$WORK/nsd.err" &
for _ in $(seq 50); do ip netns exec $CLI dig @"$(ip_m 0)" -p 5300 +short +time=1 +tries=1 "api.$ZONE" | grep -q . && break; sleep 0.2; done
{
    shuf -n 2000 -r "$WORK/names" | sed 's/ A$/ A/'
    echo "api.$ZONE A"; echo "api-int.$ZONE A"; echo "console.apps.$ZONE A"
} >"$WORK/queries"
dnsperf_qps() { ip netns exec $CLI dnsperf -s "$(ip_m 0)" -p "$1" -d "$WORK/queries" -l 8 -c 4 -T 2 -q 500 2>&1 | awk '/Queries per second/ {printf "%.0f", $4}'; }
KQ=(); NQ=()
for r in 1 2; do KQ+=("$(dnsperf_qps 53)"); NQ+=("$(dnsperf_qps 5300)"); done
. "$ROOT/bench/lib/stats.sh"
KQPS=$(printf '%s\n' "${KQ[@]}" | median)
NQPS=$(printf '%s\n' "${NQ[@]}" | median)

# --- goodbye and expiry -------------------------------------------------------------------
dropped_after() { # expected count, timeout s -> seconds until every master lists that many
    local want=$1 t0 m ok
    t0=$(now_ms)
    while (($(now_ms) - t0 < $2 * 1000)); do
        ok=1
        for m in 0 1 2; do [[ $(members_at "$(ip_m $m)") == "$want" ]] || { ok=0; break; }; done
        ((ok)) && { echo "scale=1; ($(now_ms) - $t0) / 1000" | bc; return; }
        sleep 0.5
    done
    echo never
}
cmd leave "$LEAVE"
LEAVE_S=$(dropped_after $((EXPECTED - LEAVE)) 60)
cmd stop "$LEAVE"
STOP_S=$(dropped_after $((EXPECTED - 2 * LEAVE)) $((EXPIRY * 3)))
EXPECTED=$((EXPECTED - 2 * LEAVE))

# --- a member flood from one address ------------------------------------------------------
refused_sum() { metric_sum "$1" '^keelson_members_registry_refused_total\\{'; }
R0=0; for m in 0 1 2; do R0=$((R0 + $(refused_sum "$(ip_m $m)"))); done
FLOOD_TICKS=(); for p in "${MPIDS[@]}"; do FLOOD_TICKS+=("$(ticks "$p")"); done
tf=$(now_ms)
cmd flood "$FLOOD"
until grep -q '^ok flood' "$WORK/load.out"; do sleep 0.5; done
FLOOD_SECS=$(echo "scale=2; ($(now_ms) - $tf) / 1000" | bc)
FLOOD_LINE=$(grep '^ok flood' "$WORK/load.out" | tail -1)
R1=0; for m in 0 1 2; do R1=$((R1 + $(refused_sum "$(ip_m $m)"))); done
FLOOD_CPU=()
for i in 0 1 2; do FLOOD_CPU+=("$(echo "scale=1; ($(ticks "${MPIDS[$i]}") - ${FLOOD_TICKS[$i]}) * 100 / $HZ / $FLOOD_SECS" | bc)"); done
FLOOD_REFUSALS=$(for m in 0 1 2; do metrics "$(ip_m $m)" | grep '^keelson_members_registry_refused_total'; done | awk '{split($1, a, "reason=\""); split(a[2], b, "\""); s[b[1]] += $2} END {for (r in s) if (s[r]) printf "%s=%d ", r, s[r]}')
FLOOD_LISTED=$(for m in 0 1 2; do members_at "$(ip_m $m)"; done | sort -n | tail -1)

# --- the boot storm ------------------------------------------------------------------------
H=$(holder)
HNS=$(ns_m "$H")
ACCEPT='application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1'
SD=$WORK/storm
mkdir -p "$SD/www/config" "$SD/www/assets" "$SD/tmp"
ip netns exec $CLI curl -sf --cacert "$OUT/tls/ca.crt" -H "Accept: $ACCEPT" "https://$VIP:22623/config/worker" -o "$SD/www/config/worker"
ip netns exec $CLI curl -sf --cacert "$OUT/tls/ca.crt" "https://$VIP:22623/assets/keelson-agent" -o "$SD/www/assets/keelson-agent"
CFG_BYTES=$(stat -c %s "$SD/www/config/worker")
BIN_BYTES=$(stat -c %s "$SD/www/assets/keelson-agent")
chmod -R a+rX "$SD"
cat >"$SD/nginx.conf" <<EOF
worker_processes auto;
daemon off;
pid $SD/nginx.pid;
error_log stderr warn;
$([[ $(id -u) -eq 0 ]] && echo "user root;")
events { worker_connections 4096; }
http {
  access_log off;
  sendfile on;
  client_body_temp_path $SD/tmp;
  proxy_temp_path $SD/tmp;
  fastcgi_temp_path $SD/tmp;
  uwsgi_temp_path $SD/tmp;
  scgi_temp_path $SD/tmp;
  server {
    listen 22643 ssl;
    ssl_certificate $OUT/tls/server.crt;
    ssl_certificate_key $OUT/tls/server.key;
    root $SD/www;
    location /config/ { default_type application/json; }
  }
}
EOF
ip netns exec "$HNS" nginx -p "$SD" -c "$SD/nginx.conf" 2>"$SD/nginx.log" &
for _ in $(seq 50); do ip netns exec $CLI curl -sf --cacert "$OUT/tls/ca.crt" -o /dev/null "https://$VIP:22643/config/worker" && break; sleep 0.2; done
cmp -s <(ip netns exec $CLI curl -sf --cacert "$OUT/tls/ca.crt" "https://$VIP:22643/config/worker") "$SD/www/config/worker" ||
    { echo "nginx serves other bytes" >&2; exit 1; }
storm() { # port -> seconds until every client has both files
    local t0 out c pids=()
    : >"$SD/out.$1"
    t0=$(now_ms)
    for ((c = 0; c < STORM; c++)); do
        ip netns exec $CLI curl -s --cacert "$OUT/tls/ca.crt" -H "Accept: $ACCEPT" \
            -w '%{http_code} %{size_download}\n' -o /dev/null "https://$VIP:$1/config/worker" \
            -o /dev/null "https://$VIP:$1/assets/keelson-agent" >>"$SD/out.$1" &
        pids+=($!)
    done
    wait "${pids[@]}" || true
    out=$(echo "scale=2; ($(now_ms) - $t0) / 1000" | bc)
    local good
    good=$(grep -c -e "^200 $CFG_BYTES\$" -e "^200 $BIN_BYTES\$" "$SD/out.$1" || true)
    ((good == 2 * STORM)) || echo "storm on :$1: $good of $((2 * STORM)) fetches complete" >&2
    echo "$out"
}
KS=(); NG=()
for r in $(seq "$ROUNDS"); do
    if ((r % 2)); then KS+=("$(storm 22623)"); NG+=("$(storm 22643)"); else NG+=("$(storm 22643)"); KS+=("$(storm 22623)"); fi
done
KS_MED=$(printf '%s\n' "${KS[@]}" | median)
NG_MED=$(printf '%s\n' "${NG[@]}" | median)
STORM_RATIO=$(echo "scale=2; $KS_MED / $NG_MED" | bc)

cmd quit

# --- report ----------------------------------------------------------------------------------
max_of() { printf '%s\n' "$@" | sort -g | tail -1; }
echo
echo "== keelson at $MEMBERS members ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
echo "agent: $AGENT ($(stat -c %s "$AGENT") bytes); renewal ${RENEW} s, expiry ${EXPIRY} s; bursts of $BURST every ${BURST_GAP} s"
printf '%-44s %s\n' "masters with no members: CPU % / RSS MiB" "${IDLE_CPU[*]} / ${IDLE_RSS[*]}"
printf '%-44s %s\n' "join: CPU % of a core (whole phase / peak 1 s)" "${JOIN_CPU[*]} / ${PEAK_CPU[*]}"
printf '%-44s %s\n' "converged after the last burst (s)" "$CONVERGED"
printf '%-44s %s\n' "at rest: CPU % of a core, masters" "${REST_CPU[*]} (VIP holder: master-$H)"
printf '%-44s %s\n' "at rest: RSS MiB, masters (peak)" "${REST_RSS[*]} (${REST_HWM[*]})"
printf '%-44s %s\n' "at rest: real worker CPU % / RSS MiB" "$W_CPU / $W_RSS"
printf '%-44s %s\n' "at rest: registrations answered/s (failed)" "$REGS_S ($FAILED_S); p99 exchange ${P99} ms; smallest view $VIEW_MIN"
printf '%-44s %s\n' "at rest: member traffic on the wire" "$WIRE_KBS KiB/s, $WIRE_PPS packets/s (load generator CPU $L_CPU %)"
printf '%-44s %s\n' "ingress instance (real worker)" "$INGRESS_STATE, $INGRESS_DSTS destinations, $ADV_S adverts/s sent; members received $ADV_RX/s at $ADV_DSTS addresses"
printf '%-44s %s\n' "DNS q/s master-0 vs NSD (2 threads each)" "$KQPS vs $NQPS ($(echo "scale=2; $KQPS / $NQPS" | bc)x); runs ${KQ[*]} / ${NQ[*]}"
printf '%-44s %s\n' "DNS: member names missing (worst master)" "$DNS_MISSING"
printf '%-44s %s\n' "$LEAVE leave (goodbye) / $LEAVE stop: dropped in s" "$LEAVE_S / $STOP_S"
printf '%-44s %s\n' "flood of $FLOOD names from one address" "$FLOOD_LINE in ${FLOOD_SECS} s; masters refused $((R1 - R0)) (${FLOOD_REFUSALS% }); listed $FLOOD_LISTED (expected $EXPECTED); CPU ${FLOOD_CPU[*]} %"
printf '%-44s %s\n' "boot storm: $STORM clients, config + agent" "keelson ${KS[*]} s, nginx ${NG[*]} s (${CFG_BYTES} + ${BIN_BYTES} bytes each)"
echo
echo "scale: members=$MEMBERS converged_s=$CONVERGED master_rss_mib=$(max_of "${REST_RSS[@]}") master_cpu_pct=$(max_of "${REST_CPU[@]}") dns_missing=$DNS_MISSING storm_vs_nginx=$STORM_RATIO"

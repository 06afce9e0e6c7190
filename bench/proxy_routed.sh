#!/usr/bin/env bash
# New connections per second through the API VIP as a cluster routes them (docs/proxy.md,
# between hosts, with kernel forwarding weighed beside the proxies): clients, VIP holder and
# backend each in a network namespace of its own, joined
# by veth pairs (client i 10.77.i.2 — holder 10.77.i.1, VIP 10.77.0.100, 10.77.200.1 —
# backend 10.77.200.2, nginx serving a small file on :6443), where bench/proxy_vs_haproxy.sh
# puts all of them on loopback. Separate stacks matter for connection rates: on loopback a
# proxy's connect() runs the backend's half of the handshake too, and a client's port choice
# sees the proxy's TIME_WAIT sockets and avoids them; between hosts neither holds.
#
# Compared, each with `wrk -t1` per client, CONNS connections in all, `Connection: close`:
#   direct   the backend itself, routed through the holder (no proxy, no NAT);
#   haproxy  VIP:9445, OpenShift's haproxy.cfg (bench/lib/proxy.sh; no checks);
#   keelson  VIP:9446, `keelson-agent proxy --check none` with its defaults;
#   dnat     VIP:6443 forwarded by the holder's kernel: nftables DNAT to the backend and
#            masquerade to the holder's address, no process on the path (the "kernel
#            forwarding" design docs/proxy.md weighs and does not adopt).
# Each run gets fresh namespaces, so no TIME_WAIT or conntrack state carries from one run to
# the next. Pinning: wrk and nginx on LOAD_CPU, the proxies on PROXY_CPU; with RPS=1 (default)
# each namespace's receive processing (softirq: TCP input, forwarding, NAT) is steered to its
# own side's CPU — the holder's to PROXY_CPU, the clients' and backend's to LOAD_CPU — as each
# host's NIC queues are served by its own CPUs (RPS=0: a veth delivers on the sender's CPU, so
# the holder's input runs on the client's CPU and the reverse).
#
# Per run, besides the rate: how busy each CPU was (and the softirq share of the holder's);
# CPU time of both CPUs per connection (all the work on the machine — clients, holder and
# backend — which a proxy changes on every side) and the proxy process's own; TCP segments
# sent per connection by all namespaces; the clients' SYN retransmissions (connections that
# waited 1 s or more for their handshake) and PAWSTimewait of the backend and the holder
# (SYNs dropped by a TIME_WAIT socket of the same address pair that saw newer timestamps:
# with CLIENTS=2 and dnat, two clients' connections masqueraded onto the holder's ports meet
# each other's TIME_WAIT at the backend with unrelated timestamp clocks), from `nstat`.
#
# Judges no bar (bench/proxy_vs_haproxy.sh judges the connection-rate bar): it measures.
#
# Usage: bench/proxy_routed.sh   (root; every address is inside the run's own namespaces)
# Env: KEELSON_AGENT_BIN (default: the static release agent of `make agent`), SECS (default
#      5), ROUNDS (default 3), CONNS (default 32), CLIENTS (client namespaces sharing CONNS,
#      default 1), MODES (default "direct haproxy keelson dnat"), PROXY_CPU (1), LOAD_CPU (0),
#      RPS (1), NSTAT_DIR (keep each run's `nstat -as` of every namespace there), PERF_EVENTS
#      (perf events counted system-wide during each run, printed per connection on stderr,
#      e.g. "sched:sched_switch,irq:softirq_entry,raw_syscalls:sys_enter").
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib/proxy.sh
. bench/lib/proxy.sh
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-32}
CLIENTS=${CLIENTS:-1}
MODES=${MODES:-direct haproxy keelson dnat}
PROXY_CPU=${PROXY_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
RPS=${RPS:-1}
BIN=${KEELSON_AGENT_BIN:-target/x86_64-unknown-linux-gnu/release/keelson-agent}
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces)" >&2; exit 1; }
[[ -x $BIN ]] || { echo "missing $BIN: make agent" >&2; exit 1; }
for tool in haproxy wrk nginx nft nstat taskset ip curl; do
  command -v "$tool" >/dev/null || { echo "missing $tool (scripts/setup.sh installs it)" >&2; exit 1; }
done

P="kr$$"
L="${P}l" B="${P}b"
CLIENT_NS=()
for i in $(seq "$CLIENTS"); do CLIENT_NS+=("${P}c$i"); done
WORK=$(mktemp -d /tmp/ks-bench-routed.XXXXXX)
chmod 755 "$WORK"
PIDS=()
teardown() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
  for n in "${CLIENT_NS[@]}" "$L" "$B"; do ip netns del "$n" 2>/dev/null || true; done
}
trap 'teardown; rm -rf "$WORK"' EXIT

write_nginx_conf "$WORK" 10.77.200.2:6443
write_haproxy_cfg "$WORK/haproxy.cfg" 8000 "api 10.77.0.100:9445 10.77.200.2:6443"

# Receive processing of device $2 in namespace $1 on the CPUs of mask $3 (RPS=1).
steer() {
  [[ $RPS == 1 ]] || return 0
  ip netns exec "$1" sh -c "echo $3 >/sys/class/net/$2/queues/rx-0/rps_cpus"
}

# Fresh namespaces, the backend, and the holder's path for MODE; sets TARGET and PROXY_PID.
setup() { # mode
  local i=0 c holder load
  holder=$(printf '%x' $((1 << PROXY_CPU)))
  load=$(printf '%x' $((1 << LOAD_CPU)))
  for n in "${CLIENT_NS[@]}" "$L" "$B"; do
    ip netns add "$n"
    ip -n "$n" link set lo up
  done
  ip -n "$L" addr add 10.77.0.100/32 dev lo
  ip netns exec "$L" sysctl -qw net.ipv4.ip_forward=1
  for c in "${CLIENT_NS[@]}"; do
    i=$((i + 1))
    ip link add "${P}c$i" netns "$c" type veth peer name "${P}h$i" netns "$L"
    ip -n "$c" addr add "10.77.$i.2/24" dev "${P}c$i"
    ip -n "$L" addr add "10.77.$i.1/24" dev "${P}h$i"
    ip -n "$c" link set "${P}c$i" up
    ip -n "$L" link set "${P}h$i" up
    ip -n "$c" route add default via "10.77.$i.1"
    steer "$c" "${P}c$i" "$load"
    steer "$L" "${P}h$i" "$holder"
  done
  ip link add "${P}hb" netns "$L" type veth peer name "${P}b0" netns "$B"
  ip -n "$L" addr add 10.77.200.1/24 dev "${P}hb"
  ip -n "$B" addr add 10.77.200.2/24 dev "${P}b0"
  ip -n "$L" link set "${P}hb" up
  ip -n "$B" link set "${P}b0" up
  ip -n "$B" route add default via 10.77.200.1
  steer "$L" "${P}hb" "$holder"
  steer "$B" "${P}b0" "$load"
  ip netns exec "$B" taskset -c "$LOAD_CPU" nginx -p "$WORK/www" -c "$WORK/nginx.conf" >"$WORK/nginx.log" 2>&1 &
  PIDS+=($!)
  PROXY_PID=
  case $1 in
    direct) TARGET=10.77.200.2:6443 ;;
    haproxy)
      ip netns exec "$L" taskset -c "$PROXY_CPU" haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
      PIDS+=($!)
      PROXY_PID=$!
      TARGET=10.77.0.100:9445
      ;;
    keelson)
      ip netns exec "$L" taskset -c "$PROXY_CPU" "$BIN" proxy --listen 10.77.0.100:9446 \
        --backend 10.77.200.2:6443 --check none --monitor none --max-connections 8000 \
        >"$WORK/keelson.log" 2>&1 &
      PIDS+=($!)
      PROXY_PID=$!
      TARGET=10.77.0.100:9446
      ;;
    dnat)
      ip netns exec "$L" nft -f - <<EOF
table ip keelson_bench {
  chain prerouting { type nat hook prerouting priority -100; policy accept;
    ip daddr 10.77.0.100 tcp dport 6443 dnat to 10.77.200.2:6443
  }
  chain postrouting { type nat hook postrouting priority 100; policy accept;
    ct status dnat oifname "${P}hb" masquerade
  }
}
EOF
      TARGET=10.77.0.100:6443
      ;;
    *) echo "unknown mode $1" >&2; exit 1 ;;
  esac
  for c in "${CLIENT_NS[@]}"; do
    for _ in $(seq 100); do
      ip netns exec "$c" curl -s -o /dev/null --max-time 1 "http://$TARGET/small" && continue 2
      sleep 0.05
    done
    echo "$1: http://$TARGET/small does not answer $c" >&2
    cat "$WORK"/*.log >&2 || true
    exit 1
  done
}

# nstat counter $2 of namespace $1 (0 when absent).
counter() {
  ip netns exec "$1" nstat -asz "$2" | awk -v n="$2" '$1 == n { print $2; f = 1 } END { if (!f) print 0 }'
}
# The same summed over the client namespaces.
client_counter() {
  local n sum=0
  for n in "${CLIENT_NS[@]}"; do sum=$((sum + $(counter "$n" "$1"))); done
  echo "$sum"
}
# "busy softirq" jiffies of CPU $1 (/proc/stat: user nice system idle iowait irq softirq).
cpu_jiffies() { awk -v c="cpu$1" '$1 == c { print $2 + $3 + $4 + $7 + $8, $8 }' /proc/stat; }
# user + system jiffies of process $1.
proc_jiffies() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }

# One run of MODE in fresh namespaces. Prints "r/s syn-rtx paws-backend paws-holder
# proxy-cpu% softirq% load-cpu% us/conn proxy-us/conn segments/conn".
run() { # mode
  setup "$1"
  local pb0 ps0 lb0 pb1 ps1 lb1 pj0=0 pj1=0 i=0 c w wrks=() rate requests
  read -r pb0 ps0 < <(cpu_jiffies "$PROXY_CPU")
  read -r lb0 _ < <(cpu_jiffies "$LOAD_CPU")
  [[ -n $PROXY_PID ]] && pj0=$(proc_jiffies "$PROXY_PID")
  for c in "${CLIENT_NS[@]}"; do
    i=$((i + 1))
    ip netns exec "$c" taskset -c "$LOAD_CPU" wrk -t1 -c$(((CONNS + CLIENTS - 1) / CLIENTS)) \
      -d"${SECS}s" -H 'Connection: close' "http://$TARGET/small" >"$WORK/wrk-$i.out" &
    wrks+=($!)
  done
  if [[ -n ${PERF_EVENTS:-} ]]; then
    # System-wide counts of PERF_EVENTS over the run, per connection, on stderr.
    perf stat -a -x, -e "$PERF_EVENTS" -o "$WORK/perf.csv" sleep "$SECS" 2>/dev/null &
    wrks+=($!)
  fi
  for w in "${wrks[@]}"; do wait "$w"; done
  [[ -n $PROXY_PID ]] && pj1=$(proc_jiffies "$PROXY_PID")
  read -r pb1 ps1 < <(cpu_jiffies "$PROXY_CPU")
  read -r lb1 _ < <(cpu_jiffies "$LOAD_CPU")
  if [[ -n ${NSTAT_DIR:-} ]]; then
    mkdir -p "$NSTAT_DIR"
    for n in "${CLIENT_NS[@]}" "$L" "$B"; do
      ip netns exec "$n" nstat -as >"$NSTAT_DIR/$1-${n#"$P"}.$BASHPID.txt"
    done
  fi
  rate=$(awk '/^Requests\/sec/ { s += $2 } END { printf "%d", s }' "$WORK"/wrk-*.out)
  requests=$(awk '/requests in/ { s += $1 } END { print s + 0 }' "$WORK"/wrk-*.out)
  if [[ -n ${PERF_EVENTS:-} ]]; then
    awk -F, -v n="$requests" -v m="$1" '!/^#/ && NF > 3 && n > 0 { printf "    %-8s %-28s %8.2f per connection\n", m, $3, $1 / n }' \
      "$WORK/perf.csv" >&2
  fi
  rm -f "$WORK"/wrk-*.out
  echo "$rate $(client_counter TcpExtTCPSynRetrans) $(counter "$B" TcpExtPAWSTimewait)" \
    "$(counter "$L" TcpExtPAWSTimewait)" \
    "$(awk -v pb=$((pb1 - pb0)) -v ps=$((ps1 - ps0)) -v lb=$((lb1 - lb0)) -v t="$SECS" \
      -v hz="$(getconf CLK_TCK)" -v p=$((pj1 - pj0)) -v n="$requests" \
      -v segs=$(($(client_counter TcpOutSegs) + $(counter "$L" TcpOutSegs) + $(counter "$B" TcpOutSegs))) \
      'BEGIN { if (n == 0) n = 1; printf "%d %d %d %d %d %.1f", 100 * pb / hz / t, 100 * ps / hz / t,
        100 * lb / hz / t, (pb + lb) * 1e6 / hz / n, p * 1e6 / hz / n, segs / n }')"
  teardown
}

# The median of the space-separated numbers in "$1".
median_of() { tr ' ' '\n' <<<"$1" | grep . | median; }

declare -A RATES SYN PAWS US SEGS
echo "rounds of $SECS s, $CONNS connections from $CLIENTS client(s), RPS=$RPS"
for r in $(seq "$ROUNDS"); do
  for m in $MODES; do
    run "$m" >"$WORK/result"
    read -r rate syn pb pl busy soft lbusy us pus segs <"$WORK/result"
    printf '  round %d %-8s %6d r/s  syn-rtx %4d  paws %d/%d  cpu%d %3d%% (softirq %3d%%)  cpu%d %3d%%  %4d us/conn (proxy %4d)  %s seg/conn\n' \
      "$r" "$m" "$rate" "$syn" "$pb" "$pl" "$PROXY_CPU" "$busy" "$soft" "$LOAD_CPU" "$lbusy" \
      "$us" "$pus" "$segs"
    SEGS[$m]+="$segs "
    RATES[$m]+="$rate "
    SYN[$m]+="$syn "
    PAWS[$m]+="$((pb + pl)) "
    US[$m]+="$us "
  done
done
echo
printf '%-8s %8s %8s %6s %8s %9s   %s\n' mode 'r/s' 'syn-rtx' 'paws' 'us/conn' 'seg/conn' 'rounds r/s'
for m in $MODES; do
  printf '%-8s %8s %8s %6s %8s %9s   %s\n' "$m" "$(median_of "${RATES[$m]}")" \
    "$(median_of "${SYN[$m]}")" "$(median_of "${PAWS[$m]}")" "$(median_of "${US[$m]}")" \
    "$(median_of "${SEGS[$m]}")" "${RATES[$m]}"
done
if [[ " $MODES " == *" haproxy "* ]]; then
  h=$(median_of "${RATES[haproxy]}")
  for m in $MODES; do
    [[ $m == haproxy ]] && continue
    awk -v m="$m" -v a="$(median_of "${RATES[$m]}")" -v h="$h" \
      'BEGIN { if (h > 0) printf "%s / haproxy = %.2f\n", m, a / h }'
  done
fi

#!/usr/bin/env bash
# The API proxy (docs/proxy.md; bars in docs/architecture.md): `keelson-agent proxy` vs haproxy in TCP mode, side by side
# in one run, with the direct path (no proxy) as the baseline. Loopback only.
#
# Measured for direct / haproxy / keelson:
#   - bulk throughput: iperf3 -t SECS through the proxy to an iperf3 server (one stream);
#   - new connections/s: wrk -c CONNS with 'Connection: close', so every request is a new
#     client connection and, through a proxy, a new backend connection, to nginx serving a
#     small file; p50/p99 latency of that run (under load: mostly queueing);
#   - connect + first byte: CFB_N (default 200) `curl` runs one after another, each a new
#     connection: p50/p99 of curl's time_starttransfer (TCP connect, request, first byte);
#   - latency: wrk -c 1 keep-alive, one request at a time (no queueing), p50/p99, with the
#     proxy moved onto LOAD_CPU for that run (see ka_run); the "added" latency is the
#     proxy's p99 minus the direct p99;
#   - per connection of the close run, what a shared machine cannot blur: the proxy's CPU
#     time (user + system, /proc/PID/stat) and its system calls (perf stat -e
#     raw_syscalls:sys_enter on the proxy's process), each divided by the requests wrk
#     completed; and nginx's CPU time per connection (a proxy changes the backend's work
#     too: the segments and wake-ups it causes there);
#   - memory per open connection (PARTS "mem"): a fresh proxy of each kind in front of
#     bench/storm.py's backend (greets, holds the connection), MEM_CONNS idle clients
#     (storm.py clients) opened through it; (RSS with them open - RSS before) / clients.
#
# Fairness: both proxies are pinned with taskset to the same single CPU (PROXY_CPU): haproxy
# sizes its threads from the affinity mask as OpenShift runs it (one thread), keelson's tokio
# runtime too (one worker thread). Clients and backends (iperf3, wrk, nginx) share LOAD_CPU. haproxy
# gets the settings OpenShift ships (machine-config-operator's on-prem haproxy.cfg: mode tcp,
# retries 3, maxconn 40000, timeout connect 10s, client/server 1m, tunnel 5m); keelson-agent
# proxy runs with its defaults. Both get the same maxconn where the descriptor limit cannot
# hold 20000 connections. Neither runs
# health checks (--check none; no `check` on the haproxy server line): a check connection
# would disturb the single-client iperf3 server. The proxies' CPU use over each run is read
# from /proc/PID/stat. Runs alternate keelson/haproxy ROUNDS times; medians count.
#
# Usage: bench/proxy_vs_haproxy.sh
# Env: KEELSON_AGENT_BIN (default target/release/keelson-agent), SECS (per run, default 8),
#      ROUNDS (default 7), CONNS (wrk connections, default 32), PROXY_CPU (default 1),
#      LOAD_CPU (default 0), QUIET_MAX / QUIET_WAIT (wait up to QUIET_WAIT s, default 60,
#      before each run until other work uses at most QUIET_MAX %, default 10, of the machine),
#      PROFILE=1 (after the runs, one more close run per proxy under `perf record -g`: where
#      its CPU goes, by object and by symbol; keelson's own symbols need a binary built
#      with CARGO_PROFILE_<PROFILE>_STRIP=false),
#      PARTS (which runs, default "iperf close cfb ka"; also "mem"; bars of skipped runs are
#      not judged), MEM_CONNS (open connections of the mem part, default "5000 <most the
#      descriptor limit allows>": the proxy needs two descriptors per connection).
# Bars (docs/architecture.md): throughput >= haproxy; connections/s >= 0.9 x haproxy; added p99
# latency <= haproxy's. Exit 1 below a bar.
set -euo pipefail

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib/proxy.sh
. bench/lib/proxy.sh
SECS=${SECS:-8}
ROUNDS=${ROUNDS:-7}
CONNS=${CONNS:-32}
PROXY_CPU=${PROXY_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
QUIET_MAX=${QUIET_MAX:-10}
QUIET_WAIT=${QUIET_WAIT:-60}
PARTS=${PARTS:-iperf close cfb ka}
CFB_N=${CFB_N:-200}
# OpenShift sets maxconn 20000; haproxy needs ~2 descriptors per connection and will not
# start when it cannot raise RLIMIT_NOFILE that far (containers often cap it at 20000).
HARD_NOFILE=$(ulimit -Hn)
if [[ $HARD_NOFILE == unlimited ]] || ((HARD_NOFILE >= 40100)); then MAXCONN=20000; else MAXCONN=$(((HARD_NOFILE - 100) / 2)); fi
MEM_CONNS=${MEM_CONNS:-5000 $(((MAXCONN - 100) / 100 * 100))}
BIN=${KEELSON_AGENT_BIN:-target/release/keelson-agent}
[[ -x $BIN ]] || { echo "missing $BIN: cargo build --release -p keelson-agent" >&2; exit 1; }
for tool in haproxy iperf3 wrk nginx curl taskset ss awk perf python3; do
  command -v "$tool" >/dev/null || {
    echo "missing $tool (scripts/setup.sh installs them)" >&2
    exit 1
  }
done

WORK=$(mktemp -d /tmp/ks-bench-proxy.XXXXXX)
chmod 755 "$WORK"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 30000))
    # Any socket on the port (a TIME_WAIT left by a client run too) would stop a bind.
    ss -Htan "sport = :$p" | grep -q . || { echo "$p"; return; }
  done
}
wait_port() { # port what
  for _ in $(seq 100); do
    ss -Htln "sport = :$1" | grep -q . && return
    sleep 0.05
  done
  echo "$2 does not listen on :$1" >&2
  cat "$WORK"/*.log >&2 || true
  exit 1
}

IPERF=$(free_port)
NGX=$(free_port)
K_IPERF=$(free_port)
K_HTTP=$(free_port)
H_IPERF=$(free_port)
H_HTTP=$(free_port)

# --- backends ----------------------------------------------------------------------------
taskset -c "$LOAD_CPU" iperf3 -s -p "$IPERF" >"$WORK/iperf3-server.log" 2>&1 &
PIDS+=($!)

write_nginx_conf "$WORK" "127.0.0.1:$NGX"
taskset -c "$LOAD_CPU" nginx -p "$WORK/www" -c "$WORK/nginx.conf" >"$WORK/nginx.log" 2>&1 &
PIDS+=($!)
NGINX_MASTER=$!

# --- proxies -----------------------------------------------------------------------------
kproxy() { # listen-port backend-port
  taskset -c "$PROXY_CPU" "$BIN" proxy --listen "127.0.0.1:$1" --backend "127.0.0.1:$2" \
    --check none --monitor none --max-connections "$MAXCONN" >"$WORK/keelson-$1.log" 2>&1 &
  PIDS+=($!)
  echo $! >"$WORK/keelson-$1.pid"
}
kproxy "$K_IPERF" "$IPERF"
kproxy "$K_HTTP" "$NGX"

# OpenShift's haproxy.cfg (bench/lib/proxy.sh). The global maxconn only where the descriptor
# limit needs it (see MAXCONN).
write_haproxy_cfg "$WORK/haproxy.cfg" "$MAXCONN" "iperf 127.0.0.1:$H_IPERF 127.0.0.1:$IPERF" \
  "http 127.0.0.1:$H_HTTP 127.0.0.1:$NGX"
taskset -c "$PROXY_CPU" haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
PIDS+=($!)
HAPROXY_PID=$!

for p in "$IPERF:iperf3" "$NGX:nginx" "$K_IPERF:keelson" "$K_HTTP:keelson" \
  "$H_IPERF:haproxy" "$H_HTTP:haproxy"; do
  wait_port "${p%%:*}" "${p#*:}"
done
# The same bytes through every path, or the comparison means nothing.
for port in "$NGX" "$K_HTTP" "$H_HTTP"; do
  curl -sf "http://127.0.0.1:$port/small" | cmp -s - "$WORK/www/small" ||
    { echo "wrong answer through :$port" >&2; cat "$WORK"/*.log >&2; exit 1; }
done

# --- measurement helpers -----------------------------------------------------------------
# nginx's one worker (worker_processes 1), whose CPU time per connection the close run reports.
NGINX_WORKER=$(pgrep -P "$NGINX_MASTER" nginx | head -1)
cpu_ticks() { [[ -z $1 ]] && { echo 0; return; }; awk '{print $14 + $15}' "/proc/$1/stat"; }
CLK=$(getconf CLK_TCK)

# This machine may be shared: before each run wait (up to QUIET_WAIT s) until the whole
# machine was at most QUIET_MAX % busy for a second (between runs the servers here idle).
busy_pct() {
  local a b
  a=$(awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat)
  sleep 1
  b=$(awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN {split(a, x); split(b, y); printf "%.0f", (y[1] - x[1]) * 100 / (y[2] - x[2])}'
}
wait_quiet() {
  local t0=$SECONDS
  while (($(busy_pct) > QUIET_MAX)); do
    if ((SECONDS - t0 >= QUIET_WAIT)); then
      echo x >>"$WORK/noisy"
      return
    fi
    sleep 2
  done
}

# Runs "$@" (output to file $1) while sampling PROXY_PID's CPU and counting its system
# calls; prints "cpu <pct>", "cpus <seconds>", "sys <calls>" and "ngxs <nginx CPU seconds>".
with_cpu() {
  local t0 t1 s0 s1 n0 n1 out=$1 sp=""
  shift
  wait_quiet
  if [[ -n $PROXY_PID ]]; then
    perf stat -x, -e raw_syscalls:sys_enter -p "$PROXY_PID" -o "$WORK/perf.stat" 2>/dev/null &
    sp=$!
    sleep 0.3 # attached
  fi
  t0=$(cpu_ticks "$PROXY_PID")
  n0=$(cpu_ticks "$NGINX_WORKER")
  s0=$(date +%s.%N)
  "$@" >"$out" 2>&1 || { cat "$out" >&2; exit 1; }
  s1=$(date +%s.%N)
  t1=$(cpu_ticks "$PROXY_PID")
  n1=$(cpu_ticks "$NGINX_WORKER")
  if [[ -n $sp ]]; then
    kill -INT "$sp"
    wait "$sp" || true
    awk -F, '/raw_syscalls/ {print "sys", $1 + 0}' "$WORK/perf.stat"
  else
    echo "sys 0"
  fi
  awk -v a="$t0" -v b="$t1" -v c="$CLK" -v s="$s0" -v e="$s1" -v n="$n0" -v m="$n1" \
    'BEGIN {printf "cpu %.0f\ncpus %.4f\nngxs %.4f\n", (b - a) / c / (e - s) * 100, (b - a) / c, (m - n) / c}'
}

# Latency in microseconds from wrk's "99%  1.23ms" style.
to_us='function us(v) { if (v ~ /us$/) return v + 0; if (v ~ /ms$/) return v * 1000; if (v ~ /s$/) return v * 1000000; return v }'

iperf_run() { # port -> "gbps <x>" "cpu <y>"
  with_cpu "$WORK/iperf.out" taskset -c "$LOAD_CPU" iperf3 -c 127.0.0.1 -p "$1" -t "$SECS" -f g
  awk '/receiver/ {print "gbps", $(NF-2)}' "$WORK/iperf.out"
}

wrk_run() { # port conns extra-args... -> "rps <x>" "p50 <us>" "p99 <us>" "err <n>" "cpu <y>"
  local port=$1 conns=$2
  shift 2
  with_cpu "$WORK/wrk.out" taskset -c "$LOAD_CPU" wrk -t1 -c"$conns" -d"${SECS}s" --latency "$@" \
    "http://127.0.0.1:$port/small"
  awk "$to_us"'
    /^Requests\/sec:/ {print "rps", $2}
    / requests in / {print "req", $1}
    /^ +50%/ {print "p50", us($2)}
    /^ +99%/ {print "p99", us($2)}
    /Socket errors:/ {gsub(",", ""); e = $4 + $6 + $8 + $10}
    /Non-2xx/ {e += $NF}
    END {print "err", e + 0}' "$WORK/wrk.out"
}

cfb_run() { # port -> "p50 <us>" "p99 <us>"
  wait_quiet
  for _ in $(seq "$CFB_N"); do
    taskset -c "$LOAD_CPU" curl -so /dev/null -w '%{time_starttransfer}\n' "http://127.0.0.1:$1/small"
  done | sort -g | awk '{v[NR] = $1 * 1000000} END {print "p50", v[int(NR * 0.5)]; print "p99", v[int(NR * 0.99)]}'
}

# The keep-alive latency run puts the proxy on LOAD_CPU too, so a request never waits for
# another CPU to wake up (in a VM that costs tens to thousands of µs and swamps the proxy's
# own cost): the added latency is then the proxy's work per request and response.
ka_run() { # port pid
  [[ -n $2 ]] && taskset -a -p -c "$LOAD_CPU" "$2" >/dev/null
  wrk_run "$1" 1
  [[ -n $2 ]] && taskset -a -p -c "$PROXY_CPU" "$2" >/dev/null
  return 0
}

# One measurement of one path: appends "path metric value" lines to $WORK/results.
measure() { # name iperf-port iperf-pid http-port http-pid
  local name=$1
  PROXY_PID=$3
  [[ " $PARTS " == *" iperf "* ]] && iperf_run "$2" | sed "s/^/$name iperf_/" >>"$WORK/results"
  PROXY_PID=$5
  if [[ " $PARTS " == *" close "* ]]; then
    wrk_run "$4" "$CONNS" -H 'Connection: close' >"$WORK/close.out"
    # Per connection of this run: CPU µs and system calls.
    awk '{v[$1] = $2} END {r = v["req"] ? v["req"] : 1; print "us", v["cpus"] * 1000000 / r; print "calls", v["sys"] / r; print "ngxus", v["ngxs"] * 1000000 / r}' \
      "$WORK/close.out" >>"$WORK/close.out"
    sed "s/^/$name close_/" "$WORK/close.out" >>"$WORK/results"
  fi
  [[ " $PARTS " == *" cfb "* ]] && cfb_run "$4" | sed "s/^/$name cfb_/" >>"$WORK/results"
  [[ " $PARTS " == *" ka "* ]] && ka_run "$4" "$5" | sed "s/^/$name ka_/" >>"$WORK/results"
  return 0
}

get() { awk -v n="$1" -v m="$2" '$1 == n && $2 == m {print $3}' "$WORK/results" | median; }

# Memory per open connection: a fresh proxy of kind $1 in front of storm.py's backend on
# port $2, $3 idle clients through it; prints "<kind> <clients> <bytes per connection>".
mem_run() { # kind backend-port clients
  local who=$1 port pid before after cpid ev="$WORK/mem.events"
  port=$(free_port)
  if [[ $who == keelson ]]; then
    taskset -c "$PROXY_CPU" "$BIN" proxy --listen "127.0.0.1:$port" --backend "127.0.0.1:$2" \
      --check none --monitor none --max-connections "$MAXCONN" >"$WORK/mem-keelson.log" 2>&1 &
  else
    sed -e "s/^  bind .*/  bind 127.0.0.1:$port/" "$WORK/haproxy-mem.cfg" >"$WORK/haproxy-mem-run.cfg"
    taskset -c "$PROXY_CPU" haproxy -db -f "$WORK/haproxy-mem-run.cfg" >"$WORK/mem-haproxy.log" 2>&1 &
  fi
  pid=$!
  PIDS+=("$pid")
  wait_port "$port" "$who (mem)"
  # One connection first: what every proxy allocates once (pools, the first task) is not
  # per connection.
  timeout 5 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port && head -c1 <&3" >/dev/null
  sleep 0.5
  before=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
  rm -f "$ev" "$ev.ready"
  taskset -c "$LOAD_CPU" python3 bench/storm.py clients 127.0.0.1 "$port" "$3" "$ev" 2>"$WORK/mem-clients.log" &
  cpid=$!
  for _ in $(seq 600); do [[ -e $ev.ready ]] && break; sleep 0.2; done
  [[ -e $ev.ready ]] || { echo "$who: $3 clients not up in 120 s" >&2; tail "$WORK/mem-clients.log" >&2; exit 1; }
  sleep 1
  after=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
  kill "$cpid" "$pid"
  wait "$cpid" "$pid" 2>/dev/null || true
  echo "$who $3 $(((after - before) * 1024 / $3))"
}
if [[ " $PARTS " == *" mem "* ]]; then
  MEM_BACKEND=$(free_port)
  taskset -c "$LOAD_CPU" python3 bench/storm.py serve "$MEM_BACKEND" b >"$WORK/storm-serve.log" 2>&1 &
  PIDS+=($!)
  wait_port "$MEM_BACKEND" "storm.py serve"
  # The bind address is a placeholder, set per run (mem_run).
  write_haproxy_cfg "$WORK/haproxy-mem.cfg" "$MAXCONN" "mem 127.0.0.1:1 127.0.0.1:$MEM_BACKEND"
fi

# keelson runs one process per backend; haproxy one process with two frontends.
K_PID_HTTP=$(cat "$WORK/keelson-$K_HTTP.pid")
K_PID_IPERF=$(cat "$WORK/keelson-$K_IPERF.pid")
: >"$WORK/results"
for r in $(seq "$ROUNDS"); do
  echo "round $r/$ROUNDS ..." >&2
  measure direct "$IPERF" "" "$NGX" ""
  if ((r % 2)); then order="keelson haproxy"; else order="haproxy keelson"; fi
  for who in $order; do
    if [[ $who == keelson ]]; then
      measure keelson "$K_IPERF" "$K_PID_IPERF" "$K_HTTP" "$K_PID_HTTP"
    else
      measure haproxy "$H_IPERF" "$HAPROXY_PID" "$H_HTTP" "$HAPROXY_PID"
    fi
  done
done

if [[ ${PROFILE:-0} == 1 && " $PARTS " == *" close "* ]]; then
  for who in keelson haproxy; do
    if [[ $who == keelson ]]; then port=$K_HTTP; pid=$K_PID_HTTP; else port=$H_HTTP; pid=$HAPROXY_PID; fi
    perf record -q -g -p "$pid" -o "$WORK/perf.$who" 2>/dev/null &
    rpid=$!
    sleep 0.5
    PROXY_PID="" wrk_run "$port" "$CONNS" -H 'Connection: close' >/dev/null
    kill -INT "$rpid"
    wait "$rpid" || true
    {
      echo "== $who: where its CPU goes in a close run (perf record -g; self time)"
      perf report -i "$WORK/perf.$who" --no-children --stdio -g none --sort dso 2>/dev/null |
        grep -v '^#' | grep -v '^$' | head -4 | awk '{printf "%s %s   ", $1, $2} END {print ""}'
      perf report -i "$WORK/perf.$who" --no-children --percent-limit 1.5 --stdio -g none \
        --sort dso,symbol 2>/dev/null | grep -v '^#' | grep -v '^$' |
        awk '{$NF = ""; $(NF - 1) = ""; print}' | head -25
    } >>"$WORK/profile"
  done
fi

# Memory: each size once per kind, order alternating (no CPU contention to even out).
: >"$WORK/mem"
if [[ " $PARTS " == *" mem "* ]]; then
  i=0
  for n in $MEM_CONNS; do
    if ((i++ % 2)); then order="haproxy keelson"; else order="keelson haproxy"; fi
    for who in $order; do
      echo "memory: $n connections through $who ..." >&2
      mem_run "$who" "$MEM_BACKEND" "$n" >>"$WORK/mem"
    done
  done
fi

# --- report ------------------------------------------------------------------------------
echo
echo "loopback; proxies on CPU $PROXY_CPU, iperf3/wrk/nginx on CPU $LOAD_CPU; ${SECS}s per run,"
echo "median of $ROUNDS rounds (keelson/haproxy order alternating); $(haproxy -v | head -1 | awk '{print "haproxy", $3}'),"
echo "$(nginx -v 2>&1 | sed 's/.*\///;s/^/nginx /'), $(iperf3 -v | head -1 | awk '{print "iperf3", $2}'); keelson: $BIN"
echo "iperf3: 1 stream; close: wrk -t1 -c$CONNS 'Connection: close' (a new connection per request);"
echo "ka: wrk -t1 -c1 keep-alive, proxy moved onto CPU $LOAD_CPU for it; latency in µs;"
echo "cpu: the proxy's CPU use during the run, %; µs/conn, sc/c: the proxy's CPU time and system calls"
echo "per close-run connection (median of the rounds' quotients); ngx µs: nginx's CPU time per connection"
echo "cfb: $CFB_N curl runs one at a time, connect + first byte, µs"
echo "runs started on a busy machine (> $QUIET_MAX % CPU after waiting ${QUIET_WAIT}s): $(cat "$WORK/noisy" 2>/dev/null | wc -l) of $((ROUNDS * 9))"
printf '\n%-8s %9s %5s | %9s %7s %7s %5s %5s %7s %5s %6s | %7s %7s | %6s %6s %6s\n' \
  path "iperf3" cpu "close r/s" p50 p99 err cpu "µs/conn" sc/c "ngx µs" "cfb p50" "cfb p99" "ka p50" "ka p99" added
D99=$(get direct ka_p99)
for who in direct haproxy keelson; do
  added=$(awk -v a="$(get "$who" ka_p99)" -v d="$D99" 'BEGIN {printf "%.0f", a - d}')
  printf '%-8s %7.2fG %5.0f | %9.0f %7.0f %7.0f %5.0f %5.0f %7.0f %5.1f %6.0f | %7.0f %7.0f | %6.0f %6.0f %6s\n' "$who" \
    "$(get "$who" iperf_gbps)" "$(get "$who" iperf_cpu)" \
    "$(get "$who" close_rps)" "$(get "$who" close_p50)" "$(get "$who" close_p99)" \
    "$(get "$who" close_err)" "$(get "$who" close_cpu)" "$(get "$who" close_us)" "$(get "$who" close_calls)" \
    "$(get "$who" close_ngxus)" \
    "$(get "$who" cfb_p50)" "$(get "$who" cfb_p99)" "$(get "$who" ka_p50)" "$(get "$who" ka_p99)" "$added"
done

if [[ -s $WORK/mem ]]; then
  echo
  echo "memory per open connection (RSS with the clients open - before, / clients), bytes:"
  printf '%-11s' connections
  for n in $MEM_CONNS; do printf ' %8s' "$n"; done
  echo
  for who in haproxy keelson; do
    printf '%-11s' "$who"
    for n in $MEM_CONNS; do printf ' %8s' "$(awk -v w="$who" -v n="$n" '$1 == w && $2 == n {print $3}' "$WORK/mem")"; done
    echo
  done
fi

[[ -s $WORK/profile ]] && { echo; cat "$WORK/profile"; }

ratio() { awk -v a="$(get keelson "$1")" -v b="$(get haproxy "$1")" 'BEGIN {printf "%.2f", b ? a / b : 0}'; }
# Every round's value, in run order, to show the spread behind a median.
rounds() { awk -v n="$1" -v m="$2" '$1 == n && $2 == m {printf "%s%s", sep, $3; sep = " "}' "$WORK/results"; }
R_TPUT=$(ratio iperf_gbps)
R_CPS=$(ratio close_rps)
R_KA=$(ratio ka_rps)
K_ADD=$(awk -v a="$(get keelson ka_p99)" -v d="$D99" 'BEGIN {print a - d}')
H_ADD=$(awk -v a="$(get haproxy ka_p99)" -v d="$D99" 'BEGIN {print a - d}')
echo
printf 'keelson/haproxy: throughput %s, connections/s %s, keep-alive requests/s %s\n' \
  "$R_TPUT" "$R_CPS" "$R_KA"
printf 'added p99 (ka): keelson %.0f µs, haproxy %.0f µs\n' "$K_ADD" "$H_ADD"
for who in direct haproxy keelson; do
  printf 'per round %-8s iperf3 [%s] close r/s [%s] cfb p99 [%s] ka p99 [%s]\n' "$who" \
    "$(rounds "$who" iperf_gbps)" "$(rounds "$who" close_rps)" "$(rounds "$who" cfb_p99)" "$(rounds "$who" ka_p99)"
done
fail=0
bar() { # part description condition
  if [[ " $PARTS " != *" $1 "* ]]; then echo "bar $2: not run"; return; fi
  if awk "BEGIN {exit !($3)}"; then echo "bar $2: PASS"; else echo "bar $2: FAIL"; fail=1; fi
}
bar iperf "throughput >= haproxy" "$R_TPUT >= 1.0"
bar close "connections/s >= 0.9 x haproxy" "$R_CPS >= 0.9"
bar ka "added p99 <= haproxy's" "$K_ADD <= $H_ADD"
for n in $MEM_CONNS; do
  K_MEM=$(awk -v n="$n" '$1 == "keelson" && $2 == n {print $3}' "$WORK/mem")
  H_MEM=$(awk -v n="$n" '$1 == "haproxy" && $2 == n {print $3}' "$WORK/mem")
  bar mem "memory per open connection <= haproxy's ($n open)" "${K_MEM:-0} <= ${H_MEM:-0}"
done
exit $fail

#!/usr/bin/env bash
# Requests/s of `keelson serve` vs nginx serving the same config bytes, side by side in one
# run: plain HTTP on loopback, wrk with Ignition's own Accept header, keep-alive.
#
# Fairness: each server is pinned to the same single CPU (SERVER_CPU) and wrk to another
# (WRK_CPU), so both servers get exactly one core (keelson's tokio runtime sizes itself
# from the affinity mask; nginx runs one worker). Runs alternate keelson/nginx ROUNDS
# times and the median of each counts, which damps noise from other load on the box.
#
# Env: KEELSON (binary; default target/release/keelson, else target/debug/keelson),
#      KEELSON_AGENT (the static agent the payloads embed; default make agent's),
#      SECS (per run, default 6), ROUNDS (default 5), CONNS (default 32),
#      SERVER_CPU (default 1), WRK_CPU (default 0).
# Bar (docs/architecture.md): keelson >= 0.5 x nginx. Exit 1 below the bar.
set -euo pipefail

cd "$(dirname "$0")/.."
SECS=${SECS:-6}
ROUNDS=${ROUNDS:-5}
CONNS=${CONNS:-32}
SERVER_CPU=${SERVER_CPU:-1}
WRK_CPU=${WRK_CPU:-0}
if [[ -z "${KEELSON:-}" ]]; then
  if [[ -x target/release/keelson ]]; then KEELSON=target/release/keelson; else KEELSON=target/debug/keelson; fi
fi
[[ -x "$KEELSON" ]] || { echo "no keelson binary at $KEELSON (cargo build -p keelson)" >&2; exit 1; }
# `keelson build` takes only the static x86-64 agent (it checks the ELF header), as nodes do.
AGENT=${KEELSON_AGENT:-target/x86_64-unknown-linux-gnu/release/keelson-agent}
[[ -f "$AGENT" ]] || { echo "no static agent at $AGENT (make agent)" >&2; exit 1; }
for tool in wrk nginx curl openssl taskset ss; do
  command -v "$tool" >/dev/null || { echo "missing $tool (make setup)" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/ks-bench-ign.XXXXXX)
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
    ss -Htln "sport = :$p" | grep -q . || { echo "$p"; return; }
  done
}

# --- a build directory from the example install-config (keelson build --no-image) ---------
DIR=$WORK/out
"$KEELSON" build --config examples/install-config.yaml --out "$DIR" --no-image \
  --agent "$AGENT" --quiet

# --- servers -----------------------------------------------------------------------------
KS_PLAIN=$(free_port); KS_TLS=$(free_port); NGX=$(free_port)
taskset -c "$SERVER_CPU" "$KEELSON" serve --dir "$DIR" \
  --listen "127.0.0.1:$KS_TLS" --listen-plain "127.0.0.1:$KS_PLAIN" 2>"$WORK/keelson.log" &
PIDS+=($!)

mkdir -p "$WORK/nginx/config" "$WORK/nginx/logs"
"$KEELSON" render --config examples/install-config.yaml --role master --dir "$DIR" \
  --agent "$AGENT" | head -c -1 >"$WORK/nginx/config/master"
SIZE=$(stat -c %s "$WORK/nginx/config/master")
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/nginx.pid;
error_log stderr warn;
$( [[ $(id -u) -eq 0 ]] && echo "user root;" )
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  keepalive_requests 1000000;
  open_file_cache max=16;
  client_body_temp_path $WORK/nginx;
  proxy_temp_path $WORK/nginx;
  fastcgi_temp_path $WORK/nginx;
  uwsgi_temp_path $WORK/nginx;
  scgi_temp_path $WORK/nginx;
  server {
    listen 127.0.0.1:$NGX;
    root $WORK/nginx;
    location /config/ { default_type application/json; }
  }
}
EOF
taskset -c "$SERVER_CPU" nginx -p "$WORK/nginx" -c "$WORK/nginx.conf" 2>"$WORK/nginx.log" &
PIDS+=($!)

ACCEPT='application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1'
for i in $(seq 50); do
  curl -sf -o /dev/null "http://127.0.0.1:$KS_PLAIN/healthz" &&
    curl -sf -o /dev/null "http://127.0.0.1:$NGX/config/master" && break
  sleep 0.1
done
# Same bytes from both, or the comparison means nothing.
curl -sf -H "Accept: $ACCEPT" "http://127.0.0.1:$KS_PLAIN/config/master" >"$WORK/ks.json" ||
  { cat "$WORK/keelson.log" >&2; exit 1; }
curl -sf "http://127.0.0.1:$NGX/config/master" >"$WORK/ngx.json" || { cat "$WORK/nginx.log" >&2; exit 1; }
cmp -s "$WORK/ks.json" "$WORK/ngx.json" || { echo "keelson and nginx serve different bytes" >&2; exit 1; }

run_wrk() { # url -> requests/s
  taskset -c "$WRK_CPU" wrk -t1 -c"$CONNS" -d"${SECS}s" -H "Accept: $ACCEPT" "$1" |
    awk '/^Requests\/sec:/ {print $2}
         /Non-2xx or 3xx responses/ {print "non-2xx responses: " $0 > "/dev/stderr"; exit 1}'
}

# shellcheck source=bench/lib/stats.sh
. bench/lib/stats.sh
KS_ALL=(); NGX_ALL=()
for r in $(seq "$ROUNDS"); do
  ks=$(run_wrk "http://127.0.0.1:$KS_PLAIN/config/master")
  ngx=$(run_wrk "http://127.0.0.1:$NGX/config/master")
  printf 'round %d: keelson %s req/s, nginx %s req/s\n' "$r" "$ks" "$ngx"
  KS_ALL+=("$ks"); NGX_ALL+=("$ngx")
done
med_ks=$(printf '%s\n' "${KS_ALL[@]}" | median)
med_ngx=$(printf '%s\n' "${NGX_ALL[@]}" | median)

ratio=$(awk -v a="$med_ks" -v b="$med_ngx" 'BEGIN {printf "%.2f", a / b}')
echo
echo "GET /config/master, ${SIZE}-byte config, plain HTTP on loopback, wrk -t1 -c$CONNS -d${SECS}s,"
echo "servers pinned to CPU $SERVER_CPU, wrk to CPU $WRK_CPU, median of $ROUNDS alternating rounds"
echo "keelson binary: $KEELSON"
printf '%-10s %14s %8s\n' server "requests/s" ratio
printf '%-10s %14.0f %8s\n' nginx "$med_ngx" 1.00
printf '%-10s %14.0f %8s\n' keelson "$med_ks" "$ratio"
if awk -v r="$ratio" 'BEGIN {exit !(r >= 0.5)}'; then
  echo "bar (>= 0.5 x nginx): PASS"
else
  echo "bar (>= 0.5 x nginx): FAIL"
  exit 1
fi

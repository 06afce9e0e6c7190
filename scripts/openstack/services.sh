#!/usr/bin/env bash
# Starts and stops the all-in-one OpenStack's services (docs/openstack.md). No systemd here:
# each service starts from its Debian init script (libvirt, which has none, and RabbitMQ's
# port mapper directly), in dependency order, and must answer before the next starts.
#
#   scripts/openstack/services.sh start [NAME...]
#                                         start what is not running (all, or the named
#                                         ones); a service already running is reused and
#                                         left alone
#   scripts/openstack/services.sh stop    stop, by PID, what `start` started (the OpenStack services at once, then their infrastructure newest first)
#   scripts/openstack/services.sh status  one line per service: running (PID) or not
#
# `start` records "name pid starttime" of each service it started in $OS_STATE/started;
# `stop` stops exactly those, and only while that PID is still the same process (its start
# time in /proc matches): after a reboot the file's PIDs may belong to anyone. A service
# that does not come up is named with its log's path.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/openstack/lib.sh
[ "$(id -u)" -eq 0 ] || die "services.sh must run as root"
STARTED=$OS_STATE/started
RUN=/run/keelson-openstack
mkdir -p "$OS_STATE" "$RUN"

# "name pidfile log", in the order they start. First the infrastructure the OpenStack
# services use (D-Bus, database, queue, cache, libvirt): it stops last, one by one.
INFRA_SERVICES=(
  "dbus /run/dbus/pid /etc/init.d/dbus"
  "mariadb /run/mysqld/mysqld.pid /var/log/mysql/error.log"
  "epmd $RUN/epmd.pid /var/log/rabbitmq/epmd.log"
  "rabbitmq-server $RUN/rabbitmq/pid /var/log/rabbitmq/rabbit@localhost.log"
  "memcached /run/memcached/memcached.pid /var/log/memcached.log"
  "virtlogd /run/virtlogd.pid /var/log/libvirt/virtlogd.log"
  "libvirtd /run/libvirtd.pid /var/log/libvirt/libvirtd.log"
)
SERVICES=(
  "${INFRA_SERVICES[@]}"
  "keystone /run/keystone/keystone.pid /var/log/keystone/keystone.log"
  "glance-api /run/glance/glance-api.pid /var/log/glance/glance-api.log"
  "placement-api /run/placement/placement-api.pid /var/log/placement/placement-api.log"
  "nova-api /run/nova/nova-api.pid /var/log/nova/nova-api.log"
  "nova-api-metadata /run/nova/nova-api-metadata.pid /var/log/nova/nova-api-metadata.log"
  "nova-conductor /run/nova/nova-conductor.pid /var/log/nova/nova-conductor.log"
  "nova-scheduler /run/nova/nova-scheduler.pid /var/log/nova/nova-scheduler.log"
  "nova-compute /run/nova/nova-compute.pid /var/log/nova/nova-compute.log"
  "neutron-api /run/neutron/neutron-server.pid /var/log/neutron/neutron-api.log"
  "neutron-rpc-server /run/neutron/neutron-rpc-server.pid /var/log/neutron/neutron-rpc-server.log"
  "neutron-linuxbridge-agent /run/neutron/neutron-linuxbridge-agent.pid /var/log/neutron/neutron-linuxbridge-agent.log"
  "neutron-dhcp-agent /run/neutron/neutron-dhcp-agent.pid /var/log/neutron/neutron-dhcp-agent.log"
  "neutron-metadata-agent /run/neutron/neutron-metadata-agent.pid /var/log/neutron/neutron-metadata-agent.log"
  "neutron-l3-agent /run/neutron/neutron-l3-agent.pid /var/log/neutron/neutron-l3-agent.log"
  "api-front $RUN/api-front.pid /var/log/keelson-openstack-api-front.log"
  "heat-api /run/heat/heat-api.pid /var/log/heat/heat-api.log"
  "heat-engine /run/heat/heat-engine.pid /var/log/heat/heat-engine.log"
)

# The kernel's start time of process $1 (clock ticks since boot; /proc/PID/stat field 22,
# read after the command name, which may hold spaces).
start_time() { [ -r "/proc/$1/stat" ] && sed 's/^.*) //' "/proc/$1/stat" | cut -d' ' -f20; }

pid_of() { local p; [ -s "$1" ] && p=$(tr -dc 0-9 < "$1") && [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo "$p"; }

# How each one starts (default: its init script).
launch() {
  case $1 in
    epmd)
      # RabbitMQ's port mapper, on loopback only (erl would start one on every address).
      mkdir -p /var/log/rabbitmq
      start-stop-daemon --start --quiet --background --make-pidfile --pidfile "$RUN/epmd.pid" \
        --chuid rabbitmq --output /var/log/rabbitmq/epmd.log --exec /usr/bin/epmd -- -address 127.0.0.1 ;;
    rabbitmq-server)
      # Not by its init script: that one deletes the PID file when `rabbitmqctl wait`
      # gives up early on a slow host, and the broker then runs unrecorded. The broker
      # writes its own PID (beam's, not the wrapper shell's) once it has booted.
      install -d -o rabbitmq -g rabbitmq "$RUN/rabbitmq"
      RABBITMQ_PID_FILE=$RUN/rabbitmq/pid start-stop-daemon --start --quiet --background \
        --chuid rabbitmq --exec /usr/sbin/rabbitmq-server ;;
    virtlogd) mkdir -p /var/log/libvirt && virtlogd -d ;;
    api-front) haproxy -f /etc/keelson-openstack/api-front.cfg 2>>/var/log/keelson-openstack-api-front.log ;;
    libvirtd) libvirtd -d ;;
    *) /etc/init.d/"$1" start >/dev/null ;;
  esac
}

# ready NAME: succeeds once the service answers.
ready() {
  case $1 in
    dbus) [ -S /run/dbus/system_bus_socket ] ;;
    mariadb) mysqladmin --connect-timeout=2 ping ;;
    epmd) epmd -names ;;
    rabbitmq-server) rabbitmqctl -q await_startup ;;
    memcached) timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/11211' ;;
    virtlogd) [ -S /run/libvirt/virtlogd-sock ] ;;
    libvirtd) virsh -c qemu:///system version ;;
    keystone) curl -sf "http://$OS_HOST:5000/v3" ;;
    glance-api) curl -sf "http://$OS_HOST:9292/versions" ;;
    placement-api) curl -sf "http://$OS_HOST:8778/" ;;
    nova-api) curl -sf "http://$OS_HOST:8774/" ;;
    nova-api-metadata) curl -s -o /dev/null "http://$OS_HOST:8775/" ;;
    neutron-api) curl -sf "http://$OS_HOST:9696/" ;;
    heat-api) curl -sf "http://$OS_HOST:8004/" ;;
    api-front) curl -sf "http://$OS_PUBLIC_API:9292/versions" ;;
    # RPC services and agents: alive a few seconds after start (their reports are checked
    # by bootstrap.sh through the APIs).
    *) sleep 2; [ -n "$(pid_of "$2")" ] ;;
  esac
}

# start [NAME...]: the named services (default: all), in the table's order.
start() {
  local entry name pidfile logf pid t0
  for entry in "${SERVICES[@]}"; do
    read -r name pidfile logf <<<"$entry"
    if (($#)) && [[ " $* " != *" $name "* ]]; then continue; fi
    if pid=$(pid_of "$pidfile"); then
      log "$name: already running (PID $pid), reused"
      continue
    fi
    t0=$(date +%s.%N)
    rm -f "$pidfile"
    launch "$name" || true
    if ! wait_for 120 "$name's PID" pid_of "$pidfile"; then
      die "$name did not start; see $logf"
    fi
    pid=$(pid_of "$pidfile")
    echo "$name $pid $(start_time "$pid")" >> "$STARTED"
    if ! wait_for 120 "$name" ready "$name" "$pidfile"; then
      pid_of "$pidfile" >/dev/null || die "$name (PID $pid) exited after starting; see $logf"
      # Not left running half-started: a later start would take it for a working one.
      stop_pid "$name" "$pid"
      die "$name (PID $pid) ran but did not answer within 120 s (stopped); see $logf"
    fi
    log "$name: started (PID $pid) in $(printf '%.1f' "$(echo "$(date +%s.%N) - $t0" | bc)") s"
  done
}

# stop_pid NAME PID: TERM, up to 30 s, then KILL.
stop_pid() {
  local name=$1 pid=$2 i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 300; i++)); do
    kill -0 "$pid" 2>/dev/null || { log "$name (PID $pid) stopped"; return 0; }
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  log "$name (PID $pid) killed after 30 s"
}

# is_infra NAME: whether NAME is one of INFRA_SERVICES.
is_infra() {
  local entry
  for entry in "${INFRA_SERVICES[@]}"; do
    [ "${entry%% *}" = "$1" ] && return 0
  done
  return 1
}

# stop_service NAME PID: stops one service started by `start`, with what it started.
stop_service() {
  local name=$1 pid=$2 f dom
  # What Neutron's agents started for the cluster's networks (dnsmasq, the metadata
  # haproxy in each DHCP and router namespace) goes with the agents that started it.
  if [ "$name" = neutron-dhcp-agent ] || [ "$name" = neutron-l3-agent ]; then
    for f in /var/lib/neutron/dhcp/*/pid /var/lib/neutron/external/pids/*.pid; do
      # Only while the file names one of them (a file from before a reboot may not).
      [ -s "$f" ] && grep -qxE 'dnsmasq|haproxy' "/proc/$(cat "$f")/comm" 2>/dev/null &&
        stop_pid "$(basename "$(dirname "$f")")/$(basename "$f")" "$(cat "$f")"
    done
  fi
  # Guests libvirt still runs go with it (the run deletes its servers first).
  if [ "$name" = libvirtd ]; then
    for dom in $(virsh -c qemu:///system list --name 2>/dev/null); do
      virsh -c qemu:///system destroy "$dom" >/dev/null 2>&1 && log "guest $dom destroyed"
    done
  fi
  stop_pid "$name" "$pid"
}

# The OpenStack services (each takes ~3 s to stop, Heat's and Nova's graceful shutdown)
# stop all at once, then the infrastructure they use, newest first: 73 s one by one in the
# fresh-clone CI of 2026-11-26.
stop() {
  [ -s "$STARTED" ] || { log "nothing to stop: no service was started by services.sh start"; return 0; }
  local lines name pid started infra=()
  mapfile -t lines < "$STARTED"
  for ((i = ${#lines[@]} - 1; i >= 0; i--)); do
    read -r name pid started <<<"${lines[i]}"
    if [ -z "$started" ] || [ "$(start_time "$pid" || true)" != "$started" ]; then
      log "$name (PID $pid) is not running any more (that PID is not the process started); skipped"
      continue
    fi
    if is_infra "$name"; then
      infra+=("$name $pid")
    else
      stop_service "$name" "$pid" &
    fi
  done
  wait
  for line in "${infra[@]}"; do
    # shellcheck disable=SC2086 # name and PID, split on purpose
    stop_service $line
  done
  rm -f "$STARTED"
}

status() {
  local entry name pidfile logf pid
  for entry in "${SERVICES[@]}"; do
    read -r name pidfile logf <<<"$entry"
    if pid=$(pid_of "$pidfile"); then echo "$name running (PID $pid)"; else echo "$name stopped"; fi
  done
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: services.sh start|stop|status" ;;
esac

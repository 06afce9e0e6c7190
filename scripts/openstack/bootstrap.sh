#!/usr/bin/env bash
# The one-time set-up of the all-in-one OpenStack's state, idempotently (docs/openstack.md):
#
#   bootstrap.sh databases   the databases, their users and RabbitMQ's user, then every
#                            service's schema (needs mariadb and rabbitmq-server running)
#   bootstrap.sh keystone    the service users, endpoints and Heat's domain (needs keystone)
#   bootstrap.sh cloud       the compute host mapped to its cell, the flavors the cluster
#                            boots with (needs every service)
#
# Each step leaves a marker in $OS_STATE named after it and STATE_VERSION; a later run skips
# a step whose marker is there (a schema sync alone takes minutes on this host).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/openstack/lib.sh
[ "$(id -u)" -eq 0 ] || die "bootstrap.sh must run as root"
# Bump when a step changes what it sets up.
STATE_VERSION=1
PW=$(os_password)

done_marker() { echo "$OS_STATE/$1.v$STATE_VERSION.done"; }
# as USER COMMAND...: runs a service's management command as the service's user, its
# output in $OS_STATE/bootstrap.log (printed when it fails).
as() {
  local user=$1
  shift
  if ! runuser -u "$user" -- "$@" >> "$OS_STATE/bootstrap.log" 2>&1; then
    tail -n 30 "$OS_STATE/bootstrap.log" >&2
    die "$* failed (as $user); the whole output is in $OS_STATE/bootstrap.log"
  fi
}

databases() {
  local d
  for d in keystone glance placement nova_api nova nova_cell0 neutron heat; do
    local user=$d
    case $d in nova_api | nova_cell0) user=nova ;; esac
    mysql -e "CREATE DATABASE IF NOT EXISTS $d;
      GRANT ALL PRIVILEGES ON $d.* TO '$user'@'localhost' IDENTIFIED BY '$PW';
      GRANT ALL PRIVILEGES ON $d.* TO '$user'@'127.0.0.1' IDENTIFIED BY '$PW';"
  done
  rabbitmqctl -q list_users | grep -q '^openstack' || rabbitmqctl -q add_user openstack "$PW" >/dev/null
  rabbitmqctl -q change_password openstack "$PW" >/dev/null
  rabbitmqctl -q set_permissions openstack '.*' '.*' '.*' >/dev/null
  local m
  m=$(done_marker schemas)
  [ -e "$m" ] && { log "schemas: done before ($m)"; return 0; }
  local t0=$SECONDS
  as keystone keystone-manage db_sync
  as root keystone-manage fernet_setup --keystone-user keystone --keystone-group keystone
  as root keystone-manage credential_setup --keystone-user keystone --keystone-group keystone
  as root keystone-manage bootstrap --bootstrap-password "$PW" \
    --bootstrap-admin-url "http://$OS_HOST:5000/v3/" \
    --bootstrap-internal-url "http://$OS_HOST:5000/v3/" \
    --bootstrap-public-url "http://$OS_HOST:5000/v3/" \
    --bootstrap-region-id "$OS_REGION"
  as glance glance-manage db_sync
  as placement placement-manage db sync
  as nova nova-manage api_db sync
  as nova nova-manage cell_v2 map_cell0
  runuser -u nova -- nova-manage cell_v2 list_cells 2>/dev/null | grep -q ' cell1 ' ||
    as nova nova-manage cell_v2 create_cell --name=cell1
  as nova nova-manage db sync
  as neutron neutron-db-manage --config-file /etc/neutron/neutron.conf \
    --config-file /etc/neutron/plugins/ml2/ml2_conf.ini upgrade head
  as heat heat-manage db_sync
  touch "$m"
  log "schemas: every service's database synced in $((SECONDS - t0)) s"
}

keystone() {
  local m
  # keystone-2: the image service's public endpoint on the external network.
  m=$(done_marker keystone-2)
  [ -e "$m" ] && { log "keystone: registered before ($m)"; return 0; }
  os_admin_env
  /usr/bin/python3 scripts/openstack/register.py "$PW" "$OS_REGION" "$OS_PUBLIC_API" >&2
  touch "$m"
}

# Whether Placement has a resource provider with VCPU, MEMORY_MB and DISK_GB inventory (what
# nova-compute reports once it has talked to libvirt).
placement_inventory() {
  local token
  token=$(openstack token issue -f value -c id) || return 1
  python3 - "$token" "http://$OS_HOST:8778" <<'PY'
import json, sys, urllib.request
token, base = sys.argv[1], sys.argv[2]
def get(path):
    req = urllib.request.Request(base + path, headers={
        "X-Auth-Token": token, "OpenStack-API-Version": "placement 1.10"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)
for rp in get("/resource_providers")["resource_providers"]:
    inv = get("/resource_providers/%s/inventories" % rp["uuid"])["inventories"]
    if all(inv.get(c, {}).get("total", 0) > 0 for c in ("VCPU", "MEMORY_MB", "DISK_GB")):
        sys.exit(0)
sys.exit(1)
PY
}

# The newest heartbeat of nova-compute on this host ("Updated At", UTC, ISO 8601).
compute_heartbeat() {
  openstack compute service list --service nova-compute --host "$(hostname)" \
    -f value -c 'Updated At' | sort | tail -n 1
}

# Whether that heartbeat is later than $1 (a record that never reported says "None").
heartbeat_after() {
  local h
  h=$(compute_heartbeat)
  [[ $h == [0-9]* && $h > $1 ]]
}

# Nova schedules only onto a compute host whose service heartbeat is fresh (the scheduler's
# ComputeFilter) and whose resource provider has inventory in Placement; otherwise `server
# create` ends in NoValidHost. A service record's "up" is no proof: after a restart it still
# shows the previous process's last heartbeat for up to 60 s (service_down_time), and the new
# process may take longer than that to report under load. So: wait for a heartbeat newer
# than this wait, then for the inventory.
compute_ready() {
  local since t0=$SECONDS
  since=$(date -u +%Y-%m-%dT%H:%M:%S)
  wait_for 180 "a fresh nova-compute heartbeat" heartbeat_after "$since" ||
    die "nova-compute sent no heartbeat within 180 s (last: $(compute_heartbeat)); see /var/log/nova/nova-compute.log"
  wait_for 120 "nova-compute's inventory in Placement" placement_inventory ||
    die "no resource provider with VCPU, MEMORY_MB and DISK_GB inventory in Placement; see /var/log/nova/nova-compute.log and /var/log/placement/placement-api.log"
  log "nova-compute: fresh heartbeat and inventory in Placement after $((SECONDS - t0)) s"
}

cloud() {
  os_admin_env
  # The compute host in cell1 (once nova-compute has reported to the conductor).
  if ! runuser -u nova -- nova-manage cell_v2 list_hosts 2>/dev/null | grep -q "$(hostname)"; then
    wait_for 120 "nova-compute's service record" \
      bash -c "openstack compute service list --service nova-compute -f value -c State | grep -q up" ||
      die "nova-compute never reported up; see /var/log/nova/nova-compute.log"
    as nova nova-manage cell_v2 discover_hosts >/dev/null
  fi
  compute_ready
  # The flavors: the appliance (it needs 384 MiB; its disk is the image's, grown by Nova),
  # and the RHCOS stand-in's masters (systemd and a 35 MiB initramfs unpacked in memory).
  # hw_rng:allowed lets an image ask for a virtio-rng device (docs/image.md).
  local name ram disk
  for f in "keelson.appliance 384 1" "keelson.rhcos 768 4"; do
    read -r name ram disk <<<"$f"
    openstack flavor show "$name" >/dev/null 2>&1 ||
      openstack flavor create --ram "$ram" --disk "$disk" --vcpus 1 \
        --property hw_rng:allowed=True "$name" >/dev/null
  done
  # neutron-api's first request after a start must not be a port GET: it answers 500 on a
  # lazily loaded database mapping; listing networks first loads it.
  openstack network list >/dev/null
  external_network
}

# The external network (an admin's job on any cloud): flat on the provider veth, shared as
# router:external, its gateway the outside namespace; no DHCP (nothing boots on it).
external_network() {
  openstack network show "$OS_EXTERNAL_NET" >/dev/null 2>&1 ||
    openstack network create --external --provider-network-type flat \
      --provider-physical-network "$OS_PHYSNET" "$OS_EXTERNAL_NET" >/dev/null
  openstack subnet show "$OS_EXTERNAL_NET" >/dev/null 2>&1 ||
    openstack subnet create --network "$OS_EXTERNAL_NET" --subnet-range "$OS_EXTERNAL_CIDR" \
      --gateway "$OS_EXTERNAL_GATEWAY" --allocation-pool "$OS_EXTERNAL_POOL" --no-dhcp \
      "$OS_EXTERNAL_NET" >/dev/null
  log "external network $OS_EXTERNAL_NET ($OS_EXTERNAL_CIDR, gateway $OS_EXTERNAL_GATEWAY)"
}

case "${1:-}" in
  databases) databases ;;
  keystone) keystone ;;
  cloud) cloud ;;
  *) die "usage: bootstrap.sh databases|keystone|cloud" ;;
esac

#!/usr/bin/env bash
# Brings the all-in-one OpenStack up on this machine (docs/openstack.md), idempotently:
# installs Debian's packages if missing, writes the configuration, makes the provider
# network's veth pair, starts every service that is not running (reusing those that are),
# sets up the databases and Keystone the first time, and checks that Nova, Neutron's agents
# and Heat report in. Prints how long each phase took.
#
# Afterwards: `. /var/lib/keelson-openstack/admin-openrc` gives the admin's credentials;
# scripts/openstack/down.sh stops what this started.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/openstack/lib.sh
[ "$(id -u)" -eq 0 ] || die "up.sh must run as root"
phase() { local t=$SECONDS; "$@"; log "phase $1 ${2:-}: $((SECONDS - t)) s"; }
t0=$SECONDS

phase scripts/openstack/install.sh
phase scripts/openstack/configure.sh

# The provider network's "NIC" (no dummy links in this kernel: a veth pair). The
# linuxbridge agent enslaves $OS_PROVIDER_IF to the network's bridge; the other end lives in
# the namespace $OS_OUTSIDE_NS, from where the cluster is checked as a client would see it.
provider() {
  ip netns list | grep -qw "$OS_OUTSIDE_NS" || ip netns add "$OS_OUTSIDE_NS"
  if ! ip link show "$OS_PROVIDER_IF" >/dev/null 2>&1; then
    ip link add "$OS_PROVIDER_IF" type veth peer name "$OS_OUTSIDE_IF" netns "$OS_OUTSIDE_NS"
  fi
  ip link set "$OS_PROVIDER_IF" up
  ip -n "$OS_OUTSIDE_NS" link set lo up
  ip -n "$OS_OUTSIDE_NS" link set "$OS_OUTSIDE_IF" up
  # The external network's gateway (the outside, routing nowhere) and the host's public API
  # address; the linuxbridge agent moves the latter onto the network's bridge with the veth.
  local prefix=${OS_EXTERNAL_CIDR#*/}
  ip -n "$OS_OUTSIDE_NS" addr replace "$OS_EXTERNAL_GATEWAY/$prefix" dev "$OS_OUTSIDE_IF"
  if ! ip -o addr show | grep -q " inet $OS_PUBLIC_API/"; then
    ip addr add "$OS_PUBLIC_API/$prefix" dev "$OS_PROVIDER_IF"
  fi
}
phase provider

phase scripts/openstack/services.sh start dbus mariadb epmd rabbitmq-server memcached virtlogd libvirtd
phase scripts/openstack/bootstrap.sh databases
phase scripts/openstack/services.sh start keystone
phase scripts/openstack/bootstrap.sh keystone
phase scripts/openstack/services.sh start

agents() {
  os_admin_env
  local want="Linux bridge agent|DHCP agent|Metadata agent|L3 agent" alive
  wait_for 120 "Neutron's agents" bash -c \
    "[ \$(openstack network agent list -f value -c 'Agent Type' -c Alive | grep -E '^($want) True' | wc -l) -ge 4 ]" ||
    die "Neutron's agents did not all report alive: $(openstack network agent list -f value -c 'Agent Type' -c Alive | tr '\n' ';'); see /var/log/neutron/"
  wait_for 120 "heat-engine" bash -c "openstack orchestration service list -f value -c Status | grep -q up" ||
    die "heat-engine did not report up; see /var/log/heat/heat-engine.log"
}
phase agents
phase scripts/openstack/bootstrap.sh cloud

(umask 077; os_admin_env; env | grep '^OS_' | sed 's/^/export /' > "$OS_STATE/admin-openrc")
log "up in $((SECONDS - t0)) s; credentials in $OS_STATE/admin-openrc"

#!/usr/bin/env bash
# Stops, by PID, the OpenStack services scripts/openstack/up.sh started on this machine
# (those it found running are left alone), then removes what the network agents left in
# the host's own network namespace once they are gone: the provider veth pair and its
# outside namespace, the cluster network's bridges, Neutron's iptables and ebtables rules.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/openstack/lib.sh
[ "$(id -u)" -eq 0 ] || die "down.sh must run as root"
scripts/openstack/services.sh stop
status=$(scripts/openstack/services.sh status)
if ! grep -q '^neutron-linuxbridge-agent running' <<<"$status"; then
  for br in $(ip -o link show type bridge | awk -F': ' '{print $2}' | grep '^brq' || true); do
    ip link del "$br" && log "bridge $br removed"
  done
  for vx in $(ip -o link show type vxlan | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^vxlan-' || true); do
    ip link del "$vx"
  done
  # The routers' and DHCP servers' namespaces the agents left (their devices went with the
  # bridges above).
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^(qrouter|qdhcp)-' || true); do
    ip netns del "$ns"
  done
  ip link del "$OS_PROVIDER_IF" 2>/dev/null && log "veth $OS_PROVIDER_IF removed" || true
  ip netns del "$OS_OUTSIDE_NS" 2>/dev/null || true
  # The harness's machine-network namespace, if a run was killed before removing it.
  ip netns del kos-machine 2>/dev/null || true
  # Neutron's rules only (its chains are all named neutron-*; its ebtables chains
  # neutronARP-*/neutronMAC-*), in the tables it uses.
  for t in filter raw mangle nat; do
    for cmd in iptables ip6tables; do
      rules=$($cmd-save -t "$t" 2>/dev/null) || continue
      grep -q neutron <<<"$rules" || continue
      grep -v -e neutron <<<"$rules" | $cmd-restore -T "$t" 2>/dev/null ||
        log "$cmd -t $t: could not remove Neutron's rules"
    done
  done
  ebtables -t nat -L 2>/dev/null | grep -q neutron && {
    for c in $(ebtables -t nat -L | awk '/^Bridge chain: neutron/ {print $3}' | tr -d ,); do
      ebtables -t nat -F "$c"; done
    ebtables -t nat -F PREROUTING 2>/dev/null || true
    for c in $(ebtables -t nat -L | awk '/^Bridge chain: neutron/ {print $3}' | tr -d ,); do
      ebtables -t nat -X "$c"; done
  } || true
fi
log "down"

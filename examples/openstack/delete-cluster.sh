#!/bin/sh
# Deletes a keelson cluster that examples/openstack/create-cluster.sh made (docs/openstack.md):
# everything tagged keelson-cluster=<name> in this project, in dependency order — servers,
# ports (which detaches the floating IPs), the router's interface, the router,
# the security group, the subnet and the network, the images — and nothing else: another cluster in the project, an untagged
# resource of the same name and the floating IPs (yours, from install-config; deleting their
# ports detaches them) are left alone. It can be run again: what is gone is not looked for
# twice, and a run that finds nothing says so.
#
#   CLUSTER=ocp4 examples/openstack/delete-cluster.sh      (default: out/openstack.json's)
set -eu
OUT=${OUT:-out}
if [ -z "${CLUSTER:-}" ]; then
  [ -r "$OUT/openstack.json" ] ||
    { echo "delete-cluster: set CLUSTER= (or OUT= to keelson build's output)" >&2; exit 1; }
  CLUSTER=$(jq -r .cluster "$OUT/openstack.json")
fi
TAG="keelson-cluster=$CLUSTER"
say() { echo "delete-cluster: $*"; }

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
lookup() {
  what=$1
  shift
  openstack "$@" -f json > "$T/$what.json" 2> "$T/$what.err" || echo "$*" > "$T/$what.failed"
}
lookup servers --os-compute-api-version 2.26 server list --tags "$TAG" &
lookup routers router list --tags "$TAG" &
lookup ports port list --long --tags "$TAG" &
lookup groups security group list --tags "$TAG" &
lookup subnets subnet list --tags "$TAG" &
lookup networks network list --tags "$TAG" &
lookup images image list --tag "$TAG" &
wait
for f in "$T"/*.failed; do
  [ -e "$f" ] || continue
  echo "delete-cluster: openstack $(cat "$f") failed: $(cat "${f%.failed}.err")" >&2
  exit 1
done
ids() { jq -r '.[].ID' "$T/$1.json"; }
DELETED=0
gone() { DELETED=$((DELETED + $(echo "$2" | wc -w))); say "deleted $1: $(echo "$2" | tr '\n' ' ')"; }

# Servers first (their ports go next), waited for until Nova no longer lists them.
SERVERS=$(ids servers)
if [ -n "$SERVERS" ]; then
  # shellcheck disable=SC2086 # a list of IDs
  openstack server delete $SERVERS
  i=0
  while [ -n "$(openstack --os-compute-api-version 2.26 server list --tags "$TAG" -f value -c ID)" ]; do
    i=$((i + 1))
    [ "$i" -lt 150 ] || { echo "delete-cluster: servers still there after 300 s" >&2; exit 1; }
    sleep 2
  done
  gone servers "$(jq -r '.[].Name' "$T/servers.json")"
fi
# Ports (the nodes', the VIPs'; deleting a VIP's port detaches its floating IP, which the
# router's gateway and interface are kept for until then).
PORTS=$(jq -r '.[] | select(."Device Owner" != "network:router_interface") | .ID' "$T/ports.json")
# shellcheck disable=SC2086 # lists of IDs
[ -z "$PORTS" ] || { openstack port delete $PORTS; gone ports "$PORTS"; }
# The routers: their interfaces on the cluster's subnets, then themselves (with their
# gateways).
for router in $(ids routers); do
  for subnet in $(ids subnets); do
    # Not there (a run stopped after removing it) is no error; anything else shows at the
    # router's delete.
    openstack router remove subnet "$router" "$subnet" 2>/dev/null || true
  done
  openstack router delete "$router"
  gone router "$router"
done
# Then the security group, the subnets and networks (with the ports Neutron made there:
# DHCP's), the images.
SECGROUPS=$(ids groups)
# shellcheck disable=SC2086
[ -z "$SECGROUPS" ] || { openstack security group delete $SECGROUPS; gone "security group" "$SECGROUPS"; }
SUBNETS=$(ids subnets)
# shellcheck disable=SC2086
[ -z "$SUBNETS" ] || { openstack subnet delete $SUBNETS; gone subnets "$SUBNETS"; }
NETWORKS=$(ids networks)
# shellcheck disable=SC2086
[ -z "$NETWORKS" ] || { openstack network delete $NETWORKS; gone networks "$NETWORKS"; }
IMAGES=$(ids images)
# shellcheck disable=SC2086
[ -z "$IMAGES" ] || { openstack image delete $IMAGES; gone images "$(jq -r '.[].Name' "$T/images.json")"; }

if [ "$DELETED" -eq 0 ]; then
  say "nothing to delete: no resource in this project is tagged $TAG"
else
  say "cluster $CLUSTER deleted ($DELETED resources tagged $TAG)"
fi

#!/bin/sh
# Hosts out/bootstrap.ign in Glance and writes out/bootstrap.pointer.ign, the small config
# the bootstrap boots from instead (docs/openstack.md, "A bootstrap config over the
# user_data limit"). Nova takes at most 65,535 bytes of base64 as user_data; a bootstrap
# config carrying your distribution's own (OpenShift's is hundreds of KiB) does not fit.
# As OpenShift's installer does for its own bootstrap: the config becomes an image of the
# cluster's (tagged keelson-cluster=<name>; reused when its checksum matches), and the
# pointer merges it from the image service's public endpoint, `<endpoint>/v2/images/<id>/file`,
# with this session's token as X-Auth-Token, its sha512 checked (`keelson pointer`).
#
# The token is valid as long as Keystone says (an hour by default): boot the bootstrap
# within that time. A bootstrap that boots again later cannot fetch its config any more:
# run this again and boot it anew.
#
# create-cluster.sh runs it when the bootstrap config is too large (or HOST_BOOTSTRAP=always);
# with Heat, run it yourself and pass the pointer:
#   openstack stack create -t out/openstack.yaml \
#     --parameter-file bootstrap_user_data=out/bootstrap.pointer.ign ... ocp4
set -eu
OUT=${OUT:-out}
KEELSON=${KEELSON:-keelson}
CLUSTER=${CLUSTER:-$(jq -r .cluster "$OUT/openstack.json")}
TAG="keelson-cluster=$CLUSTER"
NAME="$CLUSTER-bootstrap-ignition"
say() { echo "host-bootstrap: $*"; }

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
openstack token issue -f json > "$T/token.json" &
openstack catalog show image -f json > "$T/catalog.json" &
openstack image list --long --tag "$TAG" -f json > "$T/images.json" &
wait
for f in token catalog images; do
  [ -s "$T/$f.json" ] || { echo "host-bootstrap: looking up the $f failed" >&2; exit 1; }
done
ENDPOINT=$(jq -r '[.endpoints[] | select(.interface == "public")][0].url // empty' "$T/catalog.json")
[ -n "$ENDPOINT" ] || { echo "host-bootstrap: the catalog has no public image endpoint" >&2; exit 1; }

sum=$(md5sum < "$OUT/bootstrap.ign" | cut -d' ' -f1)
ID=$(jq -r --arg n "$NAME" --arg s "$sum" '.[] | select(.Name == $n and .Checksum == $s) | .ID' "$T/images.json" | head -n 1)
if [ -n "$ID" ]; then
  say "exists: image $NAME ($ID), the same bootstrap.ign"
else
  OLD=$(jq -r --arg n "$NAME" '.[] | select(.Name == $n) | .ID' "$T/images.json")
  ID=$(openstack image create --disk-format raw --container-format bare \
    --file "$OUT/bootstrap.ign" --tag "$TAG" "$NAME" -f value -c id)
  say "created image $NAME ($ID) from $OUT/bootstrap.ign"
  # shellcheck disable=SC2086 # a list of IDs
  [ -z "$OLD" ] || openstack image delete $OLD
fi
set -- --for "$OUT/bootstrap.ign" --source "${ENDPOINT%/}/v2/images/$ID/file" \
  --header "X-Auth-Token=$(jq -r .id "$T/token.json")" --out "$OUT/bootstrap.pointer.ign"
# The appliance trusts only the CAs a config names: your cloud's, for an https:// endpoint.
[ -z "${OS_CACERT:-}" ] || set -- "$@" --ca "$OS_CACERT"
"$KEELSON" pointer "$@"

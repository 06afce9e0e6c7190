#!/bin/sh
# Boots a keelson cluster on OpenStack from `keelson build`'s output (docs/openstack.md): the
# images, the machine network with a router to the external network, the security group
# (least privilege), a port per VIP with its floating IP, one port per node with both VIPs
# as allowed address pairs, then the bootstrap, the masters and the workers with their
# Ignition configs as user_data — the bootstrap's hosted in Glance when it is too large for
# user_data (or HOST_BOOTSTRAP=always), booting from a pointer to it.
#
# Run it with your cloud's credentials loaded (`. openrc`, or OS_CLOUD). It converges: every
# resource is named after the cluster, tagged keelson-cluster=<name> and looked up before it
# is made, so a second run changes nothing and says so, and examples/openstack/
# delete-cluster.sh removes exactly what it made. Everything it checks (a name another
# cluster uses, a missing external network, a floating IP in use) stops it before it changes
# anything. The VIPs, the machine network, its pool, the ports, the nodes and the floating
# IPs come from out/cluster.json and out/openstack.json; the rest can be changed through the
# environment below. `make openstack-cluster` runs this file as is.
set -eu
OUT=${OUT:-out}                             # keelson build --out
KEELSON=${KEELSON:-keelson}                 # writes the hosted bootstrap's pointer
PLAN=$OUT/openstack.json
CLUSTER_JSON=$OUT/cluster.json
for f in "$PLAN" "$CLUSTER_JSON"; do
  [ -r "$f" ] || { echo "create-cluster: $f: not found; run keelson build --out $OUT first" >&2; exit 1; }
done
plan() { jq -r "$1 // empty" "$PLAN"; }
CLUSTER=${CLUSTER:-$(plan .cluster)}        # names every resource; its tag
MASTERS=${MASTERS-$(jq -r '[.nodes[] | select(.role == "master") | .name] | join(" ")' "$PLAN")}
WORKERS=${WORKERS-$(jq -r '[.nodes[] | select(.role == "worker") | .name] | join(" ")' "$PLAN")}
FLAVOR=${FLAVOR:-m1.small}                  # the bootstrap (keelson.qcow2)
MASTER_FLAVOR=${MASTER_FLAVOR:-m1.xlarge}
WORKER_FLAVOR=${WORKER_FLAVOR:-m1.large}
RHCOS_IMAGE=${RHCOS_IMAGE:-rhcos}           # the masters' image (name or ID)
RHCOS_QCOW2=${RHCOS_QCOW2:-}                # uploaded as <cluster>-rhcos when set
WORKER_IMAGE=${WORKER_IMAGE:-$RHCOS_IMAGE}
CONFIG_DRIVE=${CONFIG_DRIVE:-}              # nodes booted with a config drive; the
                                            # others read the metadata service
# Who may reach what (CIDRs). Everything else is the machine network's alone.
API_SOURCE=${API_SOURCE:-0.0.0.0/0}         # the API, 6443
INGRESS_SOURCE=${INGRESS_SOURCE:-0.0.0.0/0} # ingress, 80 and 443
STATUS_SOURCE=${STATUS_SOURCE:-$API_SOURCE} # `keelson status` (a client certificate too)
SSH_SOURCE=${SSH_SOURCE:-}                  # SSH, 22: nobody unless named
# install-config's platform.openstack fields; empty: no router, no floating IPs.
EXTERNAL_NETWORK=${EXTERNAL_NETWORK-$(plan .externalNetwork)}
API_FLOATING_IP=${API_FLOATING_IP-$(plan .apiFloatingIp)}
INGRESS_FLOATING_IP=${INGRESS_FLOATING_IP-$(plan .ingressFloatingIp)}
# The bootstrap's config in Glance, booted from a pointer: auto (when it is over Nova's
# 65,535 bytes of base64), always, or never.
HOST_BOOTSTRAP=${HOST_BOOTSTRAP:-auto}

TAG="keelson-cluster=$CLUSTER"
ZONE=$(jq -r '.name + "." + .baseDomain' "$CLUSTER_JSON")
ZONE_TAG="keelson-zone=$ZONE"
MACHINE_CIDR=$(jq -r '.machineNetworks[0]' "$CLUSTER_JSON")
API_VIP=$(jq -r '.apiVips[0]' "$CLUSTER_JSON")
INGRESS_VIP=$(jq -r '.ingressVips[0]' "$CLUSTER_JSON")
VIPS=$(jq -r '(.apiVips + .ingressVips) | join(" ")' "$CLUSTER_JSON")
POOL=$(jq -r '.allocationPool // empty | "start=\(.start),end=\(.end)"' "$PLAN")
NODES="bootstrap $MASTERS $WORKERS"
say() { echo "create-cluster: $*"; }
stop() { echo "create-cluster: $*" >&2; echo "create-cluster: nothing was changed" >&2; exit 1; }
case $HOST_BOOTSTRAP in auto | always | never) ;; *) stop "HOST_BOOTSTRAP=$HOST_BOOTSTRAP: expected auto, always or never" ;; esac

# Every lookup at once (each `openstack` command costs seconds of start-up): what exists in
# this project, and this run's token (its project; the hosted bootstrap's credentials).
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
lookup() {
  what=$1
  shift
  openstack "$@" -f json > "$T/$what.json" 2> "$T/$what.err" || echo "$*" > "$T/$what.failed"
}
lookup token token issue &
lookup images image list --long &
lookup networks network list --long &
lookup subnets subnet list --long &
lookup routers router list --long &
lookup groups security group list &
lookup ports port list --long &
lookup fips floating ip list --long &
lookup servers --os-compute-api-version 2.26 server list --tags "$TAG" &
wait
for f in "$T"/*.failed; do
  [ -e "$f" ] || continue
  stop "openstack $(cat "$f") failed: $(cat "${f%.failed}.err")"
done
PROJECT=$(jq -r .project_id "$T/token.json")

# ours KIND NAME: the IDs of this project's KIND (networks, subnets, routers, groups, ports,
# images) named NAME that carry the cluster's tag; other NAME: those that do not.
ours() { jq -r --arg n "$2" --arg t "$TAG" --arg p "$PROJECT" \
  '.[] | select(.Name == $n and ((.Project // $p) == $p)) | select((.Tags // []) | index($t)) | .ID' "$T/$1.json"; }
other() { jq -r --arg n "$2" --arg t "$TAG" --arg p "$PROJECT" \
  '.[] | select(.Name == $n and ((.Project // $p) == $p)) | select((.Tags // []) | index($t) | not) | .ID' "$T/$1.json"; }

# Checks: nothing below this block changes anything until all of them passed.
check_name() {
  kind=$1 name=$2
  [ -z "$(other "$kind" "$name")" ] ||
    stop "$kind: $name exists in this project without the tag $TAG: another cluster or something else uses the name; set CLUSTER= to another name (keelson build's metadata.name), or rename or delete it"
  [ "$(ours "$kind" "$name" | wc -l)" -le 1 ] ||
    stop "$kind: several named $name carry $TAG; delete the extra ones (openstack ${kind%s} list --tags $TAG)"
}
check_name networks "$CLUSTER"
check_name subnets "$CLUSTER"
check_name groups "$CLUSTER"
[ -z "$EXTERNAL_NETWORK" ] || check_name routers "$CLUSTER"
for n in $NODES api-vip ingress-vip; do check_name ports "$CLUSTER-$n"; done
for n in keelson rhcos bootstrap-ignition; do check_name images "$CLUSTER-$n"; done
NET=$(ours networks "$CLUSTER")
if [ -n "$NET" ] && ! jq -e --arg id "$NET" --arg z "$ZONE_TAG" \
  '.[] | select(.ID == $id) | .Tags | index($z)' "$T/networks.json" >/dev/null; then
  stop "network $CLUSTER is tagged $TAG but not $ZONE_TAG: it belongs to another cluster named $CLUSTER; set CLUSTER= to another name, or delete that cluster (examples/openstack/delete-cluster.sh)"
fi
if [ -n "$API_FLOATING_IP$INGRESS_FLOATING_IP" ] && [ -z "$EXTERNAL_NETWORK" ]; then
  stop "floating IPs $API_FLOATING_IP $INGRESS_FLOATING_IP need a router to an external network: set EXTERNAL_NETWORK= (install-config platform.openstack.externalNetwork)"
fi
EXTERNAL_ID=
if [ -n "$EXTERNAL_NETWORK" ]; then
  EXTERNAL_ID=$(jq -r --arg n "$EXTERNAL_NETWORK" \
    '.[] | select((.Name == $n or .ID == $n) and (."Router Type" == true or ."Router Type" == "External")) | .ID' "$T/networks.json" | head -n 1)
  [ -n "$EXTERNAL_ID" ] ||
    stop "external network $EXTERNAL_NETWORK: not found among the external networks this project sees (openstack network list --external lists them); set EXTERNAL_NETWORK= (install-config platform.openstack.externalNetwork)"
fi
# check_fip ADDRESS VIP-PORT-NAME: exists in this project, on the external network, and
# attached to nothing or to that port already.
check_fip() {
  fip=$(jq -c --arg a "$1" '.[] | select(."Floating IP Address" == $a)' "$T/fips.json")
  [ -n "$fip" ] ||
    stop "floating IP $1: not in this project; create it (openstack floating ip create --floating-ip-address $1 $EXTERNAL_NETWORK) or put one you have in install-config"
  [ "$(echo "$fip" | jq -r '."Floating Network"')" = "$EXTERNAL_ID" ] ||
    stop "floating IP $1 is not on the external network $EXTERNAL_NETWORK"
  port=$(echo "$fip" | jq -r '.Port // empty')
  if [ -n "$port" ] && [ "$port" != "$(ours ports "$2")" ]; then
    stop "floating IP $1 is in use (port $port, $(echo "$fip" | jq -r '."Fixed IP Address"')): detach it (openstack floating ip unset --port $1) or choose another"
  fi
}
[ -z "$API_FLOATING_IP" ] || check_fip "$API_FLOATING_IP" "$CLUSTER-api-vip"
[ -z "$INGRESS_FLOATING_IP" ] || check_fip "$INGRESS_FLOATING_IP" "$CLUSTER-ingress-vip"
has_server() { jq -e --arg n "$1" '.[] | select(.Name == $n)' "$T/servers.json" >/dev/null; }
size=$(wc -c < "$OUT/bootstrap.ign")
base64=$(( (size + 2) / 3 * 4 ))
HOSTED=no
if ! has_server bootstrap; then
  case $HOST_BOOTSTRAP in
    always) HOSTED=yes ;;
    auto) [ "$base64" -le 65535 ] || HOSTED=yes ;;
    never) [ "$base64" -le 65535 ] ||
      stop "bootstrap.ign is $size bytes, $base64 in base64, over Nova's user_data limit of 65535: HOST_BOOTSTRAP=auto hosts it in Glance" ;;
  esac
  [ "$HOSTED" = no ] || command -v "$KEELSON" >/dev/null ||
    stop "the hosted bootstrap needs keelson (KEELSON=path/to/keelson) to write its pointer"
fi

# Converging: each resource made only when missing (counted in a file: some are made in
# command substitutions, which are subshells).
: > "$T/changes"
made() { echo "$*" >> "$T/changes"; say "created $*"; }
there() { say "exists: $*"; }

# image NAME FILE FORMAT [PROPERTY...]: the cluster's image of FILE, reused when its checksum
# matches (a new one replaces it otherwise); prints its ID.
image() {
  name=$1 file=$2 format=$3
  shift 3
  sum=$(md5sum < "$file" | cut -d' ' -f1)
  old=$(ours images "$name")
  for id in $old; do
    if [ "$(jq -r --arg id "$id" '.[] | select(.ID == $id) | .Checksum' "$T/images.json")" = "$sum" ]; then
      there "image $name ($id)" >&2
      echo "$id"
      return
    fi
  done
  id=$(openstack image create --disk-format "$format" --container-format bare --file "$file" \
    --tag "$TAG" "$@" "$name" -f value -c id)
  made "image $name ($id) from $file" >&2
  [ -z "$old" ] || openstack image delete $old
  echo "$id"
}
# The appliance the bootstrap boots (docs/image.md for the properties).
KEELSON_IMAGE=$(image "$CLUSTER-keelson" "$OUT/keelson.qcow2" qcow2 \
  --property hw_qemu_guest_agent=no --property hw_rng_model=virtio \
  --property hw_disk_bus=virtio --property hw_vif_model=virtio --property os_type=linux)
if [ -n "$RHCOS_QCOW2" ]; then
  RHCOS_IMAGE=$(image "$CLUSTER-rhcos" "$RHCOS_QCOW2" qcow2 --property hw_qemu_guest_agent=yes)
fi
[ "$WORKER_IMAGE" != appliance ] || WORKER_IMAGE=$KEELSON_IMAGE
[ "$RHCOS_IMAGE" != appliance ] || RHCOS_IMAGE=$KEELSON_IMAGE

# The machine network: one subnet, DHCP on, the VIPs outside the allocation pool.
if [ -z "$NET" ]; then
  NET=$(openstack network create --tag "$TAG" --tag "$ZONE_TAG" "$CLUSTER" -f value -c id)
  made "network $CLUSTER"
else there "network $CLUSTER"; fi
SUBNET=$(ours subnets "$CLUSTER")
if [ -z "$SUBNET" ]; then
  SUBNET=$(openstack subnet create --network "$NET" --subnet-range "$MACHINE_CIDR" \
    ${POOL:+--allocation-pool "$POOL"} --tag "$TAG" "$CLUSTER" -f value -c id)
  made "subnet $CLUSTER ($MACHINE_CIDR, pool $POOL)"
else there "subnet $CLUSTER"; fi

# The router to the external network (where the floating IPs are).
if [ -n "$EXTERNAL_ID" ]; then
  ROUTER=$(ours routers "$CLUSTER")
  if [ -z "$ROUTER" ]; then
    ROUTER=$(openstack router create --tag "$TAG" "$CLUSTER" -f value -c id)
    made "router $CLUSTER"
  else there "router $CLUSTER"; fi
  if ! jq -e --arg id "$ROUTER" --arg e "$EXTERNAL_ID" \
    '.[] | select(.ID == $id) | ."External gateway info" | tostring | contains($e)' "$T/routers.json" >/dev/null; then
    openstack router set --external-gateway "$EXTERNAL_ID" "$ROUTER"
    made "router $CLUSTER's gateway on $EXTERNAL_NETWORK"
  fi
  if ! jq -e --arg s "$SUBNET" \
    '.[] | select(."Device Owner" == "network:router_interface") | ."Fixed IP Addresses" | tostring | contains($s)' \
    "$T/ports.json" >/dev/null; then
    openstack router add subnet "$ROUTER" "$SUBNET"
    made "router $CLUSTER's interface on subnet $CLUSTER"
  fi
fi

# The security group: the rules of openstack.json, each from its sources (docs/openstack.md).
GROUP=$(ours groups "$CLUSTER")
if [ -z "$GROUP" ]; then
  GROUP=$(openstack security group create --tag "$TAG" \
    --description "keelson cluster $ZONE, least privilege (docs/openstack.md)" "$CLUSTER" -f value -c id)
  made "security group $CLUSTER"
  echo '[]' > "$T/rules.json"
else
  there "security group $CLUSTER"
  openstack security group rule list --ingress "$GROUP" -f json > "$T/rules.json"
fi
cidr_of() {
  case $1 in
    machine) echo "$MACHINE_CIDR" ;; api) echo "$API_SOURCE" ;; ingress) echo "$INGRESS_SOURCE" ;;
    status) echo "$STATUS_SOURCE" ;; ssh) echo "$SSH_SOURCE" ;;
  esac
}
# "protocol min max cidr" of each rule wanted: a rule's machine-network copy is left out when
# another of its sources is anywhere already; a source left empty (SSH) gives no rule.
jq -r '.rules[] | [.protocol, (.portMin // "-" | tostring), (.portMax // "-" | tostring), (.from | join(","))] | join(" ")' "$PLAN" |
  while read -r proto min max from; do
    anywhere=no
    for s in $(echo "$from" | tr , ' '); do [ "$(cidr_of "$s")" != 0.0.0.0/0 ] || anywhere=yes; done
    for s in $(echo "$from" | tr , ' '); do
      cidr=$(cidr_of "$s")
      [ -n "$cidr" ] || continue
      [ "$s" != machine ] || [ "$anywhere" = no ] || continue
      echo "$proto $min $max $cidr"
    done
  done | sort -u > "$T/rules.wanted"
jq -r '.[] | [."IP Protocol", (."Port Range" | if . == "" or . == null then "- -" else sub(":"; " ") end), (."IP Range" // "0.0.0.0/0")] | join(" ")' \
  "$T/rules.json" | sort -u > "$T/rules.have"
comm -23 "$T/rules.wanted" "$T/rules.have" > "$T/rules.missing"
while read -r proto min max cidr; do
  ports=
  [ "$min" = - ] || ports="--dst-port $min:$max"
  # shellcheck disable=SC2086 # $ports is one option and its value, or nothing
  openstack security group rule create --ingress --protocol "$proto" $ports --remote-ip "$cidr" "$GROUP" >/dev/null
  made "rule $proto ${ports#--dst-port } from $cidr"
done < "$T/rules.missing"

# port NAME OPTIONS...: the port NAME, made with OPTIONS when missing; prints its ID.
port() {
  name=$1
  shift
  id=$(ours ports "$name")
  if [ -z "$id" ]; then
    id=$(openstack port create --network "$NET" --tag "$TAG" "$@" "$name" -f value -c id)
    made "port $name" >&2
  else there "port $name" >&2; fi
  echo "$id"
}
# A port holding each VIP, so Neutron gives the address to nobody else and its floating IP
# has a port to point at (as OpenShift's installer makes them).
API_PORT=$(port "$CLUSTER-api-vip" --fixed-ip "subnet=$SUBNET,ip-address=$API_VIP")
INGRESS_PORT=$(port "$CLUSTER-ingress-vip" --fixed-ip "subnet=$SUBNET,ip-address=$INGRESS_VIP")
# attach FIP PORT VIP
attach() {
  if jq -e --arg a "$1" --arg p "$2" '.[] | select(."Floating IP Address" == $a and .Port == $p)' "$T/fips.json" >/dev/null; then
    there "floating IP $1 on $3"
    return
  fi
  openstack floating ip set --port "$2" --fixed-ip-address "$3" "$1"
  made "floating IP $1 on $3"
}
[ -z "$API_FLOATING_IP" ] || attach "$API_FLOATING_IP" "$API_PORT" "$API_VIP"
[ -z "$INGRESS_FLOATING_IP" ] || attach "$INGRESS_FLOATING_IP" "$INGRESS_PORT" "$INGRESS_VIP"

# One port per node, allowed to carry both VIPs (Neutron drops a VIP's traffic otherwise).
pairs=
for vip in $VIPS; do pairs="$pairs --allowed-address ip-address=$vip"; done
for node in $NODES; do
  # shellcheck disable=SC2086 # $pairs is a list of options
  port "$CLUSTER-$node" --security-group "$GROUP" $pairs > "$T/port-$node"
done

# The hosted bootstrap: bootstrap.ign as an image in Glance, booted from a pointer to it
# (host-bootstrap.sh, beside this script).
USER_DATA_BOOTSTRAP=$OUT/bootstrap.ign
if [ "$HOSTED" = yes ]; then
  OUT=$OUT KEELSON=$KEELSON CLUSTER=$CLUSTER sh "$(dirname "$0")/host-bootstrap.sh" > "$T/hosted" ||
    { cat "$T/hosted"; echo "create-cluster: hosting bootstrap.ign failed" >&2; exit 1; }
  cat "$T/hosted"
  grep -q "^host-bootstrap: created" "$T/hosted" && made "the hosted bootstrap config"
  USER_DATA_BOOTSTRAP=$OUT/bootstrap.pointer.ign
  say "bootstrap.ign ($size bytes, $base64 in base64) is hosted in Glance; the bootstrap boots from $USER_DATA_BOOTSTRAP"
fi

# boot NAME IMAGE FLAVOR USER_DATA
boot() {
  if has_server "$1"; then
    there "server $1"
    return
  fi
  drive=
  case " $CONFIG_DRIVE " in *" $1 "*) drive="--config-drive true" ;; esac
  # shellcheck disable=SC2086 # $drive is one option or none
  openstack --os-compute-api-version 2.52 server create --image "$2" --flavor "$3" \
    --port "$(cat "$T/port-$1")" --user-data "$4" --tag "$TAG" $drive "$1" >/dev/null
  made "server $1"
}
boot bootstrap "$KEELSON_IMAGE" "$FLAVOR" "$USER_DATA_BOOTSTRAP"
for m in $MASTERS; do boot "$m" "$RHCOS_IMAGE" "$MASTER_FLAVOR" "$OUT/master.ign"; done
for w in $WORKERS; do boot "$w" "$WORKER_IMAGE" "$WORKER_FLAVOR" "$OUT/worker.ign"; done

CHANGED=$(wc -l < "$T/changes")
if [ "$CHANGED" -eq 0 ]; then
  say "nothing changed: every resource of cluster $CLUSTER ($ZONE) was already there"
else
  say "$CHANGED changes; every resource is tagged $TAG (examples/openstack/delete-cluster.sh removes them)"
fi
echo "DNS records to publish for $ZONE:"
echo "  api.$ZONE.     A  ${API_FLOATING_IP:-$API_VIP}"
echo "  *.apps.$ZONE.  A  ${INGRESS_FLOATING_IP:-$INGRESS_VIP}"
[ -n "$API_FLOATING_IP$INGRESS_FLOATING_IP" ] ||
  echo "  (the VIPs: reachable from the machine network only; floating IPs come from install-config's apiFloatingIP, ingressFloatingIP)"
echo "The cluster from your machine: keelson status --cluster $OUT${API_FLOATING_IP:+ (through $API_FLOATING_IP)}"

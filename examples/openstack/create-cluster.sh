#!/bin/sh
# Boots a keelson cluster on OpenStack from `keelson build`'s output: the image, the machine
# network, the security group, one port per node with both VIPs as allowed address pairs,
# then the bootstrap, the masters and the workers with their Ignition configs as user_data.
# Run it with your cloud's credentials loaded (`. openrc`, or OS_CLOUD); every name below
# can be changed through the environment. `make openstack-cluster` runs this file as is.
set -eu
OUT=${OUT:-out}                             # keelson build --out
CLUSTER=${CLUSTER:-ocp4}                    # tag of every resource; the security group
NETWORK=${NETWORK:-$CLUSTER}                # the machine network: used if it exists
MACHINE_CIDR=${MACHINE_CIDR:-10.0.0.0/16}   # install-config.yaml's machineNetwork
POOL=${POOL:-start=10.0.0.10,end=10.0.0.200} # addresses Neutron hands out: not the VIPs
API_VIP=${API_VIP:-10.0.0.5}
INGRESS_VIP=${INGRESS_VIP:-10.0.0.7}
MASTERS=${MASTERS-master-0 master-1 master-2}
WORKERS=${WORKERS-worker-0 worker-1}
FLAVOR=${FLAVOR:-m1.small}                  # the bootstrap (keelson.qcow2)
MASTER_FLAVOR=${MASTER_FLAVOR:-m1.xlarge}
WORKER_FLAVOR=${WORKER_FLAVOR:-m1.large}
RHCOS_IMAGE=${RHCOS_IMAGE:-rhcos}           # the masters' and workers' image
RHCOS_QCOW2=${RHCOS_QCOW2:-}                # uploaded as $RHCOS_IMAGE when set
WORKER_IMAGE=${WORKER_IMAGE:-$RHCOS_IMAGE}
CONFIG_DRIVE=${CONFIG_DRIVE:-}              # nodes booted with a config drive; the
                                            # others read the metadata service

# The appliance the bootstrap boots (docs/image.md for the properties).
openstack image create --disk-format qcow2 --container-format bare \
  --file "$OUT/keelson.qcow2" --property hw_qemu_guest_agent=no \
  --property hw_rng_model=virtio keelson
if [ -n "$RHCOS_QCOW2" ]; then
  openstack image create --disk-format qcow2 --container-format bare \
    --file "$RHCOS_QCOW2" --property hw_qemu_guest_agent=yes "$RHCOS_IMAGE"
fi

# The machine network: one subnet, DHCP on, the VIPs outside the allocation pool.
openstack network show "$NETWORK" >/dev/null 2>&1 ||
  openstack network create --tag "$CLUSTER" "$NETWORK"
openstack subnet create --network "$NETWORK" --subnet-range "$MACHINE_CIDR" \
  --allocation-pool "$POOL" --tag "$CLUSTER" "$NETWORK"

# VRRP (IP protocol 112) and the service ports: API 6443, API proxy 9445, Ignition 22623,
# 22624, /metrics 22625 (docs/metrics.md), DNS, ingress 80 and 443; the router's stats and
# readiness (1936) from the machine network only; 5353 for mDNS members only.
openstack security group create --description "keelson cluster $CLUSTER" "$CLUSTER"
openstack security group rule create --protocol 112 "$CLUSTER"
for p in 6443 9445 22623 22624 22625 53 80 443; do
  openstack security group rule create --protocol tcp --dst-port "$p" "$CLUSTER"
done
openstack security group rule create --protocol tcp --dst-port 1936 \
  --remote-ip "$MACHINE_CIDR" "$CLUSTER"
openstack security group rule create --protocol udp --dst-port 53 "$CLUSTER"
openstack security group rule create --protocol udp --dst-port 5353 "$CLUSTER"

# One port per node, allowed to carry both VIPs (Neutron drops a VIP's traffic otherwise).
for node in bootstrap $MASTERS $WORKERS; do
  openstack port create --network "$NETWORK" --security-group "$CLUSTER" \
    --allowed-address ip-address="$API_VIP" --allowed-address ip-address="$INGRESS_VIP" \
    --tag "$CLUSTER" "$CLUSTER-$node"
done

# boot NAME IMAGE FLAVOR USER_DATA
boot() {
  drive=
  case " $CONFIG_DRIVE " in *" $1 "*) drive="--config-drive true" ;; esac
  # shellcheck disable=SC2086 # $drive is one option or none
  openstack server create --image "$2" --flavor "$3" --port "$CLUSTER-$1" \
    --user-data "$4" $drive "$1"
}
boot bootstrap keelson "$FLAVOR" "$OUT/bootstrap.ign"
for m in $MASTERS; do boot "$m" "$RHCOS_IMAGE" "$MASTER_FLAVOR" "$OUT/master.ign"; done
for w in $WORKERS; do boot "$w" "$WORKER_IMAGE" "$WORKER_FLAVOR" "$OUT/worker.ign"; done

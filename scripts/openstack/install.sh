#!/usr/bin/env bash
# Installs the all-in-one OpenStack `make openstack-cluster` runs (docs/openstack.md): Debian
# 12's own Zed packages, idempotently, with no service started by the packages (a
# policy-rc.d denies every start; scripts/openstack/start.sh starts them). Then proves it:
# every program and init script the run needs is looked up, and each one missing is named
# with its package.
#
#   scripts/openstack/install.sh           install what is missing, then check
#   scripts/openstack/install.sh --check   check only (exit 1, one line per missing thing)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

# "what package": a command or a file the run uses, and the Debian package providing it.
# The one list; --check and the installer both read it.
OPENSTACK_REQUIRED=(
  # Infrastructure: the database, the message queue, the token cache.
  "mariadbd mariadb-server"
  "/usr/lib/python3/dist-packages/pymysql python3-pymysql"
  "rabbitmq-server rabbitmq-server"
  "memcached memcached"
  "/usr/lib/python3/dist-packages/memcache.py python3-memcache"
  # Identity, images, placement (each API under uwsgi, by its init script).
  "/etc/init.d/keystone keystone"
  "/etc/init.d/glance-api glance-api"
  "/etc/init.d/placement-api placement-api"
  # Compute: libvirt with QEMU (TCG: virt_type=qemu).
  "/etc/init.d/nova-api nova-api"
  "/etc/init.d/nova-conductor nova-conductor"
  "/etc/init.d/nova-scheduler nova-scheduler"
  "/etc/init.d/nova-compute nova-compute"
  "/etc/nova/nova-compute.conf nova-compute-qemu"
  "libvirtd libvirt-daemon-system"
  "virtlogd libvirt-daemon-system"
  "virsh libvirt-clients"
  # Config drives: Nova writes them with genisoimage (nova-compute only recommends it).
  "genisoimage genisoimage"
  "dbus-daemon dbus-daemon"
  # Networking: ML2 + linuxbridge, DHCP with isolated metadata, the metadata proxy.
  "/etc/init.d/neutron-api neutron-api"
  "/etc/init.d/neutron-rpc-server neutron-rpc-server"
  "/etc/init.d/neutron-linuxbridge-agent neutron-linuxbridge-agent"
  "/etc/init.d/neutron-dhcp-agent neutron-dhcp-agent"
  "/etc/init.d/neutron-metadata-agent neutron-metadata-agent"
  # The tenant network's router to the external network, and its floating IPs.
  "/etc/init.d/neutron-l3-agent neutron-l3-agent"
  # The public API front guests reach Glance through (configure.sh).
  "haproxy haproxy"
  "iptables iptables"
  "ebtables ebtables"
  # Orchestration.
  "/etc/init.d/heat-api heat-api"
  "/etc/init.d/heat-engine heat-engine"
  # The client every README command uses, and Heat's.
  "openstack python3-openstackclient"
  "/usr/lib/python3/dist-packages/heatclient python3-heatclient"
)

present() {
  case "$1" in
    /*) [ -e "$1" ] ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}

# Prints "openstack: <what>: not found (apt package <p>)" for every missing entry.
check() {
  local missing=0 entry what pkg
  for entry in "${OPENSTACK_REQUIRED[@]}"; do
    read -r what pkg <<<"$entry"
    present "$what" || { echo "openstack: $what: not found (apt package $pkg)"; missing=1; }
  done
  return $missing
}

if [ "${1:-}" = "--check" ]; then
  check >&2
  exit $?
fi

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
declare -A want=()
for entry in "${OPENSTACK_REQUIRED[@]}"; do
  read -r what pkg <<<"$entry"
  present "$what" || want[$pkg]=1
done

if ((${#want[@]})); then
  echo "openstack: installing ${!want[*]}" >&2
  start=$(date +%s)
  # Keep apt from starting the daemons it installs (start.sh starts them, bound to
  # loopback); setup.sh writes the same file.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
  fi
  # The packages' own questions: no database set-up and no endpoint registration by the
  # maintainer scripts (configure.sh does both, the same way every time).
  for p in keystone glance-common nova-common neutron-common placement-common heat-common; do
    printf '%s %s/configure_db boolean false\n' "$p" "$p"
    printf '%s %s/dbconfig-install boolean false\n' "$p" "$p"
  done | $SUDO debconf-set-selections
  $SUDO apt-get update -qq
  mapfile -t pkgs < <(printf '%s\n' "${!want[@]}" | sort -u)
  # --no-remove: abort rather than remove anything (the QEMU the tests use stays).
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    --no-remove "${pkgs[@]}" >/dev/null
  echo "openstack: installed in $(( $(date +%s) - start )) s" >&2
fi

if ! check >&2; then
  echo "openstack: some packages are still missing after installing (see above)" >&2
  exit 1
fi
echo "openstack: every package the all-in-one OpenStack needs is installed" >&2

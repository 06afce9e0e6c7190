#!/usr/bin/env bash
# Installs what building, testing and benchmarking keelson needs on a fresh Debian 12 machine,
# idempotently, then proves it: every external command the build, the tests, `make
# qemu-cluster` and bench/ run is looked up, and each one missing is named with its package.
#
#   scripts/setup.sh           install what is missing, then check
#   scripts/setup.sh --check   check only (exit 1, one line per missing command)
#
# Daemons installed here (nginx, keepalived, dnsmasq, ...) must not start on their own:
# tests start their own copies inside network namespaces. A policy-rc.d keeps apt from
# starting them during the install and is removed after it: the host is left as it was,
# apart from the packages.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the code runs, derived from it (grep for Command::new, sh(&[...]) and the bench
# scripts): "command package". Keep this table the one list; `--check` and the installer
# both read it.
REQUIRED=(
  # The image and the QEMU cluster.
  "qemu-img qemu-utils"
  "qemu-system-x86_64 qemu-system-x86"
  "xorriso xorriso"
  "mkfs.vfat dosfstools"
  "mcopy mtools"
  "syslinux syslinux"
  "depmod kmod"
  "mkfs.ext4 e2fsprogs"
  "dpkg-deb dpkg"
  "dpkg-query dpkg"
  "apt-get apt"
  # The RHCOS stand-in the QEMU cluster's masters boot (qemu-tests/src/standin/): a Debian
  # root built with mmdebstrap, made into ext4 without mounting it (mkfs.ext4 -d).
  "mmdebstrap mmdebstrap"
  # Payloads: ignition-validate checks the configs of spec 3.0-3.3 (the specs Debian's 2.14 knows).
  "ignition-validate ignition"
  "systemd-analyze systemd"
  # Network-namespace tests and the harness.
  "ip iproute2"
  "ss iproute2"
  # bench/proxy_routed.sh: TCP counters (SYN retransmissions, PAWS drops) per namespace.
  "nstat iproute2"
  "nft nftables"
  "ping iputils-ping"
  "dig bind9-dnsutils"
  "curl curl"
  "sysctl procps"
  "killall psmisc"
  "file file"
  "jq jq"
  "sha256sum coreutils"
  "timeout coreutils"
  "taskset util-linux"
  # scripts/cargo-tests.sh: the static agent built in a session of its own at idle priority.
  "setsid util-linux"
  "chrt util-linux"
  # scripts/previous-agent.sh: the previous version's agent, built from git history, one
  # build at a time.
  "git git"
  "flock util-linux"
  "bc bc"
  # The VRRP test's packet injector (agent/tests/vrrp_election.rs).
  "python3 python3"
  "openssl openssl"
  # Real peers the tests and benchmarks run against.
  "keepalived keepalived"
  # Routing daemons: the appliance image carries BIRD for bgp-mode VIPs; the BGP fabric test
  # and bench/bgp_failover.sh run BIRD and FRR as top-of-rack routers (docs/bgp.md).
  "bird bird2"
  "birdc bird2"
  "vtysh frr"
  "haproxy haproxy"
  # etcd 3.4 forms a cluster through the cluster DNS's SRV records (agent/tests/dns_etcd.rs).
  "etcd etcd-server"
  "etcdctl etcd-client"
  "nsd nsd"
  "dnsmasq dnsmasq-base"
  "dnsperf dnsperf"
  "avahi-daemon avahi-daemon"
  "avahi-browse avahi-utils"
  "avahi-publish avahi-utils"
  # avahi-daemon in a private mount namespace of its own (its pid file is fixed).
  "unshare util-linux"
  "mount mount"
  "dbus-daemon dbus-daemon"
  "nginx nginx-light"
  # `promtool check metrics` checks the agent's /metrics in agent/tests/metrics_roles.rs.
  "promtool prometheus"
  "wrk wrk"
  "iperf3 iperf3"
  # bench/vip_soak.sh: both cores saturated while the VIP holder's apiserver is slow; the
  # segment's loss and jitter (tc netem).
  "stress-ng stress-ng"
  "tc iproute2"
  # Open vSwitch: agent/tests/node_address_ovs.rs moves a node's address onto an OVS br-ex
  # as OpenShift's ovs-configuration does. The test starts its own daemons with ovs-ctl in
  # a namespace (the package's own service is kept from starting, as every daemon here).
  "ovs-vsctl openvswitch-switch"
  # The same test turns off checksum offload on its veths: the userspace datapath this
  # kernel leaves OVS (no openvswitch module) passes on what a veth left unfinished.
  "ethtool ethtool"
  # PROFILE=1 of bench/dns_vs_nsd.sh: system calls per query and a profile.
  "perf linux-perf"
  # `make agent` strips the static agent itself (below the size bar, docs/architecture.md).
  "strip binutils"
)
# Files (not commands) the image builder and the UEFI boot test read: "path package".
REQUIRED_FILES=(
  "/usr/share/ovmf/OVMF.fd ovmf"
  "/usr/lib/syslinux/mbr/gptmbr.bin syslinux-common"
  "/usr/lib/systemd/boot/efi/systemd-bootx64.efi systemd-boot-efi"
  # The Ignition program itself (the test of the Accept header Ignition 2.14 sends).
  "/usr/lib/dracut/modules.d/30ignition/ignition ignition"
  # FRR's daemons, which the BGP fabric test starts as routers (vtysh alone is a client).
  "/usr/lib/frr/zebra frr"
  "/usr/lib/frr/bfdd frr"
  "/usr/lib/frr/bgpd frr"
  # ovs-ctl, which starts ovsdb-server and ovs-vswitchd without systemd.
  "/usr/share/openvswitch/scripts/ovs-ctl openvswitch-switch"
)
# Cargo subcommands `make lint` runs: "command crate". (`make fuzz` installs cargo-fuzz
# itself: minutes of compiling that `make test` does not need.)
REQUIRED_CARGO=(
  "cargo-machete cargo-machete"
)

# Commands live in sbin too; a plain user's PATH may not have it.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

# Prints "<what>: not found (package <p>)" for every missing entry; returns 1 if any.
check() {
  local missing=0 entry cmd pkg
  for entry in "${REQUIRED[@]}"; do
    read -r cmd pkg <<<"$entry"
    command -v "$cmd" >/dev/null 2>&1 || { echo "setup: $cmd: not found (apt package $pkg)"; missing=1; }
  done
  for entry in "${REQUIRED_FILES[@]}"; do
    read -r cmd pkg <<<"$entry"
    [ -e "$cmd" ] || { echo "setup: $cmd: not found (apt package $pkg)"; missing=1; }
  done
  for entry in "${REQUIRED_CARGO[@]}"; do
    read -r cmd pkg <<<"$entry"
    command -v "$cmd" >/dev/null 2>&1 || { echo "setup: $cmd: not found (cargo install $pkg)"; missing=1; }
  done
  [ -e .cache/kernel/.done ] || { echo "setup: .cache/kernel: not unpacked (apt package linux-image-cloud-amd64)"; missing=1; }
  return $missing
}

if [ "${1:-}" = "--check" ]; then
  check >&2
  exit $?
fi

SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo

# Packages of missing commands and files, and packages whose files are missing.
declare -A want=()
for entry in "${REQUIRED[@]}"; do
  read -r cmd pkg <<<"$entry"
  command -v "$cmd" >/dev/null 2>&1 || want[$pkg]=1
done
for entry in "${REQUIRED_FILES[@]}"; do
  read -r path pkg <<<"$entry"
  [ -e "$path" ] || want[$pkg]=1
done

if ((${#want[@]})); then
  echo "setup: installing ${!want[*]}" >&2
  # Keep apt from starting the daemons it installs, for this install only: a policy-rc.d
  # left in place (exit 101) would keep every daemon the machine's owner installs later
  # from starting by itself. One that was there before is the owner's, and stays.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
  fi
  $SUDO apt-get update -qq
  pkgs=("${!want[@]}")
  # QEMU's system emulator and its utilities come from one origin and one version: a base
  # image may carry a newer qemu-utils (backports) that Debian 12's qemu-system-x86 breaks,
  # and apt would resolve that by removing qemu-utils. Ask for both at the version the
  # emulator will have, in the same transaction.
  if [[ -n ${want[qemu-system-x86]:-} || -n ${want[qemu-utils]:-} ]]; then
    qver=$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null || true)
    [ -n "$qver" ] || qver=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ {print $2}')
    pkgs=("${pkgs[@]/#qemu-system-x86/}")
    pkgs=("${pkgs[@]/#qemu-utils/}")
    pkgs+=("qemu-system-x86=$qver" "qemu-utils=$qver")
  fi
  # One transaction; --no-remove makes apt abort rather than remove anything to make room.
  mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | grep -v '^$' | sort -u)
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    --no-remove --allow-downgrades "${pkgs[@]}" >/dev/null
fi

for entry in "${REQUIRED_CARGO[@]}"; do
  read -r cmd crate <<<"$entry"
  if ! command -v "$cmd" >/dev/null 2>&1; then
    echo "setup: cargo install $crate" >&2
    cargo install --quiet --locked "$crate"
  fi
done

# The appliance kernel: Debian's cloud kernel, unpacked (not installed) into .cache/kernel.
KDIR=.cache/kernel
if [ ! -e "$KDIR/.done" ]; then
  echo "setup: fetching linux-image-cloud-amd64" >&2
  rm -rf "$KDIR" && mkdir -p "$KDIR/deb"
  ( cd "$KDIR/deb" && apt-get download -qq "$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')" )
  deb=$(ls "$KDIR"/deb/*.deb)
  dpkg-deb -x "$deb" "$KDIR/root"
  # The package leaves modules.dep to depmod at install time; we unpack instead, so run it.
  kver=$(ls "$KDIR/root/lib/modules")
  depmod -b "$KDIR/root" "$kver"
  { echo "package=$(dpkg-deb -f "$deb" Package)"; echo "version=$(dpkg-deb -f "$deb" Version)";
    echo "sha256=$(sha256sum "$deb" | cut -d' ' -f1)"; } > "$KDIR/package.txt"
  touch "$KDIR/.done"
fi

if ! check >&2; then
  echo "setup: some commands are still missing after installing (see above)" >&2
  exit 1
fi
echo "setup: every command the build, tests, qemu-cluster and bench/ run is present" >&2

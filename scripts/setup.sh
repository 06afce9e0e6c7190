#!/usr/bin/env bash
# Installs what building and testing keelson needs on a fresh Debian machine, idempotently.
# Daemons installed here (nginx, keepalived, dnsmasq, ...) must not start on their own:
# tests start their own copies inside network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  # Ignition: ignition-validate checks every config we write (spec 3.0-3.3).
  ignition
  # Peers the tests and benchmarks run against.
  keepalived haproxy nsd dnsmasq-base bind9-dnsutils dnsperf avahi-daemon avahi-utils dbus-daemon
  nginx-light wrk iperf3
  # Image and QEMU.
  qemu-system-x86 qemu-utils ovmf syslinux syslinux-common systemd-boot-efi
  xorriso dosfstools mtools
  # Tools the tests call.
  iproute2 nftables file jq curl procps psmisc kmod
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  # Keep apt from starting the daemons it installs.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

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
  /sbin/depmod -b "$KDIR/root" "$kver"
  { echo "package=$(dpkg-deb -f "$deb" Package)"; echo "version=$(dpkg-deb -f "$deb" Version)";
    echo "sha256=$(sha256sum "$deb" | cut -d' ' -f1)"; } > "$KDIR/package.txt"
  touch "$KDIR/.done"
fi

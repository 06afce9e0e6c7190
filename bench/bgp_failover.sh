#!/usr/bin/env bash
# Client-seen outage when an API VIP holder dies: BGP anycast through a real routing daemon
# (BIRD 2, and FRR for comparison) against VRRP (keelson and keepalived, the setup of
# bench/vrrp_failover.sh at OpenShift's settings), side by side in one run (the bar:
# BGP's outage at most 0.35 x keepalived's, docs/bgp.md).
#
# BGP: two racks behind top-of-rack routers, a spine with the client, three masters
# (qemu-tests/src/fabric.rs); BFD 300 ms x 3; m2, alone in its rack, dies (its switch port
# goes down, every process in its namespace is stopped and killed). VRRP: two nodes and a
# client on one bridge, 1 s adverts, priority 100 each; the holder dies the same way.
# A client opens a new connection every 50 ms (1 s limit each); the outage is the time from
# the cut to the sending of the last request that failed. Prints every run, the medians,
# each daemon's resident memory on a master, and the bar (BGP <= 0.35 x keepalived).
#
# Usage (root): bench/bgp_failover.sh [runs=5]     DAEMONS=bird|frr|none to narrow the BGP side
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
[ "$(id -u)" = 0 ] || { echo "needs root" >&2; exit 1; }
for c in bird birdc vtysh keepalived; do
    command -v "$c" >/dev/null || { echo "$c not installed: scripts/setup.sh" >&2; exit 1; }
done
make -s agent >/dev/null
cargo build -q --release -p keelson-qemu-tests --bin bgp-failover --bin kube-standin
echo "$(bird --version 2>&1 | head -1); $(/usr/lib/frr/zebra --version 2>&1 | head -1); $(keepalived -v 2>&1 | head -1)"
KEELSON_STANDIN_BIN="$PWD/target/release/kube-standin" nice -n 10 target/release/bgp-failover "$RUNS"

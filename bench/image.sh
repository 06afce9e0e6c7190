#!/usr/bin/env bash
# bench/image.sh: appliance image sizes and the time from QEMU start to the agent's
# `keelson-agent ready:` line under TCG, SeaBIOS and OVMF, one VM at a time.
# Bars: qcow2 <= 40 MiB; ready <= 10 s under TCG.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
make -s setup agent >/dev/null
export KEELSON_AGENT_BIN="$PWD/target/x86_64-unknown-linux-gnu/${AGENT_PROFILE:-release}/keelson-agent"
export KEELSON_BOOT_SEQUENTIAL=1
cargo build -q -p keelson-qemu-tests --tests
for i in $(seq "$RUNS"); do
  cargo test -q -p keelson-qemu-tests --test image_boot -- --nocapture 2>&1 | grep -E '^image' | sed "s/^/run $i: /"
done

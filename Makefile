# keelson: `make test` and `make qemu-cluster` do all their set-up themselves.
SHELL := /bin/bash
TARGET := x86_64-unknown-linux-gnu
# The static agent (docs/architecture.md, "Bars"): the explicit --target keeps the flag off proc-macro crates.
AGENT_PROFILE ?= release
AGENT_BIN := target/$(TARGET)/$(AGENT_PROFILE)/keelson-agent
export KEELSON_AGENT_BIN := $(abspath $(AGENT_BIN))
# The QEMU cluster's stand-in kube-apiserver, shipped in its test image.
export KEELSON_STANDIN_BIN := $(abspath target/$(TARGET)/$(AGENT_PROFILE)/kube-standin)
# The commit the agent reports (agent/build.rs): cargo compares this value, so the static LTO
# agent is rebuilt when the commit changes and only then. Empty outside a git checkout (the
# agent then says `unknown`); set it yourself to build a tarball under its commit.
KEELSON_COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
export KEELSON_COMMIT := $(KEELSON_COMMIT)
# The host tools the cluster targets run (keelson, qemu-cluster, ...), built with the crate
# features `cargo test --workspace --all-targets` unifies (`--examples` takes the dev-
# dependencies' in, jsonschema's regex among them): after make test's cargo phase they are
# fresh, where `cargo build -p keelson -p keelson-qemu-tests` rebuilt 36 crates with another
# feature set (51 s of make test).
HOST_BUILD := cargo build --workspace --examples

.PHONY: all setup agent build image test lint qemu-cluster qemu-day2 openstack-cluster standin bench fuzz proptest-explore clean

all: build

setup:
	@./scripts/setup.sh

# Stripped here as well as by the profile's `strip = true`: with a profile override of its own
# (the agent's opt-level "s", Cargo.toml) cargo's release build kept the symbol table, and the
# static agent is held to a stripped size bar (docs/architecture.md, "Bars").
agent:
	RUSTFLAGS="-C target-feature=+crt-static" cargo build --profile $(AGENT_PROFILE) --target $(TARGET) \
	  -p keelson-agent -p keelson-qemu-tests --bin keelson-agent --bin kube-standin
	strip --strip-all $(AGENT_BIN)

build: setup agent
	cargo build --release -p keelson

image: setup build
	target/release/keelson build --config examples/install-config.yaml --out out

# Style, warnings, and no declared-but-unused dependency (cargo-machete; setup installs it).
lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo machete

# The test command (README, .ci/run): every crate's tests, then the whole cluster under QEMU
# in both configurations: unicast with the masters on the RHCOS stand-in, multicast with
# every node on the appliance (the RHCOS path once is enough; twice would double the time),
# then the bootstrap and one master through a real all-in-one OpenStack (Nova, Neutron,
# Glance; docs/openstack.md), which the run installs, starts and stops itself.
# CI=1: a test that would skip for a missing tool, root or the static agent fails instead,
# and every property test draws from its own fixed seed (`make proptest-explore` explores).
# scripts/selftest.sh checks the set-up, the lint and the harness themselves (its harness
# part runs inside cargo-tests.sh, on the testkit binary that build makes).
# scripts/cargo-tests.sh is `make agent` + `cargo test --workspace --all-targets` + the
# doctests, with the agent, a compile check of every fuzz target and the previous version's
# agent (the upgrade test's, cached) built at idle priority beside the tests that do not need
# them, and those in two lanes (docs/testing.md; TEST_JOBS=1 runs them one at a time,
# AGENT_BACKGROUND=0 builds the agent first).
test: export CI = 1
test: setup
	@mkdir -p target && date +%s > target/.make-test-start
	scripts/timed.sh selftest ./scripts/selftest.sh --before-build
	scripts/timed.sh cargo-tests ./scripts/cargo-tests.sh
	scripts/timed.sh qemu-unicast $(MAKE) --no-print-directory qemu-cluster CONFIG=unicast
	QEMU_CLUSTER_MASTERS=appliance scripts/timed.sh qemu-multicast $(MAKE) --no-print-directory qemu-cluster CONFIG=multicast
	scripts/timed.sh openstack $(MAKE) --no-print-directory openstack-cluster OPENSTACK_ARGS=--subset
	@echo "make test: passed in $$(($$(date +%s) - $$(cat target/.make-test-start))) s"

# Bootstrap, three masters and two workers under QEMU (TCG; ACCEL=kvm where KVM works),
# checked from a network namespace on their segment; prints a table (docs/qemu-cluster.md).
# CONFIG=unicast (default): cluster.json as `keelson build` writes it, on a bridge that drops
# multicast; CONFIG=multicast: VRRP multicast and mDNS on QEMU's multicast socket segment;
# CONFIG=dualstack: IPv4 and IPv6 VIPs and node addresses, every node on the appliance, on a
# learning bridge (not part of `make test`).
CONFIG ?= unicast
# The masters boot the RHCOS stand-in (QEMU_CLUSTER_MASTERS=appliance: the appliance).
qemu-cluster: setup agent
	$(HOST_BUILD) --bin keelson --bin qemu-cluster
	KEELSON_BIN=$(abspath target/debug/keelson) target/debug/qemu-cluster --config $(CONFIG)

# Day-2 operations in the QEMU cluster (docs/operations.md, docs/qemu-cluster.md): the control
# plane as qemu-cluster boots it (masters on the RHCOS stand-in, no workers), then a rolling
# agent upgrade and a membership key rotation with a client through the API VIP (0 failed
# requests expected), and a master replaced by a new one at another address. Not part of `make test`. DAY2_CONFIG=unicast
# runs it on the unicast segment; KEELSON_AGENT_NEW=<binary> rolls out another agent;
# DAY2_SEGMENT=hub runs the multicast configuration on QEMU's multicast socket segment (a hub)
# instead of a learning bridge. DAY2_HANDBACK: the VRRP hand-back window (docs/vrrp.md),
# 30 s as `keelson build` writes for bare metal (the segment has no port security);
# DAY2_HANDBACK= (empty) keeps the example's OpenStack default, off.
DAY2_CONFIG ?= multicast
DAY2_SEGMENT ?= switch
DAY2_HANDBACK ?= 30
qemu-day2: setup agent
	$(HOST_BUILD) --bin keelson --bin qemu-day2
	KEELSON_HANDBACK_SECS=$(DAY2_HANDBACK) KEELSON_BIN=$(abspath target/debug/keelson) target/debug/qemu-day2 --config $(DAY2_CONFIG) --segment $(DAY2_SEGMENT)

# The cluster on a real OpenStack: installs, configures and starts an all-in-one Debian 12
# (Zed) OpenStack on this machine (scripts/openstack/, idempotent; services already running
# are reused), runs the README's script examples/openstack/create-cluster.sh, checks the
# cluster from outside and stops, by PID, what it started (docs/openstack.md).
# OPENSTACK_ARGS=--subset: bootstrap and one master only (what `make test` runs).
openstack-cluster: setup agent
	$(HOST_BUILD) --bin keelson --bin openstack-cluster --bin qemu-cluster
	KEELSON_BIN=$(abspath target/debug/keelson) scripts/openstack/run.sh $(OPENSTACK_ARGS)

# The RHCOS stand-in the masters of qemu-cluster boot (docs/rhcos.md): built with mmdebstrap
# on first use (minutes), then taken from ~/.cache/keelson/standin/ (shared by every clone;
# STANDIN_CACHE=DIR elsewhere). qemu-cluster builds it itself.
standin: setup agent
	$(HOST_BUILD) --bin qemu-cluster
	target/debug/qemu-cluster standin

# Every bench script, each beside its real peer (its header says what it measures, and its bar).
# `build`: the static agent and the release `keelson` (bench/ignition_server.sh serves with
# it: a debug build served a quarter of the release's rate, 31,469 against 127,739 r/s).
bench: setup build
	@for b in bench/*.sh; do echo "== $$b"; bash $$b || exit 1; done

# Every cargo-fuzz target (agent/fuzz/README.md) for FUZZ_SECS seconds each (default 20),
# FUZZ_JOBS at once (default 1), then a summary table; FUZZ_TARGETS="a b" runs some only.
# Not part of `make test`.
fuzz: setup
	@command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
	agent/fuzz/run.sh $(FUZZ_TARGETS)

# Every crate's property tests with fresh random seeds and PROPTEST_CASES cases each
# (default 4096): new cases are found here, not in `make test`, whose seeds are fixed. A
# failure prints its seed (PROPTEST_RNG_SEED=<seed> repeats it) and the line to commit under
# the crate's proptest-regressions/ (docs/testing.md). Not part of `make test`.
PROPTEST_CASES ?= 4096
proptest-explore:
	KEELSON_PROPTEST_EXPLORE=1 PROPTEST_CASES=$(PROPTEST_CASES) cargo test --workspace --lib

clean:
	cargo clean
	rm -rf out .cache

#!/usr/bin/env bash
# The previous version (version N) for the upgrade test (qemu-tests/tests/agent_upgrade.rs,
# docs/testing.md "The upgrade from the previous version"): its agent, its `keelson` (the
# test builds the cluster's files with it, as the user did when they installed N) and its
# examples/install-config.yaml, built from git at PREVIOUS_COMMIT, cached; the agent's path
# is printed on stdout, the other two sit beside it (`keelson`, `install-config.yaml`).
#
#   scripts/previous-agent.sh            build them unless cached; print the agent's path
#   KEELSON_PREVIOUS_COMMIT=<rev> ...    another version N (a commit or a tag: v0.1.0, v0.2.0)
#
# N is release 0.1.0, tagged v0.1.0: ba9a3c9b1e74, the newest commit before the last change
# of an on-the-wire format of docs/operations.md's version-skew table (its child taught
# cluster.json the input-only `vrrp.transport` and `vrrp.handbackSecs`), so N really speaks
# the formats the current agent changed last. The commit is named by its hash, which a clone
# without tags has too.
#
# Cheap: a debug build of the `keelson-agent` and `keelson` binaries alone (dynamically
# linked: the test runs them on this host), from `git archive` of that commit (no
# checkout, no worktree), `--locked` to that commit's Cargo.lock. The binaries are kept in
# ~/.cache/keelson/previous-agent/<commit>/ (PREVIOUS_AGENT_CACHE=DIR elsewhere), shared by
# every clone like the RHCOS stand-in. The build's source and target directories are
# removed after it (the target directory is about 1 GiB; N changes once a release).
set -euo pipefail
cd "$(dirname "$0")/.."

PREVIOUS_COMMIT=ba9a3c9b1e742755f9554470b21d7020427f1a84
rev=${KEELSON_PREVIOUS_COMMIT:-$PREVIOUS_COMMIT}
fail() { echo "previous-agent: FAILED: $*" >&2; exit 1; }

command -v git >/dev/null || fail "git: not found (the previous version is built from this clone's history)"
commit=$(git rev-parse --verify --quiet "$rev^{commit}") ||
  fail "$rev: no such commit in this clone (a shallow clone? git fetch --unshallow)"
cache=${PREVIOUS_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/keelson/previous-agent}
dir=$cache/$commit
bin=$dir/keelson-agent
# .done-2: the cache holds the agent, `keelson` and the example (a cache of the agent alone,
# `.done`, is rebuilt).
if [ -x "$bin" ] && [ -e "$dir/.done-2" ]; then
  echo "$bin"
  exit 0
fi
# One build at a time (make test warms the cache in the background while a test may ask).
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -x "$bin" ] && [ -e "$dir/.done-2" ]; then
  echo "$bin"
  exit 0
fi

short=${commit:0:12}
echo "previous-agent: building keelson-agent and keelson at $short (debug; once per machine, cached in $dir)" >&2
t=$SECONDS
src=$cache/src-$short
target=$cache/target-$short
rm -rf "$src" "$target" "$dir"
mkdir -p "$src" "$dir"
git archive "$commit" | tar -x -C "$src"
# The commit the agent reports (`--version`): the archive has no .git for its build.rs.
(cd "$src" && KEELSON_COMMIT=$short CARGO_TARGET_DIR="$target" \
  cargo build --locked --quiet -p keelson-agent --bin keelson-agent -p keelson --bin keelson) >&2 ||
  fail "cargo build of keelson-agent and keelson at $short (its log above)"
cp "$target/debug/keelson-agent" "$bin"
cp "$target/debug/keelson" "$dir/keelson"
cp "$src/examples/install-config.yaml" "$dir/install-config.yaml"
rm -rf "$src" "$target"
"$bin" --version >&2 || fail "$bin --version"
"$dir/keelson" --version >&2 || fail "$dir/keelson --version"
touch "$dir/.done-2"
echo "previous-agent: built in $((SECONDS - t)) s" >&2
echo "$bin"

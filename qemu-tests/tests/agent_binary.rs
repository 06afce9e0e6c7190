//! The static agent as `make agent` builds it: statically linked and within the size bar of docs/architecture.md ("Bars")
//! size bar (<= 12 MiB stripped), so growth is noticed when it happens.

/// docs/architecture.md, "Bars".
const MAX_BYTES: u64 = 12 * 1024 * 1024;

#[test]
fn the_agent_is_static_stripped_and_small() {
    let Some(agent) = keelson_testkit::require_env(
        "KEELSON_AGENT_BIN",
        "`make test` sets it to the static agent",
    ) else {
        return;
    };
    if !keelson_testkit::require("file") {
        return;
    }
    let size = std::fs::metadata(&agent)
        .unwrap_or_else(|e| panic!("{}: {e}", agent))
        .len();
    assert!(
        size <= MAX_BYTES,
        "{} is {size} bytes, over the {MAX_BYTES}-byte bar",
        agent
    );
    let out = std::process::Command::new("file")
        .arg(&agent)
        .output()
        .expect("running file(1)");
    let what = String::from_utf8_lossy(&out.stdout);
    assert!(
        what.contains("static") && !what.contains("dynamically linked"),
        "{what}"
    );
    assert!(what.contains(", stripped"), "{what}");
}

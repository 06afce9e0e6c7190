//! The defaults docs/cluster-json.md quotes are the ones `keelson build` writes: every table row
//! whose default is a number is compared with the `cluster.json` built from the example
//! install-config, so a changed default fails here until the reference page says it too.

use keelson_cluster::install_config::InstallConfig;
use serde_json::Value;

const DOC: &str = include_str!("../../docs/cluster-json.md");
const EXAMPLE: &str = include_str!("../../examples/install-config.yaml");

/// Where a section of the page lives in the built document (`None`: not in the defaults,
/// such as `bgp`, which only a patch adds).
fn section_value<'v>(built: &'v Value, heading: &str) -> Option<&'v Value> {
    match heading {
        "Top level" => Some(built),
        "`vrrp`" => Some(&built["vrrp"]),
        "`vrrp.instances[]`" => built["vrrp"]["instances"].get(0),
        "`api`" => Some(&built["api"]),
        "`dns`" => Some(&built["dns"]),
        "`ignition`" => Some(&built["ignition"]),
        "`members`" => Some(&built["members"]),
        "`metrics`" => Some(&built["metrics"]),
        _ => None,
    }
}

/// `| \`field\` | type | \`123\` | ...` → (field, 123).
fn numeric_row(line: &str) -> Option<(&str, u64)> {
    let mut cells = line.split('|').map(str::trim).skip(1);
    let field = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
    let _type = cells.next()?;
    let default = cells.next()?.strip_prefix('`')?.strip_suffix('`')?;
    Some((field, default.parse().ok()?))
}

#[test]
fn the_numbers_the_reference_page_quotes_are_the_built_defaults() {
    let ic = InstallConfig::parse(EXAMPLE).expect("the example install-config parses");
    let built: Value = serde_json::from_slice(&ic.cluster_config().to_json()).unwrap();
    let mut heading = String::new();
    let mut compared = Vec::new();
    let mut wrong = Vec::new();
    for line in DOC.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            heading = h.trim().to_owned();
            continue;
        }
        if line.starts_with("### ") {
            // Subsections (health checks) describe shapes, not defaults of one object.
            heading.clear();
            continue;
        }
        let Some((field, documented)) = numeric_row(line) else {
            continue;
        };
        let Some(section) = section_value(&built, &heading) else {
            continue;
        };
        match section.get(field) {
            Some(v) if v.as_u64() == Some(documented) => {
                compared.push(format!("{heading}.{field}"))
            }
            Some(v) => wrong.push(format!(
                "{heading} {field}: the page says {documented}, the build writes {v}"
            )),
            // A field written only when set says so on its row.
            None if line.contains("mitted") => {}
            None => wrong.push(format!(
                "{heading} {field}: the page gives {documented}, the build writes no such field"
            )),
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/cluster-json.md out of step:\n{}",
        wrong.join("\n")
    );
    // The page's tables were read at all: a renamed heading would otherwise compare nothing.
    assert!(compared.len() >= 15, "compared only {compared:?}");
}

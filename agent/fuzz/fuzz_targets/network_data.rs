//! `network_data.json` into `metadata::NetworkData`, then `metadata::network_plan::plan` against links
//! made from the document's own MAC addresses and names (so networks find their links),
//! as init does before configuring interfaces. Checks: what parses round-trips through
//! JSON; a plan only names links it was given, each once; addresses agree with their
//! prefixes; DNS servers are deduplicated.
#![no_main]

use keelson_agent::metadata::NetworkData;
use keelson_agent::metadata::network_plan::plan;
use keelson_agent::net::LinkInfo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<NetworkData>(data) else {
        return;
    };
    let text = serde_json::to_vec(&doc).expect("serialises");
    let back: NetworkData = serde_json::from_slice(&text).expect("own output parses");
    assert_eq!(back, doc, "round trip");

    let mut links = vec![LinkInfo {
        index: 1,
        name: "lo".into(),
        mac: String::new(),
    }];
    for (i, l) in doc.links.iter().enumerate() {
        links.push(LinkInfo {
            index: i as u32 + 2,
            name: l.name.clone().unwrap_or_else(|| format!("eth{i}")),
            mac: l
                .ethernet_mac_address
                .clone()
                .unwrap_or_default()
                .to_ascii_lowercase(),
        });
    }
    for given in [Some(&doc), None] {
        let Ok(p) = plan(given, &links) else {
            continue;
        };
        for (i, iface) in p.interfaces.iter().enumerate() {
            assert!(links.contains(&iface.link), "planned a link we do not have");
            assert!(
                !p.interfaces[..i].iter().any(|o| o.link == iface.link),
                "link planned twice"
            );
            for a in &iface.addresses {
                assert!(a.prefix_len() <= a.max_prefix_len());
            }
        }
        let mut dns = p.dns.clone();
        dns.sort();
        dns.dedup();
        assert_eq!(dns.len(), p.dns.len(), "DNS servers repeated");
    }
});

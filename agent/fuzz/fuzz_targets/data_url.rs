//! `data:` URLs into `apply::dataurl::parse`, the decoder `apply` runs on every inline
//! Ignition resource. Checks: whatever decodes re-encodes (percent-encoded and base64, as
//! `keelson` renders file contents) to URLs that decode to the same bytes; and decoding is
//! deterministic.
#![no_main]

use base64::Engine;
use keelson_agent::apply::dataurl::{decode, parse};
use libfuzzer_sys::fuzz_target;

fn percent_encode(data: &[u8]) -> String {
    data.iter()
        .map(|&b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Most inputs should reach the body: prefix `data:` unless the input already has it.
    let url = if text
        .get(..5)
        .is_some_and(|p| p.eq_ignore_ascii_case("data:"))
    {
        text.to_owned()
    } else {
        format!("data:{text}")
    };
    let first = parse(&url);
    assert_eq!(first, parse(&url), "deterministic");
    let Ok(decoded) = first else {
        return;
    };
    let plain = format!(
        "data:{},{}",
        decoded.media_type,
        percent_encode(&decoded.data)
    );
    assert_eq!(decode(&plain).as_deref(), Ok(&decoded.data[..]), "{plain}");
    let b64 = format!(
        "data:;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&decoded.data)
    );
    assert_eq!(decode(&b64).as_deref(), Ok(&decoded.data[..]), "{b64}");
});

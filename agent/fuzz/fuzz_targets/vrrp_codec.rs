//! Fuzzes the VRRP codec: parsing never panics, and whatever parses re-encodes to bytes
//! that parse to the same advert (reserved bits and v2 auth data with auth_type 0 are not
//! kept, so the bytes themselves may differ). Run with
//! `cd agent/fuzz && cargo +nightly fuzz run vrrp_codec`.
#![no_main]

use std::net::IpAddr;

use keelson_agent::vrrp::codec::{GROUP_V4, GROUP_V6, encode, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&family, bytes)) = data.split_first() else {
        return;
    };
    let (src, dst): (IpAddr, IpAddr) = if family & 1 == 1 {
        ("fe80::1".parse().unwrap(), GROUP_V6.into())
    } else {
        ("10.0.0.1".parse().unwrap(), GROUP_V4.into())
    };
    if let Ok(advert) = parse(bytes, src, dst) {
        let again = encode(&advert, src, dst).expect("a parsed advert encodes");
        assert_eq!(parse(&again, src, dst), Ok(advert), "round trip");
    }
});

//! `Accept` header values into `negotiate::negotiate`, which picks the Ignition spec the
//! server answers `/config/<pool>` with. Checks: the answer is a spec keelson writes; an
//! error carries the header and the versions it refused; the same header always gets the
//! same answer, whether sent as one line or (split at a comma) as two joined with ", "
//! as the server joins repeated header lines.
#![no_main]

use keelson_cluster::SpecVersion;
use keelson_cluster::negotiate::negotiate;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let answer = negotiate(Some(data));
    match &answer {
        Ok(spec) => assert!(SpecVersion::ALL.contains(spec), "{spec:?}"),
        Err(e) => {
            assert_eq!(e.header, String::from_utf8_lossy(data));
            assert!(!e.asked.is_empty());
        }
    }
    assert_eq!(negotiate(Some(data)), answer, "deterministic");
    if let Some(at) = data.iter().position(|&b| b == b',') {
        let joined = [&data[..at], b", ", &data[at + 1..]].concat();
        let again = negotiate(Some(&joined));
        assert_eq!(
            again.is_ok(),
            answer.is_ok(),
            "{:?}",
            String::from_utf8_lossy(&joined)
        );
        if let (Ok(a), Ok(b)) = (&answer, &again) {
            assert_eq!(a, b);
        }
    }
});

//! Which Ignition spec version to serve, from the `Accept` header the client sent
//! (docs/ignition-server.md), on top of the one `Accept` parser the agent's other HTTP
//! endpoints (metrics) use too ([`media_ranges`]). Pure code: no I/O.
//!
//! What real clients send:
//! - Ignition 2.x and later (spec 3): `application/vnd.coreos.ignition+json;version=3.2.0, */*;q=0.1`
//!   (the version is the newest spec that Ignition release understands).
//! - Ignition 0.x (spec 2, RHCOS 4.2-4.5): `application/vnd.coreos.ignition+json; version=2.2.0,
//!   application/vnd.coreos.ignition+json; version=1; q=0.5, */*; q=0.1`.
//! - curl and other tools: nothing, or `*/*`.
//!
//! The rules follow OpenShift's machine-config-server (`detectSpecVersionFromAcceptHeader`
//! in openshift/machine-config-operator `pkg/server/api.go`), extended to every spec
//! version keelson writes:
//! - media ranges are tried in descending `q` order (stable for equal `q`); a range with
//!   `q=0` means "not acceptable" (RFC 9110 §12.4.2) and is skipped;
//! - the first `application/vnd.coreos.ignition+json` range whose `version` keelson can
//!   serve decides: `3.N.x` with N known gets `3.N.0`; `3.N.x` with N newer than keelson
//!   knows gets [`SpecVersion::NEWEST`] (Ignition accepts any older 3.x config); `2.2.x`
//!   and later 2.x get `2.2.0`;
//! - a `version` that is not a semantic version (the `version=1` of old clients) is ignored,
//!   as machine-config-server does;
//! - when no range names a usable version: if some Ignition range named a version keelson
//!   cannot serve (`1.0.0`, `2.0.0`, `2.1.0`, `4.0.0`...), the answer is an error (HTTP 400:
//!   a 2.0/2.1-only client cannot parse a 2.2 config); otherwise (no header, `*/*`, an
//!   Ignition range without version) the answer is `2.2.0`, so that plain `curl` gets what
//!   machine-config-server gives it.

use crate::version::SpecVersion;

/// The Ignition config media type.
pub const IGNITION_MEDIA_TYPE: &str = "application/vnd.coreos.ignition+json";

/// The version served when the client names none.
pub const NO_VERSION_DEFAULT: SpecVersion = SpecVersion::V2_2;

/// The `Accept` header asked only for Ignition spec versions keelson cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Accept header {header:?} asks for Ignition spec version(s) {asked}: expected 2.2.x or later 2.x, or 3.x"
)]
pub struct NegotiateError {
    /// The header as received (lossy UTF-8).
    pub header: String,
    /// The versions it named, comma-separated.
    pub asked: String,
}

/// A semantic version as it appears in a `version=` media-type parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SemVer {
    major: u64,
    minor: u64,
}

/// Parses `MAJOR.MINOR.PATCH[-pre][+build]` (numbers without leading zeros, as semver);
/// `None` for anything else (e.g. the bare `1` old clients send).
fn parse_semver(s: &str) -> Option<SemVer> {
    let s = s.trim().trim_matches('"');
    let core = s.split(['-', '+']).next().unwrap_or("");
    let mut it = core.split('.');
    let mut num = || -> Option<u64> {
        let p = it.next()?;
        if p.is_empty()
            || !p.bytes().all(|b| b.is_ascii_digit())
            || (p.len() > 1 && p.starts_with('0'))
        {
            return None;
        }
        p.parse().ok()
    };
    let (major, minor, _patch) = (num()?, num()?, num()?);
    if it.next().is_some() {
        return None;
    }
    Some(SemVer { major, minor })
}

/// One media range of an `Accept` header (RFC 9110 §12.5.1), borrowed from the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaRange<'a> {
    /// `type/subtype` as written (compare with `eq_ignore_ascii_case`).
    pub media_type: &'a str,
    /// Parameters other than `q`, in order, names and values trimmed (values may be quoted).
    pub params: Vec<(&'a str, &'a str)>,
    /// Quality in thousandths (RFC 9110 allows three decimals); 0 means "not acceptable".
    pub q: u16,
}

impl<'a> MediaRange<'a> {
    /// The first parameter named `name` (case-insensitive), if any.
    pub fn param(&self, name: &str) -> Option<&'a str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    /// Whether the client accepts this range at all (`q` above 0).
    pub fn acceptable(&self) -> bool {
        self.q > 0
    }
}

/// Parses `q` (`0`, `0.5`, `1.000`...) into thousandths; invalid values count as 1, the
/// default, as machine-config-server ignores an unparsable `q`.
fn parse_q(s: &str) -> u16 {
    let s = s.trim();
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return 1000;
    }
    let whole = match int {
        "0" => 0u16,
        "1" => 1000,
        _ => return 1000,
    };
    let mut thousandths = 0u16;
    for (i, b) in frac.bytes().enumerate() {
        thousandths += u16::from(b - b'0') * [100, 10, 1][i];
    }
    (whole + thousandths).min(1000)
}

/// The media ranges of an `Accept` header, in descending `q` order (stable: equal `q` keeps
/// the client's order). Items that are not media ranges (no `/`) are ignored, as
/// machine-config-server does; ranges with `q=0` are kept so callers can see what the
/// client refused ([`MediaRange::acceptable`]).
pub fn media_ranges(header: &str) -> Vec<MediaRange<'_>> {
    let mut ranges: Vec<MediaRange<'_>> = header
        .split(',')
        .filter_map(|item| {
            let mut parts = item.split(';').map(str::trim);
            let media_type = parts.next()?;
            if !media_type.contains('/') {
                return None;
            }
            let mut params = Vec::new();
            let mut q = None;
            for param in parts {
                let Some((k, v)) = param.split_once('=') else {
                    continue;
                };
                let (k, v) = (k.trim(), v.trim());
                if k.eq_ignore_ascii_case("q") {
                    q.get_or_insert_with(|| parse_q(v));
                } else {
                    params.push((k, v));
                }
            }
            Some(MediaRange {
                media_type,
                params,
                q: q.unwrap_or(1000),
            })
        })
        .collect();
    ranges.sort_by_key(|r| std::cmp::Reverse(r.q));
    ranges
}

/// Maps a requested semantic version to the spec keelson serves for it, if any.
fn serve_for(v: SemVer) -> Option<SpecVersion> {
    match (v.major, v.minor) {
        // 3.0 up to NEWEST are all in ALL, so a miss means a newer minor: Ignition
        // accepts any older 3.x config, so serve the newest keelson writes.
        (3, minor) => Some(
            SpecVersion::ALL
                .into_iter()
                .find(|s| !s.is_v2() && u64::from(s.major_minor().1) == minor)
                .unwrap_or(SpecVersion::NEWEST),
        ),
        (2, minor) if minor >= 2 => Some(SpecVersion::V2_2),
        _ => None,
    }
}

/// Chooses the spec version to serve for an `Accept` header (`None`: no header).
pub fn negotiate(accept: Option<&[u8]>) -> Result<SpecVersion, NegotiateError> {
    let Some(raw) = accept else {
        return Ok(NO_VERSION_DEFAULT);
    };
    let header = String::from_utf8_lossy(raw);
    let mut unsupported: Vec<&str> = Vec::new();
    for range in media_ranges(&header) {
        if !range.acceptable() || !range.media_type.eq_ignore_ascii_case(IGNITION_MEDIA_TYPE) {
            continue;
        }
        let Some(raw_version) = range.param("version") else {
            continue;
        };
        let Some(v) = parse_semver(raw_version) else {
            continue;
        };
        match serve_for(v) {
            Some(spec) => return Ok(spec),
            None => unsupported.push(raw_version),
        }
    }
    if unsupported.is_empty() {
        Ok(NO_VERSION_DEFAULT)
    } else {
        Err(NegotiateError {
            header: header.to_string(),
            asked: unsupported.join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn n(h: &str) -> Result<SpecVersion, NegotiateError> {
        negotiate(Some(h.as_bytes()))
    }

    #[test]
    fn ignition_2x_clients_get_the_spec_they_ask_for() {
        for (asked, served) in [
            ("3.0.0", SpecVersion::V3_0),
            ("3.1.0", SpecVersion::V3_1),
            ("3.2.0", SpecVersion::V3_2),
            ("3.3.0", SpecVersion::V3_3),
            ("3.4.0", SpecVersion::V3_4),
            ("3.5.0", SpecVersion::V3_5),
        ] {
            let h = format!("application/vnd.coreos.ignition+json;version={asked}, */*;q=0.1");
            assert_eq!(n(&h).unwrap(), served, "{h}");
        }
    }

    /// The exact header of the Ignition the RHCOS stand-in runs (Debian's 2.14.0,
    /// `internal/resource/url.go`), and what RHCOS 4.6-4.12 send (2.7-2.14: 3.1.0-3.3.0).
    /// `ignition_binary_sends_this_header` in tests/ checks the first against the program.
    pub const IGNITION_2_14_ACCEPT: &str =
        "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1";

    #[test]
    fn ignition_2_14_gets_3_3() {
        assert_eq!(n(IGNITION_2_14_ACCEPT).unwrap(), SpecVersion::V3_3);
    }

    #[test]
    fn patch_and_prerelease_map_to_the_minor() {
        assert_eq!(
            n("application/vnd.coreos.ignition+json;version=3.2.7").unwrap(),
            SpecVersion::V3_2
        );
        assert_eq!(
            n("application/vnd.coreos.ignition+json;version=3.1.0-experimental").unwrap(),
            SpecVersion::V3_1
        );
    }

    #[test]
    fn newer_3x_minor_gets_newest() {
        for v in [
            "3.6.0",
            "3.6.0-experimental",
            "3.99.1",
            "3.18446744073709551615.0",
        ] {
            let h = format!("application/vnd.coreos.ignition+json;version={v}, */*;q=0.1");
            assert_eq!(n(&h).unwrap(), SpecVersion::NEWEST, "{h}");
        }
    }

    #[test]
    fn ignition_0x_clients_get_2_2() {
        // Exactly as Ignition 0.x sends it (internal/resource/url.go ConfigHeaders).
        for v in ["2.2.0", "2.3.0", "2.4.0"] {
            let h = format!(
                "application/vnd.coreos.ignition+json; version={v}, application/vnd.coreos.ignition+json; version=1; q=0.5, */*; q=0.1"
            );
            assert_eq!(n(&h).unwrap(), SpecVersion::V2_2, "{h}");
        }
    }

    #[test]
    fn no_version_gets_2_2() {
        assert_eq!(negotiate(None).unwrap(), SpecVersion::V2_2);
        for h in [
            "",
            "*/*",
            "application/json",
            "application/vnd.coreos.ignition+json",
            "application/vnd.coreos.ignition+json; version=1",
            "garbage without slash",
            "application/vnd.coreos.ignition+json;version=banana",
        ] {
            assert_eq!(n(h).unwrap(), SpecVersion::V2_2, "{h:?}");
        }
    }

    #[test]
    fn unservable_versions_are_errors() {
        for v in ["1.0.0", "2.0.0", "2.1.0", "4.0.0", "0.1.0"] {
            let h = format!("application/vnd.coreos.ignition+json;version={v}, */*;q=0.1");
            let err = n(&h).unwrap_err();
            assert!(err.asked.contains(v), "{err}");
            assert!(err.to_string().contains("expected"), "{err}");
        }
        // Old 2.0/2.1-only clients (Container Linux era).
        assert!(
            n("application/vnd.coreos.ignition+json; version=2.1.0, application/vnd.coreos.ignition+json; version=1; q=0.5, */*; q=0.1")
                .is_err()
        );
    }

    #[test]
    fn q_order_decides_and_q0_is_skipped() {
        let h = "application/vnd.coreos.ignition+json;version=3.1.0;q=0.4, application/vnd.coreos.ignition+json;version=3.3.0;q=0.9";
        assert_eq!(n(h).unwrap(), SpecVersion::V3_3);
        let h = "application/vnd.coreos.ignition+json;version=3.3.0;q=0, */*";
        assert_eq!(n(h).unwrap(), SpecVersion::V2_2);
        // Equal q: the client's order.
        let h = "application/vnd.coreos.ignition+json;version=3.4.0, application/vnd.coreos.ignition+json;version=3.0.0";
        assert_eq!(n(h).unwrap(), SpecVersion::V3_4);
        // An unservable version loses to a servable one anywhere in the header.
        let h = "application/vnd.coreos.ignition+json;version=4.0.0, application/vnd.coreos.ignition+json;version=3.2.0;q=0.5";
        assert_eq!(n(h).unwrap(), SpecVersion::V3_2);
    }

    #[test]
    fn case_and_whitespace_are_tolerated() {
        let h = "Application/VND.CoreOS.Ignition+JSON ;  Version = 3.2.0 , */* ; q=0.1";
        assert_eq!(n(h).unwrap(), SpecVersion::V3_2);
        let h = "application/vnd.coreos.ignition+json;version=\"3.3.0\"";
        assert_eq!(n(h).unwrap(), SpecVersion::V3_3);
    }

    #[test]
    fn media_ranges_sort_by_q_and_keep_params() {
        let r = media_ranges("text/plain;version=0.0.4;q=0.5, junk, a/b; Q=0 ;x=\"y\", c/d");
        let got: Vec<(&str, u16)> = r.iter().map(|r| (r.media_type, r.q)).collect();
        assert_eq!(got, [("c/d", 1000), ("text/plain", 500), ("a/b", 0)]);
        assert_eq!(r[1].param("VERSION"), Some("0.0.4"));
        assert_eq!(r[2].param("x"), Some("\"y\""));
        assert!(!r[2].acceptable());
        assert!(r[0].params.is_empty());
    }

    #[test]
    fn q_values_parse() {
        assert_eq!(parse_q("0"), 0);
        assert_eq!(parse_q("0.1"), 100);
        assert_eq!(parse_q("0.125"), 125);
        assert_eq!(parse_q("1.000"), 1000);
        assert_eq!(parse_q("1.5"), 1000);
        assert_eq!(parse_q("x"), 1000);
        assert_eq!(parse_q("0.1234"), 1000);
    }

    #[test]
    fn semver_parse() {
        assert_eq!(parse_semver("3.2.0"), Some(SemVer { major: 3, minor: 2 }));
        assert_eq!(parse_semver("1"), None);
        assert_eq!(parse_semver("3.2"), None);
        assert_eq!(parse_semver("03.2.0"), None);
        assert_eq!(parse_semver("3.2.0.1"), None);
        assert_eq!(parse_semver("3..0"), None);
    }

    proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = negotiate(Some(&bytes));
        }

        #[test]
        fn never_panics_on_header_like_input(s in r#"[a-z/+.;=, *"0-9qQ-]{0,120}"#) {
            let _ = negotiate(Some(s.as_bytes()));
        }

        #[test]
        fn any_3x_is_served(minor in 0u64..1000, patch in 0u64..1000, other in "[a-z]{1,8}/[a-z*]{1,8}") {
            let h = format!("{other};q=0.1, application/vnd.coreos.ignition+json;version=3.{minor}.{patch}");
            let got = n(&h).unwrap();
            prop_assert_eq!(got.major_minor().0, 3);
            prop_assert_eq!(u64::from(got.major_minor().1), minor.min(u64::from(SpecVersion::NEWEST.major_minor().1)));
        }

        #[test]
        fn result_is_ok_unless_an_ignition_version_was_named(s in "[a-z/ ,;=.0-9*]{0,80}") {
            if !s.contains("ignition") {
                prop_assert_eq!(n(&s).unwrap(), SpecVersion::V2_2);
            }
        }
    }
}

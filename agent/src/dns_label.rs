//! What a node name is, decided once: a DNS label as a host name may be (RFC 1123 §2.1: 1
//! to 63 ASCII letters, digits and hyphens, not starting or ending with a hyphen). A-labels,
//! the ASCII form of internationalised names (`xn--bcher-kva`, RFC 5890 §2.3.2.1), are such
//! labels, and Kubernetes node names may be them; the agent never decodes one (it carries
//! no Unicode tables), it only compares them, ignoring ASCII case.
//!
//! Members, the node's identity, the mDNS records, the unicast registry and the cluster DNS
//! zone all hold a [`DnsLabel`], so a name one of them accepts the others accept too.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest label DNS allows (RFC 1035 §2.3.4).
pub const MAX_LEN: usize = 63;

/// A node name: one DNS label (see the module).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DnsLabel(String);

/// A name that is not a [`DnsLabel`], and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "node name {name:?}: expected a DNS label (1 to 63 letters, digits or '-', not starting or ending with '-'): {reason}"
)]
pub struct DnsLabelError {
    /// The name given.
    pub name: String,
    /// What is wrong with it.
    pub reason: String,
}

impl DnsLabel {
    /// `name` if it is a DNS label.
    pub fn new(name: impl Into<String>) -> Result<Self, DnsLabelError> {
        let name = name.into();
        match why_not(&name) {
            None => Ok(DnsLabel(name)),
            Some(reason) => Err(DnsLabelError { name, reason }),
        }
    }

    /// Whether `name` is a DNS label.
    pub fn is_valid(name: &str) -> bool {
        why_not(name).is_none()
    }

    /// The label's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `other` is the same name, ASCII case ignored (as DNS compares names).
    pub fn eq_ignore_case(&self, other: &str) -> bool {
        self.0.eq_ignore_ascii_case(other)
    }
}

/// Why `name` is not a DNS label; `None` when it is one.
fn why_not(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Some("it is empty".into());
    }
    if bytes.len() > MAX_LEN {
        return Some(format!("{} bytes, over {MAX_LEN}", bytes.len()));
    }
    if let Some((at, c)) = name
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        return Some(format!("{c:?} at byte {at}"));
    }
    if bytes[0] == b'-' {
        return Some("it starts with '-'".into());
    }
    if bytes[bytes.len() - 1] == b'-' {
        return Some("it ends with '-'".into());
    }
    None
}

impl fmt::Display for DnsLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for DnsLabel {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for DnsLabel {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for DnsLabel {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for DnsLabel {
    type Err = DnsLabelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DnsLabel::new(s)
    }
}

impl TryFrom<String> for DnsLabel {
    type Error = DnsLabelError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        DnsLabel::new(s)
    }
}

impl TryFrom<&str> for DnsLabel {
    type Error = DnsLabelError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        DnsLabel::new(s)
    }
}

impl From<DnsLabel> for String {
    fn from(l: DnsLabel) -> String {
        l.0
    }
}

impl PartialEq<str> for DnsLabel {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for DnsLabel {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for DnsLabel {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

/// Property-test strategies for node names.
#[cfg(test)]
pub mod strategy {
    use proptest::prelude::*;

    use super::DnsLabel;

    /// Any DNS label, A-labels (`xn--...`) among them, mixed case included.
    pub fn dns_label() -> impl Strategy<Value = DnsLabel> {
        prop_oneof![
            "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?",
            "xn--[a-z0-9]([a-z0-9-]{0,57}[a-z0-9])?",
        ]
        .prop_map(|s| DnsLabel::new(s).expect("the strategy makes labels"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_and_a_labels_are_labels() {
        for ok in [
            "master-0",
            "a",
            "0",
            "MASTER-0",
            "xn--bcher-kva",
            "xn--cwl6ngym1",
            "ab--cd",
            &"a".repeat(63),
        ] {
            assert_eq!(DnsLabel::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn what_is_not_a_label_is_named() {
        for (bad, why) in [
            ("", "empty"),
            (&"a".repeat(64) as &str, "64 bytes, over 63"),
            ("master_0", "'_' at byte 6"),
            ("master.example", "'.' at byte 6"),
            ("bücher", "'ü' at byte 1"),
            ("-a", "starts with '-'"),
            ("a-", "ends with '-'"),
            ("a\u{0}b", "'\\0' at byte 1"),
        ] {
            let e = DnsLabel::new(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad:?}: {e}");
            assert!(!DnsLabel::is_valid(bad));
        }
    }

    #[test]
    fn json_is_checked_both_ways() {
        let l: DnsLabel = serde_json::from_str("\"xn--bcher-kva\"").unwrap();
        assert_eq!(serde_json::to_string(&l).unwrap(), "\"xn--bcher-kva\"");
        let e = serde_json::from_str::<DnsLabel>("\"no_way\"").unwrap_err();
        assert!(e.to_string().contains("expected a DNS label"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(keelson_testkit::proptest::config())]
        #[test]
        fn labels_survive_hickory_names_untouched(label in strategy::dns_label()) {
            // hickory takes our bytes as they are (no IDNA on the way in or out).
            let l = hickory_proto::rr::domain::Label::from_raw_bytes(label.as_bytes()).unwrap();
            let name = hickory_proto::rr::Name::from_labels([l]).unwrap();
            proptest::prop_assert_eq!(name.iter().next().unwrap(), label.as_bytes());
        }

        #[test]
        fn anything_either_is_a_label_or_is_refused_with_a_reason(s in ".{0,70}") {
            match DnsLabel::new(s.clone()) {
                Ok(l) => proptest::prop_assert_eq!(l.as_str(), s.as_str()),
                Err(e) => proptest::prop_assert!(!e.reason.is_empty()),
            }
        }
    }
}

//! What travels between a node and a registry: the paths and headers, the bodies of a
//! registration and a goodbye, the entries of an answer, and the shape every listed member
//! must have however it was heard.

use serde::{Deserialize, Serialize};

use super::super::auth::Proof;
use crate::member::Member;

/// The registration path on the Ignition server.
pub const MEMBERS_PATH: &str = "/keelson/v1/members";

/// The header of every registry answer naming the membership key its node signs with (an
/// authenticated cluster only). A client that does not hold that key ignores the answer:
/// the records in an answer carry no proof of their own, so without it a node left on a
/// retired key would still list itself, through its own registry, on every node that
/// registers with it (docs/operations.md). Older registries send none; their answers are
/// believed as before.
pub const KEY_HEADER: &str = "keelson-membership-key";

/// The header of a registry's `304 Not Modified` answer to a registration that named the
/// list it holds (`If-None-Match` with the `ETag` of an earlier answer): every member of
/// that list is still listed and was last heard at most this many milliseconds before the
/// answer. The client takes its copy of the list in again with that age, so a renewal
/// costs neither side the list while nothing changed. Older registries ignore
/// `If-None-Match` and always answer with the list; older clients never send it.
pub const FRESH_HEADER: &str = "keelson-members-fresh-ms";

/// What a node sends to register or renew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    /// The cluster zone (`<name>.<baseDomain>`); other clusters are refused.
    pub cluster: String,
    /// The node.
    pub member: Member,
    /// Its proof (authenticated clusters: `cluster.json` `members.keyId`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Proof>,
}

/// What a node sends with its goodbye (`DELETE /keelson/v1/members/<node>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Goodbye {
    /// Its proof (authenticated clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Proof>,
}

/// One entry of the registry's answer: a member and how long ago it was last heard, so
/// clients expire it when the registry does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    /// The member.
    pub member: Member,
    /// Milliseconds since it was last heard.
    pub age_ms: u64,
}

/// A member that this registry will not list; says which field and what was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemberShapeError {
    /// No address, or more than 16.
    #[error("member.addresses: expected 1 to 16 addresses")]
    Addresses,
    /// A version longer than 64 bytes or with control characters.
    #[error("member.version: expected at most 64 bytes, no control characters")]
    Version,
}

/// What every member this registry lists must look like, however it was heard: 1 to 16
/// addresses, a version of at most 64 bytes without control characters (its name is a
/// [`DnsLabel`], checked when it was read).
pub(super) fn check_member(m: &Member) -> Result<(), MemberShapeError> {
    if m.addresses.is_empty() || m.addresses.len() > 16 {
        return Err(MemberShapeError::Addresses);
    }
    if m.version.len() > 64 || m.version.chars().any(char::is_control) {
        return Err(MemberShapeError::Version);
    }
    Ok(())
}

//! Ignition spec versions keelson writes and serves.

use std::fmt;
use std::str::FromStr;

/// An Ignition config spec version keelson can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum SpecVersion {
    /// 2.2.0: RHCOS 4.2-4.5 (`config.append`, `filesystem: "root"`, sha512 only).
    V2_2,
    /// 3.0.0
    V3_0,
    /// 3.1.0
    V3_1,
    /// 3.2.0 (RHCOS 4.8+; keelson's default)
    V3_2,
    /// 3.3.0
    V3_3,
    /// 3.4.0
    V3_4,
    /// 3.5.0
    V3_5,
}

/// `--spec` or an Accept header named a version keelson does not write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported Ignition spec version {0:?}: expected one of 2.2.0, 3.0.0, 3.1.0, 3.2.0, 3.3.0, 3.4.0, 3.5.0"
)]
pub struct UnsupportedVersion(pub String);

impl SpecVersion {
    /// Every supported version, oldest first.
    pub const ALL: [SpecVersion; 7] = [
        SpecVersion::V2_2,
        SpecVersion::V3_0,
        SpecVersion::V3_1,
        SpecVersion::V3_2,
        SpecVersion::V3_3,
        SpecVersion::V3_4,
        SpecVersion::V3_5,
    ];
    /// The default for `keelson build` and for configs served without a version asked.
    pub const DEFAULT: SpecVersion = SpecVersion::V3_2;
    /// The newest 3.x version keelson writes.
    pub const NEWEST: SpecVersion = SpecVersion::V3_5;

    /// `(major, minor)`.
    pub fn major_minor(self) -> (u32, u32) {
        match self {
            SpecVersion::V2_2 => (2, 2),
            SpecVersion::V3_0 => (3, 0),
            SpecVersion::V3_1 => (3, 1),
            SpecVersion::V3_2 => (3, 2),
            SpecVersion::V3_3 => (3, 3),
            SpecVersion::V3_4 => (3, 4),
            SpecVersion::V3_5 => (3, 5),
        }
    }

    /// The version string as it appears in `ignition.version`, e.g. `3.2.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            SpecVersion::V2_2 => "2.2.0",
            SpecVersion::V3_0 => "3.0.0",
            SpecVersion::V3_1 => "3.1.0",
            SpecVersion::V3_2 => "3.2.0",
            SpecVersion::V3_3 => "3.3.0",
            SpecVersion::V3_4 => "3.4.0",
            SpecVersion::V3_5 => "3.5.0",
        }
    }

    /// Whether this is a 2.x spec.
    pub fn is_v2(self) -> bool {
        self == SpecVersion::V2_2
    }
}

impl fmt::Display for SpecVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SpecVersion {
    type Err = UnsupportedVersion;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SpecVersion::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnsupportedVersion(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects() {
        for v in SpecVersion::ALL {
            assert_eq!(v.as_str().parse::<SpecVersion>().unwrap(), v);
        }
        assert!("3.6.0".parse::<SpecVersion>().is_err());
        assert!("3.2".parse::<SpecVersion>().is_err());
    }
}

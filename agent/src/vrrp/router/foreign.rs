//! Other virtual routers on our VRID: adverts for other VIPs (or of another version or
//! authentication) from a host that is neither a member nor a static peer, kept per
//! source within a bound so that forged sources cannot grow it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// How many other virtual routers on our VRID the core remembers (each named once): a
/// bound on what a flood of forged sources can make it keep; beyond it they are counted
/// only.
pub const FOREIGN_SOURCES_MAX: usize = 16;

/// How long after its last advert another virtual router on our VRID stays a finding.
pub const FOREIGN_FINDING_HOLD: Duration = Duration::from_secs(60);

/// Another virtual router heard on our VRID (a finding while heard within
/// [`FOREIGN_FINDING_HOLD`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignRouter {
    /// The VIPs it last advertised.
    pub addresses: Vec<IpAddr>,
    /// Its first advert.
    pub first: Duration,
    /// Its last advert.
    pub last: Duration,
    /// Its adverts heard.
    pub adverts: u64,
}

/// Records an advert from `src` at `at` advertising `addresses`. True when `src` is new
/// and was kept (the caller names it once); false when it was known (updated) or the
/// bound [`FOREIGN_SOURCES_MAX`] is reached (not kept).
pub(super) fn record(
    foreign: &mut BTreeMap<IpAddr, ForeignRouter>,
    src: IpAddr,
    at: Duration,
    addresses: &[IpAddr],
) -> bool {
    if let Some(seen) = foreign.get_mut(&src) {
        seen.last = seen.last.max(at);
        seen.adverts += 1;
        seen.addresses = addresses.to_vec();
        return false;
    }
    if foreign.len() >= FOREIGN_SOURCES_MAX {
        return false;
    }
    foreign.insert(
        src,
        ForeignRouter {
            addresses: addresses.to_vec(),
            first: at,
            last: at,
            adverts: 1,
        },
    );
    true
}

//! Cloud port security seen from a unicast VRRP instance (docs/vrrp.md, "Port security"),
//! pure: time is a [`Duration`] since the instance's origin.
//!
//! Two settings of a cloud network (OpenStack Neutron's port security) break a VIP without
//! any error anywhere:
//!
//! - **The VIP is not an allowed address pair of the holder's port.** Neutron's
//!   anti-spoofing drops every packet the holder sends from the VIP, and its ARP protection
//!   drops the holder's ARP replies for it: the VIP is held and nobody can reach it. The
//!   holder finds out itself: while master it connects (TCP) to a few targets on its network
//!   twice, once from its own address and once from the VIP; a target that answers the
//!   first and never the second, round after round, means its port drops the VIP
//!   ([`judge_round`], [`VipCheck`]). Then it lowers its priority to 1, so a router whose
//!   port passes the VIP takes it over, and says which port needs the pair.
//! - **The security group does not pass IP protocol 112.** Adverts stop at every port; each
//!   backup would take the missing adverts for a dead master and claim the VIP beside the
//!   holder (split brain; the ARP conflict rule would then move it back and forth). A
//!   backup claims a silent master's VIP only once its death is confirmed by ARP
//!   ([`super::confirm`]): a master that died cannot answer the probes, a live one whose
//!   adverts are dropped does. The holder keeps the VIP, and once no advert has arrived for
//!   [`ADVERTS_STALE_FACTOR`] Master_Down intervals the backup says that adverts do not
//!   arrive and how to let them (after 10 s at least, [`ADVERTS_STALE_MIN`]). A master
//!   that stops answering (it died) no longer holds anyone back.

/// What is wrong with the port or its security group (a status value: it lives with the
/// status document's types).
pub use crate::status::model::PortProblem as Problem;

/// How a target answered one TCP connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// It answered (connected, or refused: a reset came back either way).
    Answered,
    /// Nothing came back within the timeout.
    Silent,
    /// The connect could not be tried (no route, no such source address): says nothing.
    Unknown,
}

/// One target tried from both sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Paths {
    /// From the node's own address.
    pub from_node: Reach,
    /// From the VIP.
    pub from_vip: Reach,
}

/// What one round of connects says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Some target answered the VIP: its traffic leaves the port.
    VipPasses,
    /// A target answered the node but not the VIP, and none answered the VIP.
    VipDropped,
    /// Nothing to go by (no target answered either source).
    Inconclusive,
}

/// Judges one round of connects.
pub fn judge_round(paths: &[Paths]) -> Round {
    if paths.iter().any(|p| p.from_vip == Reach::Answered) {
        Round::VipPasses
    } else if paths
        .iter()
        .any(|p| p.from_node == Reach::Answered && p.from_vip == Reach::Silent)
    {
        Round::VipDropped
    } else {
        Round::Inconclusive
    }
}

/// Rounds in a row that must say [`Round::VipDropped`] before the holder believes it (a
/// peer's first answer can be late while its ARP entry for the VIP is fresh).
pub const CONFIRM_ROUNDS: u32 = 2;

/// A change of what the holder believes about its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The port drops the VIP (from now on).
    Found,
    /// The VIP passes again.
    Cleared,
}

/// The holder's belief about its port, over rounds.
#[derive(Debug, Clone, Default)]
pub struct VipCheck {
    dropped_rounds: u32,
    found: bool,
}

impl VipCheck {
    /// Whether the port is believed to drop the VIP.
    pub fn found(&self) -> bool {
        self.found
    }

    /// Takes one round's verdict; says when the belief changes.
    pub fn on_round(&mut self, round: Round) -> Option<Change> {
        match round {
            Round::VipPasses => {
                self.dropped_rounds = 0;
                std::mem::take(&mut self.found).then_some(Change::Cleared)
            }
            Round::VipDropped => {
                self.dropped_rounds += 1;
                (!self.found && self.dropped_rounds >= CONFIRM_ROUNDS).then(|| {
                    self.found = true;
                    Change::Found
                })
            }
            Round::Inconclusive => None,
        }
    }
}

/// How many Master_Down intervals without any advert make adverts "not arriving" (what a
/// backup reports; holding the claim does not wait for it), and at least
/// [`ADVERTS_STALE_MIN`].
pub const ADVERTS_STALE_FACTOR: u32 = 3;

/// The shortest silence reported as adverts not arriving: at 100 ms adverts three
/// Master_Down intervals are a second, which a holder stalled on a loaded host also keeps
/// silent (its kernel answering the backups' ARP meanwhile), and the report names a fix
/// for the cloud's security group.
pub const ADVERTS_STALE_MIN: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    const A: Reach = Reach::Answered;
    const S: Reach = Reach::Silent;
    const U: Reach = Reach::Unknown;

    fn p(from_node: Reach, from_vip: Reach) -> Paths {
        Paths {
            from_node,
            from_vip,
        }
    }

    #[test]
    fn a_round_blames_the_vip_only_when_the_node_gets_through() {
        assert_eq!(judge_round(&[p(A, S)]), Round::VipDropped);
        assert_eq!(judge_round(&[p(A, S), p(A, A)]), Round::VipPasses);
        // The target is down or filtered for everyone: nothing to say about the VIP.
        assert_eq!(judge_round(&[p(S, S)]), Round::Inconclusive);
        assert_eq!(judge_round(&[p(U, U), p(S, U)]), Round::Inconclusive);
        assert_eq!(judge_round(&[]), Round::Inconclusive);
        // No route from the VIP (not assigned yet): not a drop.
        assert_eq!(judge_round(&[p(A, U)]), Round::Inconclusive);
    }

    #[test]
    fn the_check_needs_rounds_in_a_row_and_one_pass_clears_it() {
        let mut c = VipCheck::default();
        assert_eq!(c.on_round(Round::VipDropped), None);
        assert!(!c.found());
        assert_eq!(c.on_round(Round::VipDropped), Some(Change::Found));
        assert!(c.found());
        assert_eq!(c.on_round(Round::VipDropped), None, "already found");
        assert_eq!(c.on_round(Round::Inconclusive), None);
        assert!(c.found(), "an inconclusive round changes nothing");
        assert_eq!(c.on_round(Round::VipPasses), Some(Change::Cleared));
        assert!(!c.found());
        // A pass between two drops starts the count again.
        assert_eq!(c.on_round(Round::VipDropped), None);
        assert_eq!(c.on_round(Round::VipPasses), None);
        assert_eq!(c.on_round(Round::VipDropped), None);
        assert_eq!(c.on_round(Round::VipDropped), Some(Change::Found));
    }

    #[test]
    fn the_fix_names_the_vip_and_the_port() {
        let vip: std::net::IpAddr = "10.0.0.5".parse().unwrap();
        let fix = Problem::VipNotAllowed.fix(vip, "fa:16:3e:00:00:01");
        assert!(
            fix.contains("--allowed-address ip-address=10.0.0.5"),
            "{fix}"
        );
        assert!(fix.contains("--mac-address fa:16:3e:00:00:01"), "{fix}");
        assert!(Problem::VrrpBlocked.fix(vip, "").contains("--protocol 112"));
        assert_eq!(
            Problem::ALL.map(Problem::as_str),
            ["vip_not_allowed", "vrrp_blocked"]
        );
    }
}

//! Our TXT record's items beyond `role=`, `cluster=` and `version=`: the addresses of a
//! signed record, split over `addrs=`, `addrs2=`... at the 255-byte limit of a
//! character-string, and the reading of a received TXT record with its proof.

use std::net::IpAddr;

use hickory_proto::rr::rdata::TXT;
use keelson_cluster::Role;

use crate::members::auth::Proof;

use super::Rejected;

/// The longest character-string in a TXT record (RFC 1035 §3.3).
pub(super) const TXT_STRING_MAX: usize = 255;

/// `addrs=a,b,...` items, each at most 255 bytes: `addrs=`, then `addrs2=`, `addrs3=`...
pub(super) fn addrs_items(addresses: &[IpAddr]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::from("addrs=");
    let mut empty = true;
    for a in addresses {
        let a = a.to_string();
        if !empty && cur.len() + 1 + a.len() > TXT_STRING_MAX {
            out.push(std::mem::take(&mut cur));
            cur = format!("addrs{}=", out.len() + 1);
            empty = true;
        }
        if !empty {
            cur.push(',');
        }
        cur.push_str(&a);
        empty = false;
    }
    out.push(cur);
    out
}

/// The proof items of a TXT record.
#[derive(Debug)]
pub(super) enum TxtProof {
    /// None of `kid=`, `time=`, `seq=`, `mac=`.
    Absent,
    /// Some, or unreadable: a proof that cannot verify.
    Malformed,
    /// All four.
    Present(Proof),
}

/// What a TXT record of our service says.
#[derive(Debug)]
pub(super) struct Txt {
    pub(super) role: Role,
    pub(super) cluster: String,
    pub(super) version: String,
    /// `addrs=`, `addrs2=`... (signed records).
    pub(super) addrs: Vec<IpAddr>,
    pub(super) proof: TxtProof,
}

/// The most addresses a record may carry (as a unicast registration).
const MAX_ADDRS: usize = 16;

/// Reads `role=`, `cluster=`, `version=`, and for signed records `addrs=` (continued in
/// `addrs2=`...) and the proof, from a TXT record.
pub(super) fn parse_txt(txt: &TXT) -> Result<Txt, Rejected> {
    let mut role = None;
    let mut cluster = None;
    let mut version = String::new();
    let mut addr_parts: Vec<(u32, String)> = Vec::new();
    let (mut kid, mut time, mut seq, mut mac) = (None, None, None, None);
    for item in txt.txt_data.iter() {
        let Ok(item) = std::str::from_utf8(item) else {
            continue;
        };
        let Some((k, v)) = item.split_once('=') else {
            continue;
        };
        let k = k.to_ascii_lowercase();
        match k.as_str() {
            "role" => {
                role = Some(match v {
                    "bootstrap" => Role::Bootstrap,
                    "master" => Role::Master,
                    "worker" => Role::Worker,
                    _ => return Err(Rejected::Bogus),
                })
            }
            "cluster" => cluster = Some(v.to_string()),
            "version" if v.len() <= 64 => version = v.to_string(),
            "kid" => kid = Some(v.to_string()),
            "time" => time = Some(v.parse::<u64>().ok()),
            "seq" => seq = Some(v.parse::<u64>().ok()),
            "mac" => mac = Some(v.to_string()),
            _ => {
                if let Some(n) = k.strip_prefix("addrs") {
                    let index = if n.is_empty() {
                        Some(1)
                    } else {
                        n.parse::<u32>().ok().filter(|i| *i >= 2)
                    };
                    if let Some(i) = index
                        && addr_parts.len() < MAX_ADDRS
                    {
                        addr_parts.push((i, v.to_string()));
                    }
                }
            }
        }
    }
    addr_parts.sort_by_key(|(i, _)| *i);
    let mut addrs = Vec::new();
    for (_, part) in &addr_parts {
        for a in part.split(',').filter(|a| !a.is_empty()) {
            addrs.push(a.parse::<IpAddr>().map_err(|_| Rejected::Bogus)?);
        }
    }
    if addrs.len() > MAX_ADDRS {
        return Err(Rejected::Bogus);
    }
    let proof = match (kid, time, seq, mac) {
        (None, None, None, None) => TxtProof::Absent,
        (Some(key_id), Some(Some(time_ms)), Some(Some(seq)), Some(mac)) => {
            TxtProof::Present(Proof {
                key_id,
                time_ms,
                seq,
                mac,
            })
        }
        _ => TxtProof::Malformed,
    };
    match (role, cluster) {
        (Some(role), Some(cluster)) => Ok(Txt {
            role,
            cluster,
            version,
            addrs,
            proof,
        }),
        _ => Err(Rejected::Bogus),
    }
}

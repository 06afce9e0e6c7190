//! DNS messages on the wire for the authoritative path: a reader for the plain query shape
//! nearly every client sends, and a writer for our answers.
//!
//! Hand-written rather than hickory-proto's `Message` because that decodes into owned
//! records and encodes through a general encoder: a dozen allocations and two name walks per
//! query, which is most of what one thread spends answering the zone (docs/dns.md, the
//! bench). The reader accepts only the plain shape (one uncompressed question, at most an
//! OPT record whose options hickory reads as opaque); anything else goes to hickory in the
//! handler, and a property test holds the two to the same reading. What the writer writes
//! is checked by decoding it with hickory.

/// Record types the zone answers or the reader knows.
pub mod rtype {
    /// IPv4 address.
    pub const A: u16 = 1;
    /// Start of authority.
    pub const SOA: u16 = 6;
    /// IPv6 address.
    pub const AAAA: u16 = 28;
    /// Service location (RFC 2782).
    pub const SRV: u16 = 33;
    /// EDNS(0) pseudo-record.
    pub const OPT: u16 = 41;
    /// Any type (a question only).
    pub const ANY: u16 = 255;
}

/// Class IN.
pub const CLASS_IN: u16 = 1;
/// Class ANY (a question only).
pub const CLASS_ANY: u16 = 255;
/// Largest UDP payload we advertise and accept to send (the DNS flag day 2020 value).
pub const OUR_UDP_PAYLOAD: u16 = 1232;
/// Header length.
pub const HEADER_LEN: usize = 12;
/// Length of the OPT record we append: root name, type, class, TTL, empty RDATA.
pub const OPT_LEN: usize = 11;
/// Longest name in wire form (RFC 1035 §2.3.4).
pub const MAX_NAME: usize = 255;
/// EDNS option code hickory parses (client subnet) rather than keeping opaque: a query
/// carrying it goes to hickory, so a malformed one gets FORMERR as before.
const EDNS_CLIENT_SUBNET: u16 = 8;

/// The EDNS(0) part of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edns {
    /// The client's UDP payload size (the OPT class), as sent.
    pub payload: u16,
    /// EDNS version.
    pub version: u8,
}

/// A query, as the answer writer needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Question<'a> {
    /// Message ID.
    pub id: u16,
    /// Recursion desired (echoed).
    pub rd: bool,
    /// Checking disabled (echoed).
    pub cd: bool,
    /// The question name in wire form, uncompressed, spelt as the client spelt it.
    pub name: &'a [u8],
    /// Question type.
    pub qtype: u16,
    /// Question class.
    pub qclass: u16,
    /// The query's OPT record, if any.
    pub edns: Option<Edns>,
}

fn u16_at(p: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*p.get(i)?, *p.get(i + 1)?]))
}

/// Where the uncompressed name starting at `start` ends (the index after its root label),
/// or `None` for a pointer, a reserved label type, a name over [`MAX_NAME`] or a cut.
pub fn name_end(p: &[u8], start: usize) -> Option<usize> {
    let mut i = start;
    loop {
        let len = usize::from(*p.get(i)?);
        if len == 0 {
            return (i + 1 - start <= MAX_NAME).then_some(i + 1);
        }
        if len > 63 {
            return None;
        }
        i += 1 + len;
        if i - start >= MAX_NAME {
            return None;
        }
    }
}

/// Reads the plain query shape: a query (QR clear) with opcode QUERY, one uncompressed
/// question, no answer or authority records, and at most one additional record that is an
/// EDNS(0) OPT at the root whose options are well formed (and not client subnet). `None`
/// for anything else: the caller hands that to the general decoder.
pub fn read_plain_query(p: &[u8]) -> Option<Question<'_>> {
    if p.len() < HEADER_LEN || p[2] & 0xf8 != 0 {
        return None; // QR set, or an opcode other than QUERY
    }
    let counts = [u16_at(p, 4)?, u16_at(p, 6)?, u16_at(p, 8)?, u16_at(p, 10)?];
    if counts[0] != 1 || counts[1] != 0 || counts[2] != 0 || counts[3] > 1 {
        return None;
    }
    let end = name_end(p, HEADER_LEN)?;
    let qtype = u16_at(p, end)?;
    let qclass = u16_at(p, end + 2)?;
    let edns = if counts[3] == 1 {
        Some(read_opt(p, end + 4)?)
    } else {
        None
    };
    Some(Question {
        id: u16::from_be_bytes([p[0], p[1]]),
        rd: p[2] & 0x01 != 0,
        cd: p[3] & 0x10 != 0,
        name: &p[HEADER_LEN..end],
        qtype,
        qclass,
        edns,
    })
}

/// An OPT record at `at` owned by the root, with options that fill its RDATA exactly.
fn read_opt(p: &[u8], at: usize) -> Option<Edns> {
    if *p.get(at)? != 0 || u16_at(p, at + 1)? != rtype::OPT {
        return None;
    }
    let payload = u16_at(p, at + 3)?;
    let version = *p.get(at + 6)?;
    let rdlen = usize::from(u16_at(p, at + 9)?);
    let rdata = p.get(at + 11..at + 11 + rdlen)?;
    let mut i = 0;
    while i < rdata.len() {
        let code = u16_at(rdata, i)?;
        let len = usize::from(u16_at(rdata, i + 2)?);
        if code == EDNS_CLIENT_SUBNET || i + 4 + len > rdata.len() {
            return None;
        }
        i += 4 + len;
    }
    Some(Edns { payload, version })
}

/// Header flag bits of a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    /// Authoritative answer.
    pub aa: bool,
    /// Truncated.
    pub tc: bool,
    /// Recursion desired (echoed).
    pub rd: bool,
    /// Checking disabled (echoed).
    pub cd: bool,
    /// Response code (the low four bits).
    pub rcode: u8,
}

/// The owner of a record being written.
#[derive(Debug, Clone, Copy)]
pub enum Owner<'n> {
    /// The question name (a pointer to it).
    Question,
    /// The zone origin.
    Origin,
    /// One label under the origin (`etcd-0`).
    UnderOrigin(&'n [u8]),
}

/// Message sections that hold records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// Answer.
    Answer,
    /// Authority.
    Authority,
    /// Additional.
    Additional,
}

/// A position to roll back to (a record that did not fit).
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    len: usize,
    counts: [u16; 3],
}

/// Writes one response into a caller's buffer: header, the question, records whose names
/// are the question or sit under the zone origin (compressed against the question when the
/// origin is its suffix, else against the origin's first copy), and OPT.
#[derive(Debug)]
pub struct Writer<'b> {
    out: &'b mut Vec<u8>,
    origin: &'b [u8],
    origin_at: Option<u16>,
    counts: [u16; 3],
    question_end: usize,
}

/// Offset a compression pointer can reach.
const MAX_POINTER: usize = 0x3fff;

impl<'b> Writer<'b> {
    /// Starts a response to `q` in `out` (cleared) for a zone whose origin is `origin`
    /// (wire form, lower case).
    pub fn new(out: &'b mut Vec<u8>, q: &Question<'_>, origin: &'b [u8]) -> Self {
        out.clear();
        out.extend_from_slice(&[0; HEADER_LEN]);
        out.extend_from_slice(q.name);
        out.extend_from_slice(&q.qtype.to_be_bytes());
        out.extend_from_slice(&q.qclass.to_be_bytes());
        let origin_at = suffix_at(q.name, origin).map(|i| (HEADER_LEN + i) as u16);
        Writer {
            question_end: out.len(),
            out,
            origin,
            origin_at,
            counts: [0; 3],
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// Whether nothing but the header and question is written.
    pub fn is_empty(&self) -> bool {
        self.out.len() == self.question_end
    }

    /// The current position, for [`Writer::rollback`].
    pub fn mark(&self) -> Mark {
        Mark {
            len: self.out.len(),
            counts: self.counts,
        }
    }

    /// Forgets everything written after `m`.
    pub fn rollback(&mut self, m: Mark) {
        self.out.truncate(m.len);
        self.counts = m.counts;
        if self.origin_at.is_some_and(|at| usize::from(at) >= m.len) {
            self.origin_at = None;
        }
    }

    /// Drops every record (the truncated form keeps the question).
    pub fn clear_records(&mut self) {
        self.rollback(Mark {
            len: self.question_end,
            counts: [0; 3],
        });
    }

    fn pointer(&mut self, at: u16) {
        self.out.extend_from_slice(&(0xc000 | at).to_be_bytes());
    }

    /// Writes `label` (if any) then the origin: a pointer to an earlier copy when
    /// `compress`, else in full (remembered for later pointers when it can be reached).
    fn name_under_origin(&mut self, label: Option<&[u8]>, compress: bool) {
        if let Some(label) = label {
            self.out.push(label.len() as u8);
            self.out.extend_from_slice(label);
        }
        match self.origin_at {
            Some(at) if compress => self.pointer(at),
            _ => {
                if compress && self.out.len() <= MAX_POINTER {
                    self.origin_at = Some(self.out.len() as u16);
                }
                self.out.extend_from_slice(self.origin);
            }
        }
    }

    fn owner(&mut self, owner: Owner<'_>) {
        match owner {
            Owner::Question => self.pointer(HEADER_LEN as u16),
            Owner::Origin => self.name_under_origin(None, true),
            Owner::UnderOrigin(label) => self.name_under_origin(Some(label), true),
        }
    }

    /// Writes a record header; returns where its RDATA length goes ([`Writer::end_record`]).
    fn begin_record(&mut self, owner: Owner<'_>, rtype: u16, ttl: u32) -> usize {
        self.owner(owner);
        self.out.extend_from_slice(&rtype.to_be_bytes());
        self.out.extend_from_slice(&CLASS_IN.to_be_bytes());
        self.out.extend_from_slice(&ttl.to_be_bytes());
        self.out.extend_from_slice(&[0, 0]);
        self.out.len()
    }

    fn end_record(&mut self, rdata_at: usize, section: Section) {
        let len = (self.out.len() - rdata_at) as u16;
        self.out[rdata_at - 2..rdata_at].copy_from_slice(&len.to_be_bytes());
        self.counts[section as usize] += 1;
    }

    /// An A or AAAA record.
    pub fn address(&mut self, section: Section, owner: Owner<'_>, ttl: u32, ip: std::net::IpAddr) {
        let (t, bytes): (u16, &[u8]) = match &ip {
            std::net::IpAddr::V4(v4) => (rtype::A, &v4.octets()[..]),
            std::net::IpAddr::V6(v6) => (rtype::AAAA, &v6.octets()[..]),
        };
        let at = self.begin_record(owner, t, ttl);
        self.out.extend_from_slice(bytes);
        self.end_record(at, section);
    }

    /// An SRV record whose target is `label` under the origin, written uncompressed as
    /// RFC 2782 requires.
    pub fn srv(&mut self, owner: Owner<'_>, ttl: u32, srv: [u16; 3], target: &[u8]) {
        let at = self.begin_record(owner, rtype::SRV, ttl);
        for v in srv {
            self.out.extend_from_slice(&v.to_be_bytes());
        }
        self.name_under_origin(Some(target), false);
        self.end_record(at, Section::Answer);
    }

    /// The zone's SOA record (`ns.<origin>`, `hostmaster.<origin>`, then the five numbers).
    pub fn soa(&mut self, section: Section, owner: Owner<'_>, ttl: u32, numbers: [u32; 5]) {
        let at = self.begin_record(owner, rtype::SOA, ttl);
        self.name_under_origin(Some(b"ns"), true);
        self.name_under_origin(Some(b"hostmaster"), true);
        for n in numbers {
            self.out.extend_from_slice(&n.to_be_bytes());
        }
        self.end_record(at, section);
    }

    /// Appends our OPT record (payload `payload`, version 0, no flags or options) and
    /// finishes the header; returns the message length.
    pub fn finish(self, id: u16, flags: Flags, opt_payload: Option<u16>) -> usize {
        let mut additional = self.counts[Section::Additional as usize];
        if let Some(payload) = opt_payload {
            self.out.push(0);
            self.out.extend_from_slice(&rtype::OPT.to_be_bytes());
            self.out.extend_from_slice(&payload.to_be_bytes());
            self.out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
            additional += 1;
        }
        let h = &mut self.out[..HEADER_LEN];
        h[0..2].copy_from_slice(&id.to_be_bytes());
        h[2] = 0x80 | if flags.aa { 0x04 } else { 0 } | if flags.tc { 0x02 } else { 0 };
        h[2] |= u8::from(flags.rd);
        // RA is set, as on every answer of this server (forwarding is offered).
        h[3] = 0x80 | if flags.cd { 0x10 } else { 0 } | (flags.rcode & 0x0f);
        h[4..6].copy_from_slice(&1u16.to_be_bytes());
        h[6..8].copy_from_slice(&self.counts[Section::Answer as usize].to_be_bytes());
        h[8..10].copy_from_slice(&self.counts[Section::Authority as usize].to_be_bytes());
        h[10..12].copy_from_slice(&additional.to_be_bytes());
        self.out.len()
    }
}

/// Where `suffix` (lower case) starts in the wire name `name`, compared case-insensitively
/// on label boundaries.
pub fn suffix_at(name: &[u8], suffix: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < name.len() {
        if name.len() - i == suffix.len() {
            return name[i..].eq_ignore_ascii_case(suffix).then_some(i);
        }
        if name.len() - i < suffix.len() || name[i] == 0 {
            return None;
        }
        i += 1 + usize::from(name[i]);
    }
    None
}

/// `name` (text, dotted, with or without the final dot) in wire form, lower case; `None`
/// for an empty or over-long label or name.
pub fn name_to_wire(name: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(name.len() + 2);
    for label in name
        .trim_end_matches('.')
        .split('.')
        .filter(|l| !l.is_empty())
    {
        if label.len() > 63 {
            return None;
        }
        out.push(label.len() as u8);
        out.extend(label.bytes().map(|b| b.to_ascii_lowercase()));
    }
    out.push(0);
    (out.len() <= MAX_NAME).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns as HEdns, Message, Query};
    use hickory_proto::rr::{Name, RecordType};

    fn query(name: &str, t: RecordType, edns: Option<u16>) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = 0xbeef;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        if let Some(size) = edns {
            let mut e = HEdns::new();
            e.set_max_payload(size);
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    #[test]
    fn reads_the_plain_shape() {
        let p = query("Api.ocp4.example.com.", RecordType::AAAA, Some(4096));
        let q = read_plain_query(&p).unwrap();
        assert_eq!(q.id, 0xbeef);
        assert!(q.rd && !q.cd);
        assert_eq!(q.name, b"\x03Api\x04ocp4\x07example\x03com\x00");
        assert_eq!((q.qtype, q.qclass), (28, 1));
        assert_eq!(
            q.edns,
            Some(Edns {
                payload: 4096,
                version: 0
            })
        );
        assert_eq!(
            read_plain_query(&query("x.", RecordType::A, None))
                .unwrap()
                .edns,
            None
        );
    }

    #[test]
    fn leaves_the_rest_to_the_decoder() {
        let p = query("a.example.", RecordType::A, None);
        let mut response = p.clone();
        response[2] |= 0x80;
        assert!(read_plain_query(&response).is_none());
        let mut notify = p.clone();
        notify[2] |= 4 << 3;
        assert!(read_plain_query(&notify).is_none());
        let mut two = p.clone();
        two[5] = 2;
        assert!(read_plain_query(&two).is_none());
        // A compressed question name (pointer to itself is as good as any).
        let mut ptr = p[..12].to_vec();
        ptr.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        assert!(read_plain_query(&ptr).is_none());
        assert!(read_plain_query(&p[..p.len() - 1]).is_none());
        // Client subnet goes to the decoder (which parses it).
        let mut ecs = query("a.example.", RecordType::A, Some(1232));
        let n = ecs.len();
        ecs[n - 2..].copy_from_slice(&[0, 8]);
        ecs.extend_from_slice(&[0, 8, 0, 4, 0, 1, 0, 0]);
        assert!(read_plain_query(&ecs).is_none());
    }

    #[test]
    fn name_limits() {
        let mut long = Vec::new();
        for _ in 0..3 {
            long.push(63);
            long.extend([b'a'; 63]);
        }
        long.push(61);
        long.extend([b'b'; 61]);
        long.push(0);
        assert_eq!(long.len(), 255);
        assert_eq!(name_end(&long, 0), Some(255));
        assert_eq!(name_end(&long[..200], 0), None, "cut short");
        let mut over = long[..192].to_vec();
        over.push(62);
        over.extend([b'c'; 62]);
        over.push(0);
        assert_eq!(over.len(), 256);
        assert_eq!(name_end(&over, 0), None);
        assert_eq!(name_end(&[64, 0], 0), None);
    }

    #[test]
    fn suffix_on_label_boundaries() {
        let origin = name_to_wire("ocp4.example.com").unwrap();
        let name = name_to_wire("api.OCP4.example.com").unwrap();
        assert_eq!(suffix_at(&name, &origin), Some(4));
        assert_eq!(suffix_at(&origin, &origin), Some(0));
        let other = name_to_wire("xocp4.example.com").unwrap();
        assert_eq!(suffix_at(&other, &origin), None);
        assert_eq!(suffix_at(&name_to_wire("com").unwrap(), &origin), None);
        assert_eq!(name_to_wire(&"a".repeat(64)), None);
        assert_eq!(name_to_wire("."), Some(vec![0]));
    }
}

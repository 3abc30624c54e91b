//! Remanence (seed 000: "the queue must survive a servent shutdown …
//! provided the servent comes back quickly"): the queue as bytes, and back.
//!
//! Format, all integers big-endian:
//!
//! ```text
//! offset  size  field
//! 0       4     magic "RPQ1"
//! 4       1     format version, 2 (1 is still read)
//! 5       8     saved at, ms since the UNIX epoch (wall clock)
//! 13      4     record count, at most MAX_RECORDS
//! 17      78×n  records (70×n in version 1), head of the queue first:
//!   +0    1       kind: 1 PARQ, 2 passive
//!   +1    1       flags: 1 called back, 2 has X-Node, 4 peer is IPv4,
//!                 8 X-Node is IPv4; other bits 0
//!   +2    1       Sq disconnections used
//!   +3    1       reserved, 0
//!   +4    16      ID
//!   +20   16      peer address (IPv4 in the last 4 bytes)
//!   +36   16      X-Node address (zero without X-Node)
//!   +52   2       X-Node port (zero without X-Node)
//!   +54   4       last position told
//!   +58   4       body length for the ETA, KiB
//!   +62   4       ms until a retry is on time, from "saved at"
//!   +66   4       ms until the entry lapses, from "saved at"; not 0
//!   +70   8       the requested URL's digest (the first 8 bytes of its
//!                 blake3, little-endian, 0 taken as 1); 0 if unknown (an
//!                 entry reloaded from a version 1 file); version 2 only
//! end-32  32    blake3 of every byte before it
//! ```
//!
//! Instants do not survive a restart, so times are stored as what remains
//! of them at the save, and the downtime (the wall-clock gap between save
//! and load) is taken off at the load. A downtime longer than `remanence`
//! (300 s) drops every entry (issue 5: "entries survive a restart of up to
//! 300 s"); a wall clock that went backwards counts as no downtime. An
//! entry bound to a connection keeps the lifetime it has (Retry-After +
//! `lifetime_grace`): cutting it to `remanence`, as a disconnection from Sq
//! once did, lost the places of positions told to come back after more
//! than 300 s. Legacy entries are not saved: seed 001 holds a place only
//! as long as its connection, and upload slots in progress end with the
//! process.
//!
//! Version 2 added the URL's digest, so that after a restart a PARQ
//! request without its ID finds its address's entry for the URL rather
//! than making a second one. A version 1 file is still read, its entries
//! with no URL (such a request then makes a new entry, as before); and a
//! PARQ entry whose lifetime ended before its Retry-After (which version 1
//! files of Sq entries could hold) gets `lifetime_grace` after it. Any
//! other version is refused ([`RemanenceError::UnsupportedVersion`]), and
//! the caller starts with an empty queue.
//!
//! Any byte string gives a queue or a [`RemanenceError`]; writing the bytes
//! crash-safely (temp file, fsync, rename) is the caller's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;
use tokio::time::Instant;

use super::{Entry, IdGenerator, Kind, QueueConfig, QueueId, UploadQueue};

const MAGIC: &[u8; 4] = b"RPQ1";
/// The version written.
const VERSION: u8 = 2;
/// The first version, without the URL digest.
const VERSION_1: u8 = 1;
const HEADER_LEN: usize = 17;
const RECORD_LEN: usize = 78;
const RECORD_LEN_V1: usize = 70;
const CHECKSUM_LEN: usize = 32;
/// Most records a remanence file may hold, whatever `queue_max` says.
pub const MAX_RECORDS: u32 = 1 << 20;

const FLAG_CALLED_BACK: u8 = 1;
const FLAG_HAS_NODE: u8 = 2;
const FLAG_PEER_V4: u8 = 4;
const FLAG_NODE_V4: u8 = 8;
const KNOWN_FLAGS: u8 = FLAG_CALLED_BACK | FLAG_HAS_NODE | FLAG_PEER_V4 | FLAG_NODE_V4;

/// Why saved queue bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RemanenceError {
    /// Shorter than a header and checksum.
    #[error("{len} bytes, too short for a queue file ({min} at least)")]
    TooShort {
        /// Length given.
        len: usize,
        /// Minimum length.
        min: usize,
    },
    /// Not a queue file.
    #[error("bad magic")]
    BadMagic,
    /// A format version this build does not read.
    #[error("format version {version} is not supported")]
    UnsupportedVersion {
        /// The version found.
        version: u8,
    },
    /// More records than [`MAX_RECORDS`].
    #[error("{count} records, more than {max}")]
    TooManyRecords {
        /// Records announced.
        count: u32,
        /// The limit.
        max: u32,
    },
    /// The length does not match the record count.
    #[error("{len} bytes, expected {expected} for the record count")]
    LengthMismatch {
        /// Length given.
        len: usize,
        /// Length the count implies.
        expected: usize,
    },
    /// The checksum does not match: torn or altered bytes.
    #[error("checksum mismatch")]
    ChecksumMismatch,
    /// A record with an impossible field.
    #[error("record {index}: {problem}")]
    BadRecord {
        /// Zero-based record index.
        index: usize,
        /// What is wrong.
        problem: &'static str,
    },
}

fn millis(duration: Duration) -> u32 {
    u32::try_from(duration.as_millis()).unwrap_or(u32::MAX)
}

fn unix_millis(wall: SystemTime) -> u64 {
    wall.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn put_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            out.extend_from_slice(&[0; 12]);
            out.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => out.extend_from_slice(&v6.octets()),
    }
}

fn get_ip(bytes: &[u8; 16], is_v4: bool) -> Option<IpAddr> {
    if is_v4 {
        if bytes[..12] != [0; 12] {
            return None;
        }
        Some(IpAddr::V4(Ipv4Addr::new(
            bytes[12], bytes[13], bytes[14], bytes[15],
        )))
    } else {
        Some(IpAddr::V6(Ipv6Addr::from(*bytes)))
    }
}

fn array<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    bytes[at..at + N]
        .try_into()
        .expect("callers check the record length first")
}

impl UploadQueue {
    /// The queue as bytes for [`UploadQueue::from_bytes`]: PARQ and
    /// passive entries, head first, times relative to `wall` (the wall
    /// clock at `now`).
    pub fn to_bytes(&self, now: Instant, wall: SystemTime) -> Vec<u8> {
        let records: Vec<&Entry> = self
            .entries
            .values()
            .filter(|e| e.kind != Kind::Active && e.deadline > now)
            .collect();
        let count = u32::try_from(records.len())
            .unwrap_or(u32::MAX)
            .min(MAX_RECORDS);
        let mut out = Vec::with_capacity(HEADER_LEN + records.len() * RECORD_LEN + CHECKSUM_LEN);
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&unix_millis(wall).to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        for entry in records.into_iter().take(count as usize) {
            let mut flags = 0;
            if entry.called_back {
                flags |= FLAG_CALLED_BACK;
            }
            if entry.node.is_some() {
                flags |= FLAG_HAS_NODE;
            }
            if entry.peer.is_ipv4() {
                flags |= FLAG_PEER_V4;
            }
            if entry.node.is_some_and(|n| n.is_ipv4()) {
                flags |= FLAG_NODE_V4;
            }
            out.push(entry.kind as u8);
            out.push(flags);
            out.push(entry.disconnects);
            out.push(0);
            out.extend_from_slice(entry.id.as_bytes());
            put_ip(&mut out, entry.peer);
            match entry.node {
                Some(node) => {
                    put_ip(&mut out, node.ip());
                    out.extend_from_slice(&node.port().to_be_bytes());
                }
                None => out.extend_from_slice(&[0; 18]),
            }
            out.extend_from_slice(&entry.last_position.to_be_bytes());
            out.extend_from_slice(&entry.len_kib.to_be_bytes());
            let not_before = entry.not_before.saturating_duration_since(now);
            let left = entry.deadline.saturating_duration_since(now);
            out.extend_from_slice(&millis(not_before).to_be_bytes());
            out.extend_from_slice(&millis(left).max(1).to_be_bytes());
            out.extend_from_slice(&entry.resource.to_le_bytes());
        }
        let checksum = blake3::hash(&out);
        out.extend_from_slice(checksum.as_bytes());
        out
    }

    /// A queue from bytes written by [`UploadQueue::to_bytes`], `wall`
    /// being the wall clock at `now`. Entries whose time ran out during the
    /// downtime are dropped, all of them if the downtime exceeds
    /// `config.remanence`; entries past `config.queue_max` are dropped from
    /// the back. No upload is in progress.
    ///
    /// # Errors
    /// A [`RemanenceError`] if the bytes are not a whole, intact queue file
    /// of version 1 or 2.
    pub fn from_bytes(
        config: QueueConfig,
        ids: IdGenerator,
        bytes: &[u8],
        now: Instant,
        wall: SystemTime,
    ) -> Result<Self, RemanenceError> {
        let min = HEADER_LEN + CHECKSUM_LEN;
        if bytes.len() < min {
            return Err(RemanenceError::TooShort {
                len: bytes.len(),
                min,
            });
        }
        if &bytes[..4] != MAGIC {
            return Err(RemanenceError::BadMagic);
        }
        let version = bytes[4];
        let record_len = match version {
            VERSION => RECORD_LEN,
            VERSION_1 => RECORD_LEN_V1,
            _ => return Err(RemanenceError::UnsupportedVersion { version }),
        };
        let saved_at = u64::from_be_bytes(array(bytes, 5));
        let count = u32::from_be_bytes(array(bytes, 13));
        if count > MAX_RECORDS {
            return Err(RemanenceError::TooManyRecords {
                count,
                max: MAX_RECORDS,
            });
        }
        let expected = HEADER_LEN + count as usize * record_len + CHECKSUM_LEN;
        if bytes.len() != expected {
            return Err(RemanenceError::LengthMismatch {
                len: bytes.len(),
                expected,
            });
        }
        let (body, checksum) = bytes.split_at(bytes.len() - CHECKSUM_LEN);
        if blake3::hash(body).as_bytes() != checksum {
            return Err(RemanenceError::ChecksumMismatch);
        }

        let mut queue = UploadQueue::new(config, ids);
        let downtime = Duration::from_millis(unix_millis(wall).saturating_sub(saved_at));
        let mut records = Vec::with_capacity(count as usize);
        for (index, record) in body[HEADER_LEN..].chunks_exact(record_len).enumerate() {
            records.push(parse_record(record, index, downtime, &queue.config, now)?);
        }
        // Every record was checked before any is dropped: a corrupt file is
        // refused whatever the downtime.
        if downtime > queue.config.remanence {
            return Ok(queue);
        }
        for (index, entry) in records.into_iter().enumerate() {
            let Some(entry) = entry else { continue };
            if queue.by_id.contains_key(&entry.id, now) {
                return Err(RemanenceError::BadRecord {
                    index,
                    problem: "duplicate ID",
                });
            }
            if entry.kind == Kind::Passive && queue.by_address.contains_key(&entry.peer, now) {
                return Err(RemanenceError::BadRecord {
                    index,
                    problem: "duplicate passive address",
                });
            }
            if queue.is_full() {
                break;
            }
            queue.insert(entry, false, now);
        }
        Ok(queue)
    }
}

/// One record (of either version: its length tells) as an entry, or
/// `None` if its time ran out in the downtime.
fn parse_record(
    record: &[u8],
    index: usize,
    downtime: Duration,
    config: &QueueConfig,
    now: Instant,
) -> Result<Option<Entry>, RemanenceError> {
    let bad = |problem| RemanenceError::BadRecord { index, problem };
    let kind = match record[0] {
        1 => Kind::Parq,
        2 => Kind::Passive,
        _ => return Err(bad("unknown kind")),
    };
    let flags = record[1];
    if flags & !KNOWN_FLAGS != 0 {
        return Err(bad("unknown flags"));
    }
    if record[3] != 0 {
        return Err(bad("reserved byte set"));
    }
    let has_node = flags & FLAG_HAS_NODE != 0;
    let peer = get_ip(&array(record, 20), flags & FLAG_PEER_V4 != 0)
        .ok_or_else(|| bad("IPv4 peer with high bytes set"))?;
    let node_ip: [u8; 16] = array(record, 36);
    let port = u16::from_be_bytes(array(record, 52));
    let node = if has_node {
        if port == 0 {
            return Err(bad("X-Node port 0"));
        }
        let ip = get_ip(&node_ip, flags & FLAG_NODE_V4 != 0)
            .ok_or_else(|| bad("IPv4 X-Node with high bytes set"))?;
        Some(SocketAddr::new(ip, port))
    } else {
        if node_ip != [0; 16] || port != 0 || flags & (FLAG_NODE_V4 | FLAG_CALLED_BACK) != 0 {
            return Err(bad("X-Node fields without X-Node"));
        }
        None
    };
    if kind == Kind::Passive && (has_node || record[2] != 0) {
        return Err(bad("passive entry with PARQ fields"));
    }
    let last_position = u32::from_be_bytes(array(record, 54));
    let len_kib = u32::from_be_bytes(array(record, 58));
    let not_before = Duration::from_millis(u64::from(u32::from_be_bytes(array(record, 62))));
    let left = Duration::from_millis(u64::from(u32::from_be_bytes(array(record, 66))));
    if left.is_zero() {
        return Err(bad("lapsed entry"));
    }
    let resource = if record.len() == RECORD_LEN {
        u64::from_le_bytes(array(record, 70))
    } else {
        0
    };
    // A place outlives the Retry-After it was told (version 1 files cut
    // Sq entries to 300 s).
    let left = if kind == Kind::Parq && left < not_before + config.retry_slack {
        not_before + config.lifetime_grace
    } else {
        left
    };
    let Some(left) = left.checked_sub(downtime).filter(|d| !d.is_zero()) else {
        return Ok(None);
    };
    Ok(Some(Entry {
        id: QueueId::from_bytes(array(record, 4)),
        not_before: now + not_before.saturating_sub(downtime),
        deadline: now + left,
        peer,
        node,
        connection: None,
        resource,
        len_kib,
        last_position,
        prev_position: 0,
        kind,
        disconnects: record[2],
        called_back: flags & FLAG_CALLED_BACK != 0,
        claims: false,
        woken: false,
    }))
}

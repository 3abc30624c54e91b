//! Fair upload slots (issue 5): the accelerator's queue of requests waiting
//! for an upload slot, sans-IO. An "upload slot" is a response body being
//! sent; a request beyond the slots waits in one first-come first-served
//! queue, whatever dialect its client speaks:
//!
//! - PARQ 1.0.a (seed 000, request `X-Queue: 1.0`, [`parq`]): the client
//!   gets a random ID and keeps its place by coming back with
//!   `X-Queued: position=…; ID=…` after `Retry-After` and within the
//!   lifetime. Entries near the head (the synchronous part, Sq) keep their
//!   connection; the rest (Aq) are told to close it. A client that gave
//!   `X-Node` and lets its lifetime lapse gets one QUEUE callback.
//! - Passive queueing (seed 000 §5, no `X-Queue`, also in [`parq`]): the
//!   place is kept by peer address for 300 s after each request.
//! - Active Queueing 0.1 (seed 001, `X-Queue: 0.1`, [`active`]): the place
//!   is kept by the persistent connection, polled between pollMin and
//!   pollMax.
//!
//! Who gets a free slot. Seed 000 holds a free slot for the head of the
//! queue until it comes back ("If all the slots before become cancelled,
//! this will force the server to reserve the slot for that amount of
//! time", the Retry-After), but a client that gave up cannot say so (PARQ
//! has no cancel: "the client simply stops sending requests"), so held
//! until the place lapses, a slot stayed idle for Retry-After + 300 s
//! behind every abandoned head. Our reading, fair to whoever plays by the
//! rules and bounded for whoever does not:
//!
//! - an entry *claims* a free slot from each reply until its Retry-After
//!   (pollMin for legacy) plus `slot_hold_grace` (10 s), or a grace after
//!   its QUEUE callback; a request is served when fewer entries before it
//!   claim a slot than there are free slots, and a newcomer when fewer
//!   entries claim one at all. So a client that comes back on time is
//!   never overtaken by one behind it (beyond the free slots);
//! - an entry whose claim ran out keeps its place (position, ID, address)
//!   until it lapses as before. When it comes back, it is served if a
//!   slot is free and no claim is ahead of it, and otherwise told its place
//!   with a fresh Retry-After and claim: it gets the next free slot before
//!   those behind it. The slot it was not there for went to the next
//!   claimant in line meanwhile;
//! - a PARQ entry with `X-Node` that a free slot is held for before its
//!   Retry-After is called back at once (seed 000 §6: "the server would
//!   then send back QUEUE requests to them, and they would get back their
//!   slot immediately"), once per request of its client, and its answer
//!   counts as on time: a callback never makes a client too early. A lapse
//!   callback does the same;
//! - every place outlives the Retry-After it was told plus slack: Aq by its
//!   lifetime (Retry-After + `lifetime_grace`), a place disconnected from
//!   Sq until `lifetime_grace` past its Retry-After and at least
//!   `remanence` (the seed's "300 seconds max the first time" would lose
//!   positions 15 to 50, told 310 to 600 s), passive 300 s against at most
//!   250 s.
//!
//! Positions, ETAs and claims are prefix sums in a Fenwick tree over the
//! entries' order (`ranks.rs`): O(log n) per request.
//!
//! One address cannot fill the queue: it holds at most `per_address_max`
//! entries (`--queue-per-address`, all dialects together; past it a plain
//! `503`), and a PARQ request without an ID for a URL its address already
//! waits for gets that entry back rather than a new one (see [`parq`]).
//!
//! The caller owns the I/O and the clock: every method that needs the time
//! takes `now` ([`tokio::time::Instant`], so tests drive it directly), and
//! remanence across restarts ([`UploadQueue::to_bytes`],
//! [`UploadQueue::from_bytes`]) also takes the wall clock, since a
//! monotonic instant does not survive a restart. Writing the bytes to disk
//! crash-safely (temp file + rename), opening callback connections, and
//! checking auth before [`UploadQueue::admit`] are the caller's.
//! IDs, address slots and flood counters are kept in
//! [`ExpiringMap`]s (seed 003: tables whose
//! entries expire by age).
//!
//! Memory: an entry costs its `Entry` record, its place in the order,
//! lapse and claim trees, its share of the rank tree, two or three index
//! slots and at most one per-address count; [`ESTIMATED_BYTES_PER_ENTRY`]
//! adds these up (762 bytes on x86-64, under the 1 KiB).
//!
//! This file holds [`UploadQueue`], its entries and its public methods;
//! the rest is split by reason to change: `config.rs` (settings),
//! `admission.rs` (requests and answers on the wire), [`parq`] and
//! [`active`] (the dialects), `slots.rs` (who may take a free slot,
//! positions, ETAs), `limits.rs` (caps and flood counters), `order.rs`
//! (the order and its indexes), `expiry.rs` (lapses, claims, callbacks),
//! [`remanence`] (across restarts), [`headers`], [`id`] and `ranks.rs`.
//!
//! Main types: [`UploadQueue`], [`QueueConfig`], [`QueueRequest`],
//! [`Admission`], [`SlotToken`], [`Callback`].

pub mod active;
mod admission;
mod config;
mod expiry;
pub mod headers;
pub mod id;
mod limits;
mod order;
pub mod parq;
mod ranks;
pub mod remanence;
mod slots;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use tokio::time::Instant;

use crate::expiring::ExpiringMap;
use ranks::{Ranks, Sums};

pub use admission::{
    Admission, Callback, Completion, ConnectionId, LostPlace, QueueRequest, QueuedReply, Refusal,
    RefusalReason, ReplyForm, SlotToken, X_NODE, X_QUEUE, X_QUEUED,
};
pub use config::QueueConfig;
pub use headers::{HeaderError, LegacyStatus, QueueVersion, QueuedStatus, XQueue};
pub use id::{IdGenerator, QueueId, QueueIdError};
pub use remanence::RemanenceError;

/// Order key: a smaller sequence number is nearer the head. New entries
/// count up from the middle of the range, entries put back at the head
/// (legacy partial follow-up) count down from it.
type Seq = u64;
const SEQ_MIDDLE: Seq = 1 << 63;

/// The dialect an entry was queued in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Parq = 1,
    Passive = 2,
    Active = 3,
}

/// One queued request. Kept small: the queue may hold thousands.
#[derive(Debug, Clone)]
struct Entry {
    id: QueueId,
    /// A retry before this is too early (PARQ, legacy pollMin) or
    /// hammering (passive).
    not_before: Instant,
    /// The entry lapses at this instant (lifetime, 300 s, pollMax).
    deadline: Instant,
    peer: IpAddr,
    node: Option<SocketAddr>,
    /// The held connection (Sq, legacy).
    connection: Option<ConnectionId>,
    /// Hash of the requested resource (legacy same-file rule).
    resource: u64,
    /// Body length for the ETA, KiB, saturating.
    len_kib: u32,
    /// The position last told to the client.
    last_position: u32,
    /// The position told in the reply before that, 0 if none: a twin
    /// holder of the ID may still come back with it (PARQ).
    prev_position: u32,
    kind: Kind,
    disconnects: u8,
    called_back: bool,
    /// Whether it claims a free upload slot: until `not_before` +
    /// `slot_hold_grace`. Kept in step with `claim_ends` and the rank tree
    /// by `set_not_before` and `purge`.
    claims: bool,
    /// Whether it was called back early, to a slot held for it, since its
    /// client's last request (one such callback per request).
    woken: bool,
}

impl Entry {
    /// What the entry adds to the rank tree.
    fn sums(&self) -> Sums {
        Sums {
            entries: 1,
            claims: u32::from(self.claims),
            kib: u64::from(self.len_kib),
        }
    }
}

/// An estimate of the memory one queued entry costs, in bytes: the
/// `Entry` record in the order tree, its item in the lapse tree, its ID
/// in the ID table and its address or connection in an index table, each
/// tree or hash node counted with 50 % overhead (B-tree nodes are at least
/// half full; hash tables keep load below 7/8 plus control bytes).
pub const ESTIMATED_BYTES_PER_ENTRY: usize = {
    let order = size_of::<Seq>() + size_of::<Entry>();
    // Its lapse and the end of its claim on a slot.
    let lapse = 2 * size_of::<(Instant, Seq)>();
    // The rank tree's window is 2 to 8 times the entries, so 4 nodes each
    // on average (the 50 % overhead below covers the rest).
    let ranks = 4 * size_of::<Sums>();
    let ids = expiring_entry_bytes(size_of::<QueueId>());
    let index = expiring_entry_bytes(size_of::<IpAddr>());
    // A PARQ entry's (address, resource) and its address's count, each a
    // hash-table slot plus a control byte.
    let request = size_of::<((IpAddr, u64), Seq)>() + 1;
    let address = size_of::<(IpAddr, u32)>() + 1;
    (order + lapse + ranks + ids + index + request + address) * 3 / 2
};

/// An ExpiringMap entry with a `key`-byte key and a [`Seq`] value: key and
/// (value, deadline, generation) in its hash map, plus (deadline,
/// generation) → key in its expiry tree.
const fn expiring_entry_bytes(key: usize) -> usize {
    key + size_of::<Seq>() + size_of::<Instant>() + 8 + size_of::<(Instant, u64)>() + key
}

/// The upload slots and the queue in front of them.
#[derive(Debug)]
pub struct UploadQueue {
    config: QueueConfig,
    ids: IdGenerator,
    /// Entries in queue order, head first.
    entries: BTreeMap<Seq, Entry>,
    /// (deadline, seq) of every entry, first to lapse first.
    lapses: BTreeSet<(Instant, Seq)>,
    /// (end of claim, seq) of the entries that claim a free slot.
    claim_ends: BTreeSet<(Instant, Seq)>,
    /// Entries, claims and body lengths by seq, for positions, ETAs and
    /// who may take a free slot in O(log n).
    ranks: Ranks,
    by_id: ExpiringMap<QueueId, Seq>,
    by_address: ExpiringMap<IpAddr, Seq>,
    by_connection: ExpiringMap<ConnectionId, Seq>,
    /// The PARQ entry of each (address, resource hash), so a request
    /// without an ID finds its address's place for the URL. Holds exactly
    /// the live PARQ entries with a known resource (`insert`, `remove`),
    /// so it needs no expiry of its own.
    by_request: HashMap<(IpAddr, u64), Seq>,
    /// Entries per address, for `per_address_max`; kept by `insert` and
    /// `remove` like `by_request`.
    per_address: HashMap<IpAddr, u32>,
    /// PARQ and legacy rule violations per address.
    strikes: ExpiringMap<IpAddr, u16>,
    /// Passive requests before Retry-After per address.
    hammering: ExpiringMap<IpAddr, u16>,
    /// Tokens of the uploads in progress.
    uploads: HashSet<u64>,
    next_token: u64,
    next_back: Seq,
    next_front: Seq,
    /// Callbacks found while purging in `admit`, handed out by `tick`;
    /// at most `queue_max` are kept.
    callbacks: Vec<Callback>,
}

impl UploadQueue {
    /// An empty queue with no upload in progress.
    pub fn new(config: QueueConfig, ids: IdGenerator) -> Self {
        let remanence = config.remanence;
        let window = config.flood_window;
        UploadQueue {
            ids,
            entries: BTreeMap::new(),
            lapses: BTreeSet::new(),
            claim_ends: BTreeSet::new(),
            ranks: Ranks::new(),
            by_id: ExpiringMap::new(remanence),
            by_address: ExpiringMap::new(remanence),
            by_connection: ExpiringMap::new(remanence),
            by_request: HashMap::new(),
            per_address: HashMap::new(),
            strikes: ExpiringMap::new(window),
            hammering: ExpiringMap::new(window),
            uploads: HashSet::new(),
            next_token: 0,
            next_back: SEQ_MIDDLE,
            next_front: SEQ_MIDDLE - 1,
            callbacks: Vec::new(),
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Queued entries (lapsed ones not yet purged included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Uploads in progress.
    pub fn uploads(&self) -> u32 {
        u32::try_from(self.uploads.len()).unwrap_or(u32::MAX)
    }

    /// The position of the entry with `id`, if it is live at `now`.
    pub fn position_of(&self, id: QueueId, now: Instant) -> Option<u32> {
        let seq = *self.by_id.get(&id, now)?;
        let entry = self.entries.get(&seq)?;
        (entry.deadline > now).then(|| self.position(seq))
    }

    /// Decides what to do with a request: serve it, queue it, or refuse it.
    /// Auth must have been checked before: a place is not given to a
    /// stranger.
    pub fn admit(&mut self, request: &QueueRequest<'_>, now: Instant) -> Admission {
        self.purge(now);
        if self.is_flooding(request.peer, now) {
            return Admission::Refused(self.flood_refusal());
        }
        match request.offer {
            Some(version) if version.is_parq() => self.admit_parq(request, now),
            Some(_) if request.persistent => self.admit_active(request, now),
            // A legacy client without a persistent connection cannot hold
            // a place by it: it is queued by address like any other.
            _ => self.admit_passive(request, now),
        }
    }

    /// Gives an upload slot back. A legacy client whose partial request
    /// completed keeps the head of the queue for its next request on the
    /// same connection (seed 001).
    pub fn release(&mut self, token: SlotToken, completion: Completion, now: Instant) {
        if !self.uploads.remove(&token.id) {
            return;
        }
        if let (Completion::Partial, Some((connection, resource, peer))) =
            (completion, token.legacy)
        {
            self.purge(now);
            let id = self.fresh_id(now);
            let entry = Entry {
                id,
                not_before: now,
                deadline: now + self.config.partial_follow_up,
                peer,
                node: None,
                connection: Some(connection),
                resource,
                len_kib: 0,
                last_position: 1,
                prev_position: 0,
                kind: Kind::Active,
                disconnects: 0,
                called_back: false,
                claims: false,
                woken: false,
            };
            self.insert(entry, true, now);
        }
    }

    /// Tells the queue a client connection closed: a legacy client loses
    /// its place; a PARQ client in Sq keeps it the first
    /// `sq_disconnects_allowed` times, for `remanence` (300 s) or until
    /// `lifetime_grace` after the Retry-After it was told, whichever is
    /// later (positions 15 to 50 of Sq are told 310 to 600 s).
    pub fn disconnected(&mut self, connection: ConnectionId, now: Instant) {
        self.purge(now);
        let Some(seq) = self.by_connection.remove(&connection) else {
            return;
        };
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        if entry.connection != Some(connection) {
            return;
        }
        entry.connection = None;
        match entry.kind {
            Kind::Parq if entry.disconnects < self.config.sq_disconnects_allowed => {
                entry.disconnects += 1;
                let deadline = (now + self.config.remanence)
                    .max(entry.not_before + self.config.lifetime_grace)
                    .max(entry.deadline);
                self.set_deadline(seq, deadline, now);
            }
            _ => {
                self.remove(seq);
            }
        }
    }

    /// Frees the entries whose time is up and returns the QUEUE callbacks
    /// to make: a PARQ entry with an `X-Node` gets one callback when its
    /// lifetime lapses, and `callback_grace` more to come back; and one
    /// when a free slot is held for it before its Retry-After (see the
    /// module docs). Call it every second or so.
    pub fn tick(&mut self, now: Instant) -> Vec<Callback> {
        self.purge(now);
        self.wake_slot_holders(now);
        self.by_id.sweep(now);
        self.by_address.sweep(now);
        self.by_connection.sweep(now);
        self.strikes.sweep(now);
        self.hammering.sweep(now);
        std::mem::take(&mut self.callbacks)
    }
}

/// A stable digest of a resource, so an entry holds 8 bytes, not the URL,
/// and the remanence file can keep it across restarts and upgrades (std's
/// hashers may change between Rust releases). Never 0, which stands for
/// "unknown" (entries reloaded from a version 1 file).
fn resource_hash(resource: &str) -> u64 {
    let digest = blake3::hash(resource.as_bytes());
    let bytes: [u8; 8] = digest.as_bytes()[..8]
        .try_into()
        .expect("a blake3 digest is 32 bytes");
    u64::from_le_bytes(bytes).max(1)
}

#[cfg(test)]
mod tests;

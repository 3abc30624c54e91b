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
//! Main types: [`UploadQueue`], [`QueueConfig`], [`QueueRequest`],
//! [`Admission`], [`SlotToken`], [`Callback`].

pub mod active;
pub mod headers;
pub mod id;
pub mod parq;
mod ranks;
pub mod remanence;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, header};
use tokio::time::Instant;

use crate::expiring::ExpiringMap;
use ranks::{Ranks, Sums};

pub use headers::{HeaderError, LegacyStatus, QueueVersion, QueuedStatus, XQueue};
pub use id::{IdGenerator, QueueId, QueueIdError};
pub use remanence::RemanenceError;

/// The `X-Queue` header.
pub static X_QUEUE: HeaderName = HeaderName::from_static("x-queue");
/// The `X-Queued` header.
pub static X_QUEUED: HeaderName = HeaderName::from_static("x-queued");
/// The `X-Node` header.
pub static X_NODE: HeaderName = HeaderName::from_static("x-node");

/// Settings of an [`UploadQueue`]. [`QueueConfig::new`] fills in the
/// seeds' values for everything but the sizes.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Upload slots (`--slots`).
    pub slots: NonZeroU32,
    /// Most queued entries (`--queue-max`); past it, a plain 503.
    pub queue_max: u32,
    /// Positions up to this are the synchronous queue, Sq (seed 000:
    /// "Typically, Sq will hold the top 50 entries or so").
    pub sq_len: u32,
    /// The constant PARQ Retry-After beyond the formula's range (seed 000:
    /// "e.g. 600 seconds").
    pub retry_after_far: Duration,
    /// Added to the Retry-After to make the advertised lifetime: the time
    /// a client has to come back after it may.
    pub lifetime_grace: Duration,
    /// How long a place is held for a client disconnected from Sq, by
    /// address for a passive client, and across a restart (seed 000: 300
    /// seconds).
    pub remanence: Duration,
    /// Disconnections from Sq a PARQ entry survives (seed 000: "must allow
    /// at least 1").
    pub sq_disconnects_allowed: u8,
    /// How long an entry is held after its QUEUE callback, for the client
    /// to come back.
    pub callback_grace: Duration,
    /// How long after its Retry-After (or pollMin, or a QUEUE callback) an
    /// entry that has not come back still claims a free upload slot
    /// (`--queue-hold-grace`); past it the slot goes to the next entry in
    /// line that claims one, and the entry keeps its place (see the module
    /// docs).
    pub slot_hold_grace: Duration,
    /// How much earlier than Retry-After (or pollMin) a retry may come and
    /// still count as on time: clocks and timers are not exact.
    pub retry_slack: Duration,
    /// Legacy `pollMin`: polling sooner is flooding.
    pub legacy_poll_min: Duration,
    /// Legacy `pollMax`: not polling within it drops the place.
    pub legacy_poll_max: Duration,
    /// How long a legacy client that completed a partial request keeps the
    /// head of the queue for its next request.
    pub partial_follow_up: Duration,
    /// Window of the per-address flood counters.
    pub flood_window: Duration,
    /// PARQ rule violations (too early, wrong position) an address may
    /// commit in a window before it is refused outright.
    pub flood_max_strikes: u16,
    /// Requests before Retry-After a passive address may make in a window
    /// before it is refused outright (seed 000: ban only "if he clearly
    /// hammers"; a browser fetches a page's assets in parallel).
    pub passive_hammer_max: u16,
    /// Upload bandwidth for the ETA, bytes per second.
    pub upload_bandwidth: NonZeroU64,
    /// Body length assumed for the ETA when the request's is unknown.
    pub assumed_body_len: u64,
    /// Most entries one address may hold, whatever their dialect
    /// (`--queue-per-address`); past it, a plain 503. 0: no cap. A client
    /// proxy serves many users from one address, so the default is
    /// generous: a quarter of `queue_max`.
    pub per_address_max: u32,
    /// How long after a PARQ reply another holder of the same ID (a
    /// request that joined the entry without an ID, see [`parq`]) may come
    /// back with the position it was told and get the entry's state,
    /// rather than lose the place as too early or mismatched: the two
    /// retries are due at the same time and arrive close together.
    pub twin_window: Duration,
}

impl QueueConfig {
    /// A configuration with `slots` upload slots and at most `queue_max`
    /// queued entries, the rest at the seeds' values.
    pub fn new(slots: NonZeroU32, queue_max: u32) -> Self {
        QueueConfig {
            slots,
            queue_max,
            sq_len: 50,
            retry_after_far: Duration::from_secs(600),
            lifetime_grace: Duration::from_secs(300),
            remanence: Duration::from_secs(300),
            sq_disconnects_allowed: 1,
            callback_grace: Duration::from_secs(60),
            slot_hold_grace: Duration::from_secs(10),
            retry_slack: Duration::from_secs(1),
            legacy_poll_min: Duration::from_secs(45),
            legacy_poll_max: Duration::from_secs(120),
            partial_follow_up: Duration::from_secs(30),
            flood_window: Duration::from_secs(60),
            flood_max_strikes: 3,
            passive_hammer_max: 60,
            upload_bandwidth: NonZeroU64::new(10 << 20).expect("10 MiB/s is not zero"),
            assumed_body_len: 1 << 20,
            per_address_max: (queue_max / 4).max(1),
            twin_window: Duration::from_secs(5),
        }
    }
}

/// Identifies one client connection, so a held connection (Sq, legacy)
/// can be told apart from a new one. The caller numbers its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionId(pub u64);

/// What the queue needs to know about a request.
#[derive(Debug, Clone)]
pub struct QueueRequest<'a> {
    /// The client's address.
    pub peer: IpAddr,
    /// The connection the request came on.
    pub connection: ConnectionId,
    /// Whether the connection stays open after the response (HTTP/1.1
    /// without `Connection: close`); Sq and legacy queueing need it.
    pub persistent: bool,
    /// The parsed `X-Queue` of the request; `None` if absent or
    /// unparsable (passive queueing).
    pub offer: Option<QueueVersion>,
    /// The parsed `X-Queued` of the request (position and ID).
    pub queued: Option<QueuedStatus>,
    /// The parsed `X-Node` of the request: where a QUEUE callback goes.
    pub node: Option<SocketAddr>,
    /// The requested resource (the URL), for the legacy same-file rule.
    pub resource: &'a str,
    /// The body length, if known, for the ETA.
    pub expected_len: Option<u64>,
}

/// The queue's answer to a request.
#[derive(Debug)]
pub enum Admission {
    /// Send the response; give the token back with
    /// [`UploadQueue::release`] when the body is sent or abandoned.
    Serve(SlotToken),
    /// Answer `503` with [`QueuedReply::to_headers`].
    Queued(QueuedReply),
    /// Answer `503` with [`Refusal::to_headers`]; no place was given.
    Refused(Refusal),
}

/// Proof of one upload slot in use. Not `Clone`: a slot is released once.
#[derive(Debug)]
#[must_use = "an unreleased token holds its upload slot for ever"]
pub struct SlotToken {
    id: u64,
    /// Set for a legacy client: its connection, resource and address, for
    /// the partial follow-up rule.
    legacy: Option<(ConnectionId, u64, IpAddr)>,
}

/// How an upload ended, for [`UploadQueue::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// A whole response (`200`) was sent.
    Complete,
    /// A partial response (`206`) was sent completely: a legacy client may
    /// follow it with another request without losing its place.
    Partial,
    /// The upload was cut short.
    Aborted,
}

/// Why a client's earlier place was freed before it got this reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostPlace {
    /// It came back before Retry-After (PARQ: "Sending the request too soon
    /// will cause the slot to be freed").
    TooEarly,
    /// Its `X-Queued` position was not the last one it was told (PARQ: "If
    /// there is a mismatch, the corresponding slot is immediately freed").
    PositionMismatch,
    /// Its ID names no live entry: the lifetime lapsed, or it never existed.
    UnknownId,
    /// A legacy client asked for a different file ("it is shifted back to
    /// the end of the queue").
    DifferentFile,
}

/// The dialect-specific part of a queued reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyForm {
    /// PARQ: `X-Queue: 1.0` and `X-Queued`; the lifetime is given in Aq
    /// only, as in the seed's examples.
    Parq {
        /// The advertised lifetime, `None` in Sq.
        lifetime: Option<Duration>,
    },
    /// Legacy Active Queueing: `X-Queue: position=…,length=…,limit=…,
    /// pollMin=…,pollMax=…`.
    Active {
        /// Upload slots.
        limit: u32,
        /// pollMin.
        poll_min: Duration,
        /// pollMax.
        poll_max: Duration,
    },
    /// Passive: only `Retry-After`; the client knows nothing of queues.
    Passive,
}

/// A queued answer: a `503` that tells the client its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedReply {
    /// The entry's ID (sent to PARQ clients; for logs and stats otherwise).
    pub id: QueueId,
    /// Position, 1 is next.
    pub position: u32,
    /// Entries in the queue.
    pub length: u32,
    /// Estimated wait for a slot.
    pub eta: Duration,
    /// When the client should come back.
    pub retry_after: Duration,
    /// Whether the connection stays open (Sq, legacy); otherwise the reply
    /// carries `Connection: close`.
    pub keep_alive: bool,
    /// The dialect's headers.
    pub form: ReplyForm,
    /// Set when the client had a place and lost it with this request.
    pub lost: Option<LostPlace>,
}

impl QueuedReply {
    /// The headers of the `503`: `X-Queue`, `X-Queued`, `Retry-After` and
    /// `Connection: close` as the dialect and the queue part call for.
    pub fn to_headers(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        match self.form {
            ReplyForm::Parq { lifetime } => {
                map.insert(
                    X_QUEUE.clone(),
                    ascii(headers::format_version(QueueVersion::PARQ_1_0)),
                );
                let status = QueuedStatus {
                    position: Some(self.position),
                    length: Some(self.length),
                    eta: Some(secs(self.eta)),
                    lifetime: lifetime.map(secs),
                    id: Some(self.id),
                };
                map.insert(X_QUEUED.clone(), ascii(headers::format_x_queued(&status)));
            }
            ReplyForm::Active {
                limit,
                poll_min,
                poll_max,
            } => {
                let status = LegacyStatus {
                    position: Some(self.position),
                    length: Some(self.length),
                    limit: Some(limit),
                    poll_min: Some(secs(poll_min)),
                    poll_max: Some(secs(poll_max)),
                };
                map.insert(X_QUEUE.clone(), ascii(headers::format_legacy(&status)));
            }
            ReplyForm::Passive => {}
        }
        map.insert(
            header::RETRY_AFTER,
            HeaderValue::from(secs(self.retry_after)),
        );
        if !self.keep_alive {
            map.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        map
    }
}

/// Why a request got no place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// The queue holds `queue_max` entries (seed 001: "any requests which
    /// would not fit within it are sent a standard, non-queued 503").
    QueueFull,
    /// The client's address holds `per_address_max` entries already.
    AddressFull,
    /// The address broke the rules or hammered too often within the flood
    /// window.
    Flooding,
    /// A legacy client polled sooner than pollMin ("will be seen as
    /// flooding, and cause a disconnection"): close the connection.
    PollTooFast,
}

/// A plain `503` with `Retry-After` and no queue place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: RefusalReason,
    /// When to try again.
    pub retry_after: Duration,
    /// Whether to close the connection after the reply.
    pub close: bool,
}

impl Refusal {
    /// The headers of the `503`: `Retry-After`, and `Connection: close`
    /// when the connection is to be closed.
    pub fn to_headers(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(
            header::RETRY_AFTER,
            HeaderValue::from(secs(self.retry_after)),
        );
        if self.close {
            map.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        map
    }
}

/// A QUEUE callback to make: connect to `node` and send
/// [`Callback::line`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Callback {
    /// The entry's ID.
    pub id: QueueId,
    /// The client's `X-Node` address.
    pub node: SocketAddr,
}

impl Callback {
    /// The line to send: `QUEUE <ID> <server>\r\n`, where `server` is the
    /// address the client should come back to.
    pub fn line(&self, server: SocketAddr) -> String {
        headers::format_queue_callback(self.id, server)
    }
}

/// Seconds, rounded up, as header values carry them.
fn secs(duration: Duration) -> u32 {
    let whole = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    u32::try_from(whole).unwrap_or(u32::MAX)
}

fn ascii(text: String) -> HeaderValue {
    HeaderValue::try_from(text).expect("queue headers are formatted from numbers and hex")
}

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

    // ---- shared machinery, used by the dialects in parq.rs and active.rs

    fn free_slots(&self) -> u32 {
        self.config.slots.get().saturating_sub(self.uploads())
    }

    fn position(&self, seq: Seq) -> u32 {
        self.ranks.before(seq).entries.saturating_add(1)
    }

    /// Whether the entry at `seq`, whose client asks now, may take a free
    /// slot: fewer entries before it claim one than there are free slots.
    fn may_be_served(&self, seq: Seq) -> bool {
        self.ranks.before(seq).claims < self.free_slots()
    }

    fn length(&self) -> u32 {
        u32::try_from(self.entries.len()).unwrap_or(u32::MAX)
    }

    /// Whether a request not in the queue may be served now: only when the
    /// free slots outnumber the entries that claim one.
    fn newcomer_may_be_served(&self) -> bool {
        self.ranks.total().claims < self.free_slots()
    }

    fn is_full(&self) -> bool {
        self.entries.len() >= self.config.queue_max as usize
    }

    fn full_refusal(&self) -> Refusal {
        Refusal {
            reason: RefusalReason::QueueFull,
            retry_after: self.config.retry_after_far,
            close: true,
        }
    }

    /// Whether `peer` may not get another entry: it holds
    /// `per_address_max` already.
    fn address_is_full(&self, peer: IpAddr) -> bool {
        let max = self.config.per_address_max;
        max != 0 && self.per_address.get(&peer).is_some_and(|&n| n >= max)
    }

    fn address_refusal(&self) -> Refusal {
        Refusal {
            reason: RefusalReason::AddressFull,
            retry_after: self.config.retry_after_far,
            close: true,
        }
    }

    /// The refusal a request that would make a new entry gets, if any:
    /// the queue or the address is full.
    fn new_entry_refusal(&self, peer: IpAddr) -> Option<Refusal> {
        if self.is_full() {
            Some(self.full_refusal())
        } else if self.address_is_full(peer) {
            Some(self.address_refusal())
        } else {
            None
        }
    }

    fn flood_refusal(&self) -> Refusal {
        Refusal {
            reason: RefusalReason::Flooding,
            retry_after: self.config.flood_window,
            close: true,
        }
    }

    /// Estimated wait for the entry at `seq`: the bodies up to it at the
    /// upload bandwidth (seed 000: "summing the whole size of the last
    /// files requested at each queue position, and assuming an optimal
    /// transfer rate equal to the maximum upload bandwidth").
    fn eta(&self, seq: Seq) -> Duration {
        let kib = self.ranks.through(seq).kib;
        let bytes = kib.saturating_mul(1024);
        Duration::from_secs(bytes.div_ceil(self.config.upload_bandwidth.get()))
    }

    fn len_kib(&self, request: &QueueRequest<'_>) -> u32 {
        let len = request.expected_len.unwrap_or(self.config.assumed_body_len);
        u32::try_from(len.div_ceil(1024)).unwrap_or(u32::MAX)
    }

    fn is_flooding(&self, peer: IpAddr, now: Instant) -> bool {
        self.strikes
            .get(&peer, now)
            .is_some_and(|&n| n > self.config.flood_max_strikes)
            || self
                .hammering
                .get(&peer, now)
                .is_some_and(|&n| n > self.config.passive_hammer_max)
    }

    /// Counts a rule violation; true if the address is now flooding.
    fn strike(&mut self, peer: IpAddr, now: Instant) -> bool {
        let count = self.strikes.get_or_insert_with(peer, now, || 0);
        *count = count.saturating_add(1);
        *count > self.config.flood_max_strikes
    }

    /// Counts a passive request before Retry-After; true if the address is
    /// now hammering.
    fn hammer(&mut self, peer: IpAddr, now: Instant) -> bool {
        let count = self.hammering.get_or_insert_with(peer, now, || 0);
        *count = count.saturating_add(1);
        *count > self.config.passive_hammer_max
    }

    fn serve(&mut self, legacy: Option<(ConnectionId, u64, IpAddr)>) -> Admission {
        let id = self.next_token;
        self.next_token = self.next_token.wrapping_add(1);
        self.uploads.insert(id);
        Admission::Serve(SlotToken { id, legacy })
    }

    /// A random ID no live entry has.
    fn fresh_id(&mut self, now: Instant) -> QueueId {
        loop {
            let id = self.ids.next_id();
            if !self.by_id.contains_key(&id, now) {
                return id;
            }
        }
    }

    /// Adds an entry at the back (or the head) and indexes it. It claims a
    /// free slot until `not_before` + `slot_hold_grace`.
    fn insert(&mut self, entry: Entry, front: bool, now: Instant) -> Seq {
        self.make_room(front, now);
        let seq = if front {
            let seq = self.next_front;
            self.next_front -= 1;
            seq
        } else {
            let seq = self.next_back;
            self.next_back += 1;
            seq
        };
        let sums = self.link(seq, entry, now);
        self.ranks.add(seq, sums);
        seq
    }

    /// Makes the rank tree cover the next seq at the back (or the head):
    /// rebuilt over a wider window, or, when that window would be much
    /// wider than the queue (seqs are not reused, and entries come and go
    /// while an old one waits), over the entries renumbered from
    /// `SEQ_MIDDLE`. Either costs O(n) or so once per n insertions.
    fn make_room(&mut self, front: bool, now: Instant) {
        let next = |q: &Self| if front { q.next_front } else { q.next_back };
        if self.ranks.covers(next(self)) {
            return;
        }
        let live = u64::try_from(self.entries.len()).unwrap_or(u64::MAX) + 1;
        let (lo, hi) = self.span_with(next(self));
        if Ranks::capacity_for(lo, hi) > Ranks::capacity_for(0, live.saturating_mul(4)) {
            self.renumber(now);
        }
        let (lo, hi) = self.span_with(next(self));
        self.ranks
            .rebuild(lo, hi, self.entries.iter().map(|(&seq, e)| (seq, e.sums())));
    }

    /// The first and last seq of the entries and `seq`.
    fn span_with(&self, seq: Seq) -> (Seq, Seq) {
        let lo = self.entries.first_key_value().map_or(seq, |(&s, _)| s);
        let hi = self.entries.last_key_value().map_or(seq, |(&s, _)| s);
        (lo.min(seq), hi.max(seq))
    }

    /// Gives the entries new seqs from `SEQ_MIDDLE`, in order, and indexes
    /// them again; the rank tree is left for the caller to rebuild.
    fn renumber(&mut self, now: Instant) {
        let entries = std::mem::take(&mut self.entries);
        self.lapses.clear();
        self.claim_ends.clear();
        self.by_id = ExpiringMap::new(self.config.remanence);
        self.by_address = ExpiringMap::new(self.config.remanence);
        self.by_connection = ExpiringMap::new(self.config.remanence);
        self.by_request.clear();
        self.per_address.clear();
        self.ranks = Ranks::new();
        self.next_back = SEQ_MIDDLE;
        self.next_front = SEQ_MIDDLE - 1;
        for entry in entries.into_values() {
            let seq = self.next_back;
            self.next_back += 1;
            self.link(seq, entry, now);
        }
    }

    /// Puts the entry under `seq` in every table but the rank tree, and
    /// returns what it adds there.
    fn link(&mut self, seq: Seq, mut entry: Entry, now: Instant) -> Sums {
        entry.claims = entry.not_before + self.config.slot_hold_grace > now;
        if entry.claims {
            self.claim_ends
                .insert((entry.not_before + self.config.slot_hold_grace, seq));
        }
        let ttl = entry.deadline.saturating_duration_since(now);
        self.by_id.insert_with_ttl(entry.id, seq, ttl, now);
        match entry.kind {
            Kind::Passive => {
                self.by_address.insert_with_ttl(entry.peer, seq, ttl, now);
            }
            Kind::Parq | Kind::Active => {
                if let Some(connection) = entry.connection {
                    self.by_connection
                        .insert_with_ttl(connection, seq, ttl, now);
                }
            }
        }
        self.lapses.insert((entry.deadline, seq));
        *self.per_address.entry(entry.peer).or_default() += 1;
        if entry.kind == Kind::Parq && entry.resource != 0 {
            self.by_request
                .entry((entry.peer, entry.resource))
                .or_insert(seq);
        }
        let sums = entry.sums();
        self.entries.insert(seq, entry);
        sums
    }

    /// Sets when the entry's client may come back, and with it the end of
    /// its claim on a free slot.
    fn set_not_before(&mut self, seq: Seq, not_before: Instant, now: Instant) {
        let grace = self.config.slot_hold_grace;
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        let claimed = entry.claims;
        if claimed {
            self.claim_ends.remove(&(entry.not_before + grace, seq));
        }
        entry.not_before = not_before;
        entry.claims = not_before + grace > now;
        if entry.claims {
            self.claim_ends.insert((not_before + grace, seq));
        }
        match (claimed, entry.claims) {
            (false, true) => self.ranks.add(seq, CLAIM),
            (true, false) => self.ranks.sub(seq, CLAIM),
            _ => {}
        }
    }

    /// Sets the body length the entry counts for in ETAs.
    fn set_len_kib(&mut self, seq: Seq, len_kib: u32) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        let old = Sums {
            kib: u64::from(entry.len_kib),
            ..Sums::default()
        };
        entry.len_kib = len_kib;
        self.ranks.sub(seq, old);
        self.ranks.add(
            seq,
            Sums {
                kib: u64::from(len_kib),
                ..Sums::default()
            },
        );
    }

    /// Calls back the PARQ entries with an `X-Node` that a free slot is held
    /// for before their Retry-After, once per request of theirs: seed 000
    /// §6, "the server would then send back QUEUE requests to them, and
    /// they would get back their slot immediately". They may come back at
    /// once, and the slot waits `slot_hold_grace` for them.
    fn wake_slot_holders(&mut self, now: Instant) {
        for k in 1..=self.free_slots() {
            let Some(seq) = self.ranks.nth_claim(k) else {
                break;
            };
            let Some(entry) = self.entries.get_mut(&seq) else {
                continue;
            };
            let Some(node) = entry.node else {
                continue;
            };
            if entry.kind != Kind::Parq
                || entry.woken
                || entry.not_before <= now + self.config.retry_slack
            {
                continue;
            }
            entry.woken = true;
            let id = entry.id;
            // Still a claim (from now), so the k-th claim stays this one.
            self.set_not_before(seq, now, now);
            self.push_callback(Callback { id, node });
        }
    }

    /// Queues a callback for `tick` to hand out; at most `queue_max` wait.
    fn push_callback(&mut self, callback: Callback) {
        if self.callbacks.len() >= self.config.queue_max as usize {
            self.callbacks.remove(0);
        }
        self.callbacks.push(callback);
    }

    /// The PARQ entry `peer` holds for `resource` (its hash), if any.
    fn parq_entry_for(&self, peer: IpAddr, resource: u64) -> Option<Seq> {
        self.live(self.by_request.get(&(peer, resource)), Kind::Parq)
    }

    /// Moves a PARQ entry to another resource (the client changed its mind
    /// about the file), keeping the one-entry-per-request index.
    fn set_resource(&mut self, seq: Seq, resource: u64) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        if entry.resource == resource {
            return;
        }
        let old = (entry.peer, entry.resource);
        entry.resource = resource;
        let new = (entry.peer, resource);
        if self.by_request.get(&old) == Some(&seq) {
            self.by_request.remove(&old);
        }
        if resource != 0 {
            self.by_request.entry(new).or_insert(seq);
        }
    }

    /// Moves the entry's deadline and its index entries' expiry with it.
    fn set_deadline(&mut self, seq: Seq, deadline: Instant, now: Instant) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        self.lapses.remove(&(entry.deadline, seq));
        entry.deadline = deadline;
        self.lapses.insert((deadline, seq));
        let ttl = deadline.saturating_duration_since(now);
        self.by_id.insert_with_ttl(entry.id, seq, ttl, now);
        if entry.kind == Kind::Passive {
            self.by_address.insert_with_ttl(entry.peer, seq, ttl, now);
        }
        if let Some(connection) = entry.connection {
            self.by_connection
                .insert_with_ttl(connection, seq, ttl, now);
        }
    }

    /// Binds the entry to `connection` (Sq, legacy), or unbinds it.
    fn bind(&mut self, seq: Seq, connection: Option<ConnectionId>, now: Instant) {
        let Some(entry) = self.entries.get_mut(&seq) else {
            return;
        };
        if let Some(old) = entry.connection.take()
            && self.by_connection.get(&old, now) == Some(&seq)
        {
            self.by_connection.remove(&old);
        }
        entry.connection = connection;
        if let Some(connection) = connection {
            let ttl = entry.deadline.saturating_duration_since(now);
            self.by_connection
                .insert_with_ttl(connection, seq, ttl, now);
        }
    }

    /// Takes an entry out of the queue and its indexes.
    fn remove(&mut self, seq: Seq) -> Option<Entry> {
        let entry = self.entries.remove(&seq)?;
        self.ranks.sub(seq, entry.sums());
        self.lapses.remove(&(entry.deadline, seq));
        if entry.claims {
            self.claim_ends
                .remove(&(entry.not_before + self.config.slot_hold_grace, seq));
        }
        if self.by_id.remove(&entry.id).is_some_and(|s| s != seq) {
            debug_assert!(false, "an ID indexes one entry");
        }
        if entry.kind == Kind::Passive {
            self.by_address.remove(&entry.peer);
        }
        if let Some(connection) = entry.connection {
            self.by_connection.remove(&connection);
        }
        let request = (entry.peer, entry.resource);
        if self.by_request.get(&request) == Some(&seq) {
            self.by_request.remove(&request);
        }
        if let Some(count) = self.per_address.get_mut(&entry.peer) {
            *count -= 1;
            if *count == 0 {
                self.per_address.remove(&entry.peer);
            }
        }
        Some(entry)
    }

    /// The live entry of `kind` an index points to.
    fn live(&self, seq: Option<&Seq>, kind: Kind) -> Option<Seq> {
        let seq = *seq?;
        self.entries
            .get(&seq)
            .is_some_and(|e| e.kind == kind)
            .then_some(seq)
    }

    /// Frees lapsed entries; a PARQ entry with an `X-Node` that was not
    /// called back yet gets its callback and `callback_grace` instead, and
    /// may come back at once. Ends the claims whose time is up.
    fn purge(&mut self, now: Instant) {
        while let Some(&(end, seq)) = self.claim_ends.first() {
            if end > now {
                break;
            }
            self.claim_ends.pop_first();
            if let Some(entry) = self.entries.get_mut(&seq) {
                entry.claims = false;
                self.ranks.sub(seq, CLAIM);
            }
        }
        while let Some(&(deadline, seq)) = self.lapses.first() {
            if deadline > now {
                break;
            }
            let Some(entry) = self.entries.get_mut(&seq) else {
                self.lapses.pop_first();
                continue;
            };
            match entry.node {
                Some(node) if entry.kind == Kind::Parq && !entry.called_back => {
                    entry.called_back = true;
                    let id = entry.id;
                    self.bind(seq, None, now);
                    self.set_deadline(seq, now + self.config.callback_grace, now);
                    // Answering the callback is never too early (once: the
                    // answer gets a new Retry-After), and a free slot waits
                    // for the answer a grace.
                    self.set_not_before(seq, now, now);
                    self.push_callback(Callback { id, node });
                }
                _ => {
                    self.remove(seq);
                }
            }
        }
    }
}

/// A claim on a free slot, for the rank tree.
const CLAIM: Sums = Sums {
    entries: 0,
    claims: 1,
    kib: 0,
};

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

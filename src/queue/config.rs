//! The queue's settings: one typed struct with the seeds' values as its
//! defaults. Which flag fills which field is the CLI's business.
//!
//! Main type: [`QueueConfig`].

use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

/// Settings of an [`UploadQueue`](super::UploadQueue).
/// [`QueueConfig::new`] fills in the seeds' values for everything but the
/// sizes.
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
    /// request that joined the entry without an ID, see
    /// [`parq`](super::parq)) may come back with the position it was told
    /// and get the entry's state, rather than lose the place as too early
    /// or mismatched: the two retries are due at the same time and arrive
    /// close together.
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

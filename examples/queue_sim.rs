//! Fairness simulation of the accelerator's upload queue (issue 5), in
//! virtual time: `cargo run --release --example queue_sim`.
//!
//! Drives [`rproxy::queue::UploadQueue`] directly, as `src/accelerator/slots.rs` does,
//! with a simulated clock: one `Instant::now()`, then Durations added to
//! it; nothing sleeps. 1,000 clients arrive over time in the three
//! dialects (PARQ 1.0 with IDs, passive by address, legacy Active
//! Queueing 0.1 on a persistent connection) and behave in five ways:
//!
//! - good: comes back at Retry-After (pollMin for legacy), up to 1 s late;
//! - late: comes back later, but within the lifetime (PARQ Aq), the 300 s
//!   of passive queueing, or pollMax (legacy);
//! - vanish: stops coming back, half of them after a few replies, half
//!   once told position 1 or 2 (a user agent that gave up near the head);
//!   some close their held connection, some just go quiet;
//! - flooder: comes back every 0.5 s whatever it was told (150 requests);
//! - lapse (PARQ only): gives an `X-Node`, lets its lifetime lapse, and
//!   comes back when the QUEUE callback reaches it (and answers every
//!   callback, such as the one for a free slot held for it, at once).
//!
//! 8 slots, uploads of random length. The accelerator's 1 s timer is a
//! `tick` every simulated second. Run twice: with held connections kept
//! open as long as the client wants, and as the accelerator keeps them:
//! a queued reply on a held connection holds it for the time the client
//! should come back in (pollMax, or Retry-After) + 30 s, after which the
//! keep-alive idle close (`--header-read-timeout 10`) applies.
//!
//! Prints: clients served, refused and places lost by behaviour; served
//! order against arrival order among the good clients (inversions, Kendall
//! tau, the most later arrivals served before one client); slot use; the
//! CPU time of `admit` (p99); and bytes per queue entry, from
//! `ESTIMATED_BYTES_PER_ENTRY` and measured with a counting allocator
//! (heap growth with N entries queued, per entry). Each figure is printed
//! next to its target with "met" / "NOT met".
//!
//! Options: `--clients N` (1000), `--slots N` (8), `--seed N` (1),
//! `--entries N` (entries for the memory measurement, 20000),
//! `--verbose` (every lost place and overtaking).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use rproxy::queue::{
    Admission, Completion, ConnectionId, ESTIMATED_BYTES_PER_ENTRY, IdGenerator, LostPlace,
    QueueConfig, QueueId, QueueRequest, QueueVersion, QueuedReply, QueuedStatus, RefusalReason,
    ReplyForm, SlotToken, UploadQueue,
};
use tokio::time::Instant;

// ---- counting allocator -------------------------------------------------

/// The system allocator, counting the bytes currently allocated.
struct Counting;

static ALLOCATED: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to `System` unchanged; the counter is
// only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            ALLOCATED.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        ALLOCATED.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            ALLOCATED.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        new
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocated() -> isize {
    ALLOCATED.load(Ordering::Relaxed)
}

// ---- randomness (no dependency: splitmix64) -----------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next() % (hi - lo + 1)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

// ---- the simulated clients ----------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Dialect {
    Parq,
    Passive,
    Legacy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Behaviour {
    Good,
    Late,
    Vanish,
    Flooder,
    Lapse,
}

const BEHAVIOURS: [Behaviour; 5] = [
    Behaviour::Good,
    Behaviour::Late,
    Behaviour::Vanish,
    Behaviour::Flooder,
    Behaviour::Lapse,
];

#[derive(Debug)]
struct Client {
    arrival_ms: u64,
    dialect: Dialect,
    behaviour: Behaviour,
    peer: IpAddr,
    node: Option<SocketAddr>,
    /// The connection it holds open, if any.
    conn: Option<ConnectionId>,
    /// Bumped at each request: an idle-close event for an older request
    /// is stale.
    conn_gen: u64,
    /// PARQ: the ID and the position last told.
    parq: Option<(QueueId, u32)>,
    requests: u32,
    replies: u32,
    vanish_after: u32,
    /// Vanish: gives up once told position 1 or 2 (a user agent that gave
    /// up near the head) rather than after `vanish_after` replies.
    vanish_near_head: bool,
    first_queued_ms: Option<u64>,
    served_ms: Option<u64>,
    /// Gave up (vanished, flooder out of requests).
    gone: bool,
    /// Waiting for its QUEUE callback (lapse).
    awaiting_callback: bool,
    /// Bumped when its next request is scheduled: a scheduled request of
    /// an older generation was replaced (by a callback's).
    request_gen: u64,
    lost: Vec<(u64, LostPlace)>,
    refused: Vec<(u64, RefusalReason)>,
    /// Closed by the server while idle (keep-alive idle close).
    idle_closed: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The accelerator's 1 s timer.
    Tick,
    /// An upload ends.
    Done(usize),
    /// The server closes a held connection that waited too long.
    IdleClose(usize, u64),
    /// The client (re)sends its request, unless a later one was scheduled
    /// since (generation).
    Request(usize, u64),
}

struct Settings {
    clients: usize,
    slots: u32,
    seed: u64,
    entries: usize,
    verbose: bool,
}

struct Sim<'a> {
    set: &'a Settings,
    /// Keep-alive idle close of held connections, if modelled.
    idle_close: Option<Duration>,
    rng: Rng,
    queue: UploadQueue,
    start: Instant,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    clients: Vec<Client>,
    by_node: HashMap<SocketAddr, usize>,
    uploads: Vec<Option<(SlotToken, usize)>>,
    next_conn: u64,
    callbacks: u64,
    admit_ns: Vec<u64>,
    /// Slot-seconds free while someone waited in the queue.
    idle_slot_ms: u64,
    busy_slot_ms: u64,
    last_ms: u64,
    max_len: usize,
    end_ms: u64,
}

const HORIZON_MS: u64 = 8 * 3600 * 1000;

impl<'a> Sim<'a> {
    fn new(set: &'a Settings, idle_close: Option<Duration>) -> Self {
        let mut rng = Rng(set.seed);
        let slots = NonZeroU32::new(set.slots).expect("--slots must be at least 1");
        let config = QueueConfig::new(slots, 2000);
        let queue = UploadQueue::new(config, IdGenerator::from_seed([7; 32]));
        let mut clients = Vec::with_capacity(set.clients);
        let mut by_node = HashMap::new();
        // Arrivals: a Poisson process, one client every 1.2 s on average,
        // so the queue builds up against 8 slots of ~60 s uploads.
        let mut t = 0.0f64;
        for i in 0..set.clients {
            t += -1200.0 * (1.0 - rng.unit()).ln();
            let dialect = match rng.range(0, 99) {
                0..=49 => Dialect::Parq,
                50..=79 => Dialect::Passive,
                _ => Dialect::Legacy,
            };
            let roll = rng.range(0, 99);
            let behaviour = match (roll, dialect) {
                (0..=64, _) => Behaviour::Good,
                (65..=76, _) => Behaviour::Late,
                (77..=88, _) => Behaviour::Vanish,
                (89..=92, _) => Behaviour::Flooder,
                (_, Dialect::Parq) => Behaviour::Lapse,
                _ => Behaviour::Good,
            };
            let n = u32::try_from(i).expect("clients fit in u32");
            // Distinct addresses: passive clients are told apart by them.
            let peer = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n));
            let node = (behaviour == Behaviour::Lapse).then(|| SocketAddr::new(peer, 6346));
            if let Some(node) = node {
                by_node.insert(node, i);
            }
            clients.push(Client {
                arrival_ms: t as u64,
                dialect,
                behaviour,
                peer,
                node,
                conn: None,
                conn_gen: 0,
                parq: None,
                requests: 0,
                replies: 0,
                vanish_after: u32::try_from(rng.range(1, 3)).expect("small"),
                vanish_near_head: i % 2 == 1,
                first_queued_ms: None,
                served_ms: None,
                gone: false,
                awaiting_callback: false,
                request_gen: 0,
                lost: Vec::new(),
                refused: Vec::new(),
                idle_closed: 0,
            });
        }
        let mut sim = Sim {
            set,
            idle_close,
            rng,
            queue,
            start: Instant::now(),
            events: BinaryHeap::new(),
            seq: 0,
            clients,
            by_node,
            uploads: Vec::new(),
            next_conn: 1,
            callbacks: 0,
            admit_ns: Vec::new(),
            idle_slot_ms: 0,
            busy_slot_ms: 0,
            last_ms: 0,
            max_len: 0,
            end_ms: 0,
        };
        for i in 0..sim.clients.len() {
            let at = sim.clients[i].arrival_ms;
            sim.push(at, Event::Request(i, 0));
        }
        sim.push(1000, Event::Tick);
        sim
    }

    fn push(&mut self, at_ms: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at_ms, self.seq, event)));
    }

    fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    fn run(&mut self) {
        while let Some(Reverse((t, _, event))) = self.events.pop() {
            if t > HORIZON_MS {
                break;
            }
            self.account(t);
            match event {
                Event::Tick => self.tick(t),
                Event::Done(upload) => self.done(t, upload),
                Event::IdleClose(c, generation) => self.idle_closed(t, c, generation),
                Event::Request(c, generation) => {
                    if self.clients[c].request_gen == generation {
                        self.request(t, c);
                    }
                }
            }
            self.max_len = self.max_len.max(self.queue.len());
        }
    }

    /// Slot use since the last event.
    fn account(&mut self, t: u64) {
        let dt = t - self.last_ms;
        self.last_ms = t;
        let busy = u64::from(self.queue.uploads());
        self.busy_slot_ms += busy * dt;
        if !self.queue.is_empty() {
            self.idle_slot_ms += (u64::from(self.set.slots) - busy) * dt;
        }
    }

    fn active(&self) -> bool {
        self.queue.uploads() > 0
            || !self.queue.is_empty()
            || self
                .clients
                .iter()
                .any(|c| c.served_ms.is_none() && !c.gone)
    }

    fn tick(&mut self, t: u64) {
        let callbacks = self.queue.tick(self.at(t));
        for callback in callbacks {
            self.callbacks += 1;
            if let Some(&c) = self.by_node.get(&callback.node) {
                let client = &mut self.clients[c];
                // A client with X-Node listens all the time (as the client
                // proxy with --queue-callback does): the accelerator also
                // calls it back when a free slot is held for it. It comes
                // back instead of at its scheduled time.
                if !client.gone
                    && client.served_ms.is_none()
                    && client.parq.map(|(id, _)| id) == Some(callback.id)
                {
                    client.awaiting_callback = false;
                    client.request_gen += 1;
                    let generation = client.request_gen;
                    let delay = self.rng.range(200, 5000);
                    self.push(t + delay, Event::Request(c, generation));
                }
            }
        }
        if self.active() {
            self.push(t + 1000, Event::Tick);
        } else {
            self.end_ms = t;
        }
    }

    fn done(&mut self, t: u64, upload: usize) {
        let (token, c) = self.uploads[upload].take().expect("an upload ends once");
        self.queue.release(token, Completion::Complete, self.at(t));
        // The client leaves once its body is in.
        if let Some(conn) = self.clients[c].conn.take() {
            self.queue.disconnected(conn, self.at(t));
        }
    }

    fn idle_closed(&mut self, t: u64, c: usize, generation: u64) {
        let client = &mut self.clients[c];
        if client.conn_gen != generation || client.served_ms.is_some() {
            return;
        }
        if let Some(conn) = client.conn.take() {
            client.idle_closed += 1;
            self.queue.disconnected(conn, self.at(t));
        }
    }

    fn connection(&mut self, c: usize) -> ConnectionId {
        if let Some(conn) = self.clients[c].conn {
            return conn;
        }
        let conn = ConnectionId(self.next_conn);
        self.next_conn += 1;
        self.clients[c].conn = Some(conn);
        conn
    }

    fn request(&mut self, t: u64, c: usize) {
        if self.clients[c].gone || self.clients[c].served_ms.is_some() {
            return;
        }
        let conn = self.connection(c);
        let client = &mut self.clients[c];
        client.requests += 1;
        client.conn_gen += 1;
        let resource = format!("/file/{c}");
        let request = QueueRequest {
            peer: client.peer,
            connection: conn,
            persistent: client.dialect != Dialect::Passive,
            offer: match client.dialect {
                Dialect::Parq => Some(QueueVersion::PARQ_1_0),
                Dialect::Legacy => Some(QueueVersion::ACTIVE_0_1),
                Dialect::Passive => None,
            },
            queued: client.parq.map(|(id, position)| QueuedStatus {
                position: Some(position),
                length: None,
                eta: None,
                lifetime: None,
                id: Some(id),
            }),
            node: client.node,
            resource: &resource,
            expected_len: Some(8 << 20),
        };
        let now = self.at(t);
        let wall = std::time::Instant::now();
        let admission = self.queue.admit(&request, now);
        self.admit_ns
            .push(u64::try_from(wall.elapsed().as_nanos()).unwrap_or(u64::MAX));
        match admission {
            Admission::Serve(token) => {
                let client = &mut self.clients[c];
                client.served_ms = Some(t);
                // Uploads: 10..110 s, 60 s on average.
                let length = self.rng.range(10_000, 110_000);
                self.uploads.push(Some((token, c)));
                let upload = self.uploads.len() - 1;
                self.push(t + length, Event::Done(upload));
            }
            Admission::Queued(reply) => {
                let client = &mut self.clients[c];
                client.replies += 1;
                client.first_queued_ms.get_or_insert(t);
                if let Some(lost) = reply.lost {
                    client.lost.push((t, lost));
                }
                if client.dialect == Dialect::Parq {
                    client.parq = Some((reply.id, reply.position));
                }
                if !reply.keep_alive
                    && let Some(conn) = client.conn.take()
                {
                    self.queue.disconnected(conn, now);
                }
                let lifetime = match reply.form {
                    ReplyForm::Parq { lifetime } => lifetime,
                    _ => None,
                };
                self.queued(t, c, &reply, lifetime);
            }
            Admission::Refused(refusal) => {
                let client = &mut self.clients[c];
                client.refused.push((t, refusal.reason));
                if refusal.close
                    && let Some(conn) = client.conn.take()
                {
                    self.queue.disconnected(conn, now);
                }
                let next = match client.behaviour {
                    Behaviour::Flooder => 500,
                    _ => ms(refusal.retry_after),
                };
                self.again(t, c, next);
            }
        }
    }

    /// Schedules the client's next request after a queued reply.
    fn queued(&mut self, t: u64, c: usize, reply: &QueuedReply, lifetime: Option<Duration>) {
        let retry = ms(reply.retry_after);
        let keep_alive = reply.keep_alive;
        let client = &self.clients[c];
        let (dialect, behaviour) = (client.dialect, client.behaviour);
        let gives_up = if client.vanish_near_head {
            reply.position <= 2
        } else {
            client.replies >= client.vanish_after
        };
        let config = self.queue.config();
        // Latest a late client may come back and keep its place.
        let latest = match dialect {
            Dialect::Parq => lifetime.map_or(retry + 60_000, ms),
            Dialect::Passive => ms(config.remanence),
            Dialect::Legacy => ms(config.legacy_poll_max),
        }
        .saturating_sub(5000)
        .max(retry);
        let delay = match behaviour {
            Behaviour::Good => retry + self.rng.range(0, 1000),
            Behaviour::Late => self.rng.range(retry, latest),
            Behaviour::Vanish if gives_up => {
                self.clients[c].gone = true;
                // Half of them close their held connection, half go quiet.
                if self.rng.range(0, 1) == 0
                    && let Some(conn) = self.clients[c].conn.take()
                {
                    self.queue.disconnected(conn, self.at(t));
                }
                return;
            }
            Behaviour::Vanish => retry + self.rng.range(0, 1000),
            Behaviour::Flooder => 500,
            Behaviour::Lapse if self.clients[c].replies == 1 => {
                // Goes quiet (closing a held connection) and waits for
                // its QUEUE callback.
                self.clients[c].awaiting_callback = true;
                if let Some(conn) = self.clients[c].conn.take() {
                    self.queue.disconnected(conn, self.at(t));
                }
                return;
            }
            Behaviour::Lapse => retry + self.rng.range(0, 1000),
        };
        // The accelerator holds a queued connection (HoldConnection) for
        // the time the client should come back in (pollMax for legacy,
        // Retry-After for PARQ) plus 30 s, on top of the idle close.
        let hold = match dialect {
            Dialect::Legacy => ms(config.legacy_poll_max),
            _ => retry,
        } + 30_000;
        if keep_alive
            && let Some(idle) = self.idle_close.map(ms)
            && delay > idle + hold
        {
            let generation = self.clients[c].conn_gen;
            self.push(t + idle + hold, Event::IdleClose(c, generation));
        }
        self.again(t, c, delay);
    }

    fn again(&mut self, t: u64, c: usize, delay: u64) {
        let client = &mut self.clients[c];
        if client.behaviour == Behaviour::Flooder && client.requests >= 150 {
            client.gone = true;
            return;
        }
        client.request_gen += 1;
        let generation = client.request_gen;
        self.push(t + delay, Event::Request(c, generation));
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(sim: &Sim<'_>, title: &str) -> bool {
    let set = sim.set;
    println!("== {title}");
    let end = if sim.end_ms > 0 {
        sim.end_ms
    } else {
        sim.last_ms
    };
    println!(
        "virtual time {:.0} s (until every client was served or gave up{}), queue length max {}",
        end as f64 / 1000.0,
        if sim.end_ms > 0 {
            ""
        } else {
            "; NOT reached within 8 h"
        },
        sim.max_len
    );
    println!(
        "  {:<8} {:<8} {:>7} {:>7} {:>9} {:>8} {:>8} {:>11}",
        "dialect", "behaves", "clients", "served", "unserved", "lost", "refused", "idle-closed"
    );
    let mut groups: Vec<(Dialect, Behaviour)> = sim
        .clients
        .iter()
        .map(|c| (c.dialect, c.behaviour))
        .collect();
    groups.sort();
    groups.dedup();
    for (dialect, behaviour) in groups {
        let members: Vec<&Client> = sim
            .clients
            .iter()
            .filter(|c| c.dialect == dialect && c.behaviour == behaviour)
            .collect();
        let served = members.iter().filter(|c| c.served_ms.is_some()).count();
        let lost: usize = members.iter().map(|c| c.lost.len()).sum();
        let refused: usize = members.iter().map(|c| c.refused.len()).sum();
        let idle: u32 = members.iter().map(|c| c.idle_closed).sum();
        println!(
            "  {:<8} {:<8} {:>7} {:>7} {:>9} {:>8} {:>8} {:>11}",
            format!("{dialect:?}"),
            format!("{behaviour:?}"),
            members.len(),
            served,
            members.len() - served,
            lost,
            refused,
            idle
        );
    }
    let served = sim.clients.iter().filter(|c| c.served_ms.is_some()).count();
    println!(
        "served {served} of {} clients; QUEUE callbacks {}",
        set.clients, sim.callbacks
    );

    // Fairness among the good clients that had to wait: their served
    // order against their arrival order.
    let good: Vec<&Client> = sim
        .clients
        .iter()
        .filter(|c| c.behaviour == Behaviour::Good && c.first_queued_ms.is_some())
        .collect();
    let good_lost: usize = good.iter().map(|c| c.lost.len()).sum();
    let good_refused: usize = good.iter().map(|c| c.refused.len()).sum();
    let good_unserved = good.iter().filter(|c| c.served_ms.is_none()).count();
    let mut waited: Vec<(u64, u64)> = good
        .iter()
        .filter_map(|c| c.served_ms.map(|s| (c.arrival_ms, s)))
        .collect();
    waited.sort();
    let n = waited.len();
    let mut inversions = 0u64;
    let mut max_overtaken = 0usize;
    let mut worst = None;
    for i in 0..n {
        let overtaken = (i + 1..n).filter(|&j| waited[j].1 < waited[i].1).count();
        inversions += overtaken as u64;
        if overtaken > max_overtaken {
            max_overtaken = overtaken;
            worst = Some(i);
        }
    }
    let pairs = (n as u64 * n.saturating_sub(1) as u64 / 2).max(1);
    let tau = 1.0 - 2.0 * inversions as f64 / pairs as f64;
    // Anyone (any behaviour) who arrived after a good client and was
    // served before it.
    let mut max_by_anyone = 0usize;
    for g in &good {
        if let Some(s) = g.served_ms {
            let k = sim
                .clients
                .iter()
                .filter(|o| o.arrival_ms > g.arrival_ms && o.served_ms.is_some_and(|x| x < s))
                .count();
            max_by_anyone = max_by_anyone.max(k);
        }
    }
    let mut waits: Vec<u64> = good
        .iter()
        .filter_map(|c| c.served_ms.map(|s| s - c.arrival_ms))
        .collect();
    waits.sort_unstable();
    println!(
        "good clients that waited: {} ({} served, {} never served, {} places lost, {} refusals)",
        good.len(),
        n,
        good_unserved,
        good_lost,
        good_refused
    );
    println!(
        "  their wait p50 {:.0} s, p99 {:.0} s",
        percentile(&waits, 50.0) as f64 / 1000.0,
        percentile(&waits, 99.0) as f64 / 1000.0
    );
    println!(
        "  served vs arrival order: {inversions} inversions of {pairs} pairs, Kendall tau {tau:.4}"
    );
    let slots = set.slots as usize;
    let fair_lost = good_lost == 0 && good_unserved == 0 && good_refused == 0;
    println!(
        "  good clients' places lost / unserved / refused: {good_lost} / {good_unserved} / {good_refused}  (target 0)  {}",
        verdict(fair_lost)
    );
    println!(
        "  most later good arrivals served before one good client: {max_overtaken}  (target <= slots = {slots})  {}",
        verdict(max_overtaken <= slots)
    );
    if let Some(i) = worst
        && set.verbose
    {
        println!(
            "    worst: arrived {:.1} s, served {:.1} s",
            waited[i].0 as f64 / 1000.0,
            waited[i].1 as f64 / 1000.0
        );
        for &(arrived, served) in &waited[i + 1..] {
            if served < waited[i].1 {
                let who = sim
                    .clients
                    .iter()
                    .find(|c| c.arrival_ms == arrived)
                    .map(|c| format!("{:?}", c.dialect))
                    .unwrap_or_default();
                println!(
                    "      overtaken by a {who} client arrived {:.1} s, served {:.1} s",
                    arrived as f64 / 1000.0,
                    served as f64 / 1000.0
                );
            }
        }
    }
    println!("  most later arrivals of any kind served before one good client: {max_by_anyone}");
    let total = end.max(1) * u64::from(set.slots);
    println!(
        "slots busy {:.1} % of the time; slot time free while clients waited in the queue: {:.1} % (held for a client due back, or nobody to serve)",
        100.0 * sim.busy_slot_ms as f64 / total as f64,
        100.0 * sim.idle_slot_ms as f64 / total as f64
    );
    let mut admit = sim.admit_ns.clone();
    admit.sort_unstable();
    println!(
        "admit(): {} calls, CPU p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs (the live part measures the 50 ms target)",
        admit.len(),
        percentile(&admit, 50.0) as f64 / 1000.0,
        percentile(&admit, 99.0) as f64 / 1000.0,
        admit.last().copied().unwrap_or(0) as f64 / 1000.0
    );
    if set.verbose {
        for (i, c) in sim.clients.iter().enumerate() {
            for (t, lost) in &c.lost {
                println!(
                    "    client {i} {:?}/{:?} lost its place at {:.1} s: {lost:?}",
                    c.dialect,
                    c.behaviour,
                    *t as f64 / 1000.0
                );
            }
        }
    }
    fair_lost && max_overtaken <= slots
}

// ---- bytes per entry ----------------------------------------------------

/// Heap growth per entry with `n` entries of `dialect` queued behind busy
/// slots.
fn bytes_per_entry(dialect: Dialect, n: usize) -> f64 {
    let slots = NonZeroU32::new(8).expect("8");
    let config = QueueConfig::new(slots, u32::try_from(n + 10).expect("fits"));
    let start = Instant::now();
    let mut queue = UploadQueue::new(config, IdGenerator::from_seed([3; 32]));
    let mut tokens = Vec::new();
    let request = |i: usize, dialect: Dialect| {
        let n = u32::try_from(i).expect("fits");
        QueueRequest {
            peer: IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)),
            connection: ConnectionId(u64::from(n)),
            persistent: dialect == Dialect::Legacy,
            offer: match dialect {
                Dialect::Parq => Some(QueueVersion::PARQ_1_0),
                Dialect::Legacy => Some(QueueVersion::ACTIVE_0_1),
                Dialect::Passive => None,
            },
            queued: None,
            node: None,
            resource: "/file",
            expected_len: Some(1 << 20),
        }
    };
    for i in 0..8 {
        match queue.admit(&request(i, dialect), start) {
            Admission::Serve(token) => tokens.push(token),
            other => panic!("a free slot should serve: {other:?}"),
        }
    }
    let before = allocated();
    for i in 8..8 + n {
        let now = start + Duration::from_micros(i as u64);
        match queue.admit(&request(i, dialect), now) {
            Admission::Queued(_) => {}
            other => panic!("entry {i} should be queued: {other:?}"),
        }
    }
    assert_eq!(queue.len(), n, "every entry is queued");
    let after = allocated();
    let per = (after - before) as f64 / n as f64;
    drop(queue);
    drop(tokens);
    per
}

fn parse_args() -> Settings {
    let mut set = Settings {
        clients: 1000,
        slots: 8,
        seed: 1,
        entries: 20_000,
        verbose: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match arg.as_str() {
            "--clients" => set.clients = value("--clients") as usize,
            "--slots" => set.slots = u32::try_from(value("--slots")).expect("--slots fits u32"),
            "--seed" => set.seed = value("--seed"),
            "--entries" => set.entries = value("--entries") as usize,
            "--verbose" => set.verbose = true,
            other => panic!("unknown argument {other}"),
        }
    }
    set
}

fn main() {
    let set = parse_args();
    println!(
        "queue_sim: {} clients, --slots {}, seed {}; virtual time, uploads 10..110 s, one arrival per 1.2 s on average",
        set.clients, set.slots, set.seed
    );
    let mut mix: HashMap<(Dialect, Behaviour), usize> = HashMap::new();
    let mut all_fair = true;
    for (title, idle_close) in [
        (
            "held connections stay open as long as the client wants (the queue alone)",
            None,
        ),
        (
            "held connections closed 10 s (--header-read-timeout) after the hold the accelerator gives a queued reply (pollMax or Retry-After, + 30 s)",
            Some(Duration::from_secs(10)),
        ),
    ] {
        let mut sim = Sim::new(&set, idle_close);
        if mix.is_empty() {
            for c in &sim.clients {
                *mix.entry((c.dialect, c.behaviour)).or_default() += 1;
            }
            let by = |d: Dialect| {
                BEHAVIOURS
                    .iter()
                    .filter_map(|&b| mix.get(&(d, b)).map(|n| format!("{b:?} {n}")))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!("  PARQ 1.0:   {}", by(Dialect::Parq));
            println!("  passive:    {}", by(Dialect::Passive));
            println!("  legacy 0.1: {}", by(Dialect::Legacy));
        }
        sim.run();
        all_fair &= report(&sim, title);
    }

    println!("== bytes per queue entry");
    println!(
        "ESTIMATED_BYTES_PER_ENTRY: {ESTIMATED_BYTES_PER_ENTRY}  (target <= 1024)  {}",
        verdict(ESTIMATED_BYTES_PER_ENTRY <= 1024)
    );
    let mut worst = 0.0f64;
    for dialect in [Dialect::Parq, Dialect::Passive, Dialect::Legacy] {
        let wall = std::time::Instant::now();
        let per = bytes_per_entry(dialect, set.entries);
        worst = worst.max(per);
        println!(
            "measured heap growth, {} {dialect:?} entries queued: {per:.0} bytes per entry  (target <= 1024)  {}  [filled in {:.1} s]",
            set.entries,
            verdict(per <= 1024.0),
            wall.elapsed().as_secs_f64()
        );
    }
    println!(
        "summary: fairness {}, bytes per entry {} (worst measured {worst:.0})",
        verdict(all_fair),
        verdict(worst <= 1024.0)
    );
}

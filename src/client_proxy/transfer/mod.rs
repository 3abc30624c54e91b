//! Relaying a body from upstream to the user agent while writing it to the
//! cache: an hsync stream is rebuilt against the basis on the way, any
//! other body passes as it is and gets its signature computed here.
//!
//! A reader task takes the upstream body frame by frame into a small
//! channel; a driver task takes each chunk to the blocking pool, where it
//! is decoded, hashed and written to the cache entry (a large body's by a
//! writer task of its own, `cache_writer`), and hands the results to the
//! user agent's channel. Both channels are bounded, so a slow user agent
//! slows the upstream read instead of filling memory, and every wait is
//! a task's: a user agent that stops reading holds no thread (L-13).
//! An hsync body's bytes go out only as far as the stream's SIG entries
//! (or END) vouched for them, so a rotten basis shows as a failed check
//! before its wrong bytes leave (C-V3). The user agent's response ends cleanly only after every
//! check passed (END's length and blake3, the origin's `Content-Digest` or
//! `Repr-Digest`); on a failed check it is aborted, the entry is not
//! committed, and the basis that produced the wrong bytes is dropped
//! (D-A4, D-A5). A body shorter than [`WHOLE_BELOW`] that is over within
//! the upstream wait is relayed whole instead: checked (and committed)
//! before the user agent's head, sent with a Content-Length in one write,
//! and a failed check is a clean 502 rather than a cut body (D-A5's two
//! branches, by size). An interrupted transfer leaves a partial entry —
//! the prefix and its signature — so the next fetch resumes from it.
//!
//! Main items: [`relay`], [`Relay`], [`Relayed`], [`Outcome`].

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::mpsc;

use super::cache_writer::BackgroundWriter;
pub use super::cache_writer::StoreTarget;
use super::cached_body::SMALL_BODY;
use crate::cache::{CacheError, CacheKey, Completeness, EntryWriter, NewEntry};
use crate::hsync::{
    Basis, DecodeError, DecodeLimits, Decoder, EncoderOptions, FileBasis, SignatureBuilder,
    SignatureParams, choose_block_size,
};
use crate::http::server::{BodyError, ProxyBody};
use crate::http::spool::{BodyFeed, BodyItem, Spool, SpoolDisk};
use crate::http::transfer_memory::{
    self, ShareHolder, ShareTaker, TransferMemory, coded_transfer_cost,
};
use crate::http::upstream_guard::ExchangeCheck;
use digests::DigestCheck;
pub use digests::OriginDigest;
use window_pool::WindowPool;

mod digests;
mod window_pool;

/// Upstream chunks in flight between the reader task and the relay.
const CHANNEL_DEPTH: usize = 4;

/// Slices in flight towards the user agent. A user agent that stops
/// reading does not keep them: the spool takes them over (L-13).
const AGENT_DEPTH: usize = 8;

/// Largest piece of body sent to the user agent at a time (and to the
/// cache writer): what hyper holds for a user agent that stopped reading,
/// beside the spool's page. (Fewer, larger pieces in flight cost L-3 as
/// much: the relay then waits on hyper, and the accelerator's pacer takes
/// the slower client for a slower link.)
const SEND_SLICE: usize = 64 << 10;

/// Body bytes written to the cache on the relay's own thread; the rest of
/// a larger body is written by a [`BackgroundWriter`].
const BACKGROUND_WRITE_AFTER: u64 = SMALL_BODY;

/// The basis a stream is rebuilt against: nothing, or the cached body file
/// whose signature was sent (its open descriptor, so an entry replaced in
/// the meantime does not change the bytes under the decoder; D-A7).
pub enum ClientBasis {
    /// A from-scratch stream.
    None,
    /// A cached body.
    File(FileBasis),
    /// A cached body held by the memory cache (checked when it was read;
    /// immutable, so a snapshot as the descriptor is).
    Memory(Bytes),
}

impl Basis for ClientBasis {
    fn size(&self) -> u64 {
        match self {
            ClientBasis::None => 0,
            ClientBasis::File(file) => file.size(),
            ClientBasis::Memory(body) => body.len() as u64,
        }
    }

    fn append_range(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
        match self {
            ClientBasis::None => Err(std::io::Error::other("copy from an empty basis")),
            ClientBasis::File(file) => file.append_range(offset, len, out),
            ClientBasis::Memory(body) => {
                let range = usize::try_from(offset)
                    .ok()
                    .and_then(|start| Some(start..start.checked_add(len)?))
                    .filter(|range| range.end <= body.len())
                    .ok_or_else(|| std::io::Error::other("copy past the end of the basis"))?;
                out.extend_from_slice(&body[range]);
                Ok(())
            }
        }
    }
}

/// How the upstream body is coded.
pub enum Coding {
    /// An hsync/1 stream, rebuilt against `basis`; `basis_key` names the
    /// cache entry it came from, dropped if the stream fails its checks.
    Hsync {
        /// The basis.
        basis: ClientBasis,
        /// Its cache key.
        basis_key: Option<CacheKey>,
        /// Caps for the decoder.
        limits: DecodeLimits,
    },
    /// The body as it is; `expected_len` from Content-Length.
    Plain {
        /// The announced length.
        expected_len: Option<u64>,
    },
}

/// One relay: its coding, the optional cache write and the digests to
/// check.
pub struct Relay {
    /// How the body is coded.
    pub coding: Coding,
    /// The cache write, if the response is storable.
    pub store: Option<StoreTarget>,
    /// Digests the origin sent for the bytes the user agent gets.
    pub origin_digests: Vec<OriginDigest>,
    /// Whether the upstream connection saw this response break the
    /// framing rules (bytes past its end included) by the time the body
    /// is committed.
    pub framing: Option<ExchangeCheck>,
    /// Where the body is parked when the user agent stops reading (see
    /// [`crate::http::spool`]); `None` keeps it waiting in memory.
    pub spool_dir: Option<std::path::PathBuf>,
    /// What all spools take together.
    pub spool_disk: SpoolDisk,
    /// The budget a large body takes its share of before the relay's
    /// state grows (see [`crate::http::transfer_memory`]).
    pub memory: TransferMemory,
}

impl Relay {
    /// What this relay is expected to hold at most: a rebuilt body's
    /// windows and context, or a plain body's slices in flight.
    fn memory_cost(&self) -> u64 {
        match &self.coding {
            // The accelerator's windows, as it codes by default (a
            // larger window costs more than the share says).
            Coding::Hsync { .. } => {
                coded_transfer_cost(EncoderOptions::default().window_bytes, None)
            }
            Coding::Plain { expected_len } => {
                let in_flight = ((CHANNEL_DEPTH + AGENT_DEPTH) * SEND_SLICE) as u64;
                expected_len.map_or(in_flight, |len| len.min(in_flight))
            }
        }
    }
}

/// How a relay ended, for stats, logs and coalesced waiters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every check passed; `stored` says whether the entry was committed.
    Complete {
        /// Committed to the cache.
        stored: bool,
    },
    /// Upstream stopped early; `partial_stored` when the prefix was kept.
    Interrupted {
        /// A partial entry was committed.
        partial_stored: bool,
    },
    /// A check failed: nothing stored, the basis dropped.
    Corrupt {
        /// What failed.
        reason: String,
    },
    /// The user agent left and nothing was being stored.
    Abandoned,
}

/// What a relay reports when it ends.
#[derive(Debug, Clone)]
pub struct Report {
    /// How it ended.
    pub outcome: Outcome,
    /// Bytes received from upstream (the coded body).
    pub upstream_bytes: u64,
    /// Bytes of body handed to the user agent.
    pub body_bytes: u64,
}

/// A relayed body, as the user agent gets it.
pub enum Relayed {
    /// The whole body, every check passed (and a storable one committed)
    /// before the user agent's head: sent with a Content-Length, in one
    /// write, and a failure can still be a clean error status (D-A5's
    /// "buffer and verify" branch).
    Whole(Bytes),
    /// Longer than [`WHOLE_BELOW`], or slower than the wait: what came so
    /// far, then the rest as it comes (D-A5's "stream and abort" branch).
    Stream(ProxyBody),
    /// The relay failed before the user agent saw a byte.
    Failed {
        /// Why.
        reason: String,
        /// The bytes failed their checks ([`Outcome::Corrupt`]), rather
        /// than the transfer being cut.
        corrupt: bool,
    },
}

/// Bodies shorter than this are relayed [`Relayed::Whole`] when they come
/// within the wait: a 1 KiB body streamed cost hyper a write for the head,
/// one per chunk and one for the end of the chunked body.
pub const WHOLE_BELOW: usize = 64 << 10;

/// The longest a small body is waited for before its head goes out (the
/// upstream timeout when shorter): past it, the body streams as it comes,
/// so a slow link does not hold back a page's first bytes for long.
pub const WHOLE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Streams `upstream` to the user agent per `relay`, and calls `done` once
/// with the report when the relay is over (also when the user agent left).
/// A body shorter than [`WHOLE_BELOW`] that is over within `wait` comes
/// back whole; any other streams.
pub async fn relay(
    upstream: Incoming,
    relay: Relay,
    wait: std::time::Duration,
    done: impl FnOnce(Report) + Send + 'static,
) -> Relayed {
    let (to_worker, from_upstream) = mpsc::channel::<Result<Bytes, BodyError>>(CHANNEL_DEPTH);
    let (to_agent, from_worker) = mpsc::channel::<BodyItem>(AGENT_DEPTH);
    let from_worker = BodyFeed::new(from_worker);
    let feed = from_worker.clone();
    let (corrupt_tx, corrupt_rx) = tokio::sync::oneshot::channel();
    let (taker, holder) = transfer_memory::share(
        &relay.memory,
        relay.memory_cost(),
        transfer_memory::SHARE_PAST,
    );
    tokio::spawn(read_upstream(upstream, to_worker, taker));
    tokio::spawn(async move {
        let mut driver = Driver {
            spool_dir: relay.spool_dir.clone(),
            spool_disk: relay.spool_disk.clone(),
            memory: holder,
            worker: Box::new(Worker::new(relay)),
            to_agent: Some(to_agent),
            feed,
            spool: None,
        };
        let report = driver.run(from_upstream).await;
        let _ = corrupt_tx.send(matches!(report.outcome, Outcome::Corrupt { .. }));
        done(report);
        // Only now does the user agent's body end (but for a large body,
        // see `Worker::conclude`): by then the stats and any waiting
        // followers know how the transfer went.
        driver.worker.end_agent();
        driver.flush().await;
    });
    let mut prefix = Vec::new();
    let mut len = 0;
    let deadline = tokio::time::Instant::now() + wait;
    while len < WHOLE_BELOW {
        match tokio::time::timeout_at(deadline, from_worker.recv()).await {
            Ok(None) => return Relayed::Whole(concat(prefix, len)),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    len += data.len();
                    prefix.push(data);
                }
            }
            Ok(Some(Err(error))) => {
                return Relayed::Failed {
                    reason: error.to_string(),
                    corrupt: corrupt_rx.await.unwrap_or(false),
                };
            }
            Err(_) => break,
        }
    }
    Relayed::Stream(
        StreamBody::new(Prefixed {
            prefix: prefix.into(),
            rest: from_worker,
        })
        .boxed(),
    )
}

fn concat(mut parts: Vec<Bytes>, len: usize) -> Bytes {
    match parts.len() {
        0 => Bytes::new(),
        1 => parts.pop().expect("one part"),
        _ => {
            let mut whole = Vec::with_capacity(len);
            for part in &parts {
                whole.extend_from_slice(part);
            }
            whole.into()
        }
    }
}

/// The chunks a relay took before it chose to stream, then the rest.
struct Prefixed {
    prefix: std::collections::VecDeque<Bytes>,
    rest: BodyFeed,
}

impl futures_core::Stream for Prefixed {
    type Item = Result<Frame<Bytes>, BodyError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        match self.prefix.pop_front() {
            Some(data) => std::task::Poll::Ready(Some(Ok(Frame::data(data)))),
            None => self.rest.poll_recv(cx),
        }
    }
}

/// Whether a body error says the upstream's framing was malformed (hyper
/// reports a bad chunk as an `InvalidInput`/`InvalidData` I/O error under
/// its body error) rather than that the stream was cut or reset.
fn is_malformed(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData
            )
        {
            return true;
        }
        next = error.source();
    }
    false
}

async fn read_upstream(
    mut upstream: Incoming,
    to_worker: mpsc::Sender<Result<Bytes, BodyError>>,
    mut share: ShareTaker,
) {
    let mut read = 0u64;
    loop {
        // Past a small body's size, the relay's state grows: nothing more
        // is read before its share of the transfer memory (L-13, L-14).
        share.take_past(read).await;
        let Some(frame) = upstream.frame().await else {
            return;
        };
        let item = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => Ok(data),
                Err(_trailers) => continue,
            },
            Err(error) => Err(BodyError::from(error)),
        };
        if let Ok(data) = &item {
            read += data.len() as u64;
        }
        let failed = item.is_err();
        if to_worker.send(item).await.is_err() || failed {
            return;
        }
    }
}

/// Runs a relay as a task: waits for upstream chunks, the user agent and
/// the cache writer asynchronously, and takes the blocking pool only for
/// the work on the bytes (decode, hash, cache writes, commit). A user
/// agent that stops reading costs its chunks in the channels and the
/// worker's state, never a thread (L-13).
struct Driver {
    worker: Box<Worker>,
    /// `None` once the user agent's body was ended, or handed to a spool.
    to_agent: Option<mpsc::Sender<BodyItem>>,
    /// The user agent's end of that channel, for a spool to take over.
    feed: BodyFeed,
    /// The body parked on disk for a user agent that stopped reading.
    spool: Option<Spool>,
    spool_dir: Option<std::path::PathBuf>,
    spool_disk: SpoolDisk,
    /// This relay's share of the transfer memory.
    memory: ShareHolder,
}

impl Driver {
    async fn run(&mut self, mut from_upstream: mpsc::Receiver<Result<Bytes, BodyError>>) -> Report {
        let mut result = Ok(());
        while let Some(item) = from_upstream.recv().await {
            let chunk = match item {
                Ok(chunk) => chunk,
                Err(error) => {
                    let reason = format!("upstream body: {error}");
                    result = Err(if is_malformed(&*error) {
                        Stop::Malformed(reason)
                    } else {
                        Stop::Interrupted(reason)
                    });
                    break;
                }
            };
            self.worker.upstream_bytes += chunk.len() as u64;
            self.memory.collect();
            let Some(stepped) = self.blocking(move |worker| worker.step(&chunk)).await else {
                return self.lost().await;
            };
            self.flush().await;
            if let Err(stop) = stepped {
                result = Err(stop);
                break;
            }
            if self.worker.agent_gone && !self.worker.is_storing() {
                result = Err(Stop::Abandoned);
                break;
            }
        }
        drop(from_upstream);
        self.settle_writer().await;
        let Some(ending) = self.blocking(move |worker| worker.conclude(result)).await else {
            return self.lost().await;
        };
        self.flush().await;
        let outcome = match ending {
            Ending::Done(outcome) => outcome,
            Ending::Commit(commit) => {
                if commit.end_agent_first {
                    self.worker.end_agent();
                    self.flush().await;
                }
                let Some(stored) = self.blocking(move |worker| worker.commit(commit)).await else {
                    return self.lost().await;
                };
                self.flush().await;
                stored
            }
        };
        Report {
            outcome,
            upstream_bytes: self.worker.upstream_bytes,
            body_bytes: self.worker.body_bytes,
        }
    }

    /// Runs `work` on the worker on the blocking pool; `None` when it
    /// panicked (or the runtime is shutting down), the worker lost with it.
    async fn blocking<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Worker) -> T + Send + 'static,
    ) -> Option<T> {
        let mut worker = std::mem::replace(&mut self.worker, Box::new(Worker::idle()));
        let (worker, result) = tokio::task::spawn_blocking(move || {
            let result = work(&mut worker);
            (worker, result)
        })
        .await
        .ok()?;
        self.worker = worker;
        Some(result)
    }

    /// The worker was lost: the user agent's body fails rather than end
    /// (a dropped channel would end it cleanly, short), and nothing is
    /// stored (the entry writer's drop removes its files).
    async fn lost(&mut self) -> Report {
        tracing::error!("the relay's work on the body panicked; aborting the response");
        // Whoever holds the user agent's channel ends it with an error;
        // the end that `relay` gives it afterwards is then a no-op.
        self.worker.agent_ended = true;
        if let Some(spool) = self.spool.take() {
            spool
                .finish(Err("the proxy failed while relaying this body".into()))
                .await;
        }
        if let Some(sender) = self.to_agent.take() {
            let _ = sender
                .send(Err(BodyError::from(
                    "the proxy failed while relaying this body",
                )))
                .await;
        }
        Report {
            outcome: Outcome::Interrupted {
                partial_stored: false,
            },
            upstream_bytes: 0,
            body_bytes: 0,
        }
    }

    /// Hands what the last step produced to the cache writer and the user
    /// agent, waiting for each as long as it takes.
    async fn flush(&mut self) {
        let to_write = std::mem::take(&mut self.worker.to_write);
        for chunk in to_write {
            if let Some(writer) = &self.worker.background
                && !writer.write(chunk).await
            {
                // It failed and said why; nothing will be stored.
                self.worker.background = None;
            }
        }
        let to_agent = std::mem::take(&mut self.worker.to_agent);
        for item in to_agent {
            if self.spool.is_some() {
                self.spool_item(item).await;
                continue;
            }
            let Some(sender) = &self.to_agent else { break };
            // Room now: no timer, no clone (the common case, per slice).
            match sender.try_reserve() {
                Ok(room) => {
                    room.send(item);
                    continue;
                }
                Err(mpsc::error::TrySendError::Closed(())) => {
                    self.worker.agent_gone = true;
                    break;
                }
                Err(mpsc::error::TrySendError::Full(())) => {}
            }
            // A clone, so that the spool can take the channel meanwhile.
            let sender = sender.clone();
            let room = match tokio::time::timeout(STALLED_AFTER, sender.reserve()).await {
                Ok(room) => room,
                Err(_) => {
                    // The user agent stopped reading (L-13): the body goes
                    // on into a spool it will read from, so this relay can
                    // finish and free its state; without one, what only
                    // the next step needs is freed while it waits.
                    if self.start_spool().await {
                        self.spool_item(item).await;
                        continue;
                    }
                    self.worker.release_scratch();
                    sender.reserve().await
                }
            };
            let Ok(room) = room else {
                self.worker.agent_gone = true;
                break;
            };
            room.send(item);
        }
        if self.worker.agent_gone {
            self.to_agent = None;
        }
        if self.worker.agent_ended {
            self.to_agent = None;
            if let Some(spool) = self.spool.take() {
                spool
                    .finish(self.worker.agent_error.take().map_or(Ok(()), Err))
                    .await;
            }
        }
    }

    /// Hands the user agent's body to a new spool, what waited in its
    /// channel first; false when there is no spool directory or the file
    /// cannot be made.
    async fn start_spool(&mut self) -> bool {
        let Some(dir) = &self.spool_dir else {
            return false;
        };
        match Spool::create(dir, MAX_SPOOL, &self.spool_disk) {
            Ok(spool) => {
                tracing::debug!(dir = %dir.display(), "the user agent stopped reading; spooling its body");
                let queued = spool.take_over(&self.feed);
                self.to_agent = None;
                self.spool = Some(spool);
                self.worker.release_scratch();
                for item in queued {
                    self.spool_item(item).await;
                }
                true
            }
            Err(error) => {
                if error.kind() == std::io::ErrorKind::StorageFull {
                    tracing::debug!(%error, "not spooling for a stalled user agent; waiting in memory");
                } else {
                    tracing::warn!(dir = %dir.display(), %error, "cannot spool for a stalled user agent; waiting in memory");
                }
                self.spool_dir = None;
                false
            }
        }
    }

    /// One item for the user agent, into the spool: data is written, an
    /// error is kept for the spool's end.
    async fn spool_item(&mut self, item: Result<Frame<Bytes>, BodyError>) {
        let Some(spool) = &mut self.spool else { return };
        match item {
            Ok(frame) => {
                if let Ok(data) = frame.into_data()
                    && spool.write(data).await.is_err()
                {
                    // The user agent left, or the disk failed: as when a
                    // channel closes, nobody gets the rest.
                    self.worker.agent_gone = true;
                    self.spool = None;
                }
            }
            Err(error) => self.worker.agent_error = Some(error.to_string()),
        }
    }

    /// Waits for the background writer, if any, to write what it was
    /// given: the entry is then in `store` again (unless a write failed).
    async fn settle_writer(&mut self) {
        if let Some(writer) = self.worker.background.take() {
            self.worker.store = writer.finish().await;
        }
    }
}

/// The work on a relay's bytes, between waits (see [`Driver`]): what it
/// produces for the user agent and the cache writer is queued here and
/// handed on by the driver.
struct Worker {
    /// The decoder of an hsync body, with the basis's cache key.
    decoder: Option<(Decoder<ClientBasis>, Option<CacheKey>)>,
    /// A plain body's signature, computed here, and its announced length.
    plain: Option<(SignatureBuilder, Option<u64>)>,
    pool: WindowPool,
    /// Rebuilt bytes the stream has not vouched for yet.
    unverified: std::collections::VecDeque<Bytes>,
    unverified_len: u64,
    /// The cache entry while it is written here (a small body so far).
    store: Option<StoreTarget>,
    /// The cache entry once the body is large: written by a task of its own.
    background: Option<BackgroundWriter>,
    digests: DigestCheck,
    /// For the user agent and the background writer, in order.
    to_agent: Vec<Result<Frame<Bytes>, BodyError>>,
    to_write: Vec<Bytes>,
    agent_gone: bool,
    /// The user agent's body was ended (cleanly or not).
    agent_ended: bool,
    /// Why the user agent's body failed, once it did (for a spool's end).
    agent_error: Option<String>,
    upstream_bytes: u64,
    body_bytes: u64,
    /// The user agent was told this Content-Length: the chunk that reaches
    /// it is held back until the checks pass, or the user agent would see a
    /// complete-looking body that then fails (D-A5).
    announced_len: Option<u64>,
    held: Option<Bytes>,
    framing: Option<ExchangeCheck>,
}

/// A user agent that has taken nothing for this long is stalled: the
/// relay frees its per-window buffers while it waits. (Sooner would free
/// and grow them again for every window of a user agent that is merely
/// slower than the link.)
const STALLED_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// Bytes a spool holds at most ahead of its user agent; past it the relay
/// waits for the user agent, as it does without a spool.
const MAX_SPOOL: u64 = 1 << 30;

/// Rebuilt bytes held back at most, waiting for the SIG entries that
/// vouch for them: two of the largest windows and eight blocks (the
/// decoder recomputes entries eight blocks at a time). An upstream that
/// sends more without them is not speaking hsync/1.
const MAX_UNVERIFIED: u64 =
    2 * crate::hsync::MAX_WINDOW_OUTPUT as u64 + 8 * crate::hsync::MAX_BLOCK_SIZE as u64;

/// Why the worker stopped before the end of the upstream body.
enum Stop {
    /// Upstream failed (reset, cut): keep a partial entry.
    Interrupted(String),
    /// Upstream sent a malformed body (a bad chunk): keep nothing, since
    /// no byte of it can be trusted to be the body (P-5); the basis is
    /// not at fault.
    Malformed(String),
    /// The bytes are wrong: store nothing, drop the basis.
    Corrupt(String),
    /// Nobody wants the rest.
    Abandoned,
}

/// How a relay ends, once the upstream body is over.
enum Ending {
    /// Nothing (more) to commit.
    Done(Outcome),
    /// An entry to commit.
    Commit(Commit),
}

/// An entry to commit, and how.
struct Commit {
    completeness: Completeness,
    signature: Vec<u8>,
    /// The body's blake3 when the decoder computed it.
    body_digest: Option<blake3::Hash>,
    /// End the user agent's body before the commit (a large body: its
    /// fsync can take seconds the user agent need not wait for).
    end_agent_first: bool,
    /// Why the transfer stopped early (a partial entry).
    interrupted: Option<String>,
}

impl Worker {
    fn new(relay: Relay) -> Worker {
        let mut worker = Worker::idle();
        match relay.coding {
            Coding::Hsync {
                basis,
                basis_key,
                limits,
            } => {
                // The decoder hashes every byte it rebuilds (for END); the
                // cache writer hashes what it writes (for the outboard), and
                // the commit checks that both agree.
                worker.decoder = Some((Decoder::new(basis, limits), basis_key));
            }
            Coding::Plain { expected_len } => {
                let block = choose_block_size(
                    expected_len.unwrap_or(0),
                    EncoderOptions::default().max_signature_bytes,
                    EncoderOptions::default().min_block_size,
                );
                let signature = SignatureBuilder::new(SignatureParams {
                    block_size: block,
                    strong_len: crate::hsync::DEFAULT_STRONG_LEN,
                });
                worker.plain = Some((signature, expected_len));
                worker.announced_len = expected_len;
            }
        }
        worker.digests = DigestCheck::new(&relay.origin_digests);
        worker.framing = relay.framing;
        worker.store = relay.store;
        worker
    }

    /// A worker with nothing to do (a placeholder while the real one is on
    /// the blocking pool).
    fn idle() -> Worker {
        Worker {
            decoder: None,
            plain: None,
            pool: WindowPool::default(),
            unverified: Default::default(),
            unverified_len: 0,
            store: None,
            background: None,
            digests: DigestCheck::default(),
            to_agent: Vec::new(),
            to_write: Vec::new(),
            agent_gone: false,
            agent_ended: false,
            agent_error: None,
            upstream_bytes: 0,
            body_bytes: 0,
            announced_len: None,
            held: None,
            framing: None,
        }
    }

    /// Takes the next upstream chunk.
    fn step(&mut self, chunk: &Bytes) -> Result<(), Stop> {
        if let Some((decoder, _)) = &mut self.decoder {
            let pool = &self.pool;
            let unverified = &mut self.unverified;
            let unverified_len = &mut self.unverified_len;
            let pushed = decoder.push_to(chunk, |window| {
                let rebuilt = std::mem::replace(window, pool.take());
                *unverified_len += rebuilt.len() as u64;
                unverified.push_back(pool.share(rebuilt));
                Ok(())
            });
            let verified = decoder.verified_len();
            pushed.map_err(|error| Stop::Corrupt(format!("hsync stream: {error}")))?;
            self.release_verified(verified)?;
            return Ok(());
        }
        if let Some((signature, _)) = &mut self.plain
            && (self.store.is_some() || self.background.is_some())
        {
            signature.update(chunk);
        }
        self.emit(chunk);
        Ok(())
    }

    /// Frees buffers the next step would otherwise reuse.
    fn release_scratch(&mut self) {
        if let Some((decoder, _)) = &mut self.decoder {
            decoder.release_scratch();
        }
        self.pool.clear();
    }

    /// Hands on the rebuilt bytes up to `verified` (a body offset).
    fn release_verified(&mut self, verified: u64) -> Result<(), Stop> {
        let mut releasable = verified.saturating_sub(self.body_bytes);
        while releasable > 0 {
            let Some(mut window) = self.unverified.pop_front() else {
                break;
            };
            if window.len() as u64 > releasable {
                let rest = window.split_off(releasable as usize);
                self.unverified.push_front(rest);
            }
            releasable -= window.len() as u64;
            self.unverified_len -= window.len() as u64;
            self.emit(&window);
        }
        if self.unverified_len > MAX_UNVERIFIED {
            return Err(Stop::Malformed(format!(
                "upstream sent {} bytes without the SIG entries for them",
                self.unverified_len
            )));
        }
        Ok(())
    }

    /// Hands body bytes to the cache writer, the digest check and the
    /// user agent's queue.
    fn emit(&mut self, data: &Bytes) {
        self.body_bytes += data.len() as u64;
        self.digests.update(data);
        // Past the first MiB the cache writes move to a task of their own,
        // which takes the slices sent to the user agent.
        if self.body_bytes > BACKGROUND_WRITE_AFTER
            && let Some(target) = self.store.take()
        {
            self.background = Some(BackgroundWriter::start(target));
        }
        if let Some(target) = &mut self.store
            && let Err(error) = target.writer.write_body(data)
        {
            // Full disk or over budget: the user agent still gets its
            // bytes (C-E1); the entry is just not kept.
            tracing::warn!(cache = %target.store.root().display(), %error, "cache write failed; not storing this response");
            self.store = None;
        }
        // A rebuilt window can be many MiB: it goes to the user agent in
        // slices, so that the channel and the writer's queue hold a few
        // slices, not a few windows' worth of queued bytes. The user
        // agent's slices are copies: a slice of the window would keep the
        // whole window allocated for as long as a stalled user agent
        // leaves it in the channel (L-13); the cache writer's are not.
        let mut starts = (0..data.len()).step_by(SEND_SLICE).peekable();
        while let Some(start) = starts.next() {
            let range = start..data.len().min(start + SEND_SLICE);
            if self.background.is_some() {
                self.to_write.push(data.slice(range.clone()));
            }
            let chunk = Bytes::copy_from_slice(&data[range]);
            if starts.peek().is_none() && self.announced_len == Some(self.body_bytes) {
                self.held = Some(chunk);
            } else {
                self.send_to_agent(chunk);
            }
        }
    }

    /// Whether the body is still being written to a cache entry.
    fn is_storing(&self) -> bool {
        self.store.is_some() || self.background.is_some()
    }

    /// Ends the user agent's body cleanly: the held chunk, then the end of
    /// the stream. Idempotent.
    fn end_agent(&mut self) {
        if let Some(last) = self.held.take() {
            self.send_to_agent(last);
        }
        self.agent_ended = true;
    }

    fn send_to_agent(&mut self, chunk: Bytes) {
        if !self.agent_gone && !self.agent_ended {
            self.to_agent.push(Ok(Frame::data(chunk)));
        }
    }

    /// Ends the user agent's body with an error, so it is never mistaken
    /// for a whole one.
    fn abort_agent(&mut self, reason: &str) {
        tracing::warn!(%reason, "aborting the response");
        self.held = None;
        if !self.agent_gone && !self.agent_ended {
            self.to_agent.push(Err(BodyError::from(reason.to_owned())));
        }
        self.agent_ended = true;
    }

    /// The upstream body is over (`result`): the last checks, and what to
    /// commit. The background writer is settled by now.
    fn conclude(&mut self, result: Result<(), Stop>) -> Ending {
        let signature;
        let mut body_digest = None;
        let mut basis_key = None;
        let result = match self.decoder.take() {
            Some((mut decoder, key)) => {
                basis_key = key;
                // A clean end without END is a cut, as an aborted body is.
                let result = result.and_then(|()| {
                    decoder.finish().map_err(|e| match e {
                        DecodeError::Truncated { .. } => Stop::Interrupted(e.to_string()),
                        other => Stop::Corrupt(format!("hsync stream: {other}")),
                    })
                });
                match result {
                    Ok(decoded) => {
                        // END vouched for the rest.
                        if let Err(stop) = self.release_verified(decoded.len) {
                            return self.stopped(stop, None, None, None);
                        }
                        signature = Some(decoded.signature);
                        body_digest = Some(decoded.digest.into());
                        Ok(())
                    }
                    Err(stop) => {
                        // What was never vouched for is not the body's
                        // prefix: the partial entry ends where checks did
                        // (a whole number of blocks), and the writer's own
                        // digest of it is the one kept.
                        let partial = decoder.into_partial();
                        if self.unverified_len == 0 {
                            signature = partial.signature;
                            body_digest = Some(partial.digest.into());
                        } else {
                            signature = partial
                                .signature
                                .and_then(|s| signature_prefix(s, self.body_bytes));
                        }
                        Err(stop)
                    }
                }
            }
            None => {
                let (mut builder, expected_len) = self.plain.take().expect("plain or hsync");
                let result = result.and_then(|()| match expected_len {
                    Some(len) if len != self.body_bytes => Err(Stop::Interrupted(format!(
                        "body of {} bytes where Content-Length said {len}",
                        self.body_bytes
                    ))),
                    _ => Ok(()),
                });
                builder.finish();
                signature = Some(builder.to_signature_bytes());
                result
            }
        };
        match result {
            Ok(()) => self.complete(signature.unwrap_or_default(), body_digest),
            Err(stop) => self.stopped(stop, signature, body_digest, basis_key.as_ref()),
        }
    }

    /// Every byte arrived: check the origin's digests, and commit.
    fn complete(&mut self, signature: Vec<u8>, body_digest: Option<blake3::Hash>) -> Ending {
        // hyper ends a body at its length; bytes after it that its
        // connection read by now make the whole response untrustworthy
        // (P-17). Later ones are not seen here (the connection still fails
        // on them, and is not reused).
        if let Some(violation) = self.framing.as_ref().and_then(ExchangeCheck::violation) {
            let reason = format!("upstream body: {}", ExchangeCheck::error(violation));
            return self.stopped(Stop::Malformed(reason), None, None, None);
        }
        let digests = std::mem::take(&mut self.digests);
        if let Err(reason) = digests.verify() {
            self.abort_agent(&reason);
            if let Some(target) = self.store.take() {
                target.writer.abort();
            }
            return Ending::Done(Outcome::Corrupt { reason });
        }
        if self.store.is_none() {
            return Ending::Done(Outcome::Complete { stored: false });
        }
        // A small body is committed before the user agent sees its end (the
        // relay ends it after the report), so the next request (the next
        // release a page asks for) finds it.
        Ending::Commit(Commit {
            completeness: Completeness::Complete,
            signature,
            body_digest,
            end_agent_first: self.body_bytes > SMALL_BODY,
            interrupted: None,
        })
    }

    /// The relay stopped early.
    fn stopped(
        &mut self,
        stop: Stop,
        signature: Option<Vec<u8>>,
        body_digest: Option<blake3::Hash>,
        basis_key: Option<&CacheKey>,
    ) -> Ending {
        match stop {
            Stop::Abandoned => {
                self.store = None;
                Ending::Done(Outcome::Abandoned)
            }
            // The cache is settled before the user agent learns of the
            // failure, so a retry sees the state that follows from it.
            Stop::Corrupt(reason) => {
                if let Some(target) = self.store.take() {
                    if let Some(key) = basis_key {
                        target.store.remove(key);
                        tracing::warn!(basis = %key, %reason, "dropped the basis of a stream that failed its checks");
                    }
                    target.writer.abort();
                }
                self.abort_agent(&reason);
                Ending::Done(Outcome::Corrupt { reason })
            }
            Stop::Malformed(reason) => {
                if let Some(target) = self.store.take() {
                    target.writer.abort();
                }
                self.abort_agent(&reason);
                Ending::Done(Outcome::Interrupted {
                    partial_stored: false,
                })
            }
            Stop::Interrupted(reason) => match signature {
                Some(signature) if self.body_bytes > 0 && self.store.is_some() => {
                    Ending::Commit(Commit {
                        completeness: Completeness::Partial,
                        signature,
                        body_digest,
                        end_agent_first: false,
                        interrupted: Some(reason),
                    })
                }
                _ => {
                    self.store = None;
                    self.abort_agent(&reason);
                    Ending::Done(Outcome::Interrupted {
                        partial_stored: false,
                    })
                }
            },
        }
    }

    /// Commits the entry as `commit` says (blocking: fsyncs).
    fn commit(&mut self, commit: Commit) -> Outcome {
        let stored = match self.store.take() {
            Some(mut target) => {
                target.entry.completeness = commit.completeness;
                match commit_entry(
                    target.writer,
                    target.entry,
                    &commit.signature,
                    commit.body_digest,
                ) {
                    Ok(()) => true,
                    Err(error) => {
                        if commit.interrupted.is_none() {
                            tracing::warn!(%error, "cache commit failed; response served, not stored");
                        }
                        false
                    }
                }
            }
            None => false,
        };
        match commit.interrupted {
            None => Outcome::Complete { stored },
            Some(reason) => {
                self.abort_agent(&reason);
                Outcome::Interrupted {
                    partial_stored: stored,
                }
            }
        }
    }
}

/// The part of a body's `signature` (librsync format) that describes its
/// first `len` bytes, when those are a whole number of its blocks.
fn signature_prefix(mut signature: Vec<u8>, len: u64) -> Option<Vec<u8>> {
    let header = signature.get(..crate::hsync::SIGNATURE_HEADER_LEN)?;
    let block = u64::from(u32::from_be_bytes(header[4..8].try_into().ok()?));
    let strong = u64::from(u32::from_be_bytes(header[8..12].try_into().ok()?));
    if block == 0 || !len.is_multiple_of(block) {
        return None;
    }
    let keep = crate::hsync::SIGNATURE_HEADER_LEN as u64 + len / block * (4 + strong);
    if keep > signature.len() as u64 {
        return None;
    }
    signature.truncate(keep as usize);
    Some(signature)
}

fn commit_entry(
    writer: EntryWriter,
    entry: NewEntry,
    signature: &[u8],
    body_digest: Option<blake3::Hash>,
) -> Result<(), CacheError> {
    match body_digest {
        Some(digest) => writer.commit_with_digest(entry, signature, digest),
        None => writer.commit(entry, signature),
    }
}

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_prefix_describes_the_first_whole_blocks() {
        let body: Vec<u8> = (0..10_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let params = SignatureParams {
            block_size: 1024,
            strong_len: 8,
        };
        let signature_of = |bytes: &[u8]| {
            let mut builder = SignatureBuilder::new(params);
            builder.update(bytes);
            builder.finish();
            builder.to_signature_bytes()
        };
        let whole = signature_of(&body);
        assert_eq!(
            signature_prefix(whole.clone(), 3072),
            Some(signature_of(&body[..3072]))
        );
        assert_eq!(signature_prefix(whole.clone(), 0), Some(signature_of(&[])));
        assert_eq!(
            signature_prefix(whole, 3000),
            None,
            "not a whole number of blocks"
        );
    }
}

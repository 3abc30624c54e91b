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

pub use super::cache_writer::StoreTarget;
use crate::cache::CacheKey;
use crate::hsync::{Basis, DecodeLimits, EncoderOptions, FileBasis};
use crate::http::server::{BodyError, ProxyBody};
use crate::http::spool::{BodyFeed, BodyItem, Spool, SpoolDisk};
use crate::http::transfer_memory::{
    self, ShareHolder, ShareTaker, TransferMemory, coded_transfer_cost,
};
use crate::http::upstream_guard::ExchangeCheck;
pub use digests::OriginDigest;
use worker::{Ending, Stop, Worker};

mod digests;
mod window_pool;
mod worker;

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

/// A user agent that has taken nothing for this long is stalled: the
/// relay frees its per-window buffers while it waits. (Sooner would free
/// and grow them again for every window of a user agent that is merely
/// slower than the link.)
const STALLED_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// Bytes a spool holds at most ahead of its user agent; past it the relay
/// waits for the user agent, as it does without a spool.
const MAX_SPOOL: u64 = 1 << 30;

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

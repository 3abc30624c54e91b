//! Relaying a body from upstream to the user agent while writing it to the
//! cache: an hsync stream is rebuilt against the basis on the way, any
//! other body passes as it is and gets its signature computed here.
//!
//! The relay is the client proxy's place in the shared [`body_pipe`]: its
//! reader task takes the upstream body frame by frame into a small
//! channel; a driver task takes each chunk to the blocking pool, where it
//! is decoded, hashed and written to the cache entry (a large body's by a
//! writer task of its own, `cache_writer`), and hands the results to the
//! user agent's [`Downstream`], which slices them into a small channel
//! and parks them in a spool for a user agent that stopped reading. Both
//! channels are bounded, so a slow user agent slows the upstream read
//! instead of filling memory, and every wait is a task's: a user agent
//! that stops reading holds no thread (L-13).
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
//! branches, by size). A body whose upstream connection read bytes past
//! its end by then (P-17) is never stored: whole, it is still served, as
//! [`Relayed::Excess`] (its head then says no-store); streamed, it is cut
//! (`WholeOrStream` settles which, once). An interrupted transfer leaves a
//! partial entry — the prefix and its signature — so the next fetch
//! resumes from it.
//!
//! This file is the entry point and the types callers use ([`relay`]
//! choosing the whole or the streamed branch, [`Relay`], [`Coding`],
//! [`ClientBasis`], [`Relayed`], [`Report`], [`Outcome`]); the parts, each
//! with one reason to change:
//! - `driver`: the relay's async task (the worker's trips to the blocking
//!   pool, the background writer, the user agent's downstream, what an
//!   upstream error means);
//! - `worker`: the blocking work on the bytes (decode, verify, hash,
//!   cache writes, the last checks, the commit);
//! - `digests`: the origin's `Content-Digest`/`Repr-Digest`;
//! - `window_pool`: reused buffers of rebuilt windows.
//!
//! Main items: [`relay`], [`Relay`], [`Relayed`], [`Outcome`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;

pub use super::cache_writer::StoreTarget;
use crate::cache::CacheKey;
use crate::hsync::{Basis, DecodeLimits, EncoderOptions, FileBasis};
use crate::http::body_pipe::{
    self, AGENT_SLICE, DOWNSTREAM_DEPTH, Downstream, Parking, UPSTREAM_DEPTH,
};
use crate::http::server::{BodyError, ProxyBody};
use crate::http::spool::{BodyFeed, SpoolDisk};
use crate::http::transfer_memory::{self, TransferMemory, coded_transfer_cost};
use crate::http::upstream_guard::ExchangeCheck;
pub use digests::OriginDigest;
use driver::Driver;
use worker::Worker;

mod digests;
mod driver;
mod window_pool;
mod worker;

/// Bytes a spool holds at most ahead of its user agent; past it the relay
/// waits for the user agent, as it does without a spool.
const MAX_SPOOL: u64 = 1 << 30;

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
    /// Whether the caller has something better than a cut body to answer
    /// with should the body fail before its first byte (a stale entry
    /// that `stale-if-error` allows): the head is then held until that
    /// byte, past the upstream wait, rather than sent without it.
    pub hold_head: bool,
}

impl Relay {
    /// What this relay is expected to hold at most: a rebuilt body's
    /// windows and context, or a plain body's slices in flight.
    fn memory_cost(&self) -> u64 {
        match &self.coding {
            // The accelerator's windows, as it codes by default, until
            // the stream's header tells their size (`hsync_stream_cost`).
            Coding::Hsync { .. } => {
                coded_transfer_cost(EncoderOptions::default().window_bytes, None)
            }
            Coding::Plain { expected_len } => {
                let in_flight = ((UPSTREAM_DEPTH + DOWNSTREAM_DEPTH) * AGENT_SLICE) as u64;
                expected_len.map_or(in_flight, |len| len.min(in_flight))
            }
        }
    }
}

/// What rebuilding an hsync stream with this header holds at most, as
/// [`Relay::memory_cost`] does, with the windows its block size makes:
/// the encoder's windows are at least eight blocks, so a body over
/// ~400 MB, whose blocks are 1 MiB, comes in 8 MiB windows, not the
/// configured 1 MiB (L-8 at 1 GiB). `None` for a header that does not
/// parse (the decoder refuses it).
fn hsync_stream_cost(head: &[u8]) -> Option<u64> {
    let (header, _) = crate::hsync::Header::parse(head).ok()??;
    let window = EncoderOptions::default()
        .window_bytes
        .max(crate::hsync::min_window_len(header.block_size))
        .min(crate::hsync::MAX_WINDOW_OUTPUT);
    Some(coded_transfer_cost(window, None))
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
    /// The rebuilt body's blake3, when an hsync body was committed whole.
    pub committed_digest: Option<blake3::Hash>,
    /// Time the work on the bytes took on blocking threads (decoding,
    /// hashing, writing the cache).
    pub busy: std::time::Duration,
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
    Stream {
        /// The body.
        body: ProxyBody,
        /// Its length, when an hsync body was rebuilt and verified whole
        /// before any of it went on (a stream without SIG frames is held
        /// until END): the user agent may be told it. Its last piece is
        /// held back until every check passed, as a plain body's is.
        rebuilt_len: Option<u64>,
    },
    /// As [`Relayed::Whole`], but its upstream sent bytes past its end
    /// (P-17): the body as declared, not stored, and its head must let
    /// nobody after us store it either.
    Excess(Bytes),
    /// The relay failed before the user agent saw a byte.
    Failed {
        /// Why.
        reason: String,
        /// The bytes failed their checks ([`Outcome::Corrupt`]), rather
        /// than the transfer being cut.
        corrupt: bool,
    },
}

/// The length of an hsync body verified whole before any of it went on,
/// set by the worker and read by the relay as the head goes (see
/// [`Relayed::Stream`]).
#[derive(Clone, Default)]
pub(super) struct RebuiltLen(Arc<AtomicU64>);

impl RebuiltLen {
    /// Not known: the worker never set it (0 is a length).
    const UNKNOWN: u64 = 0;

    /// Stores `len`.
    pub(super) fn set(&self, len: u64) {
        // Offset by one, so that the default (0) means unknown.
        self.0.store(len + 1, Ordering::Release);
    }

    fn get(&self) -> Option<u64> {
        match self.0.load(Ordering::Acquire) {
            Self::UNKNOWN => None,
            known => Some(known - 1),
        }
    }
}

/// Bodies shorter than this are relayed [`Relayed::Whole`] when they come
/// within the wait: a 1 KiB body streamed cost hyper a write for the head,
/// one per chunk and one for the end of the chunked body.
pub const WHOLE_BELOW: usize = 64 << 10;

/// Whether a relay's body goes whole or streams, when both the relay and
/// its worker have a say: the relay streams past the wait (its head then
/// goes), and the worker may end a small body whose upstream sent bytes
/// past its end (P-17) cleanly only if it goes whole, under a head that
/// forbids storing it (a streamed head carried the origin's caching
/// fields: that body is cut). The first to choose wins.
#[derive(Clone, Default)]
pub(super) struct WholeOrStream(Arc<AtomicU8>);

impl WholeOrStream {
    const OPEN: u8 = 0;
    const STREAM: u8 = 1;
    const WHOLE: u8 = 2;

    /// The relay would stream: false when the worker chose whole first.
    fn stream(&self) -> bool {
        self.choose(Self::STREAM)
    }

    /// The worker would end the body whole: false when the relay streams.
    pub(super) fn whole(&self) -> bool {
        self.choose(Self::WHOLE)
    }

    /// Whether the worker chose whole.
    fn is_whole(&self) -> bool {
        self.0.load(Ordering::Acquire) == Self::WHOLE
    }

    /// The whole `body`, as the choice makes it.
    fn relayed(&self, body: Bytes) -> Relayed {
        if self.is_whole() {
            Relayed::Excess(body)
        } else {
            Relayed::Whole(body)
        }
    }

    fn choose(&self, choice: u8) -> bool {
        match self
            .0
            .compare_exchange(Self::OPEN, choice, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(chosen) => chosen == choice,
        }
    }
}

/// The longest a small body is waited for before its head goes out (the
/// upstream timeout when shorter): past it, the body streams as it comes,
/// so a slow link does not hold back a page's first bytes for long.
pub const WHOLE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Streams `upstream` to the user agent per `relay`, and calls `done` once
/// with the report when the relay is over (also when the user agent left).
/// A body shorter than [`WHOLE_BELOW`] that is over within `wait` comes
/// back whole; any other streams. With [`Relay::hold_head`], a body that
/// has sent nothing within `wait` is waited for until its first byte (or
/// its end, or its failure, which is then [`Relayed::Failed`]: the caller
/// still has its stale entry to answer with). Once a byte went out, a
/// failure can only cut the body.
pub async fn relay(
    upstream: ProxyBody,
    relay: Relay,
    wait: std::time::Duration,
    done: impl FnOnce(Report) + Send + 'static,
) -> Relayed {
    let hold_head = relay.hold_head;
    let choice = WholeOrStream::default();
    let rebuilt_len = RebuiltLen::default();
    let (to_worker, from_upstream) = body_pipe::upstream_channel();
    let parking = relay.spool_dir.as_deref().map(|dir| Parking {
        dir: dir.into(),
        limit: MAX_SPOOL,
        disk: relay.spool_disk.clone(),
    });
    let (to_agent, from_worker) = Downstream::new(AGENT_SLICE, parking);
    let (corrupt_tx, corrupt_rx) = tokio::sync::oneshot::channel();
    let (taker, holder) = transfer_memory::share(
        &relay.memory,
        relay.memory_cost(),
        transfer_memory::SHARE_PAST,
    );
    let taker = match relay.coding {
        Coding::Hsync { .. } => taker.sized_by_head(crate::hsync::HEADER_LEN, hsync_stream_cost),
        Coding::Plain { .. } => taker,
    };
    // Past a small body's size, the relay's state grows: nothing more is
    // read before its share of the transfer memory.
    tokio::spawn(async move {
        body_pipe::read_upstream(upstream, taker, &to_worker, |_| {}).await;
    });
    let worker_choice = choice.clone();
    let worker_len = rebuilt_len.clone();
    tokio::spawn(async move {
        let mut driver = Driver {
            memory: holder,
            worker: Box::new(Worker::new(relay, worker_choice, worker_len)),
            to_agent: Some(to_agent),
            busy: std::time::Duration::ZERO,
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
            Ok(None) => return choice.relayed(concat(prefix, len)),
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
            // Nothing yet, and a failure now would still have a better
            // answer than a cut body (RFC 5861 §4): the head waits for
            // the first byte, or the end, however long that takes.
            Err(_) if hold_head && len == 0 => match from_worker.recv().await {
                None => return choice.relayed(Bytes::new()),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        len += data.len();
                        prefix.push(data);
                    }
                    if len > 0 {
                        break;
                    }
                }
                Some(Err(error)) => {
                    return Relayed::Failed {
                        reason: error.to_string(),
                        corrupt: corrupt_rx.await.unwrap_or(false),
                    };
                }
            },
            Err(_) => break,
        }
    }
    if !choice.stream() {
        // The worker ends the body whole, short of WHOLE_BELOW (P-17):
        // the rest is on its way.
        while let Some(frame) = from_worker.recv().await {
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        len += data.len();
                        prefix.push(data);
                    }
                }
                Err(error) => {
                    return Relayed::Failed {
                        reason: error.to_string(),
                        corrupt: corrupt_rx.await.unwrap_or(false),
                    };
                }
            }
        }
        return Relayed::Excess(concat(prefix, len));
    }
    Relayed::Stream {
        body: StreamBody::new(Prefixed {
            prefix: prefix.into(),
            rest: from_worker,
        })
        .boxed(),
        // Set before the worker handed on its first byte, if at all.
        rebuilt_len: rebuilt_len.get(),
    }
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

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hsync::{Header, LiteralCodec};

    fn header(block_size: u32) -> Vec<u8> {
        let mut out = Vec::new();
        Header {
            block_size,
            strong_len: crate::hsync::DEFAULT_STRONG_LEN,
            codec: LiteralCodec::ZstdWindow,
            sig_frames: true,
        }
        .write(&mut out);
        out
    }

    /// A stream of 1 MiB blocks comes in 8 MiB windows, and its share
    /// says so; blocks of up to 128 KiB keep the 1 MiB windows' share.
    #[test]
    fn a_streams_share_follows_the_windows_its_block_size_makes() {
        let default = coded_transfer_cost(EncoderOptions::default().window_bytes, None);
        assert_eq!(default, 6 << 20);
        assert_eq!(hsync_stream_cost(&header(1 << 20)), Some(48 << 20));
        assert_eq!(hsync_stream_cost(&header(128 << 10)), Some(default));
        assert_eq!(hsync_stream_cost(&header(1024)), Some(default));
        assert_eq!(hsync_stream_cost(b"not an hsync stream"), None);
    }
}

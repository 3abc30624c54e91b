//! A coded body streamed as it is coded ([`encode_body`]): the origin's
//! reader, the encoder task and the client are joined by small bounded
//! channels, so a slow client slows the origin read instead of filling
//! memory, and the first frames leave before the origin has finished. The
//! encoder borrows a blocking thread only for a window's work (see
//! [`super::turns`]), gives back the scratch memory it can rebuild while it
//! waits, and parks the rest of the body in a [`Spool`] for a client that
//! stopped reading. The body is collected for the basis store on the way
//! ([`Kept`]).
//!
//! Leaves out whether to code (the role's decision in `mod.rs`), small
//! bodies coded whole (`whole.rs`) and the pacing measure (`pacing.rs`).
//!
//! Main types: [`Streaming`], [`Sink`], [`EncodedStream`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Uri};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::http::server::{BodyError, ProxyBody};
use crate::http::spool::{BodyFeed, Spool};
use crate::http::transfer_memory::{self, ShareHolder, ShareTaker};
use crate::http::upstream_guard::ExchangeCheck;

use super::basis_store::BasisStore;
use super::coding::{Coding, Parking};
use super::pace::Pacer;
use super::pacing::{Idle, Pacing};
use super::stats::Stats;
use super::turns::Encoders;

/// Frames in flight between the origin reader, the encoder thread and the
/// client: small, so that backpressure reaches the origin quickly.
const CHANNEL_DEPTH: usize = 4;

/// Largest piece of stream sent to the client at a time: what hyper holds
/// for a client that stops reading, beside the spool's page (the spool
/// takes over what waits in the channel).
const SEND_SLICE: usize = 32 << 10;

/// Slices in flight towards the client.
const CLIENT_DEPTH: usize = 8;

/// A body on its way into the basis store: the origin's chunks as they
/// came (copied once, when the body is complete), and its room in the
/// store's collecting budget, given back when it drops.
struct Kept {
    chunks: Vec<Bytes>,
    len: usize,
    room: OwnedSemaphorePermit,
}

impl Kept {
    fn new(store: &BasisStore) -> Option<Kept> {
        Some(Kept {
            chunks: Vec::new(),
            len: 0,
            room: store.reserve(0)?,
        })
    }

    /// Adds `chunk`; false when the body outgrew the store's limit or the
    /// budget is spent, and is not kept.
    fn add(&mut self, chunk: &Bytes, store: &BasisStore) -> bool {
        if self.len + chunk.len() > store.max_body() {
            return false;
        }
        let Some(room) = store.reserve(chunk.len()) else {
            return false;
        };
        self.room.merge(room);
        self.chunks.push(chunk.clone());
        self.len += chunk.len();
        true
    }

    fn into_body(self) -> Arc<[u8]> {
        let mut body = Vec::with_capacity(self.len);
        for chunk in &self.chunks {
            body.extend_from_slice(chunk);
        }
        body.into()
    }
}

/// How long an encoder waits, for the client to take bytes or for the
/// origin to send some, before it gives back the memory it can rebuild
/// ([`Encoder::release_buffers`](crate::hsync::Encoder::release_buffers)):
/// longer than a reader that keeps up pauses, so that such a reader's
/// windows do not pay for allocating it again.
const RELEASE_AFTER: Duration = Duration::from_millis(100);

/// Waits for `ready`; past [`RELEASE_AFTER`], calls `release` first and
/// keeps waiting.
async fn wait_releasing<T>(ready: impl Future<Output = T>, release: impl FnOnce()) -> T {
    let mut ready = std::pin::pin!(ready);
    if let Ok(value) = tokio::time::timeout(RELEASE_AFTER, ready.as_mut()).await {
        return value;
    }
    release();
    ready.await
}

type ToClient = mpsc::Sender<Result<Frame<Bytes>, BodyError>>;

/// How long a client may take nothing (sending it a frame would wait that
/// long) before its body is parked in a [`Spool`], as nginx's
/// `proxy_buffering` parks one in a temp file: the encoder then runs on at
/// the origin's pace, finishes and frees its context, window and buffers,
/// and the stalled client holds a follower task, a page and its channel
/// (L-13). As long as [`RELEASE_AFTER`]: a reader that pauses less keeps
/// its stream in memory.
const STALLED_AFTER: Duration = Duration::from_millis(100);

/// Where a coded stream goes.
enum Sink {
    /// Straight into the client's channel.
    Client(ToClient),
    /// Into a spool, whose follower feeds the client's channel.
    Spool(Spool),
}

impl Sink {
    /// Fails the client's body: a stream that went wrong never ends
    /// cleanly.
    async fn fail(self, error: BodyError) {
        match self {
            Sink::Client(to_client) => {
                let _ = to_client.send(Err(error)).await;
            }
            Sink::Spool(spool) => spool.finish(Err(error.to_string())).await,
        }
    }
}

/// Warned once per process: a spool directory that cannot take a file.
static SPOOL_FAILED: std::sync::Once = std::sync::Once::new();

/// Streams the origin body through the encoder: an async task owns the
/// encoder and moves it to a blocking thread, in its turn, only for the
/// CPU work of a chunk that completes a window; waiting for the origin or
/// the client holds no thread. The body is also collected, up to the
/// store's limits, and kept there once END's digest is known.
pub(super) fn encode_body(
    origin: Incoming,
    framing: Option<ExchangeCheck>,
    coding: Coding,
    pacer: Option<Pacer>,
    method: Method,
    uri: Uri,
) -> ProxyBody {
    let Coding {
        encoder,
        encoders,
        memory,
        store,
        stats,
        parking,
    } = coding;
    let pacing = Pacing::new(encoder, pacer);
    let (to_encoder, from_origin) = mpsc::channel::<Result<Bytes, BodyError>>(CHANNEL_DEPTH);
    let (to_client, from_encoder) = mpsc::channel::<Result<Frame<Bytes>, BodyError>>(CLIENT_DEPTH);
    let from_encoder = BodyFeed::new(from_encoder);
    let link_idle = pacing.idle.clone();
    let origin_idle = pacing.idle.clone();
    let (mut taker, holder) = match memory {
        Some((memory, cost, known_len)) => {
            // A body announced larger than a small one waits before its
            // first byte: nothing of it is read (into hyper's buffer, the
            // channel and the window) while it waits.
            let past = match known_len {
                Some(len) if len > transfer_memory::SHARE_PAST => 0,
                _ => transfer_memory::SHARE_PAST,
            };
            let (taker, holder) = transfer_memory::share(&memory, cost, past);
            (taker, Some(holder))
        }
        None => (ShareTaker::unbudgeted(), None),
    };
    let read_origin = async move {
        let mut origin = origin;
        // Past a small body's size, the coding's state grows: nothing more
        // is read before its share.
        while let Some(item) = taker.next_chunk(&mut origin).await {
            let failed = item.is_err();
            let sending = Instant::now();
            if to_encoder.send(item).await.is_err() || failed {
                return;
            }
            Idle::add(&origin_idle.origin, sending);
        }
        // No END (and nothing kept) for a body whose connection read bytes
        // past its end by now.
        if let Some(violation) = framing.as_ref().and_then(ExchangeCheck::violation) {
            let _ = to_encoder
                .send(Err(ExchangeCheck::error(violation).into()))
                .await;
        }
    };
    tokio::spawn(read_origin);
    tokio::spawn(
        Streaming {
            from_origin,
            sink: Sink::Client(to_client),
            feed: from_encoder.clone(),
            memory: holder,
            parking,
            encoders,
            store,
            stats,
            method,
            uri,
        }
        .run(pacing),
    );
    StreamBody::new(EncodedStream {
        frames: from_encoder,
        idle: link_idle,
        since: None,
    })
    .boxed()
}

/// What the task of [`encode_body`] works between.
struct Streaming {
    from_origin: mpsc::Receiver<Result<Bytes, BodyError>>,
    sink: Sink,
    /// The client's end of its channel, for a spool to take over.
    feed: BodyFeed,
    /// This coding's share of the transfer memory, held while it runs.
    memory: Option<ShareHolder>,
    /// Where the body may still be parked (taken when it is, or when that
    /// failed).
    parking: Option<Parking>,
    encoders: Encoders,
    store: Option<Arc<BasisStore>>,
    stats: Arc<Stats>,
    method: Method,
    uri: Uri,
}

impl Streaming {
    async fn run(mut self, mut pacing: Pacing) {
        let (method, uri) = (self.method.clone(), self.uri.clone());
        let mut out = Vec::new();
        let mut kept = self.store.as_deref().and_then(Kept::new);
        loop {
            let item = match self.from_origin.try_recv() {
                Ok(item) => Some(item),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    wait_releasing(self.from_origin.recv(), || {
                        pacing.encoder.release_buffers();
                        out = Vec::new();
                    })
                    .await
                }
            };
            let Some(item) = item else {
                break;
            };
            let chunk = match item {
                Ok(chunk) => chunk,
                Err(error) => {
                    // The client must see a cut stream, never a clean end.
                    tracing::warn!(%method, %uri, %error, "origin body failed; aborting the stream");
                    return self.sink.fail(error).await;
                }
            };
            if let Some(share) = &mut self.memory {
                share.collect();
            }
            if let (Some(body), Some(store)) = (&mut kept, &self.store)
                && !body.add(&chunk, store)
            {
                kept = None;
            }
            let pushed = if chunk.len() < pacing.encoder.window_room() {
                // Only copied into the window: no turn, no thread.
                pacing.push(&chunk, &mut out)
            } else {
                let parked = matches!(self.sink, Sink::Spool(_));
                if parked {
                    // Its turn may be far off: wait light.
                    pacing.encoder.release_buffers();
                    out = Vec::new();
                }
                let moved = self
                    .encoders
                    .run(&self.stats, parked, move || {
                        let pushed = pacing.push(&chunk, &mut out);
                        (pacing, out, pushed)
                    })
                    .await;
                let Some((back, back_out, pushed)) = moved else {
                    return self.sink.fail("the encoder panicked".into()).await;
                };
                (pacing, out) = (back, back_out);
                pushed
            };
            if let Err(error) = pushed {
                return self.sink.fail(error.into()).await;
            }
            if out.is_empty() {
                continue;
            }
            let wire_bytes = out.len() as u64;
            let sent = self.send(&mut out, Some(&mut pacing)).await;
            pacing.sent(wire_bytes);
            if !sent {
                return;
            }
        }
        let task_stats = self.stats.clone();
        let store = self.store.take();
        let parked = matches!(self.sink, Sink::Spool(_));
        let finished = self
            .encoders
            .run(&self.stats, parked, move || {
                let finished = pacing.encoder.finish(&mut out);
                if let Ok(summary) = &finished {
                    Stats::add(&task_stats.body_bytes, summary.body_len);
                    Stats::add(&task_stats.stream_bytes, summary.stream_bytes);
                    if let (Some(store), Some(body)) = (&store, kept) {
                        store.insert(summary.digest, body.into_body());
                    }
                }
                (out, finished)
            })
            .await;
        let Some((mut out, finished)) = finished else {
            return self.sink.fail("the encoder panicked".into()).await;
        };
        let summary = match finished {
            Ok(summary) => summary,
            Err(error) => return self.sink.fail(error.into()).await,
        };
        if !self.send(&mut out, None).await {
            return;
        }
        let spooled = matches!(self.sink, Sink::Spool(_));
        tracing::info!(
            %method, %uri, status = 200, mode = "hsync", basis = ?summary.basis,
            body = summary.body_len, stream = summary.stream_bytes,
            copied = summary.copied_bytes, uncoded_windows = summary.uncoded_windows,
            spooled, "request"
        );
        if let Sink::Spool(spool) = self.sink {
            spool.finish(Ok(())).await;
        }
    }

    /// Sends `out` to the client, or to the spool once the client stopped
    /// reading, and clears it; false if the client is gone or the spool
    /// failed. A window of a large body is many MiB (eight blocks at
    /// least, and blocks grow with the body to keep its signature small):
    /// it goes out in slices copied out of `out`, so the channel holds a
    /// few slices rather than a few windows (L-3: memory per request), and
    /// a client that stops reading keeps those slices alive, not the
    /// windows they were cut from (L-13). (Slices of one shared allocation
    /// kept a window per slice waiting: 2.5 MiB per stalled reader.)
    async fn send(&mut self, out: &mut Vec<u8>, mut pacing: Option<&mut Pacing>) -> bool {
        let mut at = 0;
        let mut stalled = false;
        while at < out.len() {
            let end = out.len().min(at + SEND_SLICE);
            let waiting = match &mut self.sink {
                Sink::Spool(spool) => {
                    let rest = match at {
                        0 => Bytes::from(std::mem::take(out)),
                        _ => Bytes::copy_from_slice(&out[at..]),
                    };
                    out.clear();
                    return write_spooled(spool, rest).await;
                }
                Sink::Client(to_client) => match to_client.try_reserve() {
                    Ok(room) => {
                        room.send(Ok(Frame::data(Bytes::copy_from_slice(&out[at..end]))));
                        at = end;
                        continue;
                    }
                    Err(mpsc::error::TrySendError::Closed(())) => return false,
                    Err(mpsc::error::TrySendError::Full(())) => to_client.clone(),
                },
            };
            let room = if stalled {
                // Not parked (parking is off, or no spool could be made):
                // this task waits here, holding no thread (L-13), and its
                // state, counted in its share of the transfer memory.
                waiting.reserve_owned().await.ok()
            } else {
                match tokio::time::timeout(STALLED_AFTER, waiting.reserve_owned()).await {
                    Ok(room) => room.ok(),
                    Err(_) => {
                        stalled = true;
                        if let Some(pacing) = pacing.as_deref_mut() {
                            pacing.encoder.release_buffers();
                        }
                        if !self.park(pacing.as_deref_mut()).await {
                            return false;
                        }
                        continue;
                    }
                }
            };
            let Some(room) = room else {
                return false;
            };
            room.send(Ok(Frame::data(Bytes::copy_from_slice(&out[at..end]))));
            at = end;
        }
        out.clear();
        true
    }

    /// Parks the rest of the body in a spool, what waited in the client's
    /// channel first, if it may be and one can be made; otherwise the
    /// caller goes on waiting for the client. False if the client left or
    /// the spool failed.
    async fn park(&mut self, pacing: Option<&mut Pacing>) -> bool {
        let Some(parking) = self.parking.take() else {
            return true;
        };
        if !matches!(self.sink, Sink::Client(_)) {
            return true;
        }
        let mut spool = match Spool::create(&parking.dir, parking.limit, &parking.disk) {
            Ok(spool) => spool,
            Err(error) if error.kind() == std::io::ErrorKind::StorageFull => {
                tracing::debug!(%error, "not parking a body: the encoder waits for its client");
                return true;
            }
            Err(error) => {
                SPOOL_FAILED.call_once(|| {
                    tracing::warn!(dir = %parking.dir.display(), %error,
                        "cannot spool for clients that stop reading; their encoders wait instead");
                });
                return true;
            }
        };
        for item in spool.take_over(&self.feed) {
            // Only data is sent before the end: a failure ends the stream.
            if let Ok(data) = item.map(Frame::into_data)
                && let Ok(data) = data
                && !write_spooled(&mut spool, data).await
            {
                return false;
            }
        }
        self.sink = Sink::Spool(spool);
        Stats::add(&self.stats.spooled, 1);
        tracing::debug!(method = %self.method, uri = %self.uri, "client stopped reading; body spooled");
        // What the stream waits for from now on is this client, which is
        // slower than the encoder: the pacer's measure of the link would
        // be the disk's, so literals keep their entropy coding.
        if let Some(pacing) = pacing {
            pacing.pacer = None;
            pacing.encoder.set_entropy_coding(true);
        }
        true
    }
}

/// Writes `data` to the spool; false if the client left or the spool
/// failed (then dropping it fails the client's body).
async fn write_spooled(spool: &mut Spool, data: Bytes) -> bool {
    match spool.write(&data).await {
        Ok(()) => true,
        Err(_) if spool.reader_left() => false,
        Err(error) => {
            tracing::warn!(%error, "spool write failed; aborting the stream");
            false
        }
    }
}

/// The encoder's frames as the response body, timing how long the link
/// waits for them (hyper polls the body only when it can write).
struct EncodedStream {
    frames: BodyFeed,
    idle: Arc<Idle>,
    /// Since when the link has been waiting.
    since: Option<Instant>,
}

impl futures_core::Stream for EncodedStream {
    type Item = Result<Frame<Bytes>, BodyError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let polled = self.frames.poll_recv(cx);
        if polled.is_pending() {
            self.since.get_or_insert_with(Instant::now);
        } else if let Some(since) = self.since.take() {
            Idle::add(&self.idle.link, since);
        }
        polled
    }
}

//! A coded body streamed as it is coded ([`encode_body`]): the encoder's
//! place in the shared [`body_pipe`], between the origin's reader and the
//! client's [`Downstream`], so a slow client slows the origin read instead
//! of filling memory, and the first frames leave before the origin has
//! finished. The encoder borrows a blocking thread only for a window's
//! work (see [`super::turns`]), gives back the scratch memory it can
//! rebuild while it waits or its client stalls, and stops pacing once the
//! body is parked for a client that stopped reading. The body is collected
//! for the basis store on the way
//! ([`Collecting`](super::basis_store::Collecting)).
//!
//! Leaves out whether to code (the role's decision in `mod.rs`), small
//! bodies coded whole (`whole.rs`), the pacing measure (`pacing.rs`), and
//! the channels, slices and spool, which are the pipe's.
//!
//! Main types: [`Streaming`], [`EncodedStream`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Uri};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc;

use crate::feed::primary::FeedCommit;
use crate::http::access_log::Note;
use crate::http::body_pipe::{self, Downstream, LINK_SLICE, Stall, UpstreamChunk};
use crate::http::server::{BodyError, ProxyBody};
use crate::http::spool::BodyFeed;
use crate::http::transfer_memory::{self, ShareHolder, ShareTaker};
use crate::http::upstream_guard::ExchangeCheck;

use super::basis_store::{BasisStore, ServedAs};
use super::coding::Coding;
use super::pace::Pacer;
use super::pacing::{Idle, Pacing};
use super::stats::Stats;
use super::turns::Encoders;

/// How long an encoder waits, for the client to take bytes or for the
/// origin to send some, before it gives back the memory it can rebuild
/// ([`Encoder::release_buffers`](crate::hsync::Encoder::release_buffers)):
/// longer than a reader that keeps up pauses, so that such a reader's
/// windows do not pay for allocating it again. As long as the pipe's
/// [`STALLED_AFTER`](body_pipe::STALLED_AFTER), after which a client's
/// body is parked.
const RELEASE_AFTER: Duration = body_pipe::STALLED_AFTER;

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

/// Streams the origin body through the encoder: an async task owns the
/// encoder and moves it to a blocking thread, in its turn, only for the
/// CPU work of a chunk that completes a window; waiting for the origin or
/// the client holds no thread. The body is also collected, up to the
/// store's limits, and kept there once END's digest is known.
pub(super) fn encode_body(
    origin: ProxyBody,
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
        served_as,
        stats,
        parking,
        note,
        feed,
    } = coding;
    let pacing = Pacing::new(encoder, pacer);
    let (to_encoder, from_origin) = body_pipe::upstream_channel();
    // A stalled client's body is parked, as nginx's `proxy_buffering`
    // parks one in a temp file: the encoder then runs on at the origin's
    // pace, finishes and frees its context, window and buffers, and the
    // stalled client holds a follower task, a page and its channel (L-13).
    let (to_client, from_encoder) = Downstream::new(LINK_SLICE, parking);
    let link_idle = pacing.idle.clone();
    let origin_idle = pacing.idle.clone();
    let known_len = memory.as_ref().and_then(|(_, _, known_len)| *known_len);
    let (taker, holder) = match memory {
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
        // Past a small body's size, the coding's state grows: nothing more
        // is read before its share. The time the reader waits for the
        // encoder is counted for the pacer.
        let ended = body_pipe::read_upstream(origin, taker, &to_encoder, |since| {
            Idle::add(&origin_idle.origin, since);
        })
        .await;
        if !ended {
            return;
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
            to_client,
            memory: holder,
            encoders,
            store,
            known_len,
            served_as,
            stats,
            method,
            uri,
            note,
            feed,
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
    from_origin: mpsc::Receiver<UpstreamChunk>,
    to_client: Downstream,
    /// This coding's share of the transfer memory, held while it runs.
    memory: Option<ShareHolder>,
    encoders: Encoders,
    store: Option<Arc<BasisStore>>,
    served_as: Option<ServedAs>,
    /// The body's announced length, if any.
    known_len: Option<u64>,
    stats: Arc<Stats>,
    method: Method,
    uri: Uri,
    note: Option<Note>,
    feed: Option<FeedCommit>,
}

impl Streaming {
    async fn run(mut self, mut pacing: Pacing) {
        let (method, uri) = (self.method.clone(), self.uri.clone());
        let mut out = Vec::new();
        let mut kept = self
            .store
            .as_ref()
            .and_then(|store| store.collect_as(self.served_as.take(), self.known_len));
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
                    return self.to_client.end(Err(error)).await;
                }
            };
            if let Some(share) = &mut self.memory {
                share.collect();
            }
            // Written to a temp file, for a large body, here on the async
            // task: buffered writes that the page cache takes.
            if let Some(body) = &mut kept
                && !body.add(&chunk)
            {
                kept = None;
            }
            let pushed = if chunk.len() < pacing.encoder.window_room() {
                // Only copied into the window: no turn, no thread.
                pacing.push(&chunk, &mut out)
            } else {
                let parked = self.to_client.is_parked();
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
                    return self.to_client.end(Err("the encoder panicked".into())).await;
                };
                (pacing, out) = (back, back_out);
                pushed
            };
            if let Err(error) = pushed {
                return self.to_client.end(Err(error.into())).await;
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
        let feed = self.feed.take();
        let parked = self.to_client.is_parked();
        let finished = self
            .encoders
            .run(&self.stats, parked, move || {
                let finished = pacing.encoder.finish(&mut out);
                if let Ok(summary) = &finished {
                    Stats::add(&task_stats.body_bytes, summary.body_len);
                    Stats::add(&task_stats.stream_bytes, summary.stream_bytes);
                    if let Some(body) = kept {
                        body.keep(summary.digest);
                    }
                    if let Some(feed) = feed {
                        feed.commit(&summary.digest, summary.body_len);
                    }
                }
                (out, finished)
            })
            .await;
        let Some((mut out, finished)) = finished else {
            return self.to_client.end(Err("the encoder panicked".into())).await;
        };
        let summary = match finished {
            Ok(summary) => summary,
            Err(error) => return self.to_client.end(Err(error.into())).await,
        };
        if !self.send(&mut out, None).await {
            return;
        }
        let spooled = self.to_client.is_parked();
        tracing::debug!(
            %method, %uri, status = 200, mode = "hsync", basis = ?summary.basis,
            body = summary.body_len, stream = summary.stream_bytes,
            copied = summary.copied_bytes, uncoded_windows = summary.uncoded_windows,
            spooled, "coded"
        );
        if let Some(note) = self.note.take() {
            note.from_upstream(summary.body_len);
        }
        self.to_client.end(Ok(())).await;
    }

    /// Sends `out` to the client, or to the spool once the client stopped
    /// reading, and clears it; false if the client is gone or the spool
    /// failed. A window of a large body is many MiB (eight blocks at
    /// least, and blocks grow with the body to keep its signature small):
    /// the pipe sends it in slices copied out of `out`, so the channel
    /// holds a few slices rather than a few windows (L-3: memory per
    /// request), and `out` keeps its allocation for the next window.
    async fn send(&mut self, out: &mut Vec<u8>, mut pacing: Option<&mut Pacing>) -> bool {
        let (stats, method, uri) = (&self.stats, &self.method, &self.uri);
        let sent = self
            .to_client
            .send(out, |stall| match stall {
                Stall::Stopped => {
                    if let Some(pacing) = pacing.as_deref_mut() {
                        pacing.encoder.release_buffers();
                    }
                }
                Stall::Parked => {
                    Stats::add(&stats.spooled, 1);
                    tracing::debug!(%method, %uri, "client stopped reading; body spooled");
                    // What the stream waits for from now on is this
                    // client, which is slower than the encoder: the
                    // pacer's measure of the link would be the disk's, so
                    // literals keep their entropy coding.
                    if let Some(pacing) = pacing.as_deref_mut() {
                        pacing.pacer = None;
                        pacing.encoder.set_entropy_coding(true);
                    }
                }
            })
            .await;
        out.clear();
        sent
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

//! The pipe a streamed body goes through in both roles: a reader task takes
//! the upstream body into a small channel ([`read_upstream`]), the role's
//! own task works on it (the accelerator encodes, the client proxy decodes,
//! checks and stores), and what comes out goes to the downstream reader
//! through a [`Downstream`]: cut into slices, sent into a small channel as
//! the reader takes them, and parked in a [`Spool`] once the reader has
//! taken nothing for [`STALLED_AFTER`] (L-13). Both channels are bounded,
//! so a slow reader slows the upstream read instead of filling memory, and
//! every wait is a task's: a reader that stops reading holds no thread.
//! The reader task takes the transfer's share of the memory budget before
//! it reads past a small body ([`ShareTaker`]); the role's task holds it
//! until the transfer ends.
//!
//! Deliberately left out: the work in the middle (encoding, decoding,
//! verification, cache writes, the basis store's copy, the pacer), which
//! stays with each role, and when it runs on a blocking thread. A role
//! hands the downstream only bytes that may leave (the client proxy's are
//! verified first), and learns of a stall through [`Stall`] to free what it
//! can rebuild. The response body is the [`BodyFeed`] a role wraps as it
//! needs (timing the link, a prefix taken before streaming).
//!
//! The depths and slice sizes live here, so that what a transfer holds in
//! flight is stated once: [`UPSTREAM_DEPTH`], [`DOWNSTREAM_DEPTH`],
//! [`LINK_SLICE`], [`AGENT_SLICE`].
//!
//! Main items: [`read_upstream`], [`Downstream`], [`Parking`], [`Stall`].

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Frame;
use tokio::sync::mpsc;

use crate::http::server::BodyError;
use crate::http::spool::{BodyFeed, BodyItem, Spool, SpoolDisk, WeakBodyFeed};
use crate::http::transfer_memory::ShareTaker;

/// Upstream chunks in flight between the reader task and the role's task:
/// small, so that backpressure reaches the upstream quickly.
pub const UPSTREAM_DEPTH: usize = 4;

/// Slices in flight towards the downstream reader. A reader that stops
/// reading does not keep them: the spool takes them over (L-13), so only
/// the slice hyper is writing stays behind. Eight rather than two keeps
/// the producer from waiting on every wake-up of hyper (L-3).
pub const DOWNSTREAM_DEPTH: usize = 8;

/// Largest piece of the coded stream the accelerator sends over the link
/// at a time: what hyper holds for a client proxy that stopped reading,
/// beside the spool's page ([`crate::http::spool::PAGE`], the same size).
/// A window is many MiB; it goes out in copied slices so that neither the
/// channel nor a stalled reader keeps a window alive.
pub const LINK_SLICE: usize = 32 << 10;

/// Largest piece of body the client proxy sends to the user agent at a
/// time (and to its cache writer): what hyper holds for a user agent that
/// stopped reading, beside the spool's page. Not smaller, because smaller
/// pieces cost L-3 wake-ups per byte; not larger, because fewer, larger
/// pieces in flight cost L-3 as much (the relay then waits on hyper, and
/// the accelerator's pacer takes the slower client for a slower link).
pub const AGENT_SLICE: usize = 64 << 10;

/// How long a reader may take nothing (sending it a slice would wait that
/// long) before it counts as stalled: the producer frees what it can
/// rebuild and parks the body in a spool, as nginx's `proxy_buffering`
/// parks one in a temp file. Sooner would free and grow the producer's
/// buffers again for every window of a reader that is merely slower than
/// the link.
pub const STALLED_AFTER: Duration = Duration::from_millis(100);

/// What the reader task sends the role's task: a chunk of the upstream
/// body, or why it failed.
pub type UpstreamChunk = Result<Bytes, BodyError>;

/// The channel from the reader task to the role's task.
pub fn upstream_channel() -> (mpsc::Sender<UpstreamChunk>, mpsc::Receiver<UpstreamChunk>) {
    mpsc::channel(UPSTREAM_DEPTH)
}

/// Reads `upstream` into `to`, taking `share` of the transfer memory where
/// it is due (L-13, L-14), until the body ends, fails, or nobody listens;
/// true when it ended (the caller may then check what follows it).
/// `waited` is told when a wait for room in the channel began, once it is
/// over (the role's task was busy); a send with room reads no clock.
pub async fn read_upstream<B>(
    mut upstream: B,
    mut share: ShareTaker,
    to: &mpsc::Sender<UpstreamChunk>,
    mut waited: impl FnMut(Instant),
) -> bool
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BodyError>,
{
    while let Some(item) = share.next_chunk(&mut upstream).await {
        let failed = item.is_err();
        let room = match to.try_reserve() {
            Ok(room) => room,
            Err(mpsc::error::TrySendError::Closed(())) => return false,
            Err(mpsc::error::TrySendError::Full(())) => {
                let since = Instant::now();
                let Ok(room) = to.reserve().await else {
                    return false;
                };
                waited(since);
                room
            }
        };
        room.send(item);
        if failed {
            return false;
        }
    }
    true
}

/// Where and how much of a body may be parked for a reader that stopped
/// reading.
#[derive(Debug, Clone)]
pub struct Parking {
    /// The directory of the spool files.
    pub dir: Arc<Path>,
    /// Bytes one spool holds at most ahead of its reader.
    pub limit: u64,
    /// What all spools take together.
    pub disk: SpoolDisk,
}

/// What a [`Downstream`] tells its producer about a stalled reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// The reader has taken nothing for [`STALLED_AFTER`]: free what can be
    /// rebuilt. The body is parked next, if it may be; otherwise the
    /// producer waits for the reader, holding no thread.
    Stopped,
    /// The rest of the body goes to a spool from now on: the producer runs
    /// at its own pace, finishes and frees its state.
    Parked,
}

/// Warned once per process: a spool directory that cannot take a file.
static SPOOL_FAILED: std::sync::Once = std::sync::Once::new();

/// The sending end of a streamed response body: slices what the producer
/// hands it into the reader's channel, and parks the rest in a spool once
/// the reader stalls.
///
/// Dropping it ends the reader's body: cleanly while it sends into the
/// channel, with an error once it is parked. A body that went wrong ends
/// through [`Downstream::end`].
pub struct Downstream {
    sink: Sink,
    /// The reader's end of the channel, for a spool to take over. Weak: a
    /// reader that drops its body closes the channel, and the producer
    /// hears that it left.
    feed: WeakBodyFeed,
    /// Where the body may still be parked (taken when it is, or when that
    /// failed).
    parking: Option<Parking>,
    /// Largest piece sent at a time.
    slice: usize,
}

/// Where a [`Downstream`] sends.
enum Sink {
    /// Straight into the reader's channel.
    Reader(mpsc::Sender<BodyItem>),
    /// Into a spool, whose follower feeds the reader's channel.
    Spool(Spool),
}

impl Downstream {
    /// A downstream of [`DOWNSTREAM_DEPTH`] pieces of at most `slice` bytes,
    /// parked per `parking` (`None`: never), and the response body that
    /// reads it.
    pub fn new(slice: usize, parking: Option<Parking>) -> (Downstream, BodyFeed) {
        let (to_reader, from_producer) = mpsc::channel(DOWNSTREAM_DEPTH);
        let feed = BodyFeed::new(from_producer);
        let downstream = Downstream {
            sink: Sink::Reader(to_reader),
            feed: feed.downgrade(),
            parking,
            slice: slice.max(1),
        };
        (downstream, feed)
    }

    /// Whether the body is parked in a spool.
    pub fn is_parked(&self) -> bool {
        matches!(self.sink, Sink::Spool(_))
    }

    /// Sends `data` to the reader in slices copied out of it, or to the
    /// spool once the reader stopped reading; `stalled` hears of a stall
    /// (see [`Stall`]). False when nobody takes the rest: the reader left,
    /// or the spool failed.
    ///
    /// The slices are copies: a slice of a shared allocation would keep a
    /// whole window alive for as long as a stalled reader leaves it in the
    /// channel (2.5 MiB per stalled reader, L-13). They are cut only when
    /// there is room for them.
    #[must_use = "false means nobody takes the rest of the body"]
    pub async fn send(&mut self, data: &[u8], mut stalled: impl FnMut(Stall)) -> bool {
        let mut at = 0;
        // Stalled once in this call and not parked: wait without a timer.
        let mut waiting = false;
        while at < data.len() {
            let end = data.len().min(at + self.slice);
            let to_reader = match &mut self.sink {
                Sink::Spool(spool) => return write_spooled(spool, &data[at..]).await,
                // Room now: no timer, no clone (the common case, per slice).
                Sink::Reader(to_reader) => match to_reader.try_reserve() {
                    Ok(room) => {
                        room.send(Ok(Frame::data(Bytes::copy_from_slice(&data[at..end]))));
                        at = end;
                        continue;
                    }
                    Err(mpsc::error::TrySendError::Closed(())) => return false,
                    // A clone, so that a spool can take the channel meanwhile.
                    Err(mpsc::error::TrySendError::Full(())) => to_reader.clone(),
                },
            };
            match self.wait(&to_reader, &mut waiting, &mut stalled).await {
                Room::Now(room) => {
                    room.send(Ok(Frame::data(Bytes::copy_from_slice(&data[at..end]))));
                    at = end;
                }
                // The rest goes to the spool.
                Room::Parked => {}
                Room::Gone => return false,
            }
        }
        true
    }

    /// Ends the reader's body: cleanly after what was sent (`Ok`), or with
    /// `error`, so that a body that went wrong never looks whole.
    pub async fn end(mut self, result: Result<(), BodyError>) {
        let error = match result {
            Ok(()) => {
                if let Sink::Spool(spool) = self.sink {
                    spool.finish(Ok(())).await;
                }
                // A dropped channel ends the reader's body cleanly.
                return;
            }
            Err(error) => error,
        };
        if let Sink::Reader(to_reader) = &self.sink {
            let to_reader = to_reader.clone();
            match self.wait(&to_reader, &mut false, &mut |_| {}).await {
                Room::Now(room) => return room.send(Err(error)),
                Room::Parked => {}
                Room::Gone => return,
            }
        }
        if let Sink::Spool(spool) = self.sink {
            spool.finish(Err(error.to_string())).await;
        }
    }

    /// Waits for room in the reader's channel; past [`STALLED_AFTER`] (the
    /// first time in a call, per `waiting`), tells the producer and parks
    /// the body if it may be.
    async fn wait<'a>(
        &mut self,
        to_reader: &'a mpsc::Sender<BodyItem>,
        waiting: &mut bool,
        stalled: &mut impl FnMut(Stall),
    ) -> Room<'a> {
        if !*waiting {
            match tokio::time::timeout(STALLED_AFTER, to_reader.reserve()).await {
                Ok(room) => return Room::from(room),
                Err(_) => {
                    *waiting = true;
                    stalled(Stall::Stopped);
                    match self.park().await {
                        Some(true) => {
                            stalled(Stall::Parked);
                            return Room::Parked;
                        }
                        Some(false) => {}
                        None => return Room::Gone,
                    }
                }
            }
        }
        // Not parked (parking is off, or no spool could be made): the
        // producer waits here, holding no thread (L-13), and its state,
        // counted in its share of the transfer memory.
        Room::from(to_reader.reserve().await)
    }

    /// Parks the rest of the body in a spool, what waited in the reader's
    /// channel first, if it may be and one can be made: `Some(true)`.
    /// `Some(false)` when it is not parked (the caller goes on waiting for
    /// the reader); `None` when the reader left or the spool failed.
    async fn park(&mut self) -> Option<bool> {
        let Some(parking) = self.parking.take() else {
            return Some(false);
        };
        let Some(feed) = self.feed.upgrade() else {
            // The reader left while we waited for it.
            return None;
        };
        let mut spool = match Spool::create(&parking.dir, parking.limit, &parking.disk) {
            Ok(spool) => spool,
            Err(error) if error.kind() == std::io::ErrorKind::StorageFull => {
                tracing::debug!(%error, "not spooling for a stalled reader: the producer waits in memory");
                return Some(false);
            }
            Err(error) => {
                SPOOL_FAILED.call_once(|| {
                    tracing::warn!(dir = %parking.dir.display(), %error,
                        "cannot spool for readers that stop reading; their producers wait in memory instead");
                });
                return Some(false);
            }
        };
        let queued = spool.take_over(&feed);
        drop(feed);
        for item in queued {
            // Only data is sent before the end: an error ends the body,
            // and nothing follows it.
            if let Ok(frame) = item
                && let Ok(data) = frame.into_data()
                && !write_spooled(&mut spool, &data).await
            {
                return None;
            }
        }
        self.sink = Sink::Spool(spool);
        tracing::debug!(dir = %parking.dir.display(), "the reader stopped reading; its body is spooled");
        Some(true)
    }
}

/// What a wait for the reader's channel came to.
enum Room<'a> {
    /// Room for one item.
    Now(mpsc::Permit<'a, BodyItem>),
    /// No room: the body was parked instead.
    Parked,
    /// The reader left, or the spool failed.
    Gone,
}

impl<'a> From<Result<mpsc::Permit<'a, BodyItem>, mpsc::error::SendError<()>>> for Room<'a> {
    fn from(reserved: Result<mpsc::Permit<'a, BodyItem>, mpsc::error::SendError<()>>) -> Room<'a> {
        reserved.map_or(Room::Gone, Room::Now)
    }
}

/// Writes `data` to the spool; false if the reader left or the spool
/// failed (then dropping it fails the reader's body).
async fn write_spooled(spool: &mut Spool, data: &[u8]) -> bool {
    match spool.write(data).await {
        Ok(()) => true,
        Err(_) if spool.reader_left() => false,
        Err(error) => {
            tracing::warn!(%error, "spool write failed; aborting the body");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    fn body(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn parking() -> Parking {
        Parking {
            dir: std::env::temp_dir().into(),
            limit: 1 << 20,
            disk: SpoolDisk::new(1 << 30),
        }
    }

    /// Reads `feed` to its end: the bytes, the largest piece, and whether
    /// it ended cleanly.
    async fn read_all(feed: BodyFeed) -> (Vec<u8>, usize, bool) {
        let (mut got, mut largest) = (Vec::new(), 0);
        while let Some(item) = feed.recv().await {
            let Ok(frame) = item else {
                return (got, largest, false);
            };
            let data = frame.into_data().expect("only data frames");
            largest = largest.max(data.len());
            got.extend_from_slice(&data);
        }
        (got, largest, true)
    }

    #[tokio::test]
    async fn a_reader_that_keeps_up_gets_the_body_in_slices_and_a_clean_end() {
        let (mut downstream, feed) = Downstream::new(1000, Some(parking()));
        let reader = tokio::spawn(read_all(feed));
        let data = body(10_500);
        for piece in data.chunks(3000) {
            assert!(downstream.send(piece, |_| panic!("no stall")).await);
        }
        assert!(!downstream.is_parked());
        downstream.end(Ok(())).await;
        let (got, largest, clean) = reader.await.unwrap();
        assert!(got == data);
        assert_eq!(largest, 1000);
        assert!(clean);
    }

    #[tokio::test]
    async fn a_stalled_reader_gets_its_body_from_a_spool_whole_and_in_order() {
        let (mut downstream, feed) = Downstream::new(1000, Some(parking()));
        let data = body(200_000);
        let mut heard = Vec::new();
        // Nobody reads: the channel fills, and past the stall the rest
        // (what waited in the channel first) goes to the spool.
        assert!(downstream.send(&data[..100_000], |s| heard.push(s)).await);
        assert_eq!(heard, [Stall::Stopped, Stall::Parked]);
        assert!(downstream.is_parked());
        assert!(
            downstream
                .send(&data[100_000..], |_| panic!("parked"))
                .await
        );
        let reader = tokio::spawn(read_all(feed));
        downstream.end(Ok(())).await;
        let (got, _, clean) = reader.await.unwrap();
        assert!(got == data, "bytes lost or reordered across the take-over");
        assert!(clean);
    }

    #[tokio::test]
    async fn without_parking_a_stalled_reader_holds_the_producer_back() {
        let (mut downstream, feed) = Downstream::new(1000, None);
        let data = body(100_000);
        let mut heard = Vec::new();
        let blocked =
            tokio::time::timeout(STALLED_AFTER * 3, downstream.send(&data, |s| heard.push(s)))
                .await;
        assert!(blocked.is_err(), "the producer ran ahead of its reader");
        assert_eq!(heard, [Stall::Stopped]);
        drop(feed);
        let gone = tokio::time::timeout(Duration::from_secs(2), downstream.send(&data, |_| {}))
            .await
            .expect("a reader that left does not hold the producer");
        assert!(!gone, "the reader left");
    }

    #[tokio::test]
    async fn a_reader_that_leaves_a_parked_body_stops_its_producer() {
        let (mut downstream, feed) = Downstream::new(1000, Some(parking()));
        let data = body(100_000);
        assert!(downstream.send(&data, |_| {}).await);
        assert!(downstream.is_parked());
        drop(feed);
        let gone = tokio::time::timeout(Duration::from_secs(2), async {
            // The spool holds a MiB ahead: the producer learns at a page.
            for _ in 0..20 {
                if !downstream.send(&data, |_| {}).await {
                    return true;
                }
            }
            false
        })
        .await
        .expect("a reader that left does not hold the producer");
        assert!(gone, "the reader left");
    }

    #[tokio::test]
    async fn a_failed_body_never_ends_cleanly_even_for_a_stalled_reader() {
        for parked in [false, true] {
            let (mut downstream, feed) = Downstream::new(1000, Some(parking()));
            // Eight slices fill the channel without a stall; more stall
            // and are parked.
            let data = body(if parked { 20_000 } else { 8_000 });
            assert!(downstream.send(&data, |_| {}).await);
            assert_eq!(downstream.is_parked(), parked);
            // The reader is still stalled: the failure is parked behind
            // the bytes, rather than the producer waiting to deliver it.
            tokio::time::timeout(Duration::from_secs(5), downstream.end(Err("cut".into())))
                .await
                .expect("the producer does not wait for a stalled reader to fail");
            let (_, _, clean) = read_all(feed).await;
            assert!(!clean, "a failed body ended cleanly");
        }
    }

    #[tokio::test]
    async fn the_reader_task_forwards_the_body_and_reports_its_waits() {
        // An upstream body over a real connection: hyper's `Incoming`.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let data = body(300_000);
        let served = data.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut head).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
                served.len()
            );
            socket.write_all(head.as_bytes()).await.unwrap();
            socket.write_all(&served).await.unwrap();
        });
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let request = http::Request::get("/")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let upstream = sender.send_request(request).await.unwrap().into_body();
        let (to, mut from) = upstream_channel();
        let waits = Arc::new(AtomicU64::new(0));
        let reader = tokio::spawn({
            let waits = waits.clone();
            async move {
                read_upstream(upstream, ShareTaker::unbudgeted(), &to, |_| {
                    waits.fetch_add(1, Ordering::Relaxed);
                })
                .await
            }
        });
        // Slow to take: the reader finds the channel full.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut got = Vec::new();
        while let Some(chunk) = from.recv().await {
            got.extend_from_slice(&chunk.unwrap());
        }
        assert!(reader.await.unwrap(), "the body ended");
        assert!(got == data);
        assert!(waits.load(Ordering::Relaxed) > 0, "no wait was reported");
    }
}

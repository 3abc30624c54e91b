//! A response body parked on disk for a reader that stopped reading, as
//! nginx's `proxy_buffering` parks one in a temp file: the side that
//! produces the body (a relay rebuilding it, an encoder coding it) goes on
//! at its own pace and frees its state when it is done, and a follower
//! task hands the file to the reader as it reads. What a stalled reader
//! costs is then a task, a page of body and the file's disk space, not
//! the producer's codec state and buffers (L-13).
//!
//! The file is unlinked as soon as it is created (nothing is left behind
//! by a crash) and written in pages of [`PAGE`] bytes, each hashed with
//! blake3 as it is written: the follower checks every page it reads back
//! before it sends it, so no byte that was not the one written leaves
//! (C-V3). A spool holds at most its configured limit, on disk too: the
//! file is a ring of that size, each page written where a page the reader
//! already took was; past it the producer waits for the reader, as it did
//! without one. All of a process's spools together take at most a
//! [`SpoolDisk`]: past it no spool is made (the producer waits for its
//! reader in memory, within its share of the transfer memory), and a
//! spool whose file can grow no more keeps the ring it has.
//!
//! A body's channel is read through a [`BodyFeed`], which a spool takes
//! over when it starts ([`Spool::take_over`]): what waits in the channel
//! then goes to the disk first, and the reader gets the spool's pages
//! through a channel of one page, each read from the disk only once the
//! reader asked for it (its poll found the channel empty). A stalled
//! reader keeps only what its connection is writing (hyper's write buffer,
//! up to its `max_buf_size`), whatever the producer's channel held while
//! it read; a page read ahead into the channel cost another 32 KiB for
//! each of them (L-8, L-13).
//!
//! Main types: [`Spool`], [`BodyFeed`], [`SpoolDisk`].

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use hyper::body::Frame;
use tokio::sync::{Notify, mpsc, watch};

use crate::http::server::BodyError;

/// Bytes written, hashed and read back at a time.
pub const PAGE: usize = 32 << 10;

/// The disk that all of a process's spools may take together (a clone
/// shares it): the operator's bound, whatever clients do. On a `/tmp` that
/// is a tmpfs, it is memory.
#[derive(Clone, Debug)]
pub struct SpoolDisk {
    used: Arc<AtomicU64>,
    cap: u64,
}

impl SpoolDisk {
    /// At most `cap` bytes of spool files at once.
    pub fn new(cap: u64) -> SpoolDisk {
        SpoolDisk {
            used: Arc::default(),
            cap,
        }
    }

    /// Bytes of spool files now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes` of the budget; false when it has not that much left.
    fn reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.cap)
            })
            .is_ok()
    }
}

/// A spool's file, unlinked, and the disk budget it took: given back when
/// the last of the producer and the follower lets go of it.
struct SpoolFile {
    file: File,
    disk: SpoolDisk,
    /// Bytes of the budget taken (the file's length, in whole pages).
    taken: AtomicU64,
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        self.disk
            .used
            .fetch_sub(*self.taken.get_mut(), Ordering::Relaxed);
    }
}

/// What a body's channel carries: a frame, or why the body failed.
pub type BodyItem = Result<Frame<Bytes>, BodyError>;

/// The receiving end of a body's channel, as the response body reads it,
/// and as a [`Spool`] takes it over: the producer keeps a
/// [`BodyFeed::downgrade`] of it for that. (Only the receiver is shared;
/// the lock is taken per poll, by one reader, and once by the spool.)
#[derive(Clone)]
pub struct BodyFeed(Arc<Mutex<Feed>>);

/// What a producer keeps of its reader's [`BodyFeed`]: enough for a spool
/// to take it over, and not enough to keep it alive, so that the channel
/// closes when the reader drops its body (a reader that left).
#[derive(Clone)]
pub struct WeakBodyFeed(Weak<Mutex<Feed>>);

impl WeakBodyFeed {
    /// The feed, while its reader still has it.
    pub fn upgrade(&self) -> Option<BodyFeed> {
        self.0.upgrade().map(BodyFeed)
    }
}

struct Feed {
    from: mpsc::Receiver<BodyItem>,
    /// The reader's waker when it last found nothing: a receiver swapped
    /// in has never seen it.
    waker: Option<Waker>,
    /// Whether the reader is asking now, for a spool's follower.
    demand: Arc<Demand>,
}

/// Whether a reader is waiting for its next item: its last poll found the
/// channel empty. A follower reads a page from the disk only then, so a
/// reader that stopped polling (its connection cannot write) has no page
/// read ahead for it.
#[derive(Default)]
struct Demand {
    asking: std::sync::atomic::AtomicBool,
    asked: Notify,
}

impl Demand {
    /// Notes what the reader's poll came to.
    fn polled(&self, pending: bool) {
        if !pending {
            self.asking.store(false, Ordering::Release);
        } else if !self.asking.swap(true, Ordering::AcqRel) {
            self.asked.notify_one();
        }
    }

    /// Waits until the reader asks for an item.
    async fn asked(&self) {
        loop {
            let asked = self.asked.notified();
            let mut asked = std::pin::pin!(asked);
            asked.as_mut().enable();
            if self.asking.swap(false, Ordering::AcqRel) {
                return;
            }
            asked.await;
        }
    }
}

impl BodyFeed {
    /// The body that reads `from`.
    pub fn new(from: mpsc::Receiver<BodyItem>) -> BodyFeed {
        BodyFeed(Arc::new(Mutex::new(Feed {
            from,
            waker: None,
            demand: Arc::default(),
        })))
    }

    /// A handle that does not keep the feed (and its channel) alive.
    pub fn downgrade(&self) -> WeakBodyFeed {
        WeakBodyFeed(Arc::downgrade(&self.0))
    }

    /// The next item, as `mpsc::Receiver::poll_recv`.
    pub fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<BodyItem>> {
        let mut feed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let polled = feed.from.poll_recv(cx);
        if polled.is_pending() && !feed.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            feed.waker = Some(cx.waker().clone());
        }
        feed.demand.polled(polled.is_pending());
        polled
    }

    /// The next item.
    pub async fn recv(&self) -> Option<BodyItem> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl futures_core::Stream for BodyFeed {
    type Item = BodyItem;

    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<BodyItem>> {
        self.poll_recv(cx)
    }
}

/// How the body ended, as the producer said.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// Still being written.
    Open,
    /// Every byte is in; the reader's body ends cleanly after them.
    Complete,
    /// The reader's body fails after the bytes written so far.
    Failed(String),
}

#[derive(Debug, Clone)]
struct Progress {
    /// Bytes of whole pages on disk (what the follower may read).
    written: u64,
    end: End,
    /// Bytes the follower has sent (what the producer may run ahead of).
    sent: u64,
    /// The reader's channel closed: nobody wants the rest.
    reader_gone: bool,
    /// The ring's length: the limit, or what the file had grown to when
    /// the disk budget ran out (before it wrapped, so every page is where
    /// both ends expect it).
    ring: u64,
}

/// The producer's end of a spool; [`Spool::follow`] starts the reader's.
pub struct Spool {
    file: Arc<SpoolFile>,
    /// The ring's length: a whole number of pages, at most the limit.
    ring: u64,
    /// Whether the file may still grow (the ring is not full yet).
    growing: bool,
    /// The partial page not yet written.
    page: BytesMut,
    /// blake3 of each page written, by page number.
    hashes: Arc<Mutex<Vec<blake3::Hash>>>,
    progress: watch::Sender<Progress>,
}

impl Spool {
    /// A spool in `dir` holding at most `limit` bytes ahead of the reader,
    /// its file within `disk`.
    ///
    /// # Errors
    /// `disk` has not a page left, or the temp file cannot be created.
    pub fn create(dir: &Path, limit: u64, disk: &SpoolDisk) -> io::Result<Spool> {
        if !disk.reserve(PAGE as u64) {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("the spools' disk budget ({} bytes) is taken", disk.cap),
            ));
        }
        let file = SpoolFile {
            disk: disk.clone(),
            taken: AtomicU64::new(PAGE as u64),
            file: match tempfile_in(dir) {
                Ok(file) => file,
                Err(error) => {
                    disk.used.fetch_sub(PAGE as u64, Ordering::Relaxed);
                    return Err(error);
                }
            },
        };
        let ring = limit.max(PAGE as u64) / PAGE as u64 * PAGE as u64;
        Ok(Spool {
            file: Arc::new(file),
            ring,
            growing: true,
            page: BytesMut::with_capacity(PAGE),
            hashes: Arc::default(),
            progress: watch::channel(Progress {
                written: 0,
                end: End::Open,
                sent: 0,
                reader_gone: false,
                ring,
            })
            .0,
        })
    }

    /// Starts the follower that hands the spool to `reader`, a page as
    /// soon as the channel has room.
    pub fn follow(&self, reader: mpsc::Sender<BodyItem>) {
        self.follow_on_demand(reader, None);
    }

    /// [`Spool::follow`]; with `demand`, each page is read only once the
    /// reader asks for it.
    fn follow_on_demand(&self, reader: mpsc::Sender<BodyItem>, demand: Option<Arc<Demand>>) {
        let follower = Follower {
            file: self.file.clone(),
            hashes: self.hashes.clone(),
            progress: self.progress.subscribe(),
            reporter: self.progress.clone(),
            demand,
        };
        tokio::spawn(follower.run(reader));
    }

    /// Takes over `feed`: its reader gets this spool's pages from now on,
    /// through a channel of one page, each read when it asks, and the
    /// items that were waiting in its channel come back, in order, for the
    /// caller to write here first (an error among them: the caller's to
    /// keep for [`Spool::finish`]). The producer sends nothing more to its
    /// own channel afterwards.
    pub fn take_over(&self, feed: &BodyFeed) -> Vec<BodyItem> {
        let (to_reader, from_spool) = mpsc::channel(1);
        let mut queued = Vec::new();
        let demand = {
            let mut feed = feed.0.lock().unwrap_or_else(PoisonError::into_inner);
            while let Ok(item) = feed.from.try_recv() {
                queued.push(item);
            }
            feed.from = from_spool;
            if let Some(waker) = feed.waker.take() {
                waker.wake();
            }
            feed.demand.clone()
        };
        self.follow_on_demand(to_reader, Some(demand));
        queued
    }

    /// Appends `data` (copied into the spool's page: the caller keeps its
    /// buffer), waiting while the spool holds its limit ahead of the
    /// reader. `Err` when the file cannot be written or the reader left.
    pub async fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let take = data.len().min(PAGE - self.page.len());
            let (now, rest) = data.split_at(take);
            self.page.extend_from_slice(now);
            data = rest;
            if self.page.len() == PAGE {
                self.write_page().await?;
            }
        }
        Ok(())
    }

    /// Writes the last partial page and ends the reader's body cleanly
    /// (`Ok`) or with `error`.
    pub async fn finish(mut self, result: Result<(), String>) {
        let written = match &result {
            Ok(()) if !self.page.is_empty() => self.write_page().await.map_err(|e| e.to_string()),
            _ => Ok(()),
        };
        let end = match result.and(written) {
            Ok(()) => End::Complete,
            Err(reason) => End::Failed(reason),
        };
        self.progress.send_modify(|p| p.end = end);
    }

    async fn write_page(&mut self) -> io::Result<()> {
        self.grow();
        // Room first: at most a ring ahead of what the reader took.
        let ring = self.ring;
        let mut watching = self.progress.subscribe();
        let room = watching
            .wait_for(|p| p.reader_gone || p.written.saturating_sub(p.sent) + PAGE as u64 <= ring)
            .await
            .map(|p| !p.reader_gone)
            .unwrap_or(false);
        if !room {
            return Err(io::Error::other("the reader left"));
        }
        let page = self.page.split().freeze();
        let file = self.file.clone();
        // Pages and the ring are whole pages, and the wait above keeps the
        // writer within a ring of the reader: this slot's page was taken.
        let offset = self.progress.borrow().written % self.ring;
        let hash = tokio::task::spawn_blocking(move || {
            file.file.write_all_at(&page, offset)?;
            Ok::<_, io::Error>((blake3::hash(&page), page.len() as u64))
        })
        .await
        .map_err(io::Error::other)??;
        self.hashes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(hash.0);
        self.progress.send_modify(|p| p.written += hash.1);
        Ok(())
    }

    /// Before writing a page past the file's end: takes a page of the
    /// disk budget for it, or, with none left, makes the ring what the
    /// file is (it has not wrapped yet: the file grows up to the ring).
    fn grow(&mut self) {
        if !self.growing {
            return;
        }
        let written = self.progress.borrow().written;
        let taken = self.file.taken.load(Ordering::Relaxed);
        if written + PAGE as u64 <= taken {
            return;
        }
        if taken >= self.ring {
            self.growing = false;
        } else if self.file.disk.reserve(PAGE as u64) {
            self.file.taken.fetch_add(PAGE as u64, Ordering::Relaxed);
        } else {
            tracing::debug!(
                ring = taken,
                "the spools' disk budget is taken: this spool keeps the file it has"
            );
            self.ring = taken;
            self.growing = false;
            self.progress.send_modify(|p| p.ring = taken);
        }
    }

    /// Whether the reader left (its channel closed).
    pub fn reader_left(&self) -> bool {
        self.progress.borrow().reader_gone
    }
}

impl Drop for Spool {
    /// A producer that stops without [`Spool::finish`] fails the body.
    fn drop(&mut self) {
        self.progress.send_modify(|p| {
            if p.end == End::Open {
                p.end = End::Failed("the body's producer stopped".into());
            }
        });
    }
}

/// The reader's end: reads pages back, checks them, sends them.
struct Follower {
    file: Arc<SpoolFile>,
    hashes: Arc<Mutex<Vec<blake3::Hash>>>,
    progress: watch::Receiver<Progress>,
    reporter: watch::Sender<Progress>,
    /// The reader's asking, when pages are read on demand.
    demand: Option<Arc<Demand>>,
}

impl Follower {
    async fn run(self, reader: mpsc::Sender<BodyItem>) {
        let reporter = self.reporter.clone();
        self.follow(reader).await;
        reporter.send_modify(|p| p.reader_gone = true);
    }

    async fn follow(mut self, reader: mpsc::Sender<BodyItem>) {
        let mut sent = 0u64;
        loop {
            let now = match self
                .progress
                .wait_for(|p| p.written > sent || p.end != End::Open)
                .await
            {
                Ok(now) => now.clone(),
                Err(_) => End::Failed("the producer stopped".into()).into_progress(sent),
            };
            if now.written > sent {
                // Room first, and the reader's asking when it is a feed's,
                // so that a page is read only once the reader takes it: a
                // stalled reader has none waiting in the channel.
                let Ok(room) = reader.reserve().await else {
                    return; // The reader left; the producer sees it.
                };
                if let Some(demand) = &self.demand {
                    tokio::select! {
                        () = demand.asked() => {}
                        () = reader.closed() => return,
                    }
                }
                let page_number = (sent / PAGE as u64) as usize;
                let len = (now.written - sent).min(PAGE as u64) as usize;
                let file = self.file.clone();
                let at = sent % now.ring;
                let read = tokio::task::spawn_blocking(move || {
                    let mut page = vec![0; len];
                    file.file.read_exact_at(&mut page, at).map(|()| page)
                })
                .await;
                let expected = self
                    .hashes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(page_number)
                    .copied();
                let page = match read {
                    Ok(Ok(page)) if Some(blake3::hash(&page)) == expected => page,
                    _ => {
                        room.send(Err(BodyError::from("spooled body failed its check")));
                        return;
                    }
                };
                room.send(Ok(Frame::data(Bytes::from(page))));
                sent += len as u64;
                self.reporter.send_modify(|p| p.sent = sent);
                continue;
            }
            if let End::Failed(reason) = now.end {
                let _ = reader.send(Err(BodyError::from(reason))).await;
            }
            return;
        }
    }
}

impl End {
    fn into_progress(self, sent: u64) -> Progress {
        Progress {
            written: sent,
            end: self,
            sent,
            reader_gone: false,
            ring: 0,
        }
    }
}

/// A new file in `dir`, already unlinked: only its descriptor names it.
fn tempfile_in(dir: &Path) -> io::Result<File> {
    use std::hash::{BuildHasher, Hasher};
    for _ in 0..16 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(std::process::id().into());
        let path = dir.join(format!(".rproxy-spool-{:016x}", hasher.finish()));
        let created = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path);
        match created {
            Ok(file) => {
                std::fs::remove_file(&path)?;
                return Ok(file);
            }
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    }
    Err(io::Error::other("no free temp file name"))
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::http::server::ReceiverStream;

    /// A budget no test here reaches.
    fn disk() -> SpoolDisk {
        SpoolDisk::new(1 << 40)
    }

    fn body(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn a_spooled_body_reaches_the_reader_whole_then_ends() {
        let dir = std::env::temp_dir();
        let data = body(3 * PAGE + 123);
        let mut spool = Spool::create(&dir, 1 << 20, &disk()).unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        spool.follow(tx);
        for piece in data.chunks(50_000) {
            spool.write(piece).await.unwrap();
        }
        spool.finish(Ok(())).await;
        let mut got = Vec::new();
        while let Some(frame) = rx.recv().await {
            got.extend_from_slice(frame.unwrap().data_ref().unwrap());
        }
        assert!(got == data);
    }

    #[tokio::test]
    async fn the_file_is_a_ring_no_larger_than_the_limit() {
        let data = body(40 * PAGE + 999);
        let limit = 4 * PAGE as u64 + 100;
        let mut spool = Spool::create(&std::env::temp_dir(), limit, &disk()).unwrap();
        let file = spool.file.clone();
        let (tx, mut rx) = mpsc::channel(1);
        spool.follow(tx);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(frame) = rx.recv().await {
                got.extend_from_slice(frame.unwrap().data_ref().unwrap());
            }
            got
        });
        for piece in data.chunks(30_000) {
            spool.write(piece).await.unwrap();
            assert!(
                file.file.metadata().unwrap().len() <= limit,
                "the file outgrew its ring"
            );
        }
        spool.finish(Ok(())).await;
        assert!(
            reader.await.unwrap() == data,
            "the ring lost or reordered bytes"
        );
        assert!(file.file.metadata().unwrap().len() <= 4 * PAGE as u64);
    }

    #[tokio::test]
    async fn a_spool_takes_over_a_channel_what_waited_in_it_first_and_wakes_its_reader() {
        let data = body(5 * PAGE + 77);
        let (tx, rx) = mpsc::channel(16);
        let feed = BodyFeed::new(rx);
        // The reader takes the first piece, then waits on the feed while
        // pieces pile up in the channel, as a stalled user agent's would.
        let mut pieces = data.chunks(40_000);
        tx.send(Ok(Frame::data(Bytes::copy_from_slice(
            pieces.next().unwrap(),
        ))))
        .await
        .unwrap();
        let first = feed.recv().await.unwrap().unwrap().into_data().unwrap();
        let reader = tokio::spawn({
            let feed = feed.clone();
            async move {
                let mut got = first.to_vec();
                while let Some(item) = feed.recv().await {
                    got.extend_from_slice(&item.unwrap().into_data().unwrap());
                }
                got
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let waiting: Vec<_> = pieces.by_ref().take(3).collect();
        // (The reader may take some of these itself: what it took before
        // the spool started is its own, in order.)
        for piece in &waiting {
            tx.send(Ok(Frame::data(Bytes::copy_from_slice(piece))))
                .await
                .unwrap();
        }
        let mut spool = Spool::create(&std::env::temp_dir(), 1 << 20, &disk()).unwrap();
        let queued = spool.take_over(&feed);
        drop(tx);
        assert!(queued.len() <= waiting.len());
        for item in queued {
            spool
                .write(&item.unwrap().into_data().unwrap())
                .await
                .unwrap();
        }
        for piece in pieces {
            spool.write(piece).await.unwrap();
        }
        spool.finish(Ok(())).await;
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), reader)
            .await
            .expect("the reader was woken by the spool's pages")
            .unwrap();
        assert!(got == data, "bytes lost or reordered across the take-over");
    }

    #[tokio::test]
    async fn a_stalled_reader_of_a_spool_has_no_page_read_for_it_until_it_asks() {
        let (tx, rx) = mpsc::channel(16);
        let feed = BodyFeed::new(rx);
        let mut spool = Spool::create(&std::env::temp_dir(), 1 << 20, &disk()).unwrap();
        assert!(spool.take_over(&feed).is_empty());
        drop(tx);
        for _ in 0..8 {
            spool.write(&body(PAGE)).await.unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // Nobody reads: the follower read no page from the disk.
        let progress = spool.progress.borrow().clone();
        assert_eq!(progress.sent, 0, "{progress:?}");
        // One poll that finds nothing asks for one page, and only one.
        let polled = std::future::poll_fn(|cx| Poll::Ready(feed.poll_recv(cx))).await;
        assert!(polled.is_pending());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let progress = spool.progress.borrow().clone();
        assert_eq!(progress.sent, PAGE as u64, "{progress:?}");
        let mut got = 0;
        let reader = tokio::spawn(async move {
            while let Some(item) = feed.recv().await {
                got += item.unwrap().into_data().unwrap().len();
            }
            got
        });
        spool.finish(Ok(())).await;
        assert_eq!(reader.await.unwrap(), 8 * PAGE);
    }

    #[tokio::test]
    async fn spools_share_a_disk_budget_past_which_none_is_made_and_none_grows() {
        let disk = SpoolDisk::new(5 * PAGE as u64);
        let mut first = Spool::create(&std::env::temp_dir(), 1 << 20, &disk).unwrap();
        let (tx, mut rx) = mpsc::channel(1);
        first.follow(tx);
        let mut second = Spool::create(&std::env::temp_dir(), 1 << 20, &disk).unwrap();
        // The first grows to four pages, taking the budget's rest.
        for _ in 0..4 {
            first.write(&body(PAGE)).await.unwrap();
        }
        assert_eq!(disk.used(), 5 * PAGE as u64);
        let refused = Spool::create(&std::env::temp_dir(), 1 << 20, &disk);
        assert_eq!(
            refused.err().map(|e| e.kind()),
            Some(io::ErrorKind::StorageFull)
        );
        // The second cannot grow past its page: it is a ring of one, and
        // its producer waits for a reader.
        second.write(&body(PAGE)).await.unwrap();
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(100),
            second.write(&body(PAGE)),
        )
        .await;
        assert!(blocked.is_err(), "a spool grew past the disk budget");
        // The first keeps its ring of four pages: a body longer than that
        // still arrives whole while its reader reads.
        let data = body(12 * PAGE + 5);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(frame) = rx.recv().await {
                got.extend_from_slice(frame.unwrap().data_ref().unwrap());
            }
            got
        });
        for piece in data.chunks(PAGE) {
            first.write(piece).await.unwrap();
        }
        assert_eq!(
            disk.used(),
            5 * PAGE as u64,
            "a spool grew past the disk budget"
        );
        first.finish(Ok(())).await;
        let got = reader.await.unwrap();
        assert_eq!(got.len(), 4 * PAGE + data.len());
        assert!(got[4 * PAGE..] == data[..]);
        drop(second);
        assert_eq!(disk.used(), 0, "the files' budget is given back");
    }

    #[tokio::test]
    async fn a_failed_producer_fails_the_body_after_what_was_written() {
        let mut spool = Spool::create(&std::env::temp_dir(), 1 << 20, &disk()).unwrap();
        let (tx, rx) = mpsc::channel(1);
        spool.follow(tx);
        spool.write(&body(PAGE)).await.unwrap();
        spool.finish(Err("cut".into())).await;
        // (The pages written go first, then the failure.)
        let body = http_body_util::StreamBody::new(ReceiverStream(rx));
        let collected = body.collect().await;
        assert!(collected.is_err(), "a failed body must not end cleanly");
    }

    #[tokio::test]
    async fn the_producer_waits_at_the_limit_and_a_reader_that_leaves_stops_it() {
        let mut spool = Spool::create(&std::env::temp_dir(), 2 * PAGE as u64, &disk()).unwrap();
        let (tx, rx) = mpsc::channel(1);
        spool.follow(tx);
        // The follower takes one page into the channel and waits; two
        // more fit the spool; the next write waits for the reader.
        for _ in 0..3 {
            spool.write(&body(PAGE)).await.unwrap();
        }
        let blocked = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            spool.write(&body(2 * PAGE)),
        )
        .await;
        assert!(blocked.is_err(), "the spool ran past its limit");
        drop(rx);
        let gone = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            spool.write(&body(4 * PAGE)),
        )
        .await
        .expect("a reader that left does not hold the producer");
        assert!(gone.is_err());
    }
}

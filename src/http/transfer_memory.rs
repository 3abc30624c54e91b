//! The memory that streamed transfers may hold at once, as a budget set by
//! configuration rather than by how many clients come (L-13, L-14).
//!
//! A coded stream holds a window of body, the context the next window's
//! literals are compressed against, the coded output and the codec's
//! scratch: several MiB on each end, for as long as it runs. Three hundred
//! concurrent 2 MB fetches took over a GiB per process, and a thousand
//! readers that stopped reading took 4-7 GiB until their bodies were
//! parked. So each such transfer first takes its share from a
//! [`TransferMemory`] (an async FIFO semaphore counted in KiB): past the
//! budget, a transfer waits, holding no thread and none of that state,
//! and reads nothing from upstream meanwhile, so the upstream's own
//! buffers stay bounded too. A transfer that needs more than the whole
//! budget takes all of it, so none waits forever.
//!
//! Deliberately left out: measuring what a transfer really allocates. The
//! share is an estimate made once, before the body is past
//! [`SHARE_PAST`], from the window size and the announced length (or what
//! the body's first bytes say: [`ShareTaker::sized_by_head`]); a small
//! body asks for little.
//!
//! Main type: [`TransferMemory`].

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::http::server::BodyError;

/// The unit the budget is counted in.
const UNIT: u64 = 1 << 10;

/// The client proxy's default budget: about forty large bodies rebuilt
/// at once.
pub const DEFAULT_CLIENT_MEMORY: u64 = 256 << 20;

/// The accelerator's default budget: about twenty large bodies coded at
/// once (only one per core codes at a time; the rest wait for a turn or
/// for their client). Half the client's, since the accelerator also keeps
/// its basis store (256 MiB by default): 300 concurrent 2 MB fetches then
/// stay under 512 MiB in all (L-14).
pub const DEFAULT_ACCELERATOR_MEMORY: u64 = 128 << 20;

/// A budget of bytes shared by a role's transfers; clones share it.
#[derive(Clone, Debug)]
pub struct TransferMemory {
    units: Arc<Semaphore>,
    total_units: u32,
}

/// A [`TransferMemory`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryFigures {
    /// Bytes that transfers' shares hold now (estimates, not allocations).
    pub taken: u64,
    /// The budget (`transfer-memory`); 0 for none.
    pub budget: u64,
}

/// A transfer's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct MemoryShare {
    _permit: Option<OwnedSemaphorePermit>,
}

impl TransferMemory {
    /// A budget of `bytes` (at least 1 KiB; at most 4 TiB). 0 means no
    /// budget: every share is granted at once.
    pub fn new(bytes: u64) -> TransferMemory {
        let total_units = match bytes {
            0 => 0,
            _ => u32::try_from((bytes / UNIT).max(1)).unwrap_or(u32::MAX),
        };
        TransferMemory {
            units: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
        }
    }

    /// Waits for `bytes` of the budget (all of it when `bytes` is more),
    /// in the order transfers asked.
    pub async fn take(&self, bytes: u64) -> MemoryShare {
        if self.total_units == 0 {
            return MemoryShare { _permit: None };
        }
        let units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.total_units);
        MemoryShare {
            // The semaphore is never closed.
            _permit: self.units.clone().acquire_many_owned(units).await.ok(),
        }
    }

    /// `bytes` of the budget if they are free now (all of it when `bytes`
    /// is more); `None` rather than a wait.
    pub fn try_take(&self, bytes: u64) -> Option<MemoryShare> {
        if self.total_units == 0 {
            return Some(MemoryShare { _permit: None });
        }
        let units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.total_units);
        let permit = self.units.clone().try_acquire_many_owned(units).ok()?;
        Some(MemoryShare {
            _permit: Some(permit),
        })
    }

    /// Bytes of the budget not taken now.
    pub fn available(&self) -> u64 {
        self.units.available_permits() as u64 * UNIT
    }

    /// What the metrics show: the shares taken now and the whole budget
    /// (0 for none).
    pub fn figures(&self) -> MemoryFigures {
        let budget = u64::from(self.total_units) * UNIT;
        MemoryFigures {
            taken: budget.saturating_sub(self.available()),
            budget,
        }
    }
}

/// Bytes of body a transfer may take before it needs its share: small
/// bodies, the most common, never wait behind large ones.
pub const SHARE_PAST: u64 = 64 << 10;

/// A transfer's share, in two halves: the task that reads the body from
/// upstream takes it once the body is past `past` bytes (so that nothing
/// more is read before: [`SHARE_PAST`] for a body of unknown length, 0 for
/// one known to be larger), and hands it to the task that holds the
/// transfer's state, which keeps it until it ends.
pub fn share(memory: &TransferMemory, bytes: u64, past: u64) -> (ShareTaker, ShareHolder) {
    let (to_holder, from_taker) = oneshot::channel();
    (
        ShareTaker {
            due: Some((memory.clone(), bytes)),
            past,
            read: 0,
            sizer: None,
            to_holder: Some(to_holder),
        },
        ShareHolder {
            from_taker,
            held: None,
        },
    )
}

/// The reading half of [`share`].
#[derive(Debug)]
pub struct ShareTaker {
    due: Option<(TransferMemory, u64)>,
    past: u64,
    /// Body bytes read so far.
    read: u64,
    sizer: Option<HeadSizer>,
    to_holder: Option<oneshot::Sender<MemoryShare>>,
}

/// See [`ShareTaker::sized_by_head`]: the head gathers in place, so a
/// relay pays no allocation for it.
#[derive(Debug)]
struct HeadSizer {
    head: [u8; MAX_HEAD],
    filled: usize,
    len: usize,
    size: fn(&[u8]) -> Option<u64>,
}

/// The longest head a share can be sized by (an hsync header is 12 bytes).
const MAX_HEAD: usize = 16;

impl ShareTaker {
    /// A reader with no share to take (a transfer outside the budget).
    pub fn unbudgeted() -> ShareTaker {
        ShareTaker {
            due: None,
            past: 0,
            read: 0,
            sizer: None,
            to_holder: None,
        }
    }

    /// Sizes the share from the body's first `len` bytes, once they are
    /// read: `size` gives the share in bytes, or `None` to keep the one
    /// asked for. For a stream whose head says what its transfer will hold
    /// (an hsync header's block size sets its windows). It applies only
    /// when the share is due past those bytes. `len` is at most 16.
    pub fn sized_by_head(mut self, len: usize, size: fn(&[u8]) -> Option<u64>) -> ShareTaker {
        assert!(len <= MAX_HEAD, "a head of {len} bytes");
        self.sizer = Some(HeadSizer {
            head: [0; MAX_HEAD],
            filled: 0,
            len,
            size,
        });
        self
    }

    /// Feeds the sizer the next bytes of the body.
    fn size_from(&mut self, data: &[u8]) {
        let (Some(sizer), Some((_, due))) = (&mut self.sizer, &mut self.due) else {
            return;
        };
        let taken = (sizer.len - sizer.filled).min(data.len());
        sizer.head[sizer.filled..sizer.filled + taken].copy_from_slice(&data[..taken]);
        sizer.filled += taken;
        if sizer.filled == sizer.len {
            if let Some(bytes) = (sizer.size)(&sizer.head[..sizer.len]) {
                *due = bytes;
            }
            self.sizer = None;
        }
    }

    /// The next data chunk of `body` (trailers are skipped), read only
    /// once this transfer's share is taken where it is due (L-13, L-14);
    /// `None` at the end.
    pub async fn next_chunk<B>(&mut self, body: &mut B) -> Option<Result<Bytes, BodyError>>
    where
        B: hyper::body::Body<Data = Bytes> + Unpin,
        B::Error: Into<BodyError>,
    {
        loop {
            self.take_past(self.read).await;
            match body.frame().await? {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        self.read += data.len() as u64;
                        self.size_from(&data);
                        return Some(Ok(data));
                    }
                }
                Err(error) => return Some(Err(error.into())),
            }
        }
    }

    /// Before reading past `body_bytes` (what the body has reached so
    /// far): from the taker's threshold on, waits for the share, once, and
    /// hands it to the holder.
    pub async fn take_past(&mut self, body_bytes: u64) {
        if body_bytes < self.past {
            return;
        }
        if let Some((memory, bytes)) = self.due.take() {
            let share = memory.take(bytes).await;
            if let Some(to_holder) = self.to_holder.take() {
                // A holder that is gone needs no share: it drops here.
                let _ = to_holder.send(share);
            }
        }
    }
}

/// The holding half of [`share`].
#[derive(Debug)]
pub struct ShareHolder {
    from_taker: oneshot::Receiver<MemoryShare>,
    held: Option<MemoryShare>,
}

impl ShareHolder {
    /// Takes over the share once the taker has it (cheap; call it per
    /// chunk).
    pub fn collect(&mut self) {
        if self.held.is_none()
            && let Ok(share) = self.from_taker.try_recv()
        {
            self.held = Some(share);
        }
    }
}

/// What a coded transfer is expected to hold at most, for a body of
/// `known_len` bytes if announced, with windows of `window` bytes: the
/// window and the context before it, the coded or rebuilt output, and the
/// codec's scratch, about six windows; a body smaller than a window needs
/// that many of its own length.
pub fn coded_transfer_cost(window: usize, known_len: Option<u64>) -> u64 {
    let window = window as u64;
    let per_window = 6 * window;
    match known_len {
        Some(len) if len < window => (6 * len + (64 << 10)).min(per_window),
        _ => per_window,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_transfer_past_the_budget_waits_until_a_share_is_given_back() {
        let memory = TransferMemory::new(10 << 20);
        let first = memory.take(6 << 20).await;
        let second = tokio::time::timeout(Duration::from_millis(100), memory.take(6 << 20)).await;
        assert!(second.is_err(), "two 6 MiB shares fit a 10 MiB budget");
        let waiting = tokio::spawn({
            let memory = memory.clone();
            async move { memory.take(6 << 20).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        drop(first);
        tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("the share given back lets the waiting transfer in")
            .unwrap();
    }

    #[tokio::test]
    async fn a_share_larger_than_the_budget_takes_all_of_it_rather_than_wait_forever() {
        let memory = TransferMemory::new(1 << 20);
        let all = tokio::time::timeout(Duration::from_secs(1), memory.take(8 << 20))
            .await
            .expect("granted");
        assert_eq!(memory.available(), 0);
        drop(all);
        assert_eq!(memory.available(), 1 << 20);
    }

    #[test]
    fn try_take_gives_what_is_free_and_never_waits() {
        let memory = TransferMemory::new(100 << 10);
        let first = memory.try_take(64 << 10).expect("free");
        assert!(memory.try_take(64 << 10).is_none(), "36 KiB left");
        let second = memory.try_take(36 << 10).expect("what is left");
        assert_eq!(memory.available(), 0);
        drop((first, second));
        assert!(memory.try_take(u64::MAX).is_some(), "all of it, no more");
        assert!(TransferMemory::new(0).try_take(u64::MAX).is_some());
    }

    #[tokio::test]
    async fn no_budget_grants_every_share_at_once() {
        let memory = TransferMemory::new(0);
        let _a = memory.take(u64::MAX).await;
        let _b = memory.take(u64::MAX).await;
    }

    #[tokio::test]
    async fn a_share_is_taken_past_the_small_size_and_held_until_the_holder_ends() {
        let memory = TransferMemory::new(1 << 20);
        let (mut taker, mut holder) = share(&memory, 512 << 10, SHARE_PAST);
        taker.take_past(SHARE_PAST - 1).await;
        assert_eq!(
            memory.available(),
            1 << 20,
            "a small body waits for nothing"
        );
        taker.take_past(SHARE_PAST).await;
        assert_eq!(memory.available(), 512 << 10);
        taker.take_past(10 << 20).await;
        assert_eq!(memory.available(), 512 << 10, "taken once");
        holder.collect();
        drop(taker);
        assert_eq!(memory.available(), 512 << 10, "the holder keeps it");
        drop(holder);
        assert_eq!(memory.available(), 1 << 20);
    }

    /// A body of these chunks, all ready.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl hyper::body::Body for Chunks {
        type Data = Bytes;
        type Error = BodyError;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, BodyError>>> {
            std::task::Poll::Ready(
                self.0
                    .pop_front()
                    .map(|chunk| Ok(hyper::body::Frame::data(chunk))),
            )
        }
    }

    /// A body whose first bytes say what it will hold takes that share,
    /// read across chunks; one whose head says nothing keeps the share
    /// asked for.
    #[tokio::test]
    async fn a_share_sized_by_the_bodys_head_takes_what_the_head_says() {
        fn size(head: &[u8]) -> Option<u64> {
            (head[0] == b'B').then(|| u64::from(head[1]) << 20)
        }
        async fn share_taken(first_chunks: &[&'static [u8]]) -> u64 {
            let memory = TransferMemory::new(64 << 20);
            let (taker, mut holder) = share(&memory, 6 << 20, 4);
            let mut taker = taker.sized_by_head(2, size);
            let mut body = Chunks(first_chunks.iter().map(|c| Bytes::from_static(c)).collect());
            while let Some(chunk) = taker.next_chunk(&mut body).await {
                chunk.unwrap();
            }
            taker.take_past(u64::MAX).await;
            holder.collect();
            (64 << 20) - memory.available()
        }
        assert_eq!(
            share_taken(&[b"B", b"\x30rest of the body"]).await,
            48 << 20
        );
        assert_eq!(share_taken(&[b"A\x30rest of the body"]).await, 6 << 20);
    }

    #[test]
    fn a_small_body_asks_for_little_and_a_large_one_for_six_windows() {
        assert_eq!(coded_transfer_cost(1 << 20, None), 6 << 20);
        assert_eq!(coded_transfer_cost(1 << 20, Some(100 << 20)), 6 << 20);
        assert_eq!(
            coded_transfer_cost(1 << 20, Some(100_000)),
            600_000 + 65_536
        );
    }
}

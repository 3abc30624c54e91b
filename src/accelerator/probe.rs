//! The first bytes of a large body that no basis will help, read before
//! the answer is chosen. When they do not compress, the body goes as the
//! origin sent it ("never worse than plain", issue 20): coded, it would be
//! the body again plus its SIG frames and framing.
//!
//! Only for a request that offers no basis (no signature, no digest) and
//! a body of announced length: against a basis, even an incompressible
//! body may share runs with the old version. Media types known to be
//! compressed skip the probe (`Coder::gains_nothing`). The bytes read are
//! held within a budget of their own (`Coder::probe`) until they are
//! passed on.
//!
//! Main items: [`probe`], [`PROBE_LEN`].

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};

use crate::http::server::{BodyError, ProxyBody};
use crate::http::transfer_memory::MemoryShare;

/// Bytes read before deciding: a zstd block's worth, which tells text,
/// markup and columns of numbers from encrypted or compressed data.
pub const PROBE_LEN: usize = 64 << 10;

/// The longest the head waits for those bytes. A stored file's first
/// 64 KiB come within milliseconds; a body that trickles is not judged,
/// and is coded as before, so its head is not held back for long.
pub const PROBE_WAIT: Duration = Duration::from_millis(500);

/// zstd level of the probe: its fastest regular level, the cost of which
/// (well under a millisecond on the sample) is small beside the body's.
const PROBE_LEVEL: i32 = 1;

/// A sample that zstd cannot bring under this share (percent) of its size
/// does not compress: the literals of a stream would not either.
const INCOMPRESSIBLE_PERCENT: usize = 97;

/// Reads up to [`PROBE_LEN`] bytes of `body` (within `wait`), and returns
/// the body whole again (what was read, then the rest, as it came: errors
/// and trailers included) and whether those bytes do not compress. A body
/// that ends, fails or stalls before `PROBE_LEN` bytes is not judged
/// (false): the usual path deals with it as before. `share` (of the
/// probes' budget) is held until the bytes read are passed on.
pub async fn probe(mut body: ProxyBody, share: MemoryShare, wait: Duration) -> (ProxyBody, bool) {
    let mut frames = VecDeque::new();
    let mut sample = Vec::with_capacity(PROBE_LEN);
    let mut ended = false;
    let read = async {
        while sample.len() < PROBE_LEN {
            match body.frame().await {
                Some(Ok(frame)) => {
                    let is_data = frame.is_data();
                    if let Some(data) = frame.data_ref() {
                        let take = (PROBE_LEN - sample.len()).min(data.len());
                        sample.extend_from_slice(&data[..take]);
                    }
                    frames.push_back(Ok(frame));
                    if !is_data {
                        // Trailers: the body is over.
                        return;
                    }
                }
                Some(Err(error)) => {
                    frames.push_back(Err(error));
                    return;
                }
                None => {
                    ended = true;
                    return;
                }
            }
        }
    };
    let in_time = tokio::time::timeout(wait, read).await.is_ok();
    let incompressible = in_time && sample.len() == PROBE_LEN && !compresses(&sample);
    let share = (!frames.is_empty()).then_some(share);
    let body = Prepended {
        frames,
        share,
        inner: body,
        ended,
    };
    (ProxyBody::new(body), incompressible)
}

/// Whether zstd at [`PROBE_LEVEL`] brings `sample` under
/// [`INCOMPRESSIBLE_PERCENT`] of its size.
fn compresses(sample: &[u8]) -> bool {
    let mut out = Vec::with_capacity(zstd_safe::compress_bound(sample.len()));
    match zstd_safe::compress(&mut out, sample, PROBE_LEVEL) {
        Ok(len) => len * 100 < sample.len() * INCOMPRESSIBLE_PERCENT,
        // Cannot tell: code it, as before the probe.
        Err(_) => true,
    }
}

/// The frames read by the probe, then the rest of the body.
struct Prepended {
    frames: VecDeque<Result<Frame<Bytes>, BodyError>>,
    /// The probes' budget for `frames`, given back once they are passed
    /// on.
    share: Option<MemoryShare>,
    inner: ProxyBody,
    /// The inner body already said it was over: not polled again.
    ended: bool,
}

impl Body for Prepended {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(frame) = self.frames.pop_front() {
            if self.frames.is_empty() {
                self.share = None;
            }
            return Poll::Ready(Some(frame));
        }
        if self.ended {
            return Poll::Ready(None);
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let held: u64 = self
            .frames
            .iter()
            .filter_map(|frame| frame.as_ref().ok()?.data_ref())
            .map(|data| data.len() as u64)
            .sum();
        if self.ended {
            return SizeHint::with_exact(held);
        }
        let inner = self.inner.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + held);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + held);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::server::ReceiverStream;
    use crate::http::transfer_memory::TransferMemory;
    use http_body_util::{Full, StreamBody};

    type Sent = Result<Frame<Bytes>, BodyError>;

    /// A body fed through a channel, and its sender.
    fn channel_body(capacity: usize) -> (tokio::sync::mpsc::Sender<Sent>, ProxyBody) {
        let (sender, receiver) = tokio::sync::mpsc::channel(capacity);
        let body = ProxyBody::new(StreamBody::new(ReceiverStream(receiver)));
        (sender, body)
    }

    fn random(len: usize, mut seed: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    }

    fn text(len: usize) -> Vec<u8> {
        b"<li class=\"item\">an entry of a list, item "
            .iter()
            .cycle()
            .take(len)
            .copied()
            .collect()
    }

    /// A body of `frames`, in order, then its end.
    fn body_of(frames: Vec<Sent>) -> ProxyBody {
        let (sender, body) = channel_body(frames.len().max(1));
        for frame in frames {
            sender.try_send(frame).expect("room for every frame");
        }
        body
    }

    fn data(bytes: Vec<u8>) -> Sent {
        Ok(Frame::data(Bytes::from(bytes)))
    }

    /// [`probe`] with a share of a budget of its own.
    async fn probed(body: ProxyBody, wait: Duration) -> (ProxyBody, bool) {
        let budget = TransferMemory::new(PROBE_LEN as u64);
        let share = budget.try_take(PROBE_LEN as u64).unwrap();
        probe(body, share, wait).await
    }

    async fn collected(body: ProxyBody) -> Vec<u8> {
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn random_bytes_do_not_compress_and_the_body_stays_whole() {
        let data = random(300_000, 7);
        let pieces = data
            .chunks(10_000)
            .map(|piece| self::data(piece.to_vec()))
            .collect();
        let (body, incompressible) = probed(body_of(pieces), Duration::from_secs(5)).await;
        assert!(incompressible);
        assert!(collected(body).await == data);
    }

    #[tokio::test]
    async fn text_compresses() {
        let data = text(300_000);
        let (body, incompressible) = probed(
            body_of(vec![self::data(data.clone())]),
            Duration::from_secs(5),
        )
        .await;
        assert!(!incompressible);
        assert!(collected(body).await == data);
    }

    /// Shorter than the sample: not judged, and whole, its length known.
    #[tokio::test]
    async fn a_body_shorter_than_the_sample_is_not_judged() {
        let data = random(PROBE_LEN - 1, 3);
        let full = ProxyBody::new(Full::new(Bytes::from(data.clone())).map_err(|n| match n {}));
        let (body, incompressible) = probed(full, Duration::from_secs(5)).await;
        assert!(!incompressible);
        assert_eq!(body.size_hint().exact(), Some(data.len() as u64));
        assert!(collected(body).await == data);
    }

    /// An error after the sample's first bytes comes out in its place.
    #[tokio::test]
    async fn an_error_is_passed_on_in_order() {
        let inner = body_of(vec![
            data(random(1000, 1)),
            Err(Box::new(std::io::Error::other("origin went away"))),
        ]);
        let (mut body, incompressible) = probed(inner, Duration::from_secs(5)).await;
        assert!(!incompressible);
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.data_ref().unwrap().len(), 1000);
        assert!(body.frame().await.unwrap().is_err());
    }

    /// A body that stalls is not waited for past the timeout, and what
    /// came is kept.
    #[tokio::test]
    async fn a_stalled_body_is_not_judged() {
        let (sender, inner) = channel_body(1);
        sender.send(data(random(1000, 2))).await.unwrap();
        let (mut body, incompressible) = probed(inner, Duration::from_millis(50)).await;
        assert!(!incompressible);
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.data_ref().unwrap().len(), 1000);
        drop(sender);
        assert!(body.frame().await.is_none());
    }

    /// The bytes read hold their share of the probes' budget until the
    /// last of them is passed on, and not after.
    #[tokio::test]
    async fn the_share_is_given_back_once_the_bytes_read_are_passed_on() {
        let budget = TransferMemory::new(PROBE_LEN as u64);
        let data = random(300_000, 5);
        let pieces = data
            .chunks(PROBE_LEN / 2)
            .map(|piece| self::data(piece.to_vec()))
            .collect();
        let share = budget.try_take(PROBE_LEN as u64).unwrap();
        let (mut body, incompressible) =
            probe(body_of(pieces), share, Duration::from_secs(5)).await;
        assert!(incompressible);
        assert!(budget.try_take(1).is_none(), "taken while the bytes wait");
        body.frame().await.unwrap().unwrap();
        assert!(budget.try_take(1).is_none(), "one of two frames still held");
        body.frame().await.unwrap().unwrap();
        assert_eq!(budget.available(), PROBE_LEN as u64);
        assert!(collected(body).await == data[PROBE_LEN..]);
    }
}

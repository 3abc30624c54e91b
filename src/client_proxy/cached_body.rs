//! Serving a stored body so that no byte leaves before it was checked
//! (C-V3), and a user agent that stops reading holds no thread (L-13).
//!
//! Small bodies (up to [`SMALL_BODY`]) are read and hashed whole before
//! the head goes out. Larger ones go group by group: each group of the
//! entry's blake3 outboard ([`crate::cache::Outboard`]) is read on the
//! blocking pool, checked, and only then handed to hyper. A group that
//! fails, or a read error or short file, quarantines the entry and aborts
//! the response before the bad bytes leave; the next request refetches.
//! A user agent that goes away ends the transfer and leaves the entry
//! alone: an unfinished read is not a failed check.
//!
//! While the user agent does not read, a transfer holds at most two groups
//! (one in the channel, one read ahead) and a task, no thread.

use std::io::{Read, Seek, SeekFrom};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc;

use crate::cache::{Outboard, OutboardBuilder};
use crate::http::server::{BodyError, ProxyBody, ReceiverStream, with_length};

/// Bodies up to this size are read and checked whole before a cached
/// response starts; larger ones are checked group by group as they stream.
pub const SMALL_BODY: u64 = 1 << 20;

/// Checked groups waiting for the user agent.
const CHANNEL_DEPTH: usize = 1;

/// A stored body, ready to serve.
pub enum CachedBody {
    /// Read and checked whole.
    Whole(Bytes),
    /// Checked group by group while it streams.
    Stream(ProxyBody),
}

/// A stored body's file (any reader in tests).
pub trait BodyFile: Read + Seek + Send + 'static {}
impl<T: Read + Seek + Send + 'static> BodyFile for T {}

/// Prepares a stored body of `len` bytes whose blake3 is `digest` for
/// serving. Blocking: call it on the blocking pool.
///
/// `outboard` is the entry's, already checked against `digest`; without
/// one (entries written before they were kept) the body is hashed whole
/// first to build it. `None` when the body fails a check before anything
/// was sent; `on_failure` has quarantined the entry then, and is called
/// too (once) when a group fails later, while the body streams.
pub fn serve_cached(
    mut body: impl BodyFile,
    len: u64,
    digest: blake3::Hash,
    outboard: Option<Outboard>,
    on_failure: impl FnOnce() + Send + 'static,
) -> Option<CachedBody> {
    if len <= SMALL_BODY {
        let mut bytes = Vec::with_capacity(len as usize);
        let read = (&mut body).take(len + 1).read_to_end(&mut bytes);
        if read.is_err() || bytes.len() as u64 != len || blake3::hash(&bytes) != digest {
            on_failure();
            return None;
        }
        return Some(CachedBody::Whole(Bytes::from(bytes)));
    }
    let outboard = match outboard.filter(|o| o.body_len() == len) {
        Some(outboard) => outboard,
        None => match build_outboard(&mut body, len, digest) {
            Some(outboard) => outboard,
            None => {
                on_failure();
                return None;
            }
        },
    };
    let (tx, rx) = mpsc::channel(CHANNEL_DEPTH);
    tokio::spawn(stream_groups(body, outboard, tx, on_failure));
    // Of known length: the response ends with its last byte, not with the
    // task's, and a log line counts it whole.
    Some(CachedBody::Stream(with_length(
        StreamBody::new(ReceiverStream(rx)).boxed(),
        len,
    )))
}

/// Hashes the whole body into an outboard and rewinds it; `None` when it
/// cannot be read or is not the body `digest` names.
fn build_outboard(body: &mut impl BodyFile, len: u64, digest: blake3::Hash) -> Option<Outboard> {
    let mut builder = OutboardBuilder::new();
    let mut buffer = vec![0; 256 << 10];
    loop {
        match body.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => builder.update(&buffer[..n]),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
        if builder.len() > len {
            return None;
        }
    }
    let (root, outboard) = builder.finish();
    (root == digest && outboard.body_len() == len && body.seek(SeekFrom::Start(0)).is_ok())
        .then_some(outboard)
}

/// Sends the body's groups in order, each read on the blocking pool and
/// checked first.
async fn stream_groups(
    mut body: impl BodyFile,
    outboard: Outboard,
    tx: mpsc::Sender<Result<Frame<Bytes>, BodyError>>,
    on_failure: impl FnOnce() + Send + 'static,
) {
    let outboard = std::sync::Arc::new(outboard);
    for index in 0..outboard.groups() {
        let checked = outboard.clone();
        let read = tokio::task::spawn_blocking(move || {
            let range = checked.group_range(index);
            let mut group = vec![0; (range.end - range.start) as usize];
            let result = body.read_exact(&mut group).map(|()| group);
            (body, result)
        })
        .await;
        let Ok((returned, result)) = read else {
            // The read panicked, or the runtime is shutting down: the body
            // must fail, not end short (a dropped channel ends it cleanly).
            let _ = tx
                .send(Err(BodyError::from("cached body unreadable")))
                .await;
            return;
        };
        body = returned;
        let failure = match result {
            Ok(group) if outboard.check_group(index, &group) => {
                if tx.send(Ok(Frame::data(Bytes::from(group)))).await.is_err() {
                    return; // The user agent left: not the entry's fault.
                }
                continue;
            }
            Ok(_) => format!("cached body failed its check at group {index}"),
            Err(error) => format!("cached body unreadable at group {index}: {error}"),
        };
        on_failure();
        let _ = tx.send(Err(BodyError::from(failure))).await;
        return;
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// The first `good` bytes of `data`, then EIO.
    struct FailingReader {
        data: Cursor<Vec<u8>>,
        good: u64,
    }

    impl Read for FailingReader {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let left = self.good.saturating_sub(self.data.position());
            if left == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            let n = buf.len().min(left as usize);
            self.data.read(&mut buf[..n])
        }
    }

    impl Seek for FailingReader {
        fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
            self.data.seek(to)
        }
    }

    struct Served {
        /// Bytes that reached the user agent before the end or the abort.
        received: Vec<u8>,
        complete: bool,
        failures: usize,
    }

    /// Serves `file` as the stored body `data` and reads it as hyper would.
    async fn serve(file: impl BodyFile, data: &[u8], outboard: Option<Outboard>) -> Served {
        let failures = Arc::new(AtomicUsize::new(0));
        let count = failures.clone();
        let served = tokio::task::spawn_blocking({
            let digest = blake3::hash(data);
            let len = data.len() as u64;
            move || {
                serve_cached(file, len, digest, outboard, move || {
                    count.fetch_add(1, Ordering::Relaxed);
                })
            }
        })
        .await
        .unwrap();
        let (received, complete) = match served {
            None => (Vec::new(), false),
            Some(CachedBody::Whole(bytes)) => (bytes.to_vec(), true),
            Some(CachedBody::Stream(mut body)) => {
                let mut received = Vec::new();
                let mut complete = true;
                while let Some(frame) = body.frame().await {
                    match frame {
                        Ok(frame) => received.extend_from_slice(frame.data_ref().unwrap()),
                        Err(_) => {
                            complete = false;
                            break;
                        }
                    }
                }
                (received, complete)
            }
        };
        Served {
            received,
            complete,
            failures: failures.load(Ordering::Relaxed),
        }
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[tokio::test]
    async fn c_e3_a_cached_body_that_fails_to_read_or_ends_short_is_dropped_and_never_served_whole()
    {
        for len in [40_000, SMALL_BODY as usize + 300_000] {
            let data = data(len);
            let good = serve(Cursor::new(data.clone()), &data, None).await;
            assert!(good.complete && good.received == data, "{len}: a good body");
            assert_eq!(good.failures, 0);
            let eio = FailingReader {
                data: Cursor::new(data.clone()),
                good: len as u64 / 2,
            };
            let outboard = Some(Outboard::of(&data));
            let eio = serve(eio, &data, outboard.clone()).await;
            let short = serve(Cursor::new(data[..len - 1].to_vec()), &data, outboard).await;
            for (what, served) in [("EIO", eio), ("short", short)] {
                assert!(!served.complete, "{len}, {what}: served as complete");
                assert_eq!(served.failures, 1, "{len}, {what}: the entry is kept");
            }
        }
    }

    #[tokio::test]
    async fn c_v3_no_byte_of_a_changed_group_is_sent_at_any_size() {
        for len in [SMALL_BODY as usize + 1, 3 << 20, (5 << 20) + 12_345] {
            let data = data(len);
            let outboard = Outboard::of(&data);
            for at in [0, 70_000, len / 2, len - 1] {
                let mut rotten = data.clone();
                rotten[at] ^= 0x04;
                for with_outboard in [true, false] {
                    let served = serve(
                        Cursor::new(rotten.clone()),
                        &data,
                        with_outboard.then(|| outboard.clone()),
                    )
                    .await;
                    assert!(!served.complete, "{len} @ {at}: completed");
                    assert_eq!(served.failures, 1, "{len} @ {at}: not quarantined");
                    assert!(
                        served.received.len() <= at,
                        "{len} @ {at}: {} bytes went out, the bad one among them",
                        served.received.len()
                    );
                    assert_eq!(served.received, data[..served.received.len()]);
                    if with_outboard {
                        // Everything before the bad group went.
                        let group = outboard.group_len() as usize;
                        assert_eq!(served.received.len(), at / group * group);
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn c_v3_a_user_agent_that_leaves_never_drops_a_good_entry() {
        let data = data(4 << 20);
        let failures = Arc::new(AtomicUsize::new(0));
        let count = failures.clone();
        let digest = blake3::hash(&data);
        let outboard = Outboard::of(&data);
        let file = Cursor::new(data.clone());
        let served = tokio::task::spawn_blocking(move || {
            serve_cached(file, 4 << 20, digest, Some(outboard), move || {
                count.fetch_add(1, Ordering::Relaxed);
            })
        })
        .await
        .unwrap();
        let Some(CachedBody::Stream(mut body)) = served else {
            panic!("a large body streams");
        };
        // Two groups, then the user agent goes away.
        body.frame().await.unwrap().unwrap();
        body.frame().await.unwrap().unwrap();
        drop(body);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(
            failures.load(Ordering::Relaxed),
            0,
            "a good entry was dropped"
        );
    }
}

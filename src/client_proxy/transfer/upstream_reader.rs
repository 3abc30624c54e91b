//! The reader task: takes the upstream body frame by frame into the
//! relay's channel, and past a small body's size reads nothing more before
//! the relay holds its share of the transfer memory (L-13, L-14). Also
//! says which upstream body errors mean malformed framing rather than a
//! cut. What is done with the chunks is the driver's business.
//!
//! Main items: [`read_upstream`], [`is_malformed`].

use bytes::Bytes;
use hyper::body::Incoming;
use tokio::sync::mpsc;

use crate::http::server::BodyError;
use crate::http::transfer_memory::ShareTaker;

/// Whether a body error says the upstream's framing was malformed (hyper
/// reports a bad chunk as an `InvalidInput`/`InvalidData` I/O error under
/// its body error) rather than that the stream was cut or reset.
pub(super) fn is_malformed(error: &(dyn std::error::Error + 'static)) -> bool {
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

/// Reads `upstream` into `to_worker` until it ends, fails, or the relay
/// stops listening.
pub(super) async fn read_upstream(
    mut upstream: Incoming,
    to_worker: mpsc::Sender<Result<Bytes, BodyError>>,
    mut share: ShareTaker,
) {
    // Past a small body's size, the relay's state grows: nothing more is
    // read before its share of the transfer memory.
    while let Some(item) = share.next_chunk(&mut upstream).await {
        let failed = item.is_err();
        if to_worker.send(item).await.is_err() || failed {
            return;
        }
    }
}

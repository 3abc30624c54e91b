//! The QUEUE callback listener (`--queue-callback ADDR`): PARQ's way for an
//! accelerator to tell a client whose lifetime lapsed that its place is
//! still there (seed 000 §4): it connects to the client's `X-Node` and
//! sends `QUEUE <ID> <ip>:<port>\r\n`. A callback for an ID we are waiting
//! on wakes that wait, which re-issues its request at once.
//!
//! The listener is open to whoever can reach it, so everything is bounded:
//! one line of at most [`MAX_CALLBACK_LINE_LEN`] bytes, read within
//! [`CALLBACK_READ_TIMEOUT`], on at most [`MAX_CALLBACK_CONNECTIONS`]
//! connections at once. Unknown IDs, junk, long lines and slow senders
//! are dropped with a debug log line. The address in the line is logged,
//! never connected to: the request goes again to `--upstream`, so a
//! forged callback can at worst make a wait come back early, and needs a
//! 128-bit ID only we and the upstream know.
//!
//! Main function: [`serve_callbacks`].

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::QueueWaits;
use crate::client_proxy::replica::Replicas;
use crate::feed::wire::parse_feed_line;
use crate::queue::headers::{MAX_CALLBACK_LINE_LEN, parse_queue_callback};

/// Callback connections served at once; more are closed at once.
pub const MAX_CALLBACK_CONNECTIONS: usize = 64;
/// Time a callback connection has to deliver its line.
pub const CALLBACK_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed accept (out of descriptors), so the loop does not
/// spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Why a callback connection gave no line.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    /// More than the limit without a line end.
    #[error("no line end within {max} bytes")]
    TooLong {
        /// The limit.
        max: usize,
    },
    /// The connection closed before sending anything.
    #[error("closed without a line")]
    Empty,
    /// A read failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads one line of at most `max` bytes (its `\n` included); a line the
/// sender ended by closing the connection counts too.
pub async fn read_line(
    stream: &mut (impl AsyncRead + Unpin),
    max: usize,
) -> Result<Vec<u8>, LineError> {
    let mut line = Vec::with_capacity(max.min(256));
    let mut chunk = [0u8; 64];
    loop {
        let room = (max + 1 - line.len()).min(chunk.len());
        let n = stream.read(&mut chunk[..room]).await?;
        if n == 0 {
            return if line.is_empty() {
                Err(LineError::Empty)
            } else {
                Ok(line)
            };
        }
        if let Some(end) = chunk[..n].iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&chunk[..=end]);
            return if line.len() > max {
                Err(LineError::TooLong { max })
            } else {
                Ok(line)
            };
        }
        line.extend_from_slice(&chunk[..n]);
        if line.len() > max {
            return Err(LineError::TooLong { max });
        }
    }
}

/// Accepts QUEUE callbacks on `listener` for ever, waking the waits of
/// `waits` they name, and change feed pushes (`FEED token csn`), waking
/// the zone of `replicas` they name (a forged one makes a zone pull early).
pub async fn serve_callbacks(
    listener: TcpListener,
    waits: Arc<QueueWaits>,
    replicas: Arc<Replicas>,
) {
    let permits = Arc::new(Semaphore::new(MAX_CALLBACK_CONNECTIONS));
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "cannot accept a QUEUE callback");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "QUEUE callback dropped: too many at once");
            continue;
        };
        let waits = waits.clone();
        let replicas = replicas.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let line = tokio::time::timeout(
                CALLBACK_READ_TIMEOUT,
                read_line(&mut stream, MAX_CALLBACK_LINE_LEN),
            )
            .await;
            let line = match line {
                Ok(Ok(line)) => line,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "QUEUE callback dropped");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "QUEUE callback dropped: too slow");
                    return;
                }
            };
            if let Some((token, csn)) = parse_feed_line(&line) {
                if replicas.wake(&token) {
                    tracing::debug!(%peer, csn, "change feed pushed: pulling now");
                } else {
                    tracing::debug!(%peer, "change feed push for a zone we do not replicate");
                }
                return;
            }
            match parse_queue_callback(&line) {
                Ok((id, server)) if waits.wake(id) => {
                    tracing::info!(%peer, %server, "QUEUE callback: coming back now");
                }
                Ok((_, server)) => {
                    tracing::debug!(%peer, %server, "QUEUE callback for an ID we do not wait on");
                }
                Err(error) => {
                    tracing::debug!(%peer, %error, "QUEUE callback dropped: not a QUEUE line");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_read_whole_and_bounded() {
        let mut ok: &[u8] = b"QUEUE 0123 1.2.3.4:5\r\nleft over";
        assert_eq!(
            read_line(&mut ok, MAX_CALLBACK_LINE_LEN).await.unwrap(),
            b"QUEUE 0123 1.2.3.4:5\r\n"
        );
        let mut closed: &[u8] = b"QUEUE 0123 1.2.3.4:5";
        assert_eq!(
            read_line(&mut closed, MAX_CALLBACK_LINE_LEN).await.unwrap(),
            b"QUEUE 0123 1.2.3.4:5"
        );
        let long = vec![b'Q'; 10_000];
        assert!(matches!(
            read_line(&mut long.as_slice(), 128).await,
            Err(LineError::TooLong { max: 128 })
        ));
        // A line end just past the limit is still too long.
        let mut just_over = vec![b'Q'; 128];
        just_over.push(b'\n');
        assert!(matches!(
            read_line(&mut just_over.as_slice(), 128).await,
            Err(LineError::TooLong { .. })
        ));
        just_over.remove(0);
        assert_eq!(
            read_line(&mut just_over.as_slice(), 128)
                .await
                .unwrap()
                .len(),
            128
        );
        assert!(matches!(
            read_line(&mut &b""[..], 128).await,
            Err(LineError::Empty)
        ));
    }
}

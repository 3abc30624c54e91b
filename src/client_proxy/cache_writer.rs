//! Writing a large body into its cache entry beside the relay.
//!
//! The relay decodes, hashes and feeds the user agent; for a large body the
//! page-cache copy of its cache writes was the largest single cost left on
//! it (on this machine 0.5–2 s of system time per GiB, varying with the
//! host's memory). Here those writes run beside it: the relay hands over
//! the same `Bytes` slices it sends to the user agent (no copy), through a
//! bounded channel, so memory stays bounded and a slow disk slows the
//! relay rather than filling memory.
//!
//! The writer is a task that takes the blocking pool only while it writes:
//! a relay whose user agent stopped reading holds no thread here either
//! (L-13), and the number of writers is not a number of threads.
//!
//! Main items: [`BackgroundWriter`], and [`StoreTarget`], the entry it
//! writes.

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::cache::{CacheStore, EntryWriter, NewEntry};

/// Where the body goes besides the user agent.
pub struct StoreTarget {
    /// The cache.
    pub store: CacheStore,
    /// The open entry.
    pub writer: EntryWriter,
    /// What to commit with it (completeness is set here).
    pub entry: NewEntry,
}

/// Slices queued for the writer (256 KiB each from the relay).
const QUEUE_DEPTH: usize = 8;

/// A cache entry being written by a task of its own.
pub(crate) struct BackgroundWriter {
    to_writer: mpsc::Sender<Bytes>,
    task: JoinHandle<Option<StoreTarget>>,
}

impl BackgroundWriter {
    /// Starts the writer task for `target` (on the current runtime: call it
    /// from the runtime or its blocking pool).
    pub(crate) fn start(target: StoreTarget) -> BackgroundWriter {
        let (to_writer, from_relay) = mpsc::channel::<Bytes>(QUEUE_DEPTH);
        let task = tokio::runtime::Handle::current().spawn(write_all(target, from_relay));
        BackgroundWriter { to_writer, task }
    }

    /// Queues `chunk` (the next body bytes), waiting while the queue is
    /// full. False once the writer has given up: the entry will not be
    /// stored.
    pub(crate) async fn write(&self, chunk: Bytes) -> bool {
        self.to_writer.send(chunk).await.is_ok()
    }

    /// Waits for every queued byte to be written: the entry, ready to
    /// commit, or `None` when a write failed (already logged).
    pub(crate) async fn finish(self) -> Option<StoreTarget> {
        drop(self.to_writer);
        self.task.await.unwrap_or_else(|_| {
            tracing::error!("the cache writer panicked; not storing this response");
            None
        })
    }
}

/// Writes what arrives, a batch (what is queued) per trip to the blocking
/// pool.
async fn write_all(
    mut target: StoreTarget,
    mut from_relay: mpsc::Receiver<Bytes>,
) -> Option<StoreTarget> {
    let mut batch = Vec::with_capacity(QUEUE_DEPTH);
    while from_relay.recv_many(&mut batch, QUEUE_DEPTH).await > 0 {
        let chunks = std::mem::take(&mut batch);
        let written = tokio::task::spawn_blocking(move || {
            for chunk in &chunks {
                if let Err(error) = target.writer.write_body(chunk) {
                    // Full disk or over budget: the user agent still gets
                    // its bytes (C-E1); the entry is just not kept
                    // (dropping the writer removes its files).
                    tracing::warn!(cache = %target.store.root().display(), %error, "cache write failed; not storing this response");
                    return None;
                }
            }
            Some(target)
        })
        .await
        .ok()
        .flatten();
        target = written?;
    }
    Some(target)
}

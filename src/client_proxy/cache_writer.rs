//! Writing a large body into its cache entry on a thread of its own.
//!
//! The relay's worker thread decodes, hashes and feeds the user agent; for
//! a large body the page-cache copy of its cache writes was the largest
//! single cost left on that thread (on this machine 0.5–2 s of system time
//! per GiB, varying with the host's memory). Here those writes run beside
//! it: the worker hands over the same `Bytes` slices it sends to the user
//! agent (no copy), through a bounded channel, so memory stays bounded and
//! a slow disk slows the worker rather than filling memory.
//!
//! Main item: [`BackgroundWriter`].

use std::sync::mpsc;
use std::thread::JoinHandle;

use bytes::Bytes;

use super::transfer::StoreTarget;

/// Slices queued for the writer thread (256 KiB each from the relay).
const QUEUE_DEPTH: usize = 8;

/// A cache entry being written by a thread of its own.
pub(crate) struct BackgroundWriter {
    to_writer: mpsc::SyncSender<Bytes>,
    thread: JoinHandle<Option<StoreTarget>>,
}

impl BackgroundWriter {
    /// Starts the writer thread for `target`. `None` when no thread can be
    /// started: the entry is then dropped (not stored), as on a failed
    /// write, and the caller goes on serving the user agent.
    pub(crate) fn start(mut target: StoreTarget) -> Option<BackgroundWriter> {
        let (to_writer, from_worker) = mpsc::sync_channel::<Bytes>(QUEUE_DEPTH);
        let root = target.store.root().to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("rproxy-cache-write".into())
            .spawn(move || {
                for chunk in from_worker {
                    if let Err(error) = target.writer.write_body(&chunk) {
                        // Full disk or over budget: the user agent still
                        // gets its bytes (C-E1); the entry is just not
                        // kept (dropping the writer removes its files).
                        tracing::warn!(cache = %target.store.root().display(), %error, "cache write failed; not storing this response");
                        return None;
                    }
                }
                Some(target)
            });
        match spawned {
            Ok(thread) => Some(BackgroundWriter { to_writer, thread }),
            Err(error) => {
                tracing::warn!(cache = %root.display(), %error, "cannot start a cache writer thread; not storing this response");
                None
            }
        }
    }

    /// Queues `chunk` (the next body bytes). False once the writer has
    /// given up: the entry will not be stored.
    pub(crate) fn write(&self, chunk: Bytes) -> bool {
        self.to_writer.send(chunk).is_ok()
    }

    /// Waits for every queued byte to be written: the entry, ready to
    /// commit, or `None` when a write failed (already logged).
    pub(crate) fn finish(self) -> Option<StoreTarget> {
        drop(self.to_writer);
        self.thread.join().unwrap_or_else(|_| {
            tracing::error!("the cache writer thread panicked; not storing this response");
            None
        })
    }
}

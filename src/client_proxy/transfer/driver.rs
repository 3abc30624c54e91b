//! The relay's task: it waits for upstream chunks, for the user agent
//! and for the background cache writer, and sends the worker to the
//! blocking pool only for the work on the bytes. A user agent that stops
//! reading costs its chunks in the channels and the worker's state, never
//! a thread; past [`STALLED_AFTER`] its body is handed to a spool, or the
//! worker's scratch buffers are freed while the relay waits (L-13). What
//! the bytes are and whether they pass is the worker's business, not this
//! file's.
//!
//! Main item: [`Driver`].

use bytes::Bytes;
use hyper::body::Frame;
use tokio::sync::mpsc;

use super::upstream_reader::is_malformed;
use super::worker::{Ending, Stop, Worker};
use super::{Outcome, Report};
use crate::http::server::BodyError;
use crate::http::spool::{BodyFeed, BodyItem, Spool, SpoolDisk};
use crate::http::transfer_memory::ShareHolder;

/// A user agent that has taken nothing for this long is stalled: the
/// relay frees its per-window buffers while it waits. (Sooner would free
/// and grow them again for every window of a user agent that is merely
/// slower than the link.)
const STALLED_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// Bytes a spool holds at most ahead of its user agent; past it the relay
/// waits for the user agent, as it does without a spool.
const MAX_SPOOL: u64 = 1 << 30;

/// Runs a relay as a task: waits for upstream chunks, the user agent and
/// the cache writer asynchronously, and takes the blocking pool only for
/// the work on the bytes (decode, hash, cache writes, commit). A user
/// agent that stops reading costs its chunks in the channels and the
/// worker's state, never a thread (L-13).
pub(super) struct Driver {
    pub(super) worker: Box<Worker>,
    /// `None` once the user agent's body was ended, or handed to a spool.
    pub(super) to_agent: Option<mpsc::Sender<BodyItem>>,
    /// The user agent's end of that channel, for a spool to take over.
    pub(super) feed: BodyFeed,
    /// The body parked on disk for a user agent that stopped reading.
    pub(super) spool: Option<Spool>,
    pub(super) spool_dir: Option<std::path::PathBuf>,
    pub(super) spool_disk: SpoolDisk,
    /// This relay's share of the transfer memory.
    pub(super) memory: ShareHolder,
}

impl Driver {
    pub(super) async fn run(
        &mut self,
        mut from_upstream: mpsc::Receiver<Result<Bytes, BodyError>>,
    ) -> Report {
        let mut result = Ok(());
        while let Some(item) = from_upstream.recv().await {
            let chunk = match item {
                Ok(chunk) => chunk,
                Err(error) => {
                    let reason = format!("upstream body: {error}");
                    result = Err(if is_malformed(&*error) {
                        Stop::Malformed(reason)
                    } else {
                        Stop::Interrupted(reason)
                    });
                    break;
                }
            };
            self.worker.upstream_bytes += chunk.len() as u64;
            self.memory.collect();
            let Some(stepped) = self.blocking(move |worker| worker.step(&chunk)).await else {
                return self.lost().await;
            };
            self.flush().await;
            if let Err(stop) = stepped {
                result = Err(stop);
                break;
            }
            if self.worker.agent_gone && !self.worker.is_storing() {
                result = Err(Stop::Abandoned);
                break;
            }
        }
        drop(from_upstream);
        self.settle_writer().await;
        let Some(ending) = self.blocking(move |worker| worker.conclude(result)).await else {
            return self.lost().await;
        };
        self.flush().await;
        let outcome = match ending {
            Ending::Done(outcome) => outcome,
            Ending::Commit(commit) => {
                if commit.end_agent_first {
                    self.worker.end_agent();
                    self.flush().await;
                }
                let Some(stored) = self.blocking(move |worker| worker.commit(commit)).await else {
                    return self.lost().await;
                };
                self.flush().await;
                stored
            }
        };
        Report {
            outcome,
            upstream_bytes: self.worker.upstream_bytes,
            body_bytes: self.worker.body_bytes,
        }
    }

    /// Runs `work` on the worker on the blocking pool; `None` when it
    /// panicked (or the runtime is shutting down), the worker lost with it.
    async fn blocking<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Worker) -> T + Send + 'static,
    ) -> Option<T> {
        let mut worker = std::mem::replace(&mut self.worker, Box::new(Worker::idle()));
        let (worker, result) = tokio::task::spawn_blocking(move || {
            let result = work(&mut worker);
            (worker, result)
        })
        .await
        .ok()?;
        self.worker = worker;
        Some(result)
    }

    /// The worker was lost: the user agent's body fails rather than end
    /// (a dropped channel would end it cleanly, short), and nothing is
    /// stored (the entry writer's drop removes its files).
    async fn lost(&mut self) -> Report {
        tracing::error!("the relay's work on the body panicked; aborting the response");
        // Whoever holds the user agent's channel ends it with an error;
        // the end that `relay` gives it afterwards is then a no-op.
        self.worker.agent_ended = true;
        if let Some(spool) = self.spool.take() {
            spool
                .finish(Err("the proxy failed while relaying this body".into()))
                .await;
        }
        if let Some(sender) = self.to_agent.take() {
            let _ = sender
                .send(Err(BodyError::from(
                    "the proxy failed while relaying this body",
                )))
                .await;
        }
        Report {
            outcome: Outcome::Interrupted {
                partial_stored: false,
            },
            upstream_bytes: 0,
            body_bytes: 0,
        }
    }

    /// Hands what the last step produced to the cache writer and the user
    /// agent, waiting for each as long as it takes.
    pub(super) async fn flush(&mut self) {
        let to_write = std::mem::take(&mut self.worker.to_write);
        for chunk in to_write {
            if let Some(writer) = &self.worker.background
                && !writer.write(chunk).await
            {
                // It failed and said why; nothing will be stored.
                self.worker.background = None;
            }
        }
        let to_agent = std::mem::take(&mut self.worker.to_agent);
        for item in to_agent {
            if self.spool.is_some() {
                self.spool_item(item).await;
                continue;
            }
            let Some(sender) = &self.to_agent else { break };
            // Room now: no timer, no clone (the common case, per slice).
            match sender.try_reserve() {
                Ok(room) => {
                    room.send(item);
                    continue;
                }
                Err(mpsc::error::TrySendError::Closed(())) => {
                    self.worker.agent_gone = true;
                    break;
                }
                Err(mpsc::error::TrySendError::Full(())) => {}
            }
            // A clone, so that the spool can take the channel meanwhile.
            let sender = sender.clone();
            let room = match tokio::time::timeout(STALLED_AFTER, sender.reserve()).await {
                Ok(room) => room,
                Err(_) => {
                    // The user agent stopped reading (L-13): the body goes
                    // on into a spool it will read from, so this relay can
                    // finish and free its state; without one, what only
                    // the next step needs is freed while it waits.
                    if self.start_spool().await {
                        self.spool_item(item).await;
                        continue;
                    }
                    self.worker.release_scratch();
                    sender.reserve().await
                }
            };
            let Ok(room) = room else {
                self.worker.agent_gone = true;
                break;
            };
            room.send(item);
        }
        if self.worker.agent_gone {
            self.to_agent = None;
        }
        if self.worker.agent_ended {
            self.to_agent = None;
            if let Some(spool) = self.spool.take() {
                spool
                    .finish(self.worker.agent_error.take().map_or(Ok(()), Err))
                    .await;
            }
        }
    }

    /// Hands the user agent's body to a new spool, what waited in its
    /// channel first; false when there is no spool directory or the file
    /// cannot be made.
    async fn start_spool(&mut self) -> bool {
        let Some(dir) = &self.spool_dir else {
            return false;
        };
        match Spool::create(dir, MAX_SPOOL, &self.spool_disk) {
            Ok(spool) => {
                tracing::debug!(dir = %dir.display(), "the user agent stopped reading; spooling its body");
                let queued = spool.take_over(&self.feed);
                self.to_agent = None;
                self.spool = Some(spool);
                self.worker.release_scratch();
                for item in queued {
                    self.spool_item(item).await;
                }
                true
            }
            Err(error) => {
                if error.kind() == std::io::ErrorKind::StorageFull {
                    tracing::debug!(%error, "not spooling for a stalled user agent; waiting in memory");
                } else {
                    tracing::warn!(dir = %dir.display(), %error, "cannot spool for a stalled user agent; waiting in memory");
                }
                self.spool_dir = None;
                false
            }
        }
    }

    /// One item for the user agent, into the spool: data is written, an
    /// error is kept for the spool's end.
    async fn spool_item(&mut self, item: Result<Frame<Bytes>, BodyError>) {
        let Some(spool) = &mut self.spool else { return };
        match item {
            Ok(frame) => {
                if let Ok(data) = frame.into_data()
                    && spool.write(&data).await.is_err()
                {
                    // The user agent left, or the disk failed: as when a
                    // channel closes, nobody gets the rest.
                    self.worker.agent_gone = true;
                    self.spool = None;
                }
            }
            Err(error) => self.worker.agent_error = Some(error.to_string()),
        }
    }

    /// Waits for the background writer, if any, to write what it was
    /// given: the entry is then in `store` again (unless a write failed).
    async fn settle_writer(&mut self) {
        if let Some(writer) = self.worker.background.take() {
            self.worker.store = writer.finish().await;
        }
    }
}

//! The relay's task: it waits for upstream chunks, for the user agent
//! and for the background cache writer, and sends the worker to the
//! blocking pool only for the work on the bytes. A user agent that stops
//! reading costs its chunks in the channels and the worker's state, never
//! a thread; the pipe's [`Downstream`] parks its body in a spool, and the
//! worker's scratch buffers are freed when it stalls (L-13). What the
//! bytes are and whether they pass is the worker's business, not this
//! file's; the slices, channels and spool are the pipe's
//! ([`crate::http::body_pipe`]). Also says which upstream body errors
//! mean malformed framing rather than a cut.
//!
//! Main items: [`Driver`], [`is_malformed`].

use tokio::sync::mpsc;

use super::worker::{Ending, Stop, Worker};
use super::{Outcome, Report};
use crate::http::body_pipe::{Downstream, Stall, UpstreamChunk};
use crate::http::transfer_memory::ShareHolder;

/// Whether a body error says the upstream's framing was malformed (hyper
/// reports a bad chunk as an `InvalidInput`/`InvalidData` I/O error under
/// its body error) rather than that the stream was cut or reset.
fn is_malformed(error: &(dyn std::error::Error + 'static)) -> bool {
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

/// Runs a relay as a task: waits for upstream chunks, the user agent and
/// the cache writer asynchronously, and takes the blocking pool only for
/// the work on the bytes (decode, hash, cache writes, commit). A user
/// agent that stops reading costs its chunks in the channels and the
/// worker's state, never a thread (L-13).
pub(super) struct Driver {
    pub(super) worker: Box<Worker>,
    /// The user agent's body; `None` once it was ended, or the user agent
    /// left.
    pub(super) to_agent: Option<Downstream>,
    /// This relay's share of the transfer memory.
    pub(super) memory: ShareHolder,
    /// Time the worker's steps took on the blocking pool so far.
    pub(super) busy: std::time::Duration,
}

impl Driver {
    pub(super) async fn run(&mut self, mut from_upstream: mpsc::Receiver<UpstreamChunk>) -> Report {
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
        let mut committed_digest = None;
        let outcome = match ending {
            Ending::Done(outcome) => outcome,
            Ending::Commit(commit) => {
                let digest = commit.whole_digest();
                if commit.end_agent_first {
                    self.worker.end_agent();
                    self.flush().await;
                }
                let Some(stored) = self.blocking(move |worker| worker.commit(commit)).await else {
                    return self.lost().await;
                };
                self.flush().await;
                if matches!(stored, Outcome::Complete { stored: true }) {
                    committed_digest = digest;
                }
                stored
            }
        };
        Report {
            outcome,
            upstream_bytes: self.worker.upstream_bytes,
            body_bytes: self.worker.body_bytes,
            committed_digest,
            busy: self.busy,
        }
    }

    /// Runs `work` on the worker on the blocking pool; `None` when it
    /// panicked (or the runtime is shutting down), the worker lost with it.
    async fn blocking<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Worker) -> T + Send + 'static,
    ) -> Option<T> {
        let mut worker = std::mem::replace(&mut self.worker, Box::new(Worker::idle()));
        let (worker, result, took) = tokio::task::spawn_blocking(move || {
            let began = std::time::Instant::now();
            let result = work(&mut worker);
            (worker, result, began.elapsed())
        })
        .await
        .ok()?;
        self.worker = worker;
        self.busy += took;
        Some(result)
    }

    /// The worker was lost: the user agent's body fails rather than end
    /// (a dropped channel would end it cleanly, short), and nothing is
    /// stored (the entry writer's drop removes its files).
    async fn lost(&mut self) -> Report {
        tracing::error!("the relay's work on the body panicked; aborting the response");
        // The end that `relay` gives the body afterwards is then a no-op.
        self.worker.agent_ended = true;
        if let Some(to_agent) = self.to_agent.take() {
            to_agent
                .end(Err("the proxy failed while relaying this body".into()))
                .await;
        }
        Report {
            outcome: Outcome::Interrupted {
                partial_stored: false,
            },
            upstream_bytes: 0,
            body_bytes: 0,
            committed_digest: None,
            busy: self.busy,
        }
    }

    /// Hands what the last step produced to the cache writer and the user
    /// agent, waiting for each as long as it takes (the user agent's body
    /// is parked in a spool once it stops reading).
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
        let pieces = std::mem::take(&mut self.worker.to_agent);
        if let Some(to_agent) = &mut self.to_agent {
            let worker = &mut self.worker;
            for piece in &pieces {
                // A stalled user agent: what only the next step needs is
                // freed while the relay waits, or once its body is parked.
                let sent = to_agent
                    .send(piece, |stall| {
                        if stall == Stall::Stopped {
                            worker.release_scratch();
                        }
                    })
                    .await;
                if !sent {
                    // The user agent left, or its spool failed: nobody
                    // gets the rest.
                    worker.agent_gone = true;
                    break;
                }
            }
        }
        if self.worker.agent_gone {
            // (A spool dropped unfinished fails the body.)
            self.to_agent = None;
        }
        if self.worker.agent_ended
            && let Some(to_agent) = self.to_agent.take()
        {
            let result = match self.worker.agent_error.take() {
                Some(reason) => Err(reason.into()),
                None => Ok(()),
            };
            to_agent.end(result).await;
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

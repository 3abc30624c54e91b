//! Turns on the CPU for the accelerator's encoders ([`Encoders`]): a
//! coding waits for its turn without a thread, and borrows a blocking
//! thread only for a window's work, so a burst of large bodies leaves the
//! async workers, and cheap requests, their share of the CPU (D-S6).
//! Parked bodies' encoders take turns of their own. What the work is, is
//! the caller's.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::stats::Stats;
use crate::http::metrics::nanos;

/// Turns on the CPU for encoders (see
/// [`AcceleratorConfig::max_encoders`](super::AcceleratorConfig::max_encoders)),
/// and one more for the encoders of parked bodies.
#[derive(Clone)]
pub(super) struct Encoders {
    turns: Arc<Semaphore>,
    /// Parked bodies (their clients stopped reading) are background work:
    /// they take turns of their own, one at a time, so a thousand of them
    /// never stand between a client that reads and its turn (L-13's
    /// bystander).
    parked: Arc<Semaphore>,
}

impl Encoders {
    pub(super) fn new(turns: usize) -> Encoders {
        Encoders {
            turns: Arc::new(Semaphore::new(turns)),
            parked: Arc::new(Semaphore::new(1)),
        }
    }

    /// Runs `work` on a blocking thread once it is this encoder's turn
    /// (among parked bodies' encoders when `parked`). The turn is awaited
    /// here, holding no thread, and ends with the work (on its thread, so a
    /// caller that stops waiting cannot let another encoder start early).
    /// `None`: the work panicked.
    pub(super) async fn run<R: Send + 'static>(
        &self,
        stats: &Stats,
        parked: bool,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Option<R> {
        let lane = if parked { &self.parked } else { &self.turns };
        let turn = match lane.clone().try_acquire_owned() {
            Ok(turn) => Some(turn),
            Err(_) => {
                Stats::add(&stats.encoder_waits, 1);
                let waited = std::time::Instant::now();
                // Never closed, so `None` only if that changes.
                let turn = lane.clone().acquire_owned().await.ok();
                Stats::add(&stats.encoder_wait_nanos, nanos(waited.elapsed()));
                turn
            }
        };
        let (done, took) = tokio::task::spawn_blocking(move || {
            let began = std::time::Instant::now();
            let done = work();
            let took = began.elapsed();
            drop(turn);
            (done, took)
        })
        .await
        .ok()?;
        Stats::add(&stats.encode_busy_nanos, nanos(took));
        Some(done)
    }
}

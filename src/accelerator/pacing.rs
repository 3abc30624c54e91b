//! The measuring side of [`super::pace`]: [`Pacing`] holds a streamed
//! coding's encoder, times each window's encoding and how long the origin's
//! reader and the link each waited for it ([`Idle`]), and hands the
//! window's cost to the sans-IO [`Pacer`], which chooses whether the next
//! window's literals are entropy coded. It reads the clock; the decision
//! is the pacer's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::hsync::{EncodeError, Encoder};

use super::pace::{Pacer, WindowCost};

/// The encoder, and the pacer that turns its entropy coding on and off
/// from what each window cost to encode and to send (`None`: the
/// configured levels throughout).
pub(super) struct Pacing {
    pub(super) encoder: Encoder,
    pub(super) pacer: Option<Pacer>,
    /// The window being encoded: its bytes and time so far.
    window: WindowCost,
    /// `encoder.windows_encoded()` when the last window was recorded.
    windows: u64,
    /// How long each side has waited for the encoder, and how long it had
    /// when the last window was recorded.
    pub(super) idle: Arc<Idle>,
    idle_before: (Duration, Duration),
    /// When the last window was recorded (or encoding started).
    recorded_at: Instant,
}

impl Pacing {
    pub(super) fn new(encoder: Encoder, pacer: Option<Pacer>) -> Pacing {
        Pacing {
            encoder,
            pacer,
            window: WindowCost::default(),
            windows: 0,
            idle: Arc::default(),
            idle_before: (Duration::ZERO, Duration::ZERO),
            recorded_at: Instant::now(),
        }
    }

    pub(super) fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let started = Instant::now();
        let pushed = self.encoder.push(chunk, out);
        self.window.encode += started.elapsed();
        self.window.body_bytes += chunk.len() as u64;
        pushed
    }

    /// Records that `wire_bytes` of stream went out; once a window is
    /// complete, records what it cost and lets the pacer choose the next
    /// window's mode.
    pub(super) fn sent(&mut self, wire_bytes: u64) {
        let windows = self.encoder.windows_encoded();
        if windows == self.windows {
            return;
        }
        self.windows = windows;
        let idle = self.idle.read();
        let now = Instant::now();
        let window = WindowCost {
            coded: self.encoder.entropy_coding(),
            wire_bytes,
            span: now - self.recorded_at,
            origin_idle: idle.0 - self.idle_before.0,
            link_idle: idle.1 - self.idle_before.1,
            ..std::mem::take(&mut self.window)
        };
        self.idle_before = idle;
        self.recorded_at = now;
        if let Some(pacer) = &mut self.pacer
            && self.encoder.is_in_fast_stage()
        {
            self.encoder.set_entropy_coding(pacer.record(window));
        }
    }
}

/// Nanoseconds that the origin's reader and the link have each waited
/// for the encoder, in all (for [`Pacing`]).
#[derive(Debug, Default)]
pub(super) struct Idle {
    pub(super) origin: AtomicU64,
    pub(super) link: AtomicU64,
}

impl Idle {
    pub(super) fn add(counter: &AtomicU64, since: Instant) {
        let waited = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter.fetch_add(waited, Ordering::Relaxed);
    }

    /// The origin's and the link's time so far.
    fn read(&self) -> (Duration, Duration) {
        let read = |counter: &AtomicU64| Duration::from_nanos(counter.load(Ordering::Relaxed));
        (read(&self.origin), read(&self.link))
    }
}

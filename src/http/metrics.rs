//! What both roles' counters share beyond refusals
//! ([`crate::http::error::Refusals`]): how long upstream took to answer
//! ([`Latency`], a histogram of the time from sending a request to having
//! the response head, which each role keeps for its trips upstream: the
//! client proxy's to its upstream, the accelerator's to its origins), and
//! the arithmetic of the figures both report ([`saved_bytes`], [`millis`]).
//! The admin listener exposes them (`crate::admin`).
//!
//! Leaves out the bodies' time (a large body takes long for reasons of
//! its own) and failed trips (counted as refusals and upstream errors).
//!
//! Main type: [`Latency`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Bucket bounds in seconds: 1 ms to about 33 s, doubling, so a local
/// origin's milliseconds and a far upstream's seconds both show; the
/// default upstream timeout (30 s) falls in the last bucket.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
    8.192, 16.384, 32.768,
];

/// Response-head latencies upstream, as a histogram over
/// [`LATENCY_BUCKETS`]. Clones share the same counts. Plain atomics
/// rather than prometheus-client's `Histogram`, whose count and sum cannot
/// be read outside its exposition: the JSON stats report them too, from
/// the same counts.
#[derive(Debug, Clone, Default)]
pub struct Latency(Arc<LatencyCounts>);

#[derive(Debug, Default)]
struct LatencyCounts {
    /// Answers per bucket (not cumulative); past the last bound, none.
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    nanos: AtomicU64,
}

/// A [`Latency`] at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatencySnapshot {
    /// `(upper bound in seconds, answers in that bucket alone)`.
    pub buckets: Vec<(f64, u64)>,
    /// Answers counted (those past the last bound too).
    pub count: u64,
    /// Their time together.
    pub sum: Duration,
}

impl Latency {
    /// Counts one answer that took `took`.
    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        if let Some(bucket) = LATENCY_BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.0.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        self.0.count.fetch_add(1, Ordering::Relaxed);
        self.0.nanos.fetch_add(nanos(took), Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> LatencySnapshot {
        LatencySnapshot {
            buckets: LATENCY_BUCKETS
                .iter()
                .zip(&self.0.buckets)
                .map(|(bound, n)| (*bound, n.load(Ordering::Relaxed)))
                .collect(),
            count: self.0.count.load(Ordering::Relaxed),
            sum: Duration::from_nanos(self.0.nanos.load(Ordering::Relaxed)),
        }
    }
}

/// `delivered - link` as a signed count (negative while the link carried
/// more than was delivered), saturating far past any real byte count.
pub fn saved_bytes(delivered: u64, link: u64) -> i64 {
    let difference = i128::from(delivered) - i128::from(link);
    i64::try_from(difference).unwrap_or(if difference < 0 { i64::MIN } else { i64::MAX })
}

/// Whole nanoseconds of `duration`, saturating (for a counter of them).
pub fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Whole milliseconds of `duration`, saturating.
pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_fall_in_their_buckets_and_add_up() {
        let latency = Latency::default();
        latency.observe(Duration::from_millis(3));
        latency.clone().observe(Duration::from_millis(7));
        latency.observe(Duration::from_secs(60));
        let counted = latency.snapshot();
        assert_eq!(counted.count, 3, "clones share the counts");
        assert_eq!(counted.sum, Duration::from_millis(60_010));
        assert_eq!(counted.buckets[2], (0.004, 1));
        assert_eq!(counted.buckets[3], (0.008, 1));
        let bucketed: u64 = counted.buckets.iter().map(|(_, n)| n).sum();
        assert_eq!(bucketed, 2, "a minute is past the last bound");
    }

    #[test]
    fn saved_bytes_go_negative_and_saturate() {
        assert_eq!(saved_bytes(10, 3), 7);
        assert_eq!(saved_bytes(3, 10), -7);
        assert_eq!(saved_bytes(u64::MAX, 0), i64::MAX);
        assert_eq!(saved_bytes(0, u64::MAX), i64::MIN);
    }
}

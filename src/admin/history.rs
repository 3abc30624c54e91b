//! The status page's memory: the byte and request counters sampled every
//! [`SAMPLE_EVERY`] into two bounded rings, 10-second points for the last
//! hour and one-minute points for the last day, so the page can chart
//! savings over minutes and hours and say what the last five minutes
//! saved. Pure: the sampler's task (in `mod.rs`) hands it the time and
//! the figures.
//!
//! Leaves out persistence: a restart starts an empty history, as the
//! counters themselves start from zero.
//!
//! Main types: [`History`], [`Point`], [`Step`].

use std::collections::VecDeque;
use std::time::Duration;

use super::Figures;

/// How often the counters are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// Fine points kept: an hour of 10-second points.
const FINE_POINTS: usize = 360;

/// Spacing of the coarse points.
const COARSE_EVERY: Duration = Duration::from_secs(60);

/// Coarse points kept: a day of one-minute points.
const COARSE_POINTS: usize = 1440;

/// The cumulative counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Point {
    /// Seconds since the Unix epoch.
    pub at: u64,
    /// Bytes delivered so far.
    pub delivered_bytes: u64,
    /// Bytes on the link so far.
    pub link_bytes: u64,
    /// Requests so far.
    pub requests: u64,
}

impl Point {
    /// The figures that make a point, at `at` (Unix seconds).
    pub fn of(figures: &Figures, at: u64) -> Point {
        Point {
            at,
            delivered_bytes: figures.delivered_bytes,
            link_bytes: figures.link_bytes,
            requests: figures.requests,
        }
    }
}

/// What happened between two points.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Step {
    /// When the step ended (Unix seconds).
    pub at: u64,
    /// Its length in seconds.
    pub seconds: u64,
    /// Bytes delivered in it.
    pub delivered_bytes: u64,
    /// Bytes on the link in it.
    pub link_bytes: u64,
    /// Requests in it.
    pub requests: u64,
}

impl Step {
    /// Between `from` and `to` (counters only grow; a smaller one counts
    /// as nothing rather than wrapping).
    pub fn between(from: &Point, to: &Point) -> Step {
        Step {
            at: to.at,
            seconds: to.at.saturating_sub(from.at),
            delivered_bytes: to.delivered_bytes.saturating_sub(from.delivered_bytes),
            link_bytes: to.link_bytes.saturating_sub(from.link_bytes),
            requests: to.requests.saturating_sub(from.requests),
        }
    }

    /// Bytes saved in it (negative when the link carried more).
    pub fn saved_bytes(&self) -> i64 {
        crate::http::metrics::saved_bytes(self.delivered_bytes, self.link_bytes)
    }
}

/// Sampled counters: the last hour at 10 s, the last day at one minute.
#[derive(Debug, Default)]
pub struct History {
    fine: VecDeque<Point>,
    coarse: VecDeque<Point>,
}

impl History {
    /// Keeps `point`; the oldest fall out of the bounded rings.
    pub fn record(&mut self, point: Point) {
        push_bounded(&mut self.fine, point, FINE_POINTS);
        let coarse_due = self
            .coarse
            .back()
            .is_none_or(|last| point.at >= last.at + COARSE_EVERY.as_secs());
        if coarse_due {
            push_bounded(&mut self.coarse, point, COARSE_POINTS);
        }
    }

    /// What happened from the newest point at least `window` before
    /// `now` (or the oldest point, when the history is younger) up to
    /// `now`; `None` before the first point.
    pub fn since(&self, now: &Point, window: Duration) -> Option<Step> {
        let start = now.at.saturating_sub(window.as_secs());
        let ring = if window <= SAMPLE_EVERY * FINE_POINTS as u32 {
            &self.fine
        } else {
            &self.coarse
        };
        let from = ring
            .iter()
            .rev()
            .find(|point| point.at <= start)
            .or_else(|| ring.front())?;
        Some(Step::between(from, now))
    }

    /// The steps between consecutive 10-second points (the last hour).
    pub fn fine_steps(&self) -> Vec<Step> {
        steps(&self.fine)
    }

    /// The steps between consecutive one-minute points (the last day).
    pub fn coarse_steps(&self) -> Vec<Step> {
        steps(&self.coarse)
    }
}

fn push_bounded(ring: &mut VecDeque<Point>, point: Point, max: usize) {
    if ring.len() == max {
        ring.pop_front();
    }
    ring.push_back(point);
}

fn steps(ring: &VecDeque<Point>) -> Vec<Step> {
    ring.iter()
        .zip(ring.iter().skip(1))
        .map(|(from, to)| Step::between(from, to))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(at: u64, delivered: u64, link: u64) -> Point {
        Point {
            at,
            delivered_bytes: delivered,
            link_bytes: link,
            requests: at / 10,
        }
    }

    #[test]
    fn the_rings_stay_bounded_and_keep_the_newest() {
        let mut history = History::default();
        // Two days of 10-second samples.
        for n in 0..(2 * 8640) {
            history.record(point(n * 10, n * 100, n * 10));
        }
        assert_eq!(history.fine.len(), FINE_POINTS);
        assert_eq!(history.coarse.len(), COARSE_POINTS);
        assert_eq!(history.fine.back().unwrap().at, (2 * 8640 - 1) * 10);
        let steps = history.coarse_steps();
        assert_eq!(steps.len(), COARSE_POINTS - 1);
        assert!(steps.iter().all(|step| step.seconds == 60));
        assert!(steps.iter().all(|step| step.saved_bytes() == 6 * 90));
    }

    #[test]
    fn since_counts_from_the_point_before_the_window_or_the_first() {
        let mut history = History::default();
        assert_eq!(history.since(&point(0, 0, 0), SAMPLE_EVERY), None);
        for n in 0..=60 {
            history.record(point(n * 10, n * 1000, n * 100));
        }
        let now = point(605, 61_000, 6_100);
        let five_minutes = history.since(&now, Duration::from_secs(300)).unwrap();
        // The newest point at or before 305 s is the one at 300 s.
        assert_eq!(five_minutes.seconds, 305);
        assert_eq!(five_minutes.delivered_bytes, 31_000);
        assert_eq!(five_minutes.saved_bytes(), 31_000 - 3_100);
        let day = history.since(&now, Duration::from_secs(86_400)).unwrap();
        assert_eq!(day.seconds, 605, "younger than the window: from the start");
        assert_eq!(day.saved_bytes(), 61_000 - 6_100);
    }

    #[test]
    fn a_counter_that_went_back_counts_as_nothing() {
        let step = Step::between(&point(10, 500, 50), &point(20, 100, 10));
        assert_eq!((step.delivered_bytes, step.link_bytes), (0, 0));
    }
}

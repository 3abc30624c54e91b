//! The minimum upload rate of request bodies (RELIABILITY L-8), as
//! Apache's mod_reqtimeout `body=…,MinRate=…`: a body may be waited for a
//! grace time plus one second per `rate` bytes it brought so far; past
//! that it fails. Without it a body trickled at a byte a second never
//! idles out, and a few thousand such clients hold every connection slot
//! for ever (R.U.D.Y., the slowloris of bodies).
//!
//! The grace is the header-read timeout: a client gets as long to start
//! its body as to send its head, and one setting fewer states the rule
//! ("after its first 10 s, an upload must average 500 B/s").
//!
//! Only waiting counts: from a read that found no byte to the read that
//! found some. Time the role spends not reading the body (an origin that
//! reads it slowly, a queue) is not the client's, and a client cannot send
//! into a full window anyway.
//!
//! The arithmetic is sans-IO: [`BodyClock`] takes `now`. [`UploadWatch`]
//! puts the timer that wakes a waiting read at the deadline on it, for the
//! two readers that enforce the rate: over HTTP/1.1 the connection's I/O
//! (`io.rs`), over HTTP/2 each stream's body (`request_body.rs`). What the
//! client is answered is `refusal.rs`'s.
//!
//! Main types: [`MinUploadRate`], [`BodyClock`], [`UploadWatch`],
//! [`SlowUpload`].

use std::future::Future;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::limits::ConnectionLimits;

/// The least rate a request body must average past its grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MinUploadRate {
    grace: Duration,
    bytes_per_sec: NonZeroU64,
}

impl MinUploadRate {
    /// The rate `limits` set, with the header-read timeout as its grace;
    /// `None` when it is off (0).
    pub(super) fn of(limits: &ConnectionLimits) -> Option<MinUploadRate> {
        Some(MinUploadRate {
            grace: limits.header_read_timeout,
            bytes_per_sec: NonZeroU64::new(limits.min_upload_bytes_per_sec)?,
        })
    }

    /// How long a body that brought `received` bytes may have been waited
    /// for: the grace, and a second per `bytes_per_sec` of them.
    pub(super) fn allowance(self, received: u64) -> Duration {
        let rate = self.bytes_per_sec.get();
        // Whole seconds, then the rest in nanoseconds (below 10^9, and
        // computed wide so that no rate overflows it).
        let nanos = u128::from(received % rate) * 1_000_000_000 / u128::from(rate);
        let earned = Duration::from_secs(received / rate).saturating_add(Duration::from_nanos(
            u64::try_from(nanos).expect("below a second"),
        ));
        self.grace.saturating_add(earned)
    }
}

/// The waiting for one request body so far.
///
/// Part of a wait may be excused: `excused` is a reading, at `now`, of a
/// clock that runs while the body's waits are not the client's doing and
/// stands still otherwise (over HTTP/2, while another stream of the
/// connection may hold the window all its streams share:
/// `request_body.rs`); [`Duration::ZERO`] where nothing is excused. What
/// it ran during a wait does not count.
#[derive(Debug, Default)]
pub(super) struct BodyClock {
    /// Waits that ended: the bytes came.
    waited: Duration,
    /// When the wait under way began, if one is, and the excused clock's
    /// reading then.
    since: Option<(Instant, Duration)>,
}

impl BodyClock {
    /// A read of the body found no byte at `now`: the deadline by which
    /// its next bytes must come, `received` bytes having come so far.
    ///
    /// Never earlier than the deadline of an earlier wait of the same body:
    /// a wait that ends adds to `waited` what it took (less what was
    /// excused of it), and its bytes add at least as much to the
    /// allowance, less nothing. So a timer set at an older deadline only
    /// ever fires early, never late.
    pub(super) fn waiting(
        &mut self,
        now: Instant,
        excused: Duration,
        rate: MinUploadRate,
        received: u64,
    ) -> Instant {
        let (since, excused_since) = *self.since.get_or_insert((now, excused));
        since
            + rate.allowance(received).saturating_sub(self.waited)
            + excused.saturating_sub(excused_since)
    }

    /// Whether a wait is under way (a read found no byte, and none found
    /// any since).
    pub(super) fn is_waiting(&self) -> bool {
        self.since.is_some()
    }

    /// A read of the body found bytes, or its end, at `now`.
    pub(super) fn arrived(&mut self, now: Instant, excused: Duration) {
        let wait = self.wait(now, excused);
        self.waited += wait;
        self.since = None;
    }

    /// The time waited so far, up to `now`.
    pub(super) fn waited(&self, now: Instant, excused: Duration) -> Duration {
        self.waited + self.wait(now, excused)
    }

    /// What counts of the wait under way, up to `now`.
    fn wait(&self, now: Instant, excused: Duration) -> Duration {
        self.since.map_or(Duration::ZERO, |(since, excused_since)| {
            now.saturating_duration_since(since)
                .saturating_sub(excused.saturating_sub(excused_since))
        })
    }
}

/// One request body's waiting under the minimum upload rate, with the
/// timer that wakes its reader at the deadline.
#[derive(Debug)]
pub(super) struct UploadWatch {
    clock: BodyClock,
    /// Wakes a read waiting for the body at its deadline, or at an older
    /// one, earlier (see [`BodyClock::waiting`]): reset when it fires, not
    /// at every byte.
    timer: Pin<Box<Sleep>>,
    /// Set once the body came too slowly: every later read fails the same.
    failed: Option<SlowUpload>,
}

impl UploadWatch {
    /// A watch whose body has not been waited for yet.
    pub(super) fn new() -> UploadWatch {
        UploadWatch {
            clock: BodyClock::default(),
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            failed: None,
        }
    }

    /// A read of the body found no byte, `received` bytes having come so
    /// far: pending (and `cx` woken at the deadline) while the body is
    /// within the rate, the failure once it is not. `excused` reads the
    /// clock of excused time (see [`BodyClock`]).
    pub(super) fn poll_wait(
        &mut self,
        cx: &mut Context<'_>,
        rate: MinUploadRate,
        received: u64,
        excused: impl Fn(Instant) -> Duration,
    ) -> Poll<SlowUpload> {
        if let Some(slow) = self.failed {
            return Poll::Ready(slow);
        }
        let now = Instant::now();
        let excused = excused(now);
        let deadline = self.clock.waiting(now, excused, rate, received);
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if now >= deadline {
                let slow = SlowUpload::new(rate, self.clock.waited(now, excused), received);
                tracing::debug!(%slow, "request body below the minimum upload rate");
                self.failed = Some(slow);
                return Poll::Ready(slow);
            }
            // Fired at an older deadline, which the body's bytes (or
            // excused time) have since pushed back.
            self.timer.as_mut().reset(deadline);
        }
    }

    /// A read of the body found bytes, or its end: the wait under way, if
    /// any, is over.
    pub(super) fn arrived(&mut self, excused: impl Fn(Instant) -> Duration) {
        if self.clock.is_waiting() {
            let now = Instant::now();
            self.clock.arrived(now, excused(now));
        }
    }

    /// The failure, once the body came too slowly.
    pub(super) fn failed(&self) -> Option<SlowUpload> {
        self.failed
    }
}

/// The excused clock (see [`BodyClock`]) of a body whose waits are all
/// its client's: over HTTP/1.1, one body at a time comes on a connection.
pub(super) fn nothing_excused(_now: Instant) -> Duration {
    Duration::ZERO
}

/// The error under the I/O error a request body's reader gets when the
/// body came slower than the minimum upload rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "request body slower than {min_rate} B/s after a grace of {grace:?}: \
     {received} bytes in {waited:.1?} of waiting"
)]
pub(super) struct SlowUpload {
    /// Body bytes that came, chunk framing included.
    pub(super) received: u64,
    /// Time spent waiting for them.
    pub(super) waited: Duration,
    /// The rate (bytes per second).
    pub(super) min_rate: u64,
    pub(super) grace: Duration,
}

impl SlowUpload {
    /// The failure of a body that brought `received` bytes in `waited` of
    /// waiting.
    pub(super) fn new(rate: MinUploadRate, waited: Duration, received: u64) -> SlowUpload {
        SlowUpload {
            received,
            waited,
            min_rate: rate.bytes_per_sec.get(),
            grace: rate.grace,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(grace_secs: u64, bytes_per_sec: u64) -> MinUploadRate {
        MinUploadRate::of(&ConnectionLimits {
            header_read_timeout: Duration::from_secs(grace_secs),
            min_upload_bytes_per_sec: bytes_per_sec,
            ..ConnectionLimits::default()
        })
        .unwrap()
    }

    #[test]
    fn the_allowance_is_the_grace_and_a_second_per_rate_bytes() {
        let apache = rate(20, 500);
        assert_eq!(apache.allowance(0), Duration::from_secs(20));
        assert_eq!(apache.allowance(500), Duration::from_secs(21));
        assert_eq!(apache.allowance(750), Duration::from_millis(21_500));
        assert_eq!(apache.allowance(1), Duration::from_millis(20_002));
        // Rates and byte counts at the edges neither overflow nor panic.
        let fast = rate(0, u64::MAX);
        assert_eq!(
            fast.allowance(u64::MAX - 1),
            Duration::from_nanos(999_999_999)
        );
        assert!(apache.allowance(u64::MAX) > Duration::from_secs(1 << 40));
        assert_eq!(
            rate(0, 1).allowance(u64::MAX),
            Duration::from_secs(u64::MAX)
        );
    }

    #[test]
    fn a_rate_of_zero_is_off() {
        let off = ConnectionLimits {
            min_upload_bytes_per_sec: 0,
            ..ConnectionLimits::default()
        };
        assert_eq!(MinUploadRate::of(&off), None);
        // On by default, with the header-read timeout as its grace.
        let default = MinUploadRate::of(&ConnectionLimits::default()).unwrap();
        assert_eq!(default.allowance(0), Duration::from_secs(10));
        assert_eq!(default.allowance(500), Duration::from_secs(11));
    }

    #[test]
    fn only_the_time_spent_waiting_counts() {
        let rate = rate(1, 100);
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let none = Duration::ZERO;
        let mut clock = BodyClock::default();
        assert_eq!(clock.waiting(at(0), none, rate, 0), at(1000));
        assert!(clock.is_waiting());
        // A second wait within the same one keeps its start.
        assert_eq!(clock.waiting(at(400), none, rate, 0), at(1000));
        clock.arrived(at(500), none);
        assert!(!clock.is_waiting());
        assert_eq!(clock.waited(at(9_000), none), Duration::from_millis(500));
        // 9 s with no read asked for (the role was not reading): not
        // counted. 50 bytes earned half a second.
        assert_eq!(clock.waiting(at(9_500), none, rate, 50), at(9_500 + 1_000));
        assert_eq!(clock.waited(at(9_700), none), Duration::from_millis(700));
    }

    #[test]
    fn excused_time_within_a_wait_does_not_count() {
        let rate = rate(1, 100);
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let ms = Duration::from_millis;
        let mut clock = BodyClock::default();
        // The excused clock reads 5 s when the wait begins (what it ran
        // before is not this body's business).
        assert_eq!(clock.waiting(at(0), ms(5_000), rate, 0), at(1000));
        // It ran 600 ms since: the deadline moves as much.
        assert_eq!(clock.waiting(at(800), ms(5_600), rate, 0), at(1600));
        assert_eq!(clock.waited(at(800), ms(5_600)), ms(200));
        clock.arrived(at(900), ms(5_600));
        assert_eq!(clock.waited(at(2_000), ms(9_000)), ms(300));
        // The next wait: 700 ms of allowance left, none excused.
        assert_eq!(clock.waiting(at(2_000), ms(9_000), rate, 0), at(2_700));
    }

    #[test]
    fn a_trickle_below_the_rate_runs_out_and_one_above_it_never_does() {
        // 20 B every 100 ms is 200 B/s: under a minimum of 400, over one
        // of 100.
        for (min, runs_out) in [(400, true), (100, false)] {
            let rate = rate(1, min);
            let start = Instant::now();
            let mut clock = BodyClock::default();
            let mut received = 0;
            let mut ran_out = false;
            for step in 0..100 {
                let asked = start + Duration::from_millis(step * 100);
                let deadline = clock.waiting(asked, Duration::ZERO, rate, received);
                let came = asked + Duration::from_millis(100);
                if came > deadline {
                    ran_out = true;
                    // 1 s free, then 200 B/s earns half a second a
                    // second: after 1.9 s of waiting for 380 bytes, the
                    // allowance is 1.95 s, and the next 20 take until 2.
                    assert_eq!(deadline, start + Duration::from_millis(1950));
                    break;
                }
                clock.arrived(came, Duration::ZERO);
                received += 20;
            }
            assert_eq!(ran_out, runs_out, "{min}");
        }
    }

    #[test]
    fn a_later_wait_never_has_an_earlier_deadline() {
        let rate = rate(2, 300);
        let start = Instant::now();
        let mut clock = BodyClock::default();
        let mut last = clock.waiting(start, Duration::ZERO, rate, 0);
        let mut now = start;
        // (wait, bytes received so far once it ended)
        for (gap, received) in [(700, 1), (1, 1), (1200, 3001), (50, 3008), (400, 3008)] {
            now += Duration::from_millis(gap);
            clock.arrived(now, Duration::ZERO);
            // The next read may come a little later still.
            now += Duration::from_millis(3);
            let deadline = clock.waiting(now, Duration::ZERO, rate, received);
            assert!(deadline >= last, "{gap} ms, {received} bytes");
            last = deadline;
        }
    }

    #[test]
    fn the_failure_says_what_came_in_what_time() {
        let rate = rate(1, 100);
        let start = Instant::now();
        let mut clock = BodyClock::default();
        clock.waiting(start, Duration::ZERO, rate, 0);
        let waited = clock.waited(start + Duration::from_millis(1400), Duration::ZERO);
        let slow = SlowUpload::new(rate, waited, 40);
        assert_eq!(
            slow.to_string(),
            "request body slower than 100 B/s after a grace of 1s: 40 bytes in 1.4s of waiting"
        );
    }
}

//! Whether an upstream is worth a request: one [`Health`] per accelerator
//! origin and per client-proxy upstream proxy, fed by the requests that go
//! there (passive) and, for an accelerator site with a `health-path`, by a
//! periodic check (active, the accelerator's `checks.rs`).
//!
//! What counts as a failure: a connection that could not be opened
//! (refused, unreachable, a name that does not resolve, TLS that fails,
//! the connect timeout) and no response head within the head timeout.
//! What does not: any answer, a 5xx included (the upstream is there and
//! said so; its answer is the client's to judge), a body cut after the
//! head, a refusal that was the request's own fault (its body, the address
//! policy). `failures` consecutive failures mark the upstream down for
//! `down_time`; one success marks it up.
//!
//! While it is down, requests are refused at once (the caller answers 503
//! with `Retry-After`, or goes another way) instead of each waiting for its
//! own connect timeout. Once the down period has passed, one request is let
//! through as a probe (half-open, as a circuit breaker does): the others
//! are still refused until its result is in. A failed probe doubles the
//! period, up to `max_down_time`; a probe that reports nothing (its client
//! went away) lets another through after one more period, so nothing stays
//! down for good. Failures of requests let through before it went down do
//! not lengthen the period: they say nothing new.
//!
//! Leaves out: where a refused request goes instead (the client proxy's
//! routes), the active check itself, and the clock: every method that
//! needs the time takes `now` (tokio's [`Instant`], which follows a paused
//! test clock).
//!
//! Main types: [`Health`], [`HealthPolicy`], [`Admission`], [`HealthView`].

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// When an upstream is marked down, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// Consecutive failures that mark it down (0: never).
    pub failures: u32,
    /// How long it stays down the first time.
    pub down_time: Duration,
    /// The longest it stays down: each failed probe doubles the period up
    /// to this.
    pub max_down_time: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            failures: 3,
            down_time: Duration::from_secs(10),
            max_down_time: Duration::from_secs(60),
        }
    }
}

/// What a request for the upstream may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Go: the upstream is up.
    Go,
    /// Go as the probe of a down upstream whose period has passed.
    Probe,
    /// Do not go: it is down (or another request probes it).
    Refused {
        /// When it is tried again (zero: a probe is under way).
        retry_in: Duration,
    },
}

/// What is known of one upstream: its failures and whether it is down.
#[derive(Debug)]
pub struct Health {
    name: String,
    policy: HealthPolicy,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Default)]
struct State {
    /// Consecutive failures, up to now.
    failures: u32,
    last_error: Option<String>,
    down: Option<Down>,
    /// How many times it was marked down.
    times_down: u64,
}

#[derive(Debug, Clone, Copy)]
struct Down {
    since: Instant,
    /// No request before this, except a probe's.
    until: Instant,
    /// The current down period (doubled by a failed probe).
    period: Duration,
    /// A probe was let through and has not reported.
    probing: bool,
}

/// An upstream's health as the status page and metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthView {
    /// The upstream: an origin's or upstream proxy's URL,
    /// `http://host:port`.
    pub name: String,
    /// Up or down.
    pub state: HealthState,
    /// Consecutive failures, up to now (0 after a success).
    pub failures: u32,
    /// The last failure, when there was one (it stays after a success).
    pub last_error: Option<String>,
    /// How many times it was marked down since it was configured (a
    /// counter: reloads carry it over).
    pub times_down: u64,
}

/// Whether requests go to an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    /// They do.
    Up,
    /// They are refused (or go another way).
    Down {
        /// How long it has been down.
        down_for: Duration,
        /// When a request probes it again (zero: the next one does, or
        /// one does now).
        retry_in: Duration,
    },
}

impl Health {
    /// An upstream, `name`d as logs and views show it, up.
    pub fn new(name: impl Into<String>, policy: HealthPolicy) -> Health {
        Health {
            name: name.into(),
            policy,
            state: Mutex::new(State::default()),
        }
    }

    /// The same upstream under a new `policy` (a reload): what `previous`
    /// knew of it carries over.
    pub fn continuing(previous: &Health, policy: HealthPolicy) -> Health {
        Health {
            name: previous.name.clone(),
            policy,
            state: Mutex::new(previous.lock().clone()),
        }
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Nothing under the lock panics; a poisoned one is still sound.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether it is down and not due for a probe: a way to skip when
    /// there are others. Changes nothing.
    pub fn is_down(&self, now: Instant) -> bool {
        self.lock().down.is_some_and(|down| now < down.until)
    }

    /// Whether a request may go now. A down upstream whose period has
    /// passed takes this request as its probe, and refuses the others
    /// for one more period or until the probe reports.
    pub fn admit(&self, now: Instant) -> Admission {
        let mut state = self.lock();
        let Some(down) = state.down.as_mut() else {
            return Admission::Go;
        };
        if now < down.until {
            return Admission::Refused {
                retry_in: down.until - now,
            };
        }
        down.until = now + down.period;
        down.probing = true;
        tracing::debug!(upstream = %self.name, "probing an upstream marked down");
        Admission::Probe
    }

    /// A request (or check) got an answer: it is up.
    pub fn record_success(&self, now: Instant) {
        let mut state = self.lock();
        state.failures = 0;
        if let Some(down) = state.down.take() {
            tracing::info!(
                upstream = %self.name,
                down_secs = now.saturating_duration_since(down.since).as_secs(),
                "upstream up again"
            );
        }
    }

    /// A request (or check) failed as the module doc says counts, with
    /// `error` saying how.
    pub fn record_failure(&self, error: impl Into<String>, now: Instant) {
        let mut state = self.lock();
        state.failures = state.failures.saturating_add(1);
        state.last_error = Some(error.into());
        let failures = state.failures;
        match state.down.as_mut() {
            // The probe's failure, or a check's once the period has
            // passed: down for longer.
            Some(down) if down.probing || now >= down.until => {
                down.period = (down.period * 2).min(self.policy.max_down_time);
                down.until = now + down.period;
                down.probing = false;
                tracing::debug!(
                    upstream = %self.name,
                    retry_secs = down.period.as_secs_f64(),
                    "upstream still down"
                );
            }
            // A request let through before it went down.
            Some(_) => {}
            None if self.policy.failures > 0 && failures >= self.policy.failures => {
                let period = self.policy.down_time.min(self.policy.max_down_time);
                state.down = Some(Down {
                    since: now,
                    until: now + period,
                    period,
                    probing: false,
                });
                state.times_down += 1;
                tracing::warn!(
                    upstream = %self.name,
                    failures = state.failures,
                    error = state.last_error.as_deref().unwrap_or(""),
                    retry_secs = period.as_secs_f64(),
                    "upstream marked down"
                );
            }
            None => {}
        }
    }

    /// What is known of it now.
    pub fn view(&self, now: Instant) -> HealthView {
        let state = self.lock();
        HealthView {
            name: self.name.clone(),
            state: match state.down {
                Some(down) => HealthState::Down {
                    down_for: now.saturating_duration_since(down.since),
                    retry_in: down.until.saturating_duration_since(now),
                },
                None => HealthState::Up,
            },
            failures: state.failures,
            last_error: state.last_error.clone(),
            times_down: state.times_down,
        }
    }
}

impl HealthView {
    /// Whether requests go to it.
    pub fn is_up(&self) -> bool {
        self.state == HealthState::Up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn policy() -> HealthPolicy {
        HealthPolicy {
            failures: 3,
            down_time: 10 * SECOND,
            max_down_time: 30 * SECOND,
        }
    }

    /// Marks `health` down with three failures at `now`.
    fn take_down(health: &Health, now: Instant) {
        for _ in 0..3 {
            health.record_failure("connection refused", now);
        }
    }

    #[test]
    fn fewer_failures_than_the_policy_leave_it_up_and_a_success_starts_over() {
        let health = Health::new("http://a:1", policy());
        let now = Instant::now();
        health.record_failure("refused", now);
        health.record_failure("refused", now);
        health.record_success(now);
        health.record_failure("refused", now);
        health.record_failure("refused", now);
        assert_eq!(health.admit(now), Admission::Go);
        let view = health.view(now);
        assert!(view.is_up());
        assert_eq!(view.failures, 2);
        assert_eq!(view.last_error.as_deref(), Some("refused"));
        assert_eq!(view.times_down, 0);
    }

    #[test]
    fn n_failures_refuse_requests_until_the_period_has_passed() {
        let health = Health::new("http://a:1", policy());
        let now = Instant::now();
        take_down(&health, now);
        assert!(health.is_down(now));
        assert_eq!(
            health.admit(now + 4 * SECOND),
            Admission::Refused {
                retry_in: 6 * SECOND
            }
        );
        assert_eq!(
            health.view(now + 4 * SECOND).state,
            HealthState::Down {
                down_for: 4 * SECOND,
                retry_in: 6 * SECOND
            }
        );
        assert_eq!(health.view(now).times_down, 1);
    }

    #[test]
    fn one_request_probes_after_the_period_and_its_success_brings_it_up() {
        let health = Health::new("http://a:1", policy());
        let now = Instant::now();
        take_down(&health, now);
        let later = now + 10 * SECOND;
        assert!(!health.is_down(later), "due for a probe");
        assert_eq!(health.admit(later), Admission::Probe);
        // Everyone else waits for the probe.
        assert!(matches!(health.admit(later), Admission::Refused { .. }));
        assert!(health.is_down(later));
        health.record_success(now);
        assert_eq!(health.admit(later), Admission::Go);
        assert!(health.view(later).is_up());
        assert_eq!(health.view(later).failures, 0);
    }

    #[test]
    fn a_failed_probe_doubles_the_period_up_to_the_most() {
        let health = Health::new("http://a:1", policy());
        let mut now = Instant::now();
        take_down(&health, now);
        for expected in [20, 30, 30] {
            now += 60 * SECOND;
            assert_eq!(health.admit(now), Admission::Probe);
            health.record_failure("still refused", now);
            assert_eq!(
                health.admit(now),
                Admission::Refused {
                    retry_in: expected * SECOND
                }
            );
        }
        assert_eq!(health.view(now).times_down, 1, "one outage");
    }

    #[test]
    fn failures_of_requests_let_through_earlier_do_not_lengthen_the_period() {
        let health = Health::new("http://a:1", policy());
        let now = Instant::now();
        take_down(&health, now);
        for _ in 0..5 {
            health.record_failure("timed out", now + SECOND);
        }
        assert_eq!(
            health.admit(now + SECOND),
            Admission::Refused {
                retry_in: 9 * SECOND
            }
        );
    }

    #[test]
    fn a_probe_that_never_reports_lets_another_through_a_period_later() {
        let health = Health::new("http://a:1", policy());
        let now = Instant::now();
        take_down(&health, now);
        let first = now + 10 * SECOND;
        assert_eq!(health.admit(first), Admission::Probe);
        assert!(matches!(
            health.admit(first + 9 * SECOND),
            Admission::Refused { .. }
        ));
        assert_eq!(health.admit(first + 10 * SECOND), Admission::Probe);
    }

    #[test]
    fn a_check_failing_after_the_period_counts_as_a_failed_probe() {
        let health = Health::new("http://a:1", policy());
        let now = Instant::now();
        take_down(&health, now);
        health.record_failure("health check answered 503", now + 10 * SECOND);
        assert_eq!(
            health.admit(now + 10 * SECOND),
            Admission::Refused {
                retry_in: 20 * SECOND
            }
        );
    }

    #[test]
    fn a_policy_of_zero_failures_never_marks_it_down() {
        let health = Health::new(
            "http://a:1",
            HealthPolicy {
                failures: 0,
                ..policy()
            },
        );
        let now = Instant::now();
        for _ in 0..100 {
            health.record_failure("refused", now);
        }
        assert_eq!(health.admit(now), Admission::Go);
        assert_eq!(health.view(now).failures, 100);
    }

    #[test]
    fn a_reload_carries_the_state_over_under_the_new_policy() {
        let health = Health::new("http://a:1", policy());
        let now = Instant::now();
        take_down(&health, now);
        let reloaded = Health::continuing(
            &health,
            HealthPolicy {
                max_down_time: 100 * SECOND,
                ..policy()
            },
        );
        assert_eq!(reloaded.name(), "http://a:1");
        assert!(reloaded.is_down(now));
        assert_eq!(reloaded.admit(now + 10 * SECOND), Admission::Probe);
        reloaded.record_failure("refused", now + 10 * SECOND);
        assert_eq!(
            reloaded.admit(now + 10 * SECOND),
            Admission::Refused {
                retry_in: 20 * SECOND
            }
        );
    }
}

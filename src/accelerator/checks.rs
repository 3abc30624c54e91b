//! The active health checks: for each site whose origin has a
//! `health-path`, a GET of it every `health-interval`, through the site's
//! own pool, naming the site (or, for the `--origin` shorthand, the
//! origin) in `Host`. A 2xx or 3xx answer within
//! the interval (or `origin-timeout`, if shorter) marks the origin up; any
//! other status, no connection or no answer in time counts as a failure,
//! as a request's would (the passive side, `origin.rs`).
//!
//! Checks run on tasks of their own, which end once the sites they were
//! made for are gone (a reload replaced them; the new sites' checks are
//! started with them).
//!
//! Leaves out what a failure means (when the origin is marked down, and
//! for how long: [`crate::http::health`]).
//!
//! Main items: [`Check`], [`run`].

use std::sync::Weak;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::sites::OriginClient;
use crate::http::error::error_chain;
use crate::http::health::Health;

/// The most of a check's answer read (and thrown away) so that its
/// connection goes back to the pool; a longer one is dropped, connection
/// and all.
const MAX_CHECK_BODY: usize = 64 << 10;

/// One origin's check.
pub(super) struct Check {
    /// `scheme://authority/health-path`.
    pub url: Uri,
    /// Sent as `Host`.
    pub host: HeaderValue,
    /// The site's pool.
    pub client: OriginClient,
    /// What the check feeds; gone with the sites.
    pub health: Weak<Health>,
}

/// Runs `checks` every `interval`, each waiting at most `timeout` for its
/// answer, until the sites they were made for are gone.
pub(super) async fn run(checks: Vec<Check>, interval: Duration, timeout: Duration) {
    let mut tasks = JoinSet::new();
    for check in checks {
        tasks.spawn(check.repeat(interval, timeout));
    }
    // Dropping the set (this future aborted) aborts the checks.
    while tasks.join_next().await.is_some() {}
}

impl Check {
    async fn repeat(self, interval: Duration, timeout: Duration) {
        let mut ticks = tokio::time::interval(interval);
        // A check slower than the interval delays the next; it does not
        // make the next ones run back to back.
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let Some(health) = self.health.upgrade() else {
                return;
            };
            match self.once(timeout).await {
                Ok(()) => health.record_success(Instant::now()),
                Err(error) => {
                    tracing::debug!(url = %self.url, %error, "health check failed");
                    health.record_failure(error, Instant::now());
                }
            }
        }
    }

    /// One GET of the health path: `Err` says why it failed.
    async fn once(&self, timeout: Duration) -> Result<(), String> {
        let mut request = Request::new(
            Empty::<Bytes>::new()
                .map_err(|never| match never {})
                .boxed(),
        );
        *request.uri_mut() = self.url.clone();
        request
            .headers_mut()
            .insert(header::HOST, self.host.clone());
        request.headers_mut().insert(
            header::USER_AGENT,
            HeaderValue::from_static("rproxy-health-check"),
        );
        let path = self.url.path();
        let response = match tokio::time::timeout(timeout, self.client.request(request)).await {
            Err(_) => return Err(format!("health check {path}: no answer within {timeout:?}")),
            Ok(Err(error)) => {
                return Err(format!("health check {path}: {}", error_chain(&error)));
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        // The body is of no interest; read, a short one lets the
        // connection serve the next check.
        let body = Limited::new(response.into_body(), MAX_CHECK_BODY).collect();
        let _ = tokio::time::timeout(timeout, body).await;
        if status.is_success() || status.is_redirection() {
            Ok(())
        } else {
            Err(format!("health check {path} answered {status}"))
        }
    }
}

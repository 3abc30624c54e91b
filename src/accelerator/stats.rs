//! The accelerator's counters, served as JSON at [`STATS_PATH`]: how many
//! requests were coded, passed through, refused (by fault) or queued, and
//! what the coded ones weighed, and a parent's tunnels. Counting only: where each counter moves is
//! the role's business.
//!
//! Main type: [`Stats`].

use std::sync::atomic::{AtomicU64, Ordering};

use crate::http::error::{ErrorKind, Refusals};
use crate::http::metrics::{Latency, millis, saved_bytes};

/// The path where each proxy answers with its counters as JSON (it shadows
/// the same path at the origin).
pub const STATS_PATH: &str = "/.rproxy/stats";

/// Counters for `GET /.rproxy/stats`, which anyone who reaches the
/// accelerator may read: aggregates only. No counter moves with whether a
/// named basis was held (there was one, `coded_against_body`): read before
/// and after one's own request, it told which bodies are held just as the
/// codec does, for bodies the codec no longer reveals (D-B3). The request
/// log line says which basis each response was coded against, for the
/// operator.
#[derive(Debug, Default)]
pub struct Stats {
    pub(super) requests: AtomicU64,
    pub(super) coded: AtomicU64,
    pub(super) passed: AtomicU64,
    /// Every refusal the role made, by whose fault it was.
    refusals: Refusals,
    /// Answered from the upload queue (503 with or without a place): an
    /// overload answer, counted apart from refusals as before.
    pub(super) queued: AtomicU64,
    pub(super) body_bytes: AtomicU64,
    pub(super) stream_bytes: AtomicU64,
    pub(super) encoder_waits: AtomicU64,
    /// Coded bodies parked in a spool for a client that stopped reading.
    pub(super) spooled: AtomicU64,
    /// CONNECT tunnels a parent-mode site opened (the target connected,
    /// 200 answered).
    pub(super) tunnels: AtomicU64,
    /// Bytes relayed through them, both ways, counted as each ends.
    pub(super) tunnel_bytes: AtomicU64,
    /// Body bytes of responses passed through uncoded, as sent.
    pub(super) passed_bytes: AtomicU64,
    /// Time encoders spent coding on blocking threads, in nanoseconds.
    pub(super) encode_busy_nanos: AtomicU64,
    /// Time codings waited for an encoder's turn, in nanoseconds.
    pub(super) encoder_wait_nanos: AtomicU64,
    /// Time from a request sent to an origin to its response head.
    pub(super) origin_latency: Latency,
    /// Held bodies looked up in the shared basis store that failed or
    /// timed out, coded without them.
    pub(super) basis_fallbacks: AtomicU64,
}

/// The accelerator's counters at one moment, as `/.rproxy/stats` shows
/// them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatsSnapshot {
    /// Requests received, stats polls left out.
    pub requests: u64,
    /// Responses coded with hsync.
    pub coded: u64,
    /// Responses passed through uncoded.
    pub passed: u64,
    /// Requests refused: the sum of the four `refused_*` below.
    pub refused: u64,
    /// Refused as the request's fault.
    pub refused_client: u64,
    /// Refused as the origin's fault.
    pub refused_upstream: u64,
    /// Refused because we are full.
    pub refused_overload: u64,
    /// Refused as our own failure.
    pub refused_proxy: u64,
    /// Answered from the upload queue (503, with or without a place).
    pub queued: u64,
    /// Body bytes of coded responses, as the origin sent them.
    pub coded_body_bytes: u64,
    /// Bytes of the hsync streams that carried them.
    pub coded_stream_bytes: u64,
    /// Codings that waited for an encoder's turn.
    pub encoder_waits: u64,
    /// Coded bodies parked for clients that stopped reading.
    pub spooled: u64,
    /// CONNECT tunnels opened.
    pub tunnels: u64,
    /// Bytes relayed by tunnels that ended, both ways.
    pub tunnel_bytes: u64,
    /// Body bytes of passed-through responses.
    #[serde(default)]
    pub passed_bytes: u64,
    /// Bytes on the hsync link: coded streams and passed bodies
    /// (`coded_stream_bytes + passed_bytes`).
    #[serde(default)]
    pub link_bytes: u64,
    /// Bytes the origins sent for them (`coded_body_bytes +
    /// passed_bytes`).
    #[serde(default)]
    pub delivered_bytes: u64,
    /// `delivered_bytes - link_bytes`: what coding saved on the link.
    #[serde(default)]
    pub saved_bytes: i64,
    /// Response heads received from origins.
    #[serde(default)]
    pub upstream_responses: u64,
    /// Lookups in the shared basis store (Redis) that failed or timed
    /// out: those bodies were coded without the held body (rsync).
    #[serde(default)]
    pub basis_fallbacks: u64,
    /// The times below: on the admin listener only (see [`Timings`]).
    #[serde(default, flatten, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// What the accelerator's work took. Left out of the public
/// `/.rproxy/stats` (D-B3): coding against a held basis takes another
/// time than coding from scratch, and a counter anyone can read before
/// and after a guess must not tell which it was; the admin listener, on
/// loopback or behind the role's users, shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Timings {
    /// Milliseconds encoders spent coding on blocking threads.
    pub encode_busy_ms: u64,
    /// Milliseconds codings waited for an encoder's turn.
    pub encoder_wait_ms: u64,
    /// Milliseconds origins took to answer, from sending the request to
    /// the response head, together.
    pub upstream_response_ms: u64,
}

impl Stats {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a refusal, in the total, under its fault and its reason.
    pub(super) fn refused(&self, kind: ErrorKind) {
        self.refusals.count(kind);
    }

    /// `(reason, count)` of the refusals so far, by the log's reason
    /// label (those not seen left out).
    pub fn refusal_reasons(&self) -> Vec<(&'static str, u64)> {
        self.refusals.reasons()
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let refused = self.refusals.read();
        let passed_bytes = get(&self.passed_bytes);
        let link_bytes = get(&self.stream_bytes) + passed_bytes;
        let delivered_bytes = get(&self.body_bytes) + passed_bytes;
        let latency = self.origin_latency.snapshot();
        StatsSnapshot {
            requests: get(&self.requests),
            coded: get(&self.coded),
            passed: get(&self.passed),
            refused: refused.total,
            refused_client: refused.client,
            refused_upstream: refused.upstream,
            refused_overload: refused.overload,
            refused_proxy: refused.proxy,
            queued: get(&self.queued),
            coded_body_bytes: get(&self.body_bytes),
            coded_stream_bytes: get(&self.stream_bytes),
            encoder_waits: get(&self.encoder_waits),
            spooled: get(&self.spooled),
            tunnels: get(&self.tunnels),
            tunnel_bytes: get(&self.tunnel_bytes),
            passed_bytes,
            link_bytes,
            delivered_bytes,
            saved_bytes: saved_bytes(delivered_bytes, link_bytes),
            upstream_responses: latency.count,
            basis_fallbacks: get(&self.basis_fallbacks),
            timings: Some(Timings {
                encode_busy_ms: get(&self.encode_busy_nanos) / 1_000_000,
                encoder_wait_ms: get(&self.encoder_wait_nanos) / 1_000_000,
                upstream_response_ms: millis(latency.sum),
            }),
        }
    }

    /// The histogram of origin response-head latencies.
    pub fn origin_latency(&self) -> &Latency {
        &self.origin_latency
    }

    /// The counters as a JSON object, as anyone who reaches the
    /// accelerator may read them: without the [`Timings`].
    pub fn to_json(&self) -> String {
        let public = StatsSnapshot {
            timings: None,
            ..self.snapshot()
        };
        serde_json::to_string(&public).expect("integers serialise") + "\n"
    }

    /// The counters with the [`Timings`], for the admin listener.
    pub fn to_admin_json(&self) -> String {
        serde_json::to_string(&self.snapshot()).expect("integers serialise") + "\n"
    }
}

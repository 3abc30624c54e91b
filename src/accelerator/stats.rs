//! The accelerator's counters, served as JSON at [`STATS_PATH`]: how many
//! requests were coded, passed through, refused (by fault) or queued, and
//! what the coded ones weighed, and a parent's tunnels. Counting only: where each counter moves is
//! the role's business.
//!
//! Main type: [`Stats`].

use std::sync::atomic::{AtomicU64, Ordering};

use crate::http::error::{Fault, Refusals};

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
}

impl Stats {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts a refusal, in the total and under its fault.
    pub(super) fn refused(&self, fault: Fault) {
        self.refusals.count(fault);
    }

    /// The counters as a JSON object.
    pub fn to_json(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let refused = self.refusals.read();
        format!(
            "{{\"requests\":{},\"coded\":{},\"passed\":{},\"refused\":{},\"refused_client\":{},\"refused_upstream\":{},\"refused_overload\":{},\"refused_proxy\":{},\"queued\":{},\"coded_body_bytes\":{},\"coded_stream_bytes\":{},\"encoder_waits\":{},\"spooled\":{},\"tunnels\":{},\"tunnel_bytes\":{}}}\n",
            get(&self.requests),
            get(&self.coded),
            get(&self.passed),
            refused.total,
            refused.client,
            refused.upstream,
            refused.overload,
            refused.proxy,
            get(&self.queued),
            get(&self.body_bytes),
            get(&self.stream_bytes),
            get(&self.encoder_waits),
            get(&self.spooled),
            get(&self.tunnels),
            get(&self.tunnel_bytes),
        )
    }
}

//! `/metrics`: a role's [`Figures`] in the Prometheus text format (0.0.4),
//! written by prometheus-client from a [`Collector`] that reads the
//! figures at scrape time, so the exposition and `/.rproxy/stats` come
//! from the same counters. Names start with `rproxy_`, carry their unit
//! (`_bytes`, `_seconds`) and end counters in `_total`; labels are the
//! same for both roles (`outcome`, `fault`, `basis`). docs/GUIDE.md lists
//! them with their meanings.
//!
//! Leaves out serving (`mod.rs`) and anything that counts.
//!
//! Main items: [`Metrics`], [`CONTENT_TYPE`].

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

use super::{Figures, Source};

/// The exposition's `Content-Type`.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A role's registry: one collector over its [`Source`].
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    /// The metrics of `source`.
    pub fn new(source: Arc<dyn Source>) -> Metrics {
        let mut registry = Registry::with_prefix("rproxy");
        registry.register_collector(Box::new(RoleCollector { source }));
        Metrics { registry }
    }

    /// The exposition now.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// Reads the role's figures once per scrape.
struct RoleCollector {
    source: Arc<dyn Source>,
}

impl std::fmt::Debug for RoleCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoleCollector")
    }
}

impl Collector for RoleCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_figures(&self.source.figures(), &mut encoder)
    }
}

/// Writes one unlabelled metric.
fn one(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let metric_encoder = encoder.encode_descriptor(name, help, unit, metric.metric_type())?;
    metric.encode(metric_encoder)
}

/// Writes a counter with one label, a sample per `(value, count)` row.
fn labelled(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    rows: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, count) in rows {
        let labels = [(label, *value)];
        ConstCounter::new(*count).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn seconds(duration: Duration) -> ConstCounter<f64> {
    ConstCounter::new(duration.as_secs_f64())
}

fn gauge(value: u64) -> ConstGauge<i64> {
    ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX))
}

/// Each checked upstream's state, labelled with its URL (an origin or
/// upstream proxy the operator configured: not a user's URL).
fn health(f: &Figures, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut up = e.encode_descriptor(
        "upstream_up",
        "Whether requests go to this origin or upstream proxy (1) or it is marked down (0).",
        None,
        MetricType::Gauge,
    )?;
    for view in &f.health {
        let labels = [("upstream", view.name.as_str())];
        ConstGauge::new(i64::from(view.is_up())).encode(up.encode_family(&labels)?)?;
    }
    let mut failures = e.encode_descriptor(
        "upstream_failures",
        "Failures in a row (no connection, no head in time) since its last success.",
        None,
        MetricType::Gauge,
    )?;
    for view in &f.health {
        let labels = [("upstream", view.name.as_str())];
        ConstGauge::new(i64::from(view.failures)).encode(failures.encode_family(&labels)?)?;
    }
    let mut downs = e.encode_descriptor(
        "upstream_marked_down",
        "Times it was marked down.",
        None,
        MetricType::Counter,
    )?;
    for view in &f.health {
        let labels = [("upstream", view.name.as_str())];
        ConstCounter::new(view.times_down).encode(downs.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Each change feed log, labelled with its site or zone (configured:
/// not a user's URL).
fn feed(f: &Figures, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    if f.feed.is_empty() {
        return Ok(());
    }
    type Pick = fn(&crate::admin::FeedFigures) -> u64;
    let rows: [(&str, &str, MetricType, Pick); 5] = [
        (
            "feed_csn",
            "The last CSN committed (accelerator) or caught up to (client proxy).",
            MetricType::Gauge,
            |z| z.csn,
        ),
        (
            "feed_entries",
            "Updates the log holds (one per path).",
            MetricType::Gauge,
            |z| z.entries,
        ),
        (
            "feed_pulls",
            "Pulls answered (accelerator) or made (client proxy).",
            MetricType::Counter,
            |z| z.pulls,
        ),
        (
            "feed_prefetched",
            "Changed bodies fetched ahead of users (client proxy).",
            MetricType::Counter,
            |z| z.prefetched,
        ),
        (
            "feed_prefetch_bytes",
            "Link bytes those prefetches took (client proxy).",
            MetricType::Counter,
            |z| z.prefetch_bytes,
        ),
    ];
    for (name, help, kind, pick) in rows {
        let mut family = e.encode_descriptor(name, help, None, kind)?;
        for zone in &f.feed {
            let labels = [("zone", zone.zone.as_str())];
            match kind {
                MetricType::Gauge => gauge(pick(zone)).encode(family.encode_family(&labels)?)?,
                _ => ConstCounter::new(pick(zone)).encode(family.encode_family(&labels)?)?,
            }
        }
    }
    Ok(())
}

fn encode_figures(f: &Figures, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let bytes = Some(&Unit::Bytes);
    let secs = Some(&Unit::Seconds);
    {
        let mut info = e.encode_descriptor(
            "build_info",
            "The running rproxy: its version and role (always 1).",
            None,
            MetricType::Gauge,
        )?;
        let labels = [
            ("version", env!("CARGO_PKG_VERSION")),
            ("role", f.role.as_str()),
        ];
        ConstGauge::new(1i64).encode(info.encode_family(&labels)?)?;
    }
    one(
        e,
        "requests",
        "Requests received (stats polls left out).",
        None,
        ConstCounter::new(f.requests),
    )?;
    labelled(
        e,
        "request_outcomes",
        "Requests by how they ended; outcomes overlap (a delta is a miss too).",
        "outcome",
        &f.outcomes.rows(),
    )?;
    labelled(
        e,
        "refused_requests",
        "Requests refused with a status of our own, by whose fault.",
        "fault",
        &f.refused.rows(),
    )?;
    labelled(
        e,
        "refused_by_reason",
        "Requests refused with a status of our own, by reason (the log line's reason).",
        "reason",
        &f.refused_reasons,
    )?;
    one(
        e,
        "link",
        "Bytes on the hsync link, both directions as counted (saved = delivered - link).",
        bytes,
        ConstCounter::new(f.link_bytes),
    )?;
    one(
        e,
        "delivered",
        "Bytes delivered: to user agents (client proxy), or sent by the origins (accelerator).",
        bytes,
        ConstCounter::new(f.delivered_bytes),
    )?;
    if let Some(signature) = f.signature_bytes {
        one(
            e,
            "signature",
            "Basis signature bytes sent upstream (part of the link bytes).",
            bytes,
            ConstCounter::new(signature),
        )?;
    }
    if let Some(cache) = &f.cache {
        one(
            e,
            "cache_entries",
            "Entries in the cache.",
            None,
            gauge(cache.entries),
        )?;
        one(
            e,
            "cache",
            "Bytes the cache takes (whole 4 KiB blocks).",
            bytes,
            gauge(cache.bytes),
        )?;
        one(
            e,
            "cache_budget",
            "The cache's size budget.",
            bytes,
            gauge(cache.budget),
        )?;
        one(
            e,
            "cache_evictions",
            "Entries evicted to make room.",
            None,
            ConstCounter::new(cache.evictions),
        )?;
        one(
            e,
            "cache_stored",
            "Entries committed to the cache.",
            None,
            ConstCounter::new(cache.stored),
        )?;
        one(
            e,
            "cache_write_errors",
            "Cache writes that failed (a full disk, say): served, not stored.",
            None,
            ConstCounter::new(cache.write_errors),
        )?;
    }
    if let Some(basis) = &f.basis {
        labelled(
            e,
            "basis_choices",
            "Fetches upstream by the basis offered.",
            "basis",
            &basis.rows(),
        )?;
    }
    if let Some(failures) = f.digest_failures {
        one(
            e,
            "digest_failures",
            "Transfers that failed a digest or stream check (nothing stored).",
            None,
            ConstCounter::new(failures),
        )?;
    }
    one(
        e,
        "transfer_memory",
        "Bytes of the transfer memory budget that streamed transfers hold now (their estimated shares).",
        bytes,
        gauge(f.transfer_memory.taken),
    )?;
    one(
        e,
        "transfer_memory_budget",
        "The transfer memory budget (transfer-memory); 0 for none.",
        bytes,
        gauge(f.transfer_memory.budget),
    )?;
    one(
        e,
        "queue_length",
        "Requests waiting now: for an upload slot (accelerator), or in the upstream's queue (client proxy).",
        None,
        gauge(f.queue_length),
    )?;
    one(
        e,
        "queue_answers",
        "Queue answers: 503s for a slot (accelerator), waits in the upstream's queue (client proxy).",
        None,
        ConstCounter::new(f.queue_answers),
    )?;
    if let Some((waits, waited)) = f.encoder_waits {
        one(
            e,
            "encoder_waits",
            "Codings that waited for an encoder's turn.",
            None,
            ConstCounter::new(waits),
        )?;
        one(
            e,
            "encoder_wait",
            "Time codings waited for an encoder's turn.",
            secs,
            seconds(waited),
        )?;
    }
    if let Some(busy) = f.encoder_busy {
        one(
            e,
            "encoder_busy",
            "Time encoders spent coding.",
            secs,
            seconds(busy),
        )?;
    }
    if let Some(fallbacks) = f.basis_fallbacks {
        one(
            e,
            "basis_fallbacks",
            "Lookups in the shared basis store that failed or timed out: those bodies were coded without it.",
            None,
            ConstCounter::new(fallbacks),
        )?;
    }
    if let Some(busy) = f.decoder_busy {
        one(
            e,
            "decoder_busy",
            "Time relays spent decoding, hashing and storing bodies.",
            secs,
            seconds(busy),
        )?;
    }
    if let Some(errors) = f.upstream_errors {
        one(
            e,
            "upstream_errors",
            "Upstream unreachable, silent or unusable.",
            None,
            ConstCounter::new(errors),
        )?;
    }
    {
        let latency = &f.upstream_latency;
        let mut histogram = e.encode_descriptor(
            "upstream_response",
            "Time from a request sent upstream (to the origin, at the accelerator) to its response head.",
            secs,
            MetricType::Histogram,
        )?;
        histogram.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            latency.sum.as_secs_f64(),
            latency.count,
            &latency.buckets,
            None,
        )?;
    }
    health(f, e)?;
    feed(f, e)?;
    one(
        e,
        "tunnels",
        "CONNECT tunnels opened.",
        None,
        ConstCounter::new(f.tunnels),
    )?;
    one(
        e,
        "tunnel",
        "Bytes relayed by tunnels that ended, both ways.",
        bytes,
        ConstCounter::new(f.tunnel_bytes),
    )?;
    Ok(())
}

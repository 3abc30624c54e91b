//! The status page at `/` of the admin listener: one self-contained HTML
//! document (inline CSS and SVG, no script, no external asset) that shows
//! at a glance what the proxy saved over the last minutes and hours (with
//! two small charts), how requests ended, the cache's fill, the queue, the
//! upstreams and the configuration. It reloads itself every 10 s.
//!
//! Aggregates only: counters and the operator's own configuration,
//! never a requested URL, a user or a client address. Every string is
//! escaped, though none comes from a request.
//!
//! Leaves out where the figures come from (`figures.rs`, `history.rs`).
//!
//! Main items: [`render`], [`Summary`], [`UpstreamView`].

use std::fmt::Write;
use std::net::SocketAddr;
use std::time::Duration;

use html_escape::encode_text;

use super::Figures;
use super::history::{History, Point, SAMPLE_EVERY, Step};
use crate::config::Role;
use crate::http::health::{HealthState, HealthView};

/// What the page says about the configuration, given once at start-up.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The role.
    pub role: Role,
    /// The proxy's listen address.
    pub listen: SocketAddr,
    /// Settings worth seeing at a glance, `(key, value)`, as the
    /// configuration file names them; never credentials or user names.
    pub settings: Vec<(String, String)>,
    /// The upstreams (client proxy: its routes) or sites (accelerator:
    /// names and origins).
    pub upstreams: Vec<UpstreamView>,
}

/// One upstream (or site) on the page.
#[derive(Debug, Clone)]
pub struct UpstreamView {
    /// As configured: `hosts -> upstream`, `names -> origin`.
    pub name: String,
}

/// The page for `figures` (now, at `now`), with `history` for the charts;
/// `started` is when the process started (Unix seconds).
pub fn render(
    summary: &Summary,
    admin: SocketAddr,
    figures: &Figures,
    history: &History,
    now: u64,
    started: u64,
) -> String {
    let role = match summary.role {
        Role::Client => "client proxy",
        Role::Accelerator => "accelerator",
    };
    let mut page = String::with_capacity(16 << 10);
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"10\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>rproxy {role}</title><style>{STYLE}</style></head><body>\
         <h1>rproxy {role}</h1><p class=\"sub\">version {} · listening on {} · admin on {} · up {}</p>",
        env!("CARGO_PKG_VERSION"),
        encode_text(&summary.listen.to_string()),
        encode_text(&admin.to_string()),
        span(Duration::from_secs(now.saturating_sub(started))),
    );
    savings(&mut page, figures, history, now);
    requests(&mut page, figures);
    if figures.cache.is_some() {
        cache(&mut page, figures);
    }
    queue(&mut page, figures);
    upstreams(&mut page, summary, figures);
    settings(&mut page, summary);
    page.push_str(
        "<p class=\"sub\">Reloads every 10 s. Aggregates only: no URL, user or client \
         address is shown. Prometheus metrics: <a href=\"/metrics\">/metrics</a>; \
         the same counters as JSON: <a href=\"/.rproxy/stats\">/.rproxy/stats</a>.</p>\
         </body></html>\n",
    );
    page
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:60em}\
h1{font-size:1.4em;margin:0}h2{font-size:1.1em;margin:1.4em 0 .4em;border-bottom:1px solid #ccc}\
.sub{color:#666;margin:.2em 0}table{border-collapse:collapse}\
td,th{padding:.15em .8em .15em 0;text-align:left;vertical-align:top}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.big{font-size:1.6em;font-weight:600}svg{display:block;margin:.3em 0}\
.key span{display:inline-block;width:.8em;height:.8em;margin:0 .3em 0 .8em}";

/// Colours of the outcome bar, in [`super::Outcomes::rows`] order.
const COLOURS: [&str; 6] = [
    "#2e7d32", "#c62828", "#1565c0", "#6a1b9a", "#9e9e9e", "#00838f",
];

fn savings(page: &mut String, figures: &Figures, history: &History, now: u64) {
    let current = Point::of(figures, now);
    let total = Step {
        at: now,
        seconds: 0,
        delivered_bytes: figures.delivered_bytes,
        link_bytes: figures.link_bytes,
        requests: figures.requests,
    };
    let _ = write!(
        page,
        "<h2>Savings</h2><p><span class=\"big\">{}</span> saved since start \
         (<span id=\"saved-bytes\">{}</span> bytes; {} delivered, {} on the link)</p>\
         <table><tr><th>window</th><th>delivered</th><th>on the link</th><th>saved</th>\
         <th>link / delivered</th><th>requests</th></tr>",
        human_signed(figures.saved_bytes()),
        figures.saved_bytes(),
        human(figures.delivered_bytes),
        human(figures.link_bytes),
    );
    for (label, window) in [
        ("last 5 minutes", Duration::from_secs(300)),
        ("last hour", Duration::from_secs(3600)),
        ("last 24 hours", Duration::from_secs(86_400)),
    ] {
        let Some(step) = history.since(&current, window) else {
            continue;
        };
        // A younger history than the window reaches back to the start,
        // as the last window did: one such row says it all.
        let partial = step.seconds + 2 * SAMPLE_EVERY.as_secs() < window.as_secs();
        let shown = if partial {
            format!(
                "{label} (only {} so far)",
                span(Duration::from_secs(step.seconds))
            )
        } else {
            label.to_owned()
        };
        savings_row(page, &shown, &step);
        if partial {
            break;
        }
    }
    savings_row(page, "since start", &total);
    page.push_str("</table>");
    let _ = write!(
        page,
        "<p class=\"sub\">Saved per 10 s, last hour:</p>{}\
         <p class=\"sub\">Saved per minute, last 24 hours:</p>{}",
        chart(&history.fine_steps(), 3600, 10),
        chart(&history.coarse_steps(), 86_400, 60),
    );
}

fn savings_row(page: &mut String, label: &str, step: &Step) {
    let _ = write!(
        page,
        "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
        encode_text(label),
        human(step.delivered_bytes),
        human(step.link_bytes),
        human_signed(step.saved_bytes()),
        ratio(step.link_bytes, step.delivered_bytes),
        step.requests,
    );
}

/// A bar chart of saved bytes per step over the last `window` seconds,
/// one bar per `every` seconds; bars below the axis saved nothing.
fn chart(steps: &[Step], window: u64, every: u64) -> String {
    const WIDTH: f64 = 720.0;
    const HEIGHT: f64 = 90.0;
    let Some(last) = steps.last() else {
        return "<p class=\"sub\">(no samples yet: one every 10 s)</p>".into();
    };
    let slots = (window / every) as f64;
    let bar = WIDTH / slots;
    let peak = steps
        .iter()
        .map(|step| step.saved_bytes().unsigned_abs())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let axis = HEIGHT / 2.0;
    let mut svg = format!(
        "<svg width=\"{WIDTH}\" height=\"{}\" viewBox=\"0 0 {WIDTH} {}\" role=\"img\" \
         aria-label=\"saved bytes\"><rect width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"#f5f5f5\"/>\
         <line x1=\"0\" y1=\"{axis}\" x2=\"{WIDTH}\" y2=\"{axis}\" stroke=\"#bbb\"/>",
        HEIGHT + 14.0,
        HEIGHT + 14.0,
    );
    for step in steps {
        let age = last.at.saturating_sub(step.at) as f64 / every as f64;
        let x = WIDTH - (age + 1.0) * bar;
        if x < 0.0 {
            continue;
        }
        let saved = step.saved_bytes();
        let h = (saved.unsigned_abs() as f64 / peak * (axis - 2.0)).max(0.5);
        let (y, colour) = if saved >= 0 {
            (axis - h, "#2e7d32")
        } else {
            (axis, "#c62828")
        };
        let _ = write!(
            svg,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{colour}\"/>",
            (bar - 0.5).max(0.5)
        );
    }
    let _ = write!(
        svg,
        "<text x=\"2\" y=\"11\" font-size=\"10\">{}</text>\
         <text x=\"2\" y=\"{}\" font-size=\"10\">-{}</text>\
         <text x=\"0\" y=\"{}\" font-size=\"10\">{} ago</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"end\">now</text></svg>",
        human(peak as u64),
        HEIGHT - 3.0,
        human(peak as u64),
        HEIGHT + 12.0,
        span(Duration::from_secs(window)),
        WIDTH,
        HEIGHT + 12.0,
    );
    svg
}

fn requests(page: &mut String, figures: &Figures) {
    let rows = figures.outcomes.rows();
    let _ = write!(
        page,
        "<h2>Requests</h2><p><span class=\"big\">{}</span> received</p>",
        figures.requests
    );
    // The split of what was served, by outcomes that do not overlap:
    // hits, misses and passes (deltas are misses, revalidations hits) at
    // a client proxy; coded and passed at an accelerator, which has only
    // those two.
    let (served, shown): (&[usize], &[usize]) = match figures.role {
        Role::Client => (&[0, 1, 4], &[0, 1, 2, 3, 4, 5]),
        Role::Accelerator => (&[2, 4], &[2, 4]),
    };
    let total: u64 = served.iter().map(|i| rows[*i].1).sum();
    if total > 0 {
        let mut x = 0.0;
        page.push_str(
            "<svg width=\"720\" height=\"16\" role=\"img\" aria-label=\"hit, miss and pass split\">",
        );
        for &i in served {
            let w = rows[i].1 as f64 / total as f64 * 720.0;
            let _ = write!(
                page,
                "<rect x=\"{x:.1}\" width=\"{w:.1}\" height=\"16\" fill=\"{}\"/>",
                COLOURS[i]
            );
            x += w;
        }
        page.push_str("</svg>");
    }
    page.push_str("<table><tr>");
    for (n, &i) in shown.iter().enumerate() {
        let (label, count) = &rows[i];
        let _ = write!(
            page,
            "<td class=\"key\"><span style=\"background:{}\"></span>{label}</td>\
             <td class=\"n\" id=\"outcome-{label}\">{count}</td><td class=\"n\">{}</td>",
            COLOURS[i],
            percent(*count, figures.requests),
        );
        if n % 3 == 2 {
            page.push_str("</tr><tr>");
        }
    }
    page.push_str("</tr></table><p>Refused: ");
    for (label, count) in figures.refused.rows() {
        let _ = write!(page, "{label} {count} · ");
    }
    let _ = write!(page, "total {}", figures.refused.total);
    if let Some(failures) = figures.digest_failures {
        let _ = write!(page, " · digest failures {failures}");
    }
    if figures.tunnels > 0 {
        let _ = write!(
            page,
            " · tunnels {} ({})",
            figures.tunnels,
            human(figures.tunnel_bytes)
        );
    }
    page.push_str("</p>");
}

fn cache(page: &mut String, figures: &Figures) {
    let Some(cache) = figures.cache else { return };
    let fill = if cache.budget == 0 {
        0.0
    } else {
        (cache.bytes as f64 / cache.budget as f64).min(1.0)
    };
    let _ = write!(
        page,
        "<h2>Cache</h2><p><span class=\"big\">{}</span> full: {} of {} in {} entries</p>\
         <svg width=\"720\" height=\"12\" role=\"img\" aria-label=\"cache fill\">\
         <rect width=\"720\" height=\"12\" fill=\"#eee\"/>\
         <rect width=\"{:.1}\" height=\"12\" fill=\"#1565c0\"/></svg>\
         <p>Stored {} · evicted {} · write errors {}",
        percent(cache.bytes, cache.budget),
        human(cache.bytes),
        human(cache.budget),
        cache.entries,
        fill * 720.0,
        cache.stored,
        cache.evictions,
        cache.write_errors,
    );
    if let Some(basis) = figures.basis {
        page.push_str("<br>Basis offered: ");
        let rows = basis.rows();
        for (n, (label, count)) in rows.iter().enumerate() {
            let label = label.replace('_', " ");
            let _ = write!(
                page,
                "{label} {count}{}",
                if n + 1 < rows.len() { " · " } else { "" }
            );
        }
    }
    if let Some(busy) = figures.decoder_busy {
        let _ = write!(
            page,
            "<br>Decoding, hashing and storing took {}",
            seconds(busy)
        );
    }
    page.push_str("</p>");
}

fn queue(page: &mut String, figures: &Figures) {
    match figures.role {
        Role::Client => {
            let _ = write!(
                page,
                "<h2>Queue</h2><p>Waiting in the upstream's queue now: <b>{}</b> · waits so far {}</p>",
                figures.queue_length, figures.queue_answers
            );
        }
        Role::Accelerator => {
            let _ = write!(
                page,
                "<h2>Queue</h2><p>Waiting for an upload slot now: <b>{}</b> · answered from the queue {}",
                figures.queue_length, figures.queue_answers
            );
            if let Some((waits, waited)) = figures.encoder_waits {
                let _ = write!(
                    page,
                    "<br>Codings that waited for an encoder: {waits} ({} together)",
                    seconds(waited)
                );
            }
            if let Some(busy) = figures.encoder_busy {
                let _ = write!(page, "<br>Encoders busy {}", seconds(busy));
            }
            page.push_str("</p>");
        }
    }
}

fn upstreams(page: &mut String, summary: &Summary, figures: &Figures) {
    let (title, what) = match summary.role {
        Role::Client => ("Upstreams", "route"),
        Role::Accelerator => ("Origins", "site"),
    };
    let _ = write!(
        page,
        "<h2>{title}</h2><table><tr><th>{what}</th><th>health</th></tr>"
    );
    for upstream in &summary.upstreams {
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td></tr>",
            encode_text(&upstream.name),
            health_of(&upstream.name, &figures.health)
        );
    }
    page.push_str("</table><table><tr><th>checked</th><th>state</th><th>failures in a row</th><th>times down</th><th>last error</th></tr>");
    if figures.health.is_empty() {
        page.push_str(
            "<tr><td colspan=5>none (parent mode and direct ways are not checked)</td></tr>",
        );
    }
    for view in &figures.health {
        let state = match view.state {
            HealthState::Up => "up".to_owned(),
            HealthState::Down { down_for, retry_in } => format!(
                "DOWN for {} s, retried in {} s",
                down_for.as_secs(),
                retry_in.as_secs()
            ),
        };
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{state}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            encode_text(&view.name),
            view.failures,
            view.times_down,
            encode_text(view.last_error.as_deref().unwrap_or("-"))
        );
    }
    let latency = &figures.upstream_latency;
    let mean = if latency.count == 0 {
        "-".to_owned()
    } else {
        format!(
            "{:.1} ms",
            latency.sum.as_secs_f64() * 1e3 / latency.count as f64
        )
    };
    let _ = write!(
        page,
        "</table><p>Responses {} (mean time to the head {mean}) · refused as their fault {}",
        latency.count, figures.refused.upstream
    );
    if let Some(errors) = figures.upstream_errors {
        let _ = write!(page, " · errors {errors}");
    }
    page.push_str("</p>");
}

/// The state of the checked upstreams a configured route or site names:
/// "up", "DOWN", or, for one that names none of them, "not checked".
fn health_of(configured: &str, health: &[HealthView]) -> &'static str {
    let named: Vec<&HealthView> = health
        .iter()
        .filter(|view| configured.contains(view.name.as_str()))
        .collect();
    match named.as_slice() {
        [] => "not checked",
        views if views.iter().all(|view| view.is_up()) => "up",
        _ => "DOWN",
    }
}

fn settings(page: &mut String, summary: &Summary) {
    page.push_str("<h2>Configuration</h2><table>");
    for (key, value) in &summary.settings {
        let _ = write!(
            page,
            "<tr><td>{}</td><td>{}</td></tr>",
            encode_text(key),
            encode_text(value)
        );
    }
    page.push_str("</table>");
}

/// `1.5 MiB`, `812 B`.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn human_signed(bytes: i64) -> String {
    if bytes < 0 {
        format!("-{}", human(bytes.unsigned_abs()))
    } else {
        human(bytes.unsigned_abs())
    }
}

fn ratio(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.3}", part as f64 / whole as f64)
    }
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".into();
    }
    let percent = part as f64 * 100.0 / whole as f64;
    // A cache a tenth full or less still shows its fill.
    if percent < 10.0 {
        format!("{percent:.1} %")
    } else {
        format!("{percent:.0} %")
    }
}

fn seconds(duration: Duration) -> String {
    format!("{:.1} s", duration.as_secs_f64())
}

/// `3 h 12 min`, `45 s`.
fn span(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        3600..86_400 if secs % 3600 < 60 => format!("{} h", secs / 3600),
        3600..86_400 => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
        _ if secs % 86_400 < 3600 => format!("{} d", secs / 86_400),
        _ => format!("{} d {} h", secs / 86_400, secs % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::figures::{CacheFigures, Outcomes};

    fn figures() -> Figures {
        Figures {
            role: Role::Client,
            requests: 3,
            outcomes: Outcomes {
                hit: 1,
                miss: 2,
                delta: 1,
                ..Outcomes::default()
            },
            refused: Default::default(),
            refused_reasons: Vec::new(),
            link_bytes: 1_000,
            delivered_bytes: 5_000,
            signature_bytes: Some(100),
            cache: Some(CacheFigures {
                entries: 2,
                bytes: 8192,
                budget: 1 << 20,
                ..Default::default()
            }),
            basis: Some(Default::default()),
            digest_failures: Some(0),
            queue_length: 0,
            queue_answers: 0,
            encoder_waits: None,
            basis_fallbacks: None,
            encoder_busy: None,
            decoder_busy: Some(Duration::from_millis(5)),
            upstream_errors: Some(0),
            upstream_latency: Default::default(),
            tunnels: 0,
            tunnel_bytes: 0,
            feed: Vec::new(),
            transfer_memory: Default::default(),
            health: vec![HealthView {
                name: "http://accel<x>".into(),
                state: HealthState::Down {
                    down_for: Duration::from_secs(12),
                    retry_in: Duration::from_secs(8),
                },
                failures: 3,
                last_error: Some("connection refused".into()),
                times_down: 1,
            }],
        }
    }

    fn summary() -> Summary {
        Summary {
            role: Role::Client,
            listen: "127.0.0.1:8082".parse().unwrap(),
            settings: vec![("cache-size".into(), "1G <b>".into())],
            upstreams: vec![UpstreamView {
                name: "* -> http://accel<x>".into(),
            }],
        }
    }

    #[test]
    fn the_page_shows_the_figures_and_escapes_the_configuration() {
        let mut history = History::default();
        history.record(Point::default());
        history.record(Point::of(&figures(), 10));
        let page = render(
            &summary(),
            "127.0.0.1:9082".parse().unwrap(),
            &figures(),
            &history,
            15,
            0,
        );
        assert!(
            page.contains("<span id=\"saved-bytes\">4000</span>"),
            "{page}"
        );
        assert!(page.contains("id=\"outcome-hit\">1<"), "{page}");
        assert!(page.contains("1G &lt;b&gt;"), "escaped: {page}");
        assert!(page.contains("http://accel&lt;x&gt;"), "escaped: {page}");
        assert!(!page.contains("<script"), "no script");
        assert!(page.contains("<rect x="), "a bar for the one step: {page}");
        assert!(
            page.contains("<td>* -&gt; http://accel&lt;x&gt;</td><td>DOWN</td>"),
            "the route names a checked upstream that is down: {page}"
        );
        assert!(
            page.contains(
                "DOWN for 12 s, retried in 8 s</td><td>3</td><td>1</td><td>connection refused"
            ),
            "{page}"
        );
    }

    #[test]
    fn the_accelerators_page_shows_only_what_it_counts() {
        let accelerator = Figures {
            role: Role::Accelerator,
            cache: None,
            basis: None,
            digest_failures: None,
            decoder_busy: None,
            upstream_errors: None,
            encoder_waits: Some((2, Duration::from_millis(1500))),
            basis_fallbacks: Some(0),
            encoder_busy: Some(Duration::from_secs(3)),
            ..figures()
        };
        let summary = Summary {
            role: Role::Accelerator,
            ..summary()
        };
        let at = "127.0.0.1:9081".parse().unwrap();
        let page = render(&summary, at, &accelerator, &History::default(), 5, 0);
        assert!(page.contains("rproxy accelerator"), "{page}");
        assert!(page.contains("id=\"outcome-delta\">1<"), "{page}");
        assert!(
            !page.contains("outcome-hit"),
            "an accelerator has no hits: {page}"
        );
        assert!(!page.contains("<h2>Cache"), "nor a cache: {page}");
        assert!(
            page.contains("waited for an encoder: 2 (1.5 s together)"),
            "{page}"
        );
        assert!(page.contains("<h2>Origins"), "{page}");
    }

    #[test]
    fn sizes_and_spans_read_as_a_person_would_say_them() {
        assert_eq!(human(812), "812 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human_signed(-(3 << 20)), "-3.0 MiB");
        assert_eq!(span(Duration::from_secs(45)), "45 s");
        assert_eq!(span(Duration::from_secs(3 * 3600 + 720)), "3 h 12 min");
        assert_eq!(span(Duration::from_secs(3600)), "1 h");
        assert_eq!(span(Duration::from_secs(86_400)), "1 d");
        assert_eq!(ratio(1, 4), "0.250");
    }
}

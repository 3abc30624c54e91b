//! A small coded body, coded whole ([`encode_whole`]): a body the origin
//! announced at most [`SMALL_BODY`] long is read in full, coded in one go
//! on a blocking thread in its turn, and sent with a Content-Length. A cut,
//! badly framed or late origin body is then a clean 502/504, since the
//! client has seen nothing yet. Streaming larger bodies is `stream.rs`.
//!
//! Main type: [`OriginBody`].

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Uri};
use http_body_util::BodyExt;

use crate::hsync::EncodeError;
use crate::http::error::ProxyError;
use crate::http::server::ProxyBody;
use crate::http::upstream_guard::ExchangeCheck;

use super::coding::Coding;
use super::stats::Stats;

/// Bodies the origin announced at most this long are read whole and coded
/// in one go, then sent with a Content-Length: one hop to a blocking thread
/// and one write to the client, where streaming cost a reader task, two
/// channels and a write per frame (about half of a 1 KiB request's CPU).
/// The origin sends such a body in one piece anyway.
pub(super) const SMALL_BODY: u64 = 64 << 10;

/// An origin body that [`encode_whole`] reads whole.
pub(super) struct OriginBody {
    pub(super) body: ProxyBody,
    pub(super) framing: Option<ExchangeCheck>,
    /// For the whole body, after the head came.
    pub(super) timeout: Duration,
}

/// Codes a small body (see [`SMALL_BODY`]) whole on a blocking thread, in
/// its turn, and sends whichever is smallest of its stream, the body
/// itself and, when the client accepts gzip (`gzip_accepted`), the body
/// gzipped.
/// A body the origin cuts, frames badly or does not finish in time is a
/// clean 502/504: the client has seen nothing yet.
pub(super) async fn encode_whole(
    origin: OriginBody,
    coding: Coding,
    gzip_accepted: bool,
    method: Method,
    uri: Uri,
) -> Result<Whole, ProxyError> {
    let Coding {
        mut encoder,
        encoders,
        memory: _,
        store,
        served_as: _,
        stats,
        parking: _,
        note,
        feed,
    } = coding;
    let body = match tokio::time::timeout(origin.timeout, origin.body.collect()).await {
        Err(_) => {
            return Err(ProxyError::upstream_timeout(format!(
                "origin sent no whole body within {:?}",
                origin.timeout
            )));
        }
        Ok(Err(error)) => {
            return Err(ProxyError::bad_upstream_response(format!(
                "origin body: {error}"
            )));
        }
        Ok(Ok(body)) => body.to_bytes(),
    };
    if let Some(check) = &origin.framing
        && let Some(violation) = check.violation()
    {
        let error = ExchangeCheck::error(violation);
        if !check.has_excess() {
            return Err(ProxyError::bad_upstream_response(format!(
                "origin body: {error}"
            )));
        }
        // P-17, learned with the body but before our head went: the body
        // as declared, uncoded, so neither kept as a basis nor listed in
        // the feed; the caller makes it no-store.
        tracing::warn!(%error, "served as declared, not coded, not stored");
        Stats::add(&stats.passed, 1);
        Stats::add(&stats.passed_bytes, body.len() as u64);
        if let Some(note) = &note {
            note.coding("identity", None);
            note.from_upstream(body.len() as u64);
        }
        return Ok(Whole::Excess(body));
    }
    let task_stats = stats.clone();
    let coded = encoders
        .run(&stats, false, move || {
            let mut out = Vec::with_capacity(body.len() / 2 + 4096);
            encoder.push(&body, &mut out)?;
            let summary = encoder.finish(&mut out)?;
            if let Some(store) = &store {
                store.insert(summary.digest, body.to_vec().into());
            }
            if let Some(feed) = &feed {
                feed.commit(&summary.digest, summary.body_len);
            }
            tracing::debug!(
                %method, %uri, status = 200, mode = "hsync", basis = ?summary.basis,
                body = summary.body_len, stream = summary.stream_bytes,
                copied = summary.copied_bytes, uncoded_windows = summary.uncoded_windows,
                "coded"
            );
            // Never more than the plain coding the client accepts: a tiny
            // or incompressible body goes plain (the client proxy signs
            // what it stores itself). The stream's fixed cost (header,
            // END with its digest: ~60 B) loses to gzip's (~20 B) only
            // on a body coded from scratch into about as much as itself.
            let gzipped = (gzip_accepted
                && (body.len() <= GZIP_CHECKED_BELOW || out.len() * 2 > body.len()))
            .then(|| gzip(&body))
            .filter(|gzipped| gzipped.len() < out.len().min(body.len()));
            let whole = if let Some(gzipped) = gzipped {
                // Counted as coded: the body was delivered, the gzip
                // crossed the link.
                Stats::add(&task_stats.coded, 1);
                Stats::add(&task_stats.body_bytes, summary.body_len);
                Stats::add(&task_stats.stream_bytes, gzipped.len() as u64);
                if let Some(note) = &note {
                    note.coding("gzip", None);
                    note.from_upstream(summary.body_len);
                }
                Whole::Gzip(Bytes::from(gzipped))
            } else if out.len() > body.len() {
                Stats::add(&task_stats.passed, 1);
                Stats::add(&task_stats.passed_bytes, summary.body_len);
                if let Some(note) = &note {
                    note.coding("identity", None);
                    note.from_upstream(summary.body_len);
                }
                Whole::Plain(body)
            } else {
                Stats::add(&task_stats.coded, 1);
                Stats::add(&task_stats.body_bytes, summary.body_len);
                Stats::add(&task_stats.stream_bytes, summary.stream_bytes);
                if let Some(note) = &note {
                    note.from_upstream(summary.body_len);
                }
                Whole::Coded(Bytes::from(out))
            };
            Ok::<_, EncodeError>(whole)
        })
        .await;
    match coded {
        Some(Ok(whole)) => Ok(whole),
        Some(Err(error)) => Err(ProxyError::internal(format!("hsync: {error}"))),
        None => Err(ProxyError::internal("the encoder panicked")),
    }
}

/// What a small body goes to the client as.
pub(super) enum Whole {
    /// Its hsync stream.
    Coded(Bytes),
    /// The body itself, as the origin sent it: its stream would have been
    /// larger.
    Plain(Bytes),
    /// The body gzipped, which the client accepts: smaller than both.
    Gzip(Bytes),
    /// The body itself, as the origin declared it, which sent bytes after
    /// it (P-17): for nobody to store.
    Excess(Bytes),
}

/// Bodies up to this long are gzipped to compare whatever their stream
/// (~0.1 ms of CPU); longer ones only when their stream is over half their
/// size, since gzip beats a stream only where the stream's fixed cost
/// counts.
const GZIP_CHECKED_BELOW: usize = 4 << 10;

/// `body` gzipped at level 9.
fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 2 + 32),
        flate2::Compression::best(),
    );
    encoder
        .write_all(body)
        .and_then(|()| encoder.finish())
        .expect("writing to memory cannot fail")
}

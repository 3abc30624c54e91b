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
/// its turn.
/// A body the origin cuts, frames badly or does not finish in time is a
/// clean 502/504: the client has seen nothing yet.
pub(super) async fn encode_whole(
    origin: OriginBody,
    coding: Coding,
    method: Method,
    uri: Uri,
) -> Result<Whole, ProxyError> {
    let Coding {
        mut encoder,
        encoders,
        memory: _,
        store,
        stats,
        parking: _,
        note,
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
    if let Some(violation) = origin.framing.as_ref().and_then(ExchangeCheck::violation) {
        let error = ExchangeCheck::error(violation);
        return Err(ProxyError::bad_upstream_response(format!(
            "origin body: {error}"
        )));
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
            tracing::debug!(
                %method, %uri, status = 200, mode = "hsync", basis = ?summary.basis,
                body = summary.body_len, stream = summary.stream_bytes,
                copied = summary.copied_bytes, uncoded_windows = summary.uncoded_windows,
                "coded"
            );
            // Never more than the body as the origin sent it: a tiny or
            // incompressible body goes plain (the client proxy signs what
            // it stores itself).
            let whole = if out.len() > body.len() {
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
}

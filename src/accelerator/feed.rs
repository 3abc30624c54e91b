//! The accelerator's feed requests, on a site's own host
//! ([`crate::feed`]): `GET /.well-known/hsync-feed` answers a pull from the
//! site's log; `POST` is a submission (SubmitUpdate): each path listed is
//! fetched from the origin, hashed as it streams, and committed when its
//! body changed and a shared cache may store it.
//!
//! A submission is bounded: at most [`MAX_SUBMITTED`] paths, read within
//! the origin timeout, fetched one after another, each body no longer than
//! `--max-encode-len`, two submissions at a time
//! ([`crate::feed::primary::MAX_SUBMISSIONS`]); a feed request takes an
//! upload slot as any request does (`--slots`). Anyone who may request the site may submit: it
//! costs the origin what requesting those paths would, and a path only
//! enters the feed with what the origin serves to anyone.
//!
//! The admin listener's `POST /feed` takes absolute URLs instead, for any
//! site ([`Accelerator::submit_urls`]).
//!
//! Main items: [`Accelerator::feed_request`], [`Accelerator::submit_urls`].

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use serde::Serialize;

use super::Accelerator;
use super::FeedConfig;
use super::basis_store::shareable;
use super::origin::FromOrigin;
use super::sites::Route;
use crate::cache::freshness::Storability;
use crate::feed::Feeds;
use crate::feed::watch::DocRoot;
use crate::feed::wire::{
    MAX_SUBMISSION_BYTES, MAX_SUBMITTED, Pull, callback_node, parse_submission,
};
use crate::http::server::{
    Peer, ProxyBody, RequestBody, json_response, slow_request_body, text_response,
};
use crate::http::upstream_guard::ExchangeCheck;

/// What became of one submitted path.
#[derive(Debug, Serialize)]
struct Submitted {
    path: String,
    /// `committed`, `unchanged`, `not-shareable`, `not-coded`, `origin-status`, `failed`.
    result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    csn: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

impl Accelerator {
    /// Answers a request for the feed of `route`'s site.
    pub(super) async fn feed_request(
        self: Arc<Self>,
        request: Request<RequestBody>,
        route: Route,
        feeds: Arc<Feeds>,
    ) -> Response<ProxyBody> {
        let host = route.host.to_str().unwrap_or_default().to_ascii_lowercase();
        match *request.method() {
            Method::GET => {
                let pull = match Pull::parse(request.uri().query()) {
                    Ok(pull) => pull,
                    Err(message) => return text_response(StatusCode::BAD_REQUEST, message),
                };
                let answer = feeds.answer(
                    &host,
                    &pull,
                    callback_node(
                        request.headers(),
                        request.extensions().get::<Peer>().map(|peer| peer.0),
                    ),
                );
                json_response(
                    StatusCode::OK,
                    serde_json::to_vec(&answer).unwrap_or_default(),
                )
            }
            Method::POST => {
                let body = request.into_body();
                let read = tokio::time::timeout(
                    self.config.origin_timeout,
                    Limited::new(body, MAX_SUBMISSION_BYTES).collect(),
                )
                .await;
                let text = match read {
                    Ok(Ok(body)) => body.to_bytes(),
                    Ok(Err(error)) if let Some(refusal) = slow_request_body(&*error) => {
                        return refusal.log_and_respond();
                    }
                    Ok(Err(error)) => {
                        return text_response(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            format!(
                                "a submission lists paths in at most {MAX_SUBMISSION_BYTES} bytes: {error}"
                            ),
                        );
                    }
                    Err(_) => {
                        return text_response(
                            StatusCode::REQUEST_TIMEOUT,
                            "the submission did not arrive in time".into(),
                        );
                    }
                };
                let paths = match std::str::from_utf8(&text)
                    .map_err(|_| "a submission is UTF-8 text".to_owned())
                    .and_then(parse_submission)
                {
                    Ok(paths) => paths,
                    Err(message) => return text_response(StatusCode::BAD_REQUEST, message),
                };
                let Some(_turn) = feeds.submission_turn().await else {
                    let mut response = text_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "other submissions are being fetched; send it again".into(),
                    );
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                    return response;
                };
                let mut results = Vec::with_capacity(paths.len());
                for path in paths {
                    results.push(self.submit(&host, &route, &feeds, path).await);
                }
                json_response(
                    StatusCode::OK,
                    serde_json::to_vec(&results).unwrap_or_default(),
                )
            }
            _ => {
                let mut response = text_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "the change feed answers GET (a pull) and POST (the paths that changed)".into(),
                );
                response
                    .headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
                response
            }
        }
    }

    /// A submission on the admin listener: absolute URLs, one per line,
    /// each fetched and committed in its site's feed. The status and JSON
    /// to answer.
    pub(crate) async fn submit_urls(&self, text: &str) -> (StatusCode, String) {
        let Some(feeds) = self.feeds.clone() else {
            return (
                StatusCode::NOT_IMPLEMENTED,
                "\"no change feed: start the accelerator with --feed-state\"\n".into(),
            );
        };
        let Some(_turn) = feeds.submission_turn().await else {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "\"other submissions are being fetched; send it again\"\n".into(),
            );
        };
        let mut results = Vec::new();
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            if results.len() >= MAX_SUBMITTED {
                return (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("\"at most {MAX_SUBMITTED} URLs in one submission\"\n"),
                );
            }
            let failed = |detail: String| Submitted {
                path: line.to_owned(),
                result: "failed",
                csn: None,
                detail: Some(detail),
            };
            let request = match line.parse::<http::Uri>() {
                Ok(uri) if uri.scheme().is_some() && uri.authority().is_some() => {
                    Request::get(uri).body(()).expect("a parsed URI")
                }
                _ => {
                    results.push(failed("not an absolute http:// URL".into()));
                    continue;
                }
            };
            let route = match self.sites.route(&request) {
                Ok(route) if route.in_feed => route,
                Ok(_) => {
                    results.push(failed("a parent-mode site keeps no feed".into()));
                    continue;
                }
                Err(error) => {
                    results.push(failed(error.to_string()));
                    continue;
                }
            };
            let host = route.host.to_str().unwrap_or_default().to_ascii_lowercase();
            let path = request
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            let mut result = self.submit(&host, &route, &feeds, path).await;
            result.path = line.to_owned();
            results.push(result);
        }
        (
            StatusCode::OK,
            serde_json::to_string(&results).unwrap_or_default() + "\n",
        )
    }

    /// The walks of the document roots `feed` watches (`--feed-watch`),
    /// for the caller to spawn once: each changed file is submitted as on
    /// the admin listener, to the accelerator `current` gives (the one a
    /// reload made). `None` when nothing is watched.
    pub fn watch_doc_roots(
        feed: &Option<FeedConfig>,
        current: impl Fn() -> Option<Arc<Accelerator>> + Send + 'static,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let feed = feed.as_ref().filter(|feed| !feed.watches.is_empty())?;
        let mut roots: Vec<DocRoot> = feed
            .watches
            .iter()
            .map(|(dir, url)| DocRoot::new(dir.clone(), url.clone()))
            .collect();
        let interval = feed.watch_interval;
        Some(async move {
            loop {
                let walked = tokio::task::spawn_blocking(move || {
                    let changed: Vec<String> =
                        roots.iter_mut().flat_map(DocRoot::changes).collect();
                    (roots, changed)
                })
                .await;
                let Ok((walked_roots, changed)) = walked else {
                    return;
                };
                roots = walked_roots;
                if !changed.is_empty() {
                    let Some(accelerator) = current() else {
                        return;
                    };
                    for batch in changed.chunks(MAX_SUBMITTED) {
                        let (_, answer) = accelerator.submit_urls(&batch.join("\n")).await;
                        tracing::info!(files = batch.len(), %answer, "change feed: document root changed");
                    }
                }
                tokio::time::sleep(interval).await;
            }
        })
    }

    /// Fetches `path` of `host` from the origin and commits its body if it
    /// changed.
    async fn submit(
        &self,
        host: &str,
        route: &Route,
        feeds: &Arc<Feeds>,
        path: String,
    ) -> Submitted {
        let outcome = |result, detail: Option<String>| Submitted {
            path: path.clone(),
            result,
            csn: None,
            detail,
        };
        let mut request = Request::get(path.as_str())
            .header(header::HOST, route.host.clone())
            .body(())
            .expect("a parsed path");
        let route = match self.sites.route(&request) {
            Ok(route) => route,
            Err(error) => return outcome("failed", Some(error.to_string())),
        };
        request.headers_mut().insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        let (mut parts, ()) = request.into_parts();
        if let Err(error) = self.rewrite_request(&mut parts, &route, false, true) {
            return outcome("failed", Some(error.to_string()));
        }
        let forwarded = parts.headers.clone();
        let empty = Empty::<Bytes>::new()
            .map_err(|never| match never {})
            .boxed();
        let FromOrigin {
            parts,
            body,
            framing,
        } = match self.fetch(parts, empty, &route).await {
            Ok(answer) => answer,
            Err(error) => return outcome("failed", Some(error.to_string())),
        };
        if parts.status != StatusCode::OK {
            return outcome("origin-status", Some(parts.status.as_str().to_owned()));
        }
        if let Storability::NotStorable(reason) = shareable(&forwarded, &parts.headers) {
            return outcome("not-shareable", Some(reason.to_owned()));
        }
        if parts.headers.contains_key(header::CONTENT_ENCODING) {
            return outcome("not-coded", Some("the origin sent it content-coded".into()));
        }
        let limit = usize::try_from(self.config.max_encode_len).unwrap_or(usize::MAX);
        let read = tokio::time::timeout(self.config.origin_timeout, async {
            let mut hasher = blake3::Hasher::new();
            let mut length = 0u64;
            let mut body = Limited::new(body, limit);
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|error| error.to_string())?;
                if let Some(data) = frame.data_ref() {
                    hasher.update(data);
                    length += data.len() as u64;
                }
            }
            Ok::<_, String>((*hasher.finalize().as_bytes(), length))
        })
        .await;
        let (digest, length) = match read {
            Ok(Ok(read)) => read,
            Ok(Err(error)) => return outcome("failed", Some(format!("origin body: {error}"))),
            Err(_) => return outcome("failed", Some("origin body timed out".into())),
        };
        if let Some(violation) = framing.as_ref().and_then(ExchangeCheck::violation) {
            return outcome("failed", Some(ExchangeCheck::error(violation).to_string()));
        }
        match feeds.commit(host, &path, &digest, length) {
            Some(csn) => Submitted {
                csn: Some(csn),
                ..outcome("committed", None)
            },
            None => outcome("unchanged", None),
        }
    }
}

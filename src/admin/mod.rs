//! The admin listener (`admin-listen`, loopback by default, never the
//! proxy's own socket): Prometheus metrics at `/metrics`, a status page at
//! `/`, the same JSON counters as the proxy's `/.rproxy/stats`,
//! `PURGE /URL-PREFIX` to remove cached entries, and `POST /feed` with the
//! URLs that changed for the change feed ([`crate::feed`]). It
//! serves an [`Admin`] with the same accept loop and connection checks as
//! the proxies ([`crate::http::server`]), and a task samples the counters
//! every 10 s for the page's charts.
//!
//! Everything it shows is aggregates. Beyond loopback the config
//! refuses it without an auth-file; with one, every request must carry
//! `Authorization: Basic` for a user of the role's users file (checked
//! by the role's own [`Authenticator`], in its budget), since a browser
//! or a Prometheus server asks a plain server, not a proxy.
//!
//! Leaves out counting (the roles count; [`Source`] reads them) and the
//! process's lifecycle: [`serve`] takes a bound listener and a shutdown
//! future, so a reload can stop one and start another.
//!
//! The parts: `figures.rs` (a role's counters in one shape),
//! `metrics.rs` (the exposition), `history.rs` (the sampled rings),
//! `page.rs` (the HTML).
//!
//! Main items: [`Admin`], [`bind`], [`serve`], [`Figures`], [`Source`].

mod figures;
pub mod history;
mod metrics;
mod page;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use crate::feed::wire::MAX_SUBMISSION_BYTES;
use crate::http::auth::{Authenticator, Refusal};
use crate::http::server::{
    ConnectionLimits, Handler, Peer, ProxyBody, RequestBody, json_response, slow_request_body,
    text_response,
};

pub use figures::{BasisFigures, CacheFigures, FeedFigures, Figures, Outcomes, Source, Submission};
pub use history::{History, SAMPLE_EVERY};
pub use metrics::{CONTENT_TYPE as METRICS_CONTENT_TYPE, Metrics};
pub use page::{Summary, UpstreamView};

/// Where the metrics are.
pub const METRICS_PATH: &str = "/metrics";

/// The method that removes cached entries by URL prefix, as Varnish and
/// Squid name it.
const PURGE: &str = "PURGE";

/// Where the admin listener takes change feed submissions.
pub const FEED_SUBMIT_PATH: &str = "/feed";

/// Time a submission's body has to arrive.
const SUBMISSION_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections the admin listener serves at once: a scraper and a few
/// browsers, not the proxy's thousands.
const ADMIN_CONNECTIONS: usize = 64;

/// What the admin listener serves: a role's counters, as metrics, a page
/// and JSON.
pub struct Admin {
    source: Arc<dyn Source>,
    metrics: Metrics,
    summary: Summary,
    /// Checks `Authorization` when the listener is beyond loopback.
    auth: Option<Arc<Authenticator>>,
    history: Mutex<History>,
    /// Where it listens, for the page (filled in once bound).
    address: Mutex<Option<SocketAddr>>,
    /// When it was made (Unix seconds): the page's uptime.
    started: u64,
}

impl Admin {
    /// The admin side of `source`, described by `summary`, asking for
    /// `auth`'s users when given.
    pub fn new(
        source: Arc<dyn Source>,
        summary: Summary,
        auth: Option<Arc<Authenticator>>,
    ) -> Admin {
        Admin {
            metrics: Metrics::new(source.clone()),
            source,
            summary,
            auth,
            history: Mutex::new(History::default()),
            address: Mutex::new(None),
            started: unix_now(),
        }
    }

    /// The Prometheus exposition now.
    pub fn metrics(&self) -> String {
        self.metrics.encode()
    }

    /// Samples the counters into the history, at `at` (Unix seconds).
    pub fn sample(&self, at: u64) {
        let point = history::Point::of(&self.source.figures(), at);
        self.history().record(point);
    }

    /// The status page now.
    pub fn page(&self) -> String {
        let address = self
            .address
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unwrap_or(self.summary.listen);
        page::render(
            &self.summary,
            address,
            &self.source.figures(),
            &self.history(),
            unix_now(),
            self.started,
        )
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        // Points are whole values: a panic elsewhere leaves none torn.
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn answer(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        if let Some(auth) = &self.auth {
            let peer = request.extensions().get::<Peer>().map(|peer| peer.0.ip());
            if let Err(refusal) = auth
                .check(&as_proxy_credentials(request.headers()), peer)
                .await
            {
                return refused(refusal, auth);
            }
        }
        if request.method().as_str() == PURGE {
            return self.purge(request.uri()).await;
        }
        if request.method() == Method::POST && request.uri().path() == FEED_SUBMIT_PATH {
            return self.submit(request.into_body()).await;
        }
        if request.method() != Method::GET && request.method() != Method::HEAD {
            let mut response = text_response(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("the admin listener answers GET, HEAD, PURGE, and POST {FEED_SUBMIT_PATH}"),
            );
            response.headers_mut().insert(
                header::ALLOW,
                HeaderValue::from_static("GET, HEAD, PURGE, POST"),
            );
            return response;
        }
        let (body, content_type) = match request.uri().path() {
            "/" => (self.page(), "text/html; charset=utf-8"),
            METRICS_PATH => (self.metrics(), metrics::CONTENT_TYPE),
            crate::client_proxy::STATS_PATH => (self.source.stats_json(), "application/json"),
            _ => {
                return text_response(
                    StatusCode::NOT_FOUND,
                    format!(
                        "not here: / is the status page, {METRICS_PATH} the metrics, {} the JSON counters",
                        crate::client_proxy::STATS_PATH
                    ),
                );
            }
        };
        let mut response = Response::new(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed(),
        );
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

impl Admin {
    /// `POST /feed`: the URLs that changed, one per line, for the change
    /// feed (a deploy hook's SubmitUpdate): the accelerator fetches and
    /// commits them; a client proxy passes them to its upstream.
    async fn submit(&self, body: RequestBody) -> Response<ProxyBody> {
        let read = tokio::time::timeout(
            SUBMISSION_READ_TIMEOUT,
            Limited::new(body, MAX_SUBMISSION_BYTES).collect(),
        )
        .await;
        let urls = match read {
            Ok(Ok(body)) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
            Ok(Err(error)) if let Some(refusal) = slow_request_body(&*error) => {
                return refusal.log_and_respond();
            }
            _ => {
                return text_response(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "POST {FEED_SUBMIT_PATH} with the changed URLs, one per line, \
                         in at most {MAX_SUBMISSION_BYTES} bytes"
                    ),
                );
            }
        };
        match self.source.submit(urls).await {
            Some((status, json)) => json_response(status, json),
            None => text_response(
                StatusCode::NOT_IMPLEMENTED,
                "this role keeps no change feed".into(),
            ),
        }
    }

    /// `PURGE /URL-PREFIX`: removes the cached entries whose URL starts
    /// with the prefix (as stored: lower-case scheme and host, no default
    /// port); `PURGE /*` removes them all. Safe while requests run: one
    /// being served keeps reading its open file.
    async fn purge(&self, target: &http::Uri) -> Response<ProxyBody> {
        let asked = target
            .path_and_query()
            .map_or("", |p| p.as_str())
            .trim_start_matches('/');
        let prefix = match asked {
            "" => {
                return text_response(
                    StatusCode::BAD_REQUEST,
                    "PURGE /URL-PREFIX, e.g. PURGE /http://www.example.com/static/; \
                     PURGE /* removes every entry"
                        .into(),
                );
            }
            "*" => String::new(),
            prefix => prefix.to_owned(),
        };
        let source = self.source.clone();
        let purged = tokio::task::spawn_blocking(move || source.purge(&prefix)).await;
        match purged {
            Ok(Some(report)) => {
                tracing::info!(
                    prefix = asked,
                    entries = report.entries,
                    bytes = report.bytes,
                    "purged"
                );
                json_response(
                    StatusCode::OK,
                    format!(
                        "{{\"entries\":{},\"bytes\":{}}}\n",
                        report.entries, report.bytes
                    ),
                )
            }
            Ok(None) => text_response(
                StatusCode::NOT_IMPLEMENTED,
                "this role keeps no cache to purge".into(),
            ),
            Err(error) => text_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the purge failed: {error}"),
            ),
        }
    }
}

impl Handler for Admin {
    fn handle(
        self: Arc<Self>,
        request: Request<RequestBody>,
    ) -> impl Future<Output = Response<ProxyBody>> + Send {
        self.answer(request)
    }
}

/// `Authorization` as the authenticator reads credentials
/// (`Proxy-Authorization`): a browser or Prometheus talks to the admin
/// listener as to a server.
fn as_proxy_credentials(headers: &HeaderMap) -> HeaderMap {
    let mut credentials = HeaderMap::new();
    for value in headers.get_all(header::AUTHORIZATION) {
        credentials.append(header::PROXY_AUTHORIZATION, value.clone());
    }
    credentials
}

/// 401 with the role's realm, or 429 while logins are throttled or busy.
fn refused(refusal: Refusal, auth: &Authenticator) -> Response<ProxyBody> {
    match refusal {
        Refusal::Unauthorized => {
            let mut response = text_response(
                StatusCode::UNAUTHORIZED,
                "log in as a user of the proxy's auth-file".into(),
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, auth.challenge().clone());
            response
        }
        Refusal::Throttled(seconds) | Refusal::Busy(seconds) => {
            let mut response = text_response(
                StatusCode::TOO_MANY_REQUESTS,
                "too many logins; try again later".into(),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            response
        }
    }
}

/// Binds the admin listener, before the runtime starts (so a taken port
/// is a start-up error).
///
/// # Errors
/// The address cannot be bound.
pub fn bind(address: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(address)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// Serves `admin` on `listener` until `shutdown` resolves, sampling its
/// counters every [`SAMPLE_EVERY`] meanwhile. Runs inside a tokio
/// runtime.
///
/// # Errors
/// The listener cannot join the runtime.
pub async fn serve(
    listener: std::net::TcpListener,
    admin: Arc<Admin>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    *admin.address.lock().unwrap_or_else(PoisonError::into_inner) = listener.local_addr().ok();
    let sampler = tokio::spawn(sample_every(admin.clone(), SAMPLE_EVERY));
    let limits = ConnectionLimits {
        max_connections: ADMIN_CONNECTIONS,
        drain_timeout: Duration::from_secs(1),
        ..ConnectionLimits::default()
    };
    crate::http::server::serve(listener, admin, limits, shutdown).await;
    sampler.abort();
    Ok(())
}

/// Samples `admin`'s counters at once and then every `every`.
async fn sample_every(admin: Arc<Admin>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        admin.sample(unix_now());
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

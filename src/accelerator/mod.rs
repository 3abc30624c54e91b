//! The accelerator: a reverse proxy in front of origin servers (one per
//! site, or the whole web for a parent-mode site) that answers clients
//! offering hsync with a delta stream against the basis signature they
//! sent, and gets out of the way of everyone else.
//!
//! It encodes exactly when DESIGN.md says: a GET that offers hsync and has
//! no Range, an origin 200 without Content-Encoding or `no-transform`, and
//! a body no larger than the configured limit. The origin is asked for
//! identity then. Everything else passes through untouched, streaming.
//! A body the origin announces at most `SMALL_BODY` (64 KiB) long is read
//! whole and coded in one go on a blocking thread, and sent with a
//! Content-Length: cheaper per request, and a cut or late origin body is a
//! clean 502/504. A larger one is coded as it streams: bounded channels, so
//! a slow client slows the origin read instead of filling memory; a
//! blocking thread, in its turn, only for a window's CPU work, so a client
//! that stops reading holds no thread (L-13); and a client that has taken
//! nothing for 100 ms gets the rest of its body through a
//! [`Spool`](crate::http::spool::Spool) on disk (`--spool-dir`, at most
//! `--max-spool` ahead of it), as nginx's `proxy_buffering` does.
//!
//! Bodies it serves coded are kept in a bounded [`basis_store::BasisStore`]
//! (memory, disk for large ones, optionally Redis shared with the other
//! accelerators behind one balancer) when a shared cache could store them (no `private`, `no-store`, cookies or
//! credentials, unless `basis_store_private`); a client that names one of
//! them in `Hsync-Basis` gets codec 3 (compressed against the body
//! itself), otherwise the rsync stream. A TRACE or OPTIONS whose
//! `Max-Forwards` reached 0 is answered here.
//!
//! This file is the role's dispatch: admission (the stats path, the site,
//! loops, `Max-Forwards`, upload slots) and the decision to code or pass
//! through. The rest, one reason to change per file:
//! - `config.rs`: the validated settings; `stats.rs`: the counters;
//! - `sites.rs`: which site and origin a request (or a CONNECT) is for,
//!   and each origin's health; `origin.rs`: the request as it goes and
//!   the trip to the origin (refused at once, 503, while the origin is
//!   marked down); `checks.rs`: the active checks of a `health-path`;
//!   `tunnel.rs`: a parent-mode site's CONNECT tunnels;
//! - [`coder`]: whether and how an answer is coded (the head, the
//!   encoder, whole or streamed), shared with a client proxy that serves
//!   downstream client proxies;
//! - `coding.rs`: what a coded response is coded with, handed from the coder to
//!   `whole.rs` (small bodies, coded whole) or `stream.rs` (coded as they
//!   stream, parked for a client that stopped reading);
//! - `turns.rs`: the encoders' turns on the CPU; `pacing.rs`: what each
//!   window cost, measured for [`pace`], which decides entropy coding;
//! - [`basis_store`]: bodies served, kept as bases; [`slots`]: the upload
//!   queue.
//!
//! Leaves out the connection (TLS, HTTP/2, limits: `http::server`) and
//! authentication (`http::auth`'s gate wraps the role).
//!
//! Main types: [`Accelerator`], [`AcceleratorConfig`].

pub mod basis_store;
mod checks;
pub mod coder;
mod coding;
mod config;
mod feed;
mod origin;
pub mod pace;
mod pacing;
mod probe;
mod sites;
pub mod slots;
mod stats;
mod stream;
mod tunnel;
mod turns;
mod whole;

pub use coder::{Coder, CoderConfig, Offer};
pub use config::{
    AcceleratorConfig, ConfigError, FeedConfig, ParentPolicy, SiteConfig, SiteNames, SiteOrigin,
    TrustedForwarders,
};
pub use stats::{STATS_PATH, Stats, StatsSnapshot, Timings};

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};

use crate::feed::primary::FeedCommit;
use crate::feed::{FEED_PATH, Feeds};
use crate::http::access_log::{Note, Side};
use crate::http::error::ProxyError;
use crate::http::headers::{HSYNC_VARY, Hop, answer_at_this_hop, max_forwards, via_names_hop};
use crate::http::health::HealthView;
use crate::http::server::{BodyError, ConnectionNumber, Handler, ProxyBody, RequestBody, counted};
use crate::http::upstream_guard::{self, ExchangeCheck};

use origin::FromOrigin;
use sites::Sites;
use slots::{Admitted, Slots};

/// What an OPTIONS this hop answers itself says in `Allow`: the methods it
/// forwards to the origin (all but CONNECT; whether the origin's resource
/// takes them is for the origin to say, to a request that reaches it).
const FORWARDED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";

/// The accelerator role.
pub struct Accelerator {
    config: AcceleratorConfig,
    slots: Option<Arc<Slots>>,
    sites: Sites,
    coder: Coder,
    stats: Arc<Stats>,
    /// The sites' change feeds (`--feed-state`), kept across reloads.
    feeds: Option<Arc<Feeds>>,
}

impl Accelerator {
    /// Builds the accelerator and a pooled client per site.
    ///
    /// # Errors
    /// A [`ConfigError`]: no site, a bad origin URL, origin TLS that
    /// cannot be set up.
    pub fn new(config: AcceleratorConfig) -> Result<Self, ConfigError> {
        let sites = Sites::new(&config.sites, config.connect_timeout, config.health, None)?;
        let slots = config
            .queue
            .clone()
            .map(|queue| Arc::new(Slots::new(queue, config.queue_state.clone())));
        let stats = Arc::new(Stats::default());
        let feeds =
            match &config.feed {
                Some(feed) => Some(Feeds::open(&feed.dir, feed.retention).map_err(|error| {
                    ConfigError::Feed {
                        dir: feed.dir.clone(),
                        error,
                    }
                })?),
                None => None,
            };
        Ok(Accelerator {
            coder: Coder::new(CoderConfig::from(&config), stats.clone()),
            stats,
            slots,
            config,
            sites,
            feeds,
        })
    }

    /// This accelerator with a new configuration (a reload): new sites
    /// and coding settings, the same counters, upload slots and queue,
    /// and kept bodies; what was known of each origin's health carries
    /// over by its URL. Requests under way finish with this one. Its
    /// health checks are the caller's to start
    /// ([`Accelerator::health_checks`]); this one's end with it.
    ///
    /// # Errors
    /// As [`Accelerator::new`].
    pub fn reconfigured(&self, config: AcceleratorConfig) -> Result<Self, ConfigError> {
        Ok(Accelerator {
            sites: Sites::new(
                &config.sites,
                config.connect_timeout,
                config.health,
                Some(&self.sites),
            )?,
            coder: self.coder.reconfigured(CoderConfig::from(&config)),
            stats: self.stats.clone(),
            slots: self.slots.clone(),
            feeds: self.feeds.clone(),
            config,
        })
    }

    /// The settings it runs with.
    pub fn config(&self) -> &AcceleratorConfig {
        &self.config
    }

    /// The transfer memory's shares now, for the metrics.
    pub fn transfer_memory_figures(&self) -> crate::http::transfer_memory::MemoryFigures {
        self.coder.memory_figures()
    }

    /// The change feed's logs, for the metrics.
    pub fn feed_figures(&self) -> Vec<crate::admin::FeedFigures> {
        let Some(feeds) = &self.feeds else {
            return Vec::new();
        };
        feeds
            .figures()
            .into_iter()
            .map(|(zone, csn, entries, pulls)| crate::admin::FeedFigures {
                zone,
                csn,
                entries,
                pulls,
                ..crate::admin::FeedFigures::default()
            })
            .collect()
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The upload slots, when there are any.
    pub fn slots(&self) -> Option<&Arc<Slots>> {
        self.slots.as_ref()
    }

    /// The health of each site's origin server, once per origin (parent-
    /// mode sites have none), for the status page and metrics.
    pub fn health_views(&self) -> Vec<HealthView> {
        self.sites.health_views(tokio::time::Instant::now())
    }

    /// The active health checks of the origins with a `health-path`, for
    /// the caller to spawn once the accelerator serves (and again for the
    /// one a reload builds): they run every `health_interval` and end
    /// once this accelerator is dropped. Nothing to do without a
    /// `health-path`.
    pub fn health_checks(&self) -> impl Future<Output = ()> + Send + 'static {
        // Settings refuse 0, which `tokio::time::interval` would panic on.
        let interval = self.config.health_interval.max(Duration::from_millis(1));
        checks::run(
            self.sites.checks(),
            interval,
            interval.min(self.config.origin_timeout),
        )
    }

    /// Refuses a request: counted under its fault, logged, answered.
    fn refuse(&self, error: ProxyError) -> Response<ProxyBody> {
        self.stats.refused(error.kind());
        error.log_and_respond()
    }

    async fn proxy(self: Arc<Self>, mut request: Request<RequestBody>) -> Response<ProxyBody> {
        if request.method() == Method::GET
            && request
                .uri()
                .authority()
                .is_none_or(|authority| sites::names_us(&request, authority))
            && request.uri().path() == STATS_PATH
        {
            let mut response = Response::new(
                Full::new(Bytes::from(self.stats.to_json()))
                    .map_err(|never| match never {})
                    .boxed(),
            );
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return response;
        }
        // Requests for the sites: the stats polls are not among them.
        Stats::add(&self.stats.requests, 1);
        if let Some(note) = request.extensions().get::<Note>() {
            note.side(Side::Accelerator);
        }
        if request.method() == Method::CONNECT {
            return self.tunnel(request).await;
        }
        let route = match self.sites.route(&request) {
            Ok(route) => route,
            Err(refusal) => return self.refuse(refusal),
        };
        if via_names_hop(request.headers(), self.config.via_name.as_bytes()) {
            return self.refuse(ProxyError::loop_detected(format!(
                "request already passed {}",
                self.config.via_name.to_str().unwrap_or("us")
            )));
        }
        let method = request.method().clone();
        if max_forwards(&method, request.headers_mut()) == Hop::Answer {
            // Before admission: answering costs less than queueing would.
            tracing::debug!(%method, status = 200, mode = "max-forwards", "answered here");
            return answer_at_this_hop(&request, FORWARDED_METHODS)
                .map(|echo| Full::new(echo).map_err(|never| match never {}).boxed());
        }
        // After auth (the gate in front of us) and the checks above, so
        // neither a stranger nor a bad request takes a place.
        let token = match self.slots.as_ref().map(|slots| slots.admit(&request)) {
            None => None,
            Some(Admitted::Serve(token)) => Some(token),
            Some(Admitted::Answer(response)) => {
                Stats::add(&self.stats.queued, 1);
                return response;
            }
        };
        let slots = self.slots.clone();
        // A feed request takes its turn as any other: its work (a long
        // listing, a submission's origin fetches) is bounded by the slots.
        let response = match self.feeds.clone() {
            Some(feeds) if route.in_feed && request.uri().path() == FEED_PATH => {
                self.feed_request(request, route, feeds).await
            }
            _ => self.exchange(request, route).await,
        };
        match (slots, token) {
            (Some(slots), Some(token)) => slots.release_with(token, response),
            _ => response,
        }
    }

    /// Forwards an admitted request along `route` and answers it, coded
    /// or passed through.
    async fn exchange(
        self: Arc<Self>,
        request: Request<RequestBody>,
        route: sites::Route,
    ) -> Response<ProxyBody> {
        let (mut parts, body) = request.into_parts();
        let (offer, body) = match self.coder.offer_reading_body(&mut parts, body).await {
            Ok(read) => read,
            Err(refusal) => return self.refuse(refusal),
        };
        if let Err(refusal) =
            self.rewrite_request(&mut parts, &route, offer.offers_hsync, offer.encodable)
        {
            return self.refuse(refusal);
        }
        // What the basis store decision reads of the request (D-B3), once
        // the response head is in.
        let request_headers = offer.encodable.then(|| parts.headers.clone());
        let method = parts.method.clone();
        let uri = parts.uri.clone();
        let note = parts.extensions.get::<Note>().cloned();
        // A query may carry what one user was given (a token, an id): a
        // path served enters the feed only without one. Submissions and
        // watched roots, which the operator names, may have any.
        let feed = match &self.feeds {
            Some(feeds) if route.in_feed && method == Method::GET && uri.query().is_none() => {
                Some(FeedCommit::new(
                    feeds.clone(),
                    route.host.to_str().unwrap_or_default().to_ascii_lowercase(),
                    uri.path().to_owned(),
                ))
            }
            _ => None,
        };
        let FromOrigin {
            mut parts,
            body,
            framing,
        } = match self.fetch(parts, body, &route).await {
            Ok(answer) => answer,
            Err(refusal) => return self.refuse(refusal),
        };
        let mut body = body.map_err(BodyError::from).boxed();
        // P-17: a response longer than its framing, known before our head
        // goes: passed on as declared (`fetch` made it no-store), never
        // coded, so never kept as a basis nor listed in the feed.
        let excess = framing.as_ref().is_some_and(ExchangeCheck::has_excess);
        let mut gains_nothing =
            request_headers.is_some() && self.coder.gains_nothing(&offer, &parts);
        let codes = request_headers.is_some() && !excess && self.coder.codes(&offer, &parts);
        if codes && !gains_nothing && self.coder.probes(&offer, &parts) {
            // A large body no basis will help: its first bytes tell
            // whether a stream could be smaller than the body at all.
            (body, gains_nothing) = self.coder.probe(body).await;
            if gains_nothing {
                tracing::debug!(%uri, "first bytes do not compress: passed as sent");
            }
        }
        match request_headers {
            Some(request) if codes && !gains_nothing => {
                if let Some(note) = note {
                    parts.extensions.insert(note);
                }
                if let Some(feed) = feed {
                    parts.extensions.insert(feed);
                }
                match (self.coder)
                    .code(parts, body, framing, offer, &request, method, uri)
                    .await
                {
                    Ok(response) => response,
                    Err(refusal) => self.refuse(refusal),
                }
            }
            _ => {
                if gains_nothing {
                    // Coded for a request that names a basis: an unaware
                    // cache between the proxies must not serve this copy
                    // to that one.
                    parts
                        .headers
                        .append(header::VARY, HeaderValue::from_static(HSYNC_VARY));
                }
                Stats::add(&self.stats.passed, 1);
                let status = parts.status.as_u16();
                if let Some(check) = framing.filter(|_| !excess) {
                    body = upstream_guard::checked_at_end(body, check);
                }
                if let Some(note) = &note {
                    note.coding("identity", None);
                }
                let stats = self.stats.clone();
                let body = counted(body, move |bytes, complete| {
                    Stats::add(&stats.passed_bytes, bytes);
                    tracing::debug!(%method, %uri, status, mode = "pass", bytes, complete, "passed");
                    if let Some(note) = note {
                        note.from_upstream(bytes);
                    }
                });
                Response::from_parts(parts, body)
            }
        }
    }
}

impl Handler for Accelerator {
    fn handle(
        self: Arc<Self>,
        request: Request<RequestBody>,
    ) -> impl Future<Output = Response<ProxyBody>> + Send {
        self.proxy(request)
    }

    fn connection_closed(&self, number: ConnectionNumber) {
        if let Some(slots) = &self.slots {
            slots.disconnected(number);
        }
    }

    fn stopped(&self) {
        if let Some(feeds) = &self.feeds {
            feeds.write_clean();
        }
        if let Some(slots) = &self.slots
            && let Err(error) = slots.save()
        {
            tracing::warn!(%error, "cannot save the queue on the way out");
        }
    }
}

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
//! Bodies it serves coded are kept in a bounded [`BasisStore`] when a
//! shared cache could store them (no `private`, `no-store`, cookies or
//! credentials, unless `basis_store_private`); a client that names one of
//! them in `Hsync-Basis` gets codec 3 (compressed against the body
//! itself), otherwise the rsync stream. A TRACE or OPTIONS whose
//! `Max-Forwards` reached 0 is answered here.
//!
//! This file is the role's dispatch: admission (the stats path, the site,
//! loops, `Max-Forwards`, upload slots) and the decision to code or pass
//! through. The rest, one reason to change per file:
//! - `config.rs`: the validated settings; `stats.rs`: the counters;
//! - `sites.rs`: which site and origin a request is for; `origin.rs`: the
//!   request as it goes and the trip to the origin;
//! - `coding.rs`: what a coded response is coded with, handed from here to
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
mod coding;
mod config;
mod origin;
pub mod pace;
mod pacing;
mod sites;
pub mod slots;
mod stats;
mod stream;
mod turns;
mod whole;

pub use config::{
    AcceleratorConfig, ConfigError, ParentPolicy, SiteConfig, SiteNames, SiteOrigin,
    TrustedForwarders,
};
pub use stats::{STATS_PATH, Stats};

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::cache::freshness::Storability;
use crate::hsync::{Basis, Encoder};
use crate::http::body_pipe::Parking;
use crate::http::error::ProxyError;
use crate::http::headers::{
    HSYNC_ACCEPT, HSYNC_BASIS, HSYNC_CODING, HSYNC_SIGNATURE, Hop, accepts_hsync,
    answer_at_this_hop, max_forwards, parse_byte_sequence, via_names_hop, weaken_etag,
};
use crate::http::server::{BodyError, ConnectionNumber, Handler, ProxyBody, counted};
use crate::http::spool::SpoolDisk;
use crate::http::transfer_memory::{TransferMemory, coded_transfer_cost};
use crate::http::upstream_guard;

use basis_store::{BasisStore, shareable};
use coding::Coding;
use origin::FromOrigin;
use pace::Pacer;
use sites::Sites;
use slots::{Admitted, Slots};
use stream::encode_body;
use turns::Encoders;
use whole::{OriginBody, SMALL_BODY, encode_whole};

/// What an OPTIONS this hop answers itself says in `Allow`: the methods it
/// forwards to the origin (all but CONNECT; whether the origin's resource
/// takes them is for the origin to say, to a request that reaches it).
const FORWARDED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";

/// The accelerator role.
pub struct Accelerator {
    config: AcceleratorConfig,
    slots: Option<Arc<Slots>>,
    sites: Sites,
    bodies: Arc<BasisStore>,
    stats: Arc<Stats>,
    encoders: Encoders,
    /// What streamed codings hold at once.
    memory: TransferMemory,
    parking: Option<Parking>,
}

/// What a request offers of hsync, read before its head is rewritten.
struct Offer {
    /// `Accept-Encoding` names hsync.
    offers_hsync: bool,
    /// A GET without Range that offers hsync: the answer may be coded.
    encodable: bool,
    /// The client's basis signature, decoded.
    signature: Option<Vec<u8>>,
    /// `Hsync-Basis` as sent (echoed in the answer) and the digest it names.
    basis_name: Option<HeaderValue>,
    basis_digest: Option<[u8; 32]>,
}

impl Offer {
    fn read(method: &Method, headers: &HeaderMap, max_signature: usize) -> Offer {
        let offers_hsync = accepts_hsync(headers);
        let basis_name = headers.get(HSYNC_BASIS).cloned();
        Offer {
            offers_hsync,
            encodable: offers_hsync
                && method == Method::GET
                && !headers.contains_key(header::RANGE),
            signature: headers
                .get(HSYNC_SIGNATURE)
                .and_then(|v| parse_byte_sequence(v, max_signature)),
            basis_digest: basis_name
                .as_ref()
                .and_then(|name| parse_byte_sequence(name, 32))
                .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok()),
            basis_name,
        }
    }
}

impl Accelerator {
    /// Builds the accelerator and a pooled client per site.
    ///
    /// # Errors
    /// A [`ConfigError`]: no site, a bad origin URL, origin TLS that
    /// cannot be set up.
    pub fn new(config: AcceleratorConfig) -> Result<Self, ConfigError> {
        let sites = Sites::new(&config.sites, config.connect_timeout)?;
        let bodies = Arc::new(BasisStore::new(
            config.basis_store_bytes,
            config.max_stored_body,
        ));
        let slots = config
            .queue
            .clone()
            .map(|queue| Arc::new(Slots::new(queue, config.queue_state.clone())));
        let encoders = match config.max_encoders {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let parking = (config.max_spool > 0).then(|| Parking {
            disk: SpoolDisk::new(config.max_spool_total),
            dir: config.spool_dir.as_path().into(),
            limit: config.max_spool,
        });
        Ok(Accelerator {
            memory: TransferMemory::new(config.transfer_memory),
            parking,
            slots,
            encoders: Encoders::new(encoders),
            stats: Arc::default(),
            bodies,
            config,
            sites,
        })
    }

    /// The upload slots, when there are any.
    pub fn slots(&self) -> Option<&Arc<Slots>> {
        self.slots.as_ref()
    }

    /// Refuses a request: counted under its fault, logged, answered.
    fn refuse(&self, error: ProxyError) -> Response<ProxyBody> {
        self.stats.refused(error.fault());
        error.log_and_respond()
    }

    async fn proxy(self: Arc<Self>, mut request: Request<Incoming>) -> Response<ProxyBody> {
        Stats::add(&self.stats.requests, 1);
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
            tracing::info!(%method, status = 200, mode = "max-forwards", "request");
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
        let response = self.exchange(request, route).await;
        match (slots, token) {
            (Some(slots), Some(token)) => slots.release_with(token, response),
            _ => response,
        }
    }

    /// Forwards an admitted request along `route` and answers it, coded
    /// or passed through.
    async fn exchange(
        self: Arc<Self>,
        request: Request<Incoming>,
        route: sites::Route,
    ) -> Response<ProxyBody> {
        let (mut parts, body) = request.into_parts();
        let offer = Offer::read(
            &parts.method,
            &parts.headers,
            self.config.max_signature_bytes,
        );
        if let Err(refusal) =
            self.rewrite_request(&mut parts, &route, offer.offers_hsync, offer.encodable)
        {
            return self.refuse(refusal);
        }
        // What the basis store decision reads of the request (D-B3), once
        // the response head is in.
        let request_headers =
            (offer.encodable && !self.config.basis_store_private).then(|| parts.headers.clone());
        let method = parts.method.clone();
        let uri = parts.uri.clone();
        match self.fetch(parts, body, &route).await {
            Ok(answer) => {
                self.respond(answer, offer, request_headers, method, uri)
                    .await
            }
            Err(refusal) => self.refuse(refusal),
        }
    }

    /// The origin's answer for the client: coded when the offer, the
    /// status, the coding and the size allow, else passed through.
    async fn respond(
        self: Arc<Self>,
        answer: FromOrigin,
        offer: Offer,
        request_headers: Option<HeaderMap>,
        method: Method,
        uri: Uri,
    ) -> Response<ProxyBody> {
        let FromOrigin {
            mut parts,
            body,
            framing,
        } = answer;
        let content_length = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let coded = parts
            .headers
            .get(header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        let no_transform = parts
            .headers
            .get_all(header::CACHE_CONTROL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|d| d.trim().eq_ignore_ascii_case("no-transform"));
        let encode = offer.encodable
            && parts.status == StatusCode::OK
            && !coded
            && !no_transform
            && content_length.is_none_or(|len| len <= self.config.max_encode_len);

        if !encode {
            Stats::add(&self.stats.passed, 1);
            let status = parts.status.as_u16();
            let mut body = body.map_err(BodyError::from).boxed();
            if let Some(check) = framing {
                body = upstream_guard::checked_at_end(body, check);
            }
            let body = counted(body, move |bytes, complete| {
                tracing::info!(%method, %uri, status, mode = "pass", bytes, complete, "request");
            });
            return Response::from_parts(parts, body);
        }

        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(HSYNC_CODING),
        );
        parts.headers.append(
            header::VARY,
            HeaderValue::from_static("Accept-Encoding, Hsync-Basis"),
        );
        weaken_etag(&mut parts.headers);
        if let Some(name) = offer.basis_name {
            parts.headers.insert(HSYNC_BASIS, name);
        }
        parts.headers.insert(HSYNC_ACCEPT, self.hsync_accept());
        // A basis we served and still hold: compress against the body itself.
        let held = offer
            .basis_digest
            .and_then(|digest| self.bodies.get(&digest))
            .map(|body| Box::new(body) as Box<dyn Basis + Send + Sync>);
        let encoder = match held {
            Some(basis) => Encoder::with_basis_body(basis, content_length, self.config.encoder),
            None => Encoder::new(
                offer.signature.as_deref(),
                content_length,
                self.config.encoder,
            ),
        };
        tracing::debug!(basis = ?encoder.basis_use(), "encoding");
        let keep = content_length.is_none_or(|len| len <= self.bodies.max_body() as u64)
            && self.may_keep(request_headers.as_ref(), &parts.headers);
        let store = keep.then(|| self.bodies.clone());
        Stats::add(&self.stats.coded, 1);
        if content_length.is_some_and(|len| len <= SMALL_BODY) {
            let origin = OriginBody {
                body,
                framing,
                timeout: self.config.origin_timeout,
            };
            let coding = Coding {
                encoder,
                encoders: self.encoders.clone(),
                memory: None,
                store,
                stats: self.stats.clone(),
                parking: None,
            };
            return match encode_whole(origin, coding, method, uri).await {
                Ok(stream) => Response::from_parts(
                    parts,
                    Full::new(stream).map_err(|never| match never {}).boxed(),
                ),
                Err(refusal) => self.refuse(refusal),
            };
        }
        let pacer = self.config.adapt_entropy_coding.then(Pacer::new);
        let coding = Coding {
            encoder,
            encoders: self.encoders.clone(),
            memory: Some((
                self.memory.clone(),
                // The coding's state, and the copy of the body collected
                // for the basis store.
                coded_transfer_cost(self.config.encoder.window_bytes, content_length)
                    + if keep {
                        content_length.unwrap_or(self.bodies.max_body() as u64)
                    } else {
                        0
                    },
                content_length,
            )),
            store,
            stats: self.stats.clone(),
            parking: self.parking.clone(),
        };
        let body = encode_body(body, framing, coding, pacer, method, uri);
        Response::from_parts(parts, body)
    }

    /// Whether the basis store may keep this response's body: only what a
    /// shared cache may store, unless the operator opted in (D-B3).
    /// `request` is `None` when the operator did.
    fn may_keep(&self, request: Option<&http::HeaderMap>, response: &http::HeaderMap) -> bool {
        let Some(request) = request else {
            return true;
        };
        match shareable(request, response) {
            Storability::Storable => true,
            Storability::NotStorable(reason) => {
                tracing::debug!(reason, "body not kept as a basis");
                false
            }
        }
    }

    /// What we advertise: version and the signature size we accept.
    fn hsync_accept(&self) -> HeaderValue {
        HeaderValue::from_str(&format!(
            "v=1, max-signature={}",
            self.config.max_signature_bytes
        ))
        .expect("digits and ASCII")
    }
}

impl Handler for Accelerator {
    fn handle(
        self: Arc<Self>,
        request: Request<Incoming>,
    ) -> impl Future<Output = Response<ProxyBody>> + Send {
        self.proxy(request)
    }

    fn connection_closed(&self, number: ConnectionNumber) {
        if let Some(slots) = &self.slots {
            slots.disconnected(number);
        }
    }
}

//! The accelerator: a reverse proxy in front of one origin that answers
//! clients offering hsync with a delta stream against the basis signature
//! they sent, and gets out of the way of everyone else.
//!
//! It encodes exactly when DESIGN.md says: a GET that offers hsync and has
//! no Range, an origin 200 without Content-Encoding or `no-transform`, and
//! a body no larger than the configured limit. The origin is asked for
//! identity then. Everything else passes through untouched, streaming.
//! The encoder is an async task between two bounded channels, so a slow
//! client slows the origin read instead of filling memory, and the first
//! frames leave before the origin has finished; it borrows a blocking
//! thread, in its turn, only for a window's CPU work, so a client that
//! stops reading holds no thread (L-13), and after a moment of waiting
//! the encoder gives back the scratch memory it can rebuild. A client
//! that has taken nothing for 100 ms gets the rest of its body through a
//! [`Spool`] on disk (`--spool-dir`, at most `--max-spool` ahead of it),
//! as nginx's `proxy_buffering` does: the encoder finishes at the origin's
//! pace and frees its state, and the client holds a page. A body the
//! origin announces at most `SMALL_BODY` (64 KiB) long is read whole and
//! coded in one go on a blocking thread instead, and sent with a
//! Content-Length: cheaper per request, and a cut or late origin body is a
//! clean 502/504.
//!
//! Bodies it serves coded are kept in a bounded [`BasisStore`] when a
//! shared cache could store them (no `private`, `no-store`, cookies or
//! credentials, unless `basis_store_private`); a client that names one of
//! them in `Hsync-Basis` gets codec 3 (compressed against the body
//! itself), otherwise the rsync stream. A TRACE or OPTIONS whose
//! `Max-Forwards` reached 0 is answered here.
//!
//! Leaves out (for now): TLS, HTTP/2, auth and queueing.
//!
//! Main types: [`Accelerator`], [`AcceleratorConfig`].

pub mod basis_store;
mod config;
pub mod pace;
mod pacing;
pub mod slots;
mod stats;
mod turns;

pub use config::{AcceleratorConfig, ConfigError};
pub use stats::{STATS_PATH, Stats};

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::http::upstream_guard::{self, ExchangeCheck, FramedHttpConnector};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::cache::freshness::Storability;
use crate::hsync::{Basis, EncodeError, Encoder};
use crate::http::error::ProxyError;
use crate::http::headers::{
    HSYNC_ACCEPT, HSYNC_BASIS, HSYNC_CODING, HSYNC_SIGNATURE, Hop, accepts_hsync, add_via,
    answer_at_this_hop, check_response_head, max_forwards, parse_byte_sequence,
    remove_hsync_coding, strip_hop_by_hop, via_names_hop, weaken_etag,
};
use crate::http::server::{
    BodyError, ConnectionNumber, Handler, ProxyBody, counted, malformed_request_body,
};
use crate::http::spool::{BodyFeed, Spool, SpoolDisk};
use crate::http::tls::TlsSession;
use crate::http::transfer_memory::{self, ShareHolder, TransferMemory, coded_transfer_cost};
use crate::queue::{X_NODE, X_QUEUE, X_QUEUED};
use basis_store::{BasisStore, shareable};
use hyper_util::client::legacy::connect::capture_connection;
use pace::Pacer;
use pacing::{Idle, Pacing};
use slots::{Admitted, Slots};
use turns::Encoders;

/// What an OPTIONS this hop answers itself says in `Allow`: the methods it
/// forwards to the origin (all but CONNECT; whether the origin's resource
/// takes them is for the origin to say, to a request that reaches it).
const FORWARDED_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE";

/// The accelerator role.
pub struct Accelerator {
    config: AcceleratorConfig,
    slots: Option<Arc<Slots>>,
    origin_authority: Authority,
    client: Client<FramedHttpConnector, ProxyBody>,
    bodies: Arc<BasisStore>,
    stats: Arc<Stats>,
    encoders: Encoders,
    /// What streamed codings hold at once.
    memory: TransferMemory,
    parking: Option<Parking>,
}

/// An HTTP/2 target always carries an authority: naming us (as the client
/// reached us) it is what origin-form is on HTTP/1.1.
fn names_us<B>(request: &Request<B>, authority: &Authority) -> bool {
    request.version() == http::Version::HTTP_2
        && request
            .extensions()
            .get::<TlsSession>()
            .is_some_and(|tls| tls.names_us(authority))
}

impl Accelerator {
    /// Builds the accelerator and its pooled origin client.
    ///
    /// # Errors
    /// [`ConfigError::BadOrigin`] for anything but `http://host[:port]`.
    pub fn new(config: AcceleratorConfig) -> Result<Self, ConfigError> {
        let bad = || ConfigError::BadOrigin {
            origin: config.origin.to_string(),
        };
        if config.origin.scheme() != Some(&Scheme::HTTP)
            || config
                .origin
                .path_and_query()
                .is_some_and(|p| p.as_str() != "/")
        {
            return Err(bad());
        }
        let origin_authority = config.origin.authority().cloned().ok_or_else(bad)?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.set_nodelay(true);
        let client =
            crate::http::server::upstream_client_builder().build(FramedHttpConnector(connector));
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
            origin_authority,
            client,
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

    /// The origin-form target, or why the request cannot go to our origin
    /// (P-12, A-7: nothing goes anywhere but the configured origin).
    fn origin_target(&self, request: &Request<Incoming>) -> Result<PathAndQuery, ProxyError> {
        if request.method() == Method::CONNECT {
            return Err(ProxyError::bad_request(
                "the accelerator does not tunnel (CONNECT)",
            ));
        }
        let uri = request.uri();
        if let Some(authority) = uri.authority().filter(|a| !names_us(request, a)) {
            let same_host = authority
                .host()
                .eq_ignore_ascii_case(self.origin_authority.host());
            let port = |a: &Authority| a.port_u16().unwrap_or(80);
            if !same_host || port(authority) != port(&self.origin_authority) {
                return Err(ProxyError::bad_request(format!(
                    "this accelerator serves only http://{}; {uri} is elsewhere",
                    self.origin_authority
                )));
            }
        }
        match uri.path_and_query() {
            Some(target) if target.as_str().starts_with('/') => Ok(target.clone()),
            _ if request.method() == Method::OPTIONS => Ok(PathAndQuery::from_static("*")),
            _ => Err(ProxyError::bad_request(format!(
                "request target {uri} is not a path"
            ))),
        }
    }

    async fn proxy(self: Arc<Self>, mut request: Request<Incoming>) -> Response<ProxyBody> {
        Stats::add(&self.stats.requests, 1);
        if request.method() == Method::GET
            && request
                .uri()
                .authority()
                .is_none_or(|authority| names_us(&request, authority))
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
        let target = match self.origin_target(&request) {
            Ok(target) => target,
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
        let response = self.exchange(request, target).await;
        match (slots, token) {
            (Some(slots), Some(token)) => slots.release_with(token, response),
            _ => response,
        }
    }

    /// Forwards an admitted request to the origin and answers it, coded or
    /// passed through.
    async fn exchange(
        self: Arc<Self>,
        request: Request<Incoming>,
        target: PathAndQuery,
    ) -> Response<ProxyBody> {
        let (mut parts, body) = request.into_parts();
        let offers_hsync = accepts_hsync(&parts.headers);
        let encodable = offers_hsync
            && parts.method == Method::GET
            && !parts.headers.contains_key(header::RANGE);
        let signature = parts
            .headers
            .get(HSYNC_SIGNATURE)
            .and_then(|v| parse_byte_sequence(v, self.config.max_signature_bytes));
        let basis_name = parts.headers.get(HSYNC_BASIS).cloned();
        let basis_digest = basis_name
            .as_ref()
            .and_then(|name| parse_byte_sequence(name, 32))
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok());

        if let Err(error) = strip_hop_by_hop(&mut parts.headers) {
            return self.refuse(ProxyError::bad_request(error.to_string()));
        }
        parts.headers.remove(HSYNC_SIGNATURE);
        parts.headers.remove(HSYNC_BASIS);
        // What the basis store decision reads of the request (D-B3), once
        // the response head is in.
        let request_headers =
            (encodable && !self.config.basis_store_private).then(|| parts.headers.clone());
        // The queue's headers are between the client and us.
        for name in [&X_QUEUE, &X_QUEUED, &X_NODE] {
            parts.headers.remove(name);
        }
        if encodable {
            // We encode the identity body; the origin must not code it.
            parts.headers.insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        } else if offers_hsync {
            remove_hsync_coding(&mut parts.headers);
        }
        add_via(&mut parts.headers, &self.config.via_name);
        parts.headers.insert(
            header::HOST,
            HeaderValue::from_str(self.origin_authority.as_str())
                .expect("an authority is a valid header value"),
        );
        parts.uri = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.origin_authority.clone())
            .path_and_query(target)
            .build()
            .expect("scheme, authority and path are valid");
        // The client may have come over HTTP/2; the origin hop is HTTP/1.1.
        parts.version = http::Version::HTTP_11;
        let method = parts.method.clone();
        let uri = parts.uri.clone();
        let mut outbound = Request::from_parts(parts, body.map_err(BodyError::from).boxed());
        let connection = capture_connection(&mut outbound);

        let response =
            match tokio::time::timeout(self.config.origin_timeout, self.client.request(outbound))
                .await
            {
                Err(_) => {
                    return self.refuse(ProxyError::upstream_timeout(format!(
                        "origin sent no response head within {:?}",
                        self.config.origin_timeout
                    )));
                }
                // The exchange failed on the client's body, not the origin.
                Ok(Err(error)) if let Some(violation) = malformed_request_body(&error) => {
                    return self.refuse(ProxyError::malformed_request(violation));
                }
                Ok(Err(error)) => {
                    return self.refuse(ProxyError::upstream_unreachable(format!(
                        "origin unreachable: {error}"
                    )));
                }
                Ok(Ok(response)) => response,
            };
        if let Err(message) = check_response_head(response.headers()) {
            // Whatever hyper made of it, the connection is not used again.
            if let Some(connected) = connection.connection_metadata().as_ref() {
                connected.poison();
            }
            return self.refuse(ProxyError::bad_upstream_response(format!(
                "origin response: {message}"
            )));
        }
        let framing = upstream_guard::last_exchange(&connection);
        let (mut parts, body) = response.into_parts();
        // The reason phrase is the origin's; ours comes from the status
        // (P-18).
        parts.extensions.remove::<hyper::ext::ReasonPhrase>();
        // The protocol version belongs to each hop: ours is HTTP/1.1
        // whatever the origin speaks (an HTTP/1.0 origin must not make us
        // answer 1.0 and lose chunked framing).
        parts.version = http::Version::HTTP_11;
        if let Err(error) = strip_hop_by_hop(&mut parts.headers) {
            return self.refuse(ProxyError::bad_upstream_response(format!(
                "origin response: {error}"
            )));
        }
        add_via(&mut parts.headers, &self.config.via_name);

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
        let encode = encodable
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
        if let Some(name) = basis_name {
            parts.headers.insert(HSYNC_BASIS, name);
        }
        parts.headers.insert(HSYNC_ACCEPT, self.hsync_accept());
        // A basis we served and still hold: compress against the body itself.
        let held = basis_digest
            .and_then(|digest| self.bodies.get(&digest))
            .map(|body| Box::new(body) as Box<dyn Basis + Send + Sync>);
        let encoder = match held {
            Some(basis) => Encoder::with_basis_body(basis, content_length, self.config.encoder),
            None => Encoder::new(signature.as_deref(), content_length, self.config.encoder),
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

/// Frames in flight between the origin reader, the encoder thread and the
/// client: small, so that backpressure reaches the origin quickly.
const CHANNEL_DEPTH: usize = 4;

/// Largest piece of stream sent to the client at a time: what hyper holds
/// for a client that stops reading, beside the spool's page (the spool
/// takes over what waits in the channel).
const SEND_SLICE: usize = 32 << 10;

/// Slices in flight towards the client.
const CLIENT_DEPTH: usize = 8;

/// Bodies the origin announced at most this long are read whole and coded
/// in one go, then sent with a Content-Length: one hop to a blocking thread
/// and one write to the client, where streaming cost a reader task, two
/// channels and a write per frame (about half of a 1 KiB request's CPU).
/// The origin sends such a body in one piece anyway.
const SMALL_BODY: u64 = 64 << 10;

/// An origin body that [`encode_whole`] reads whole.
struct OriginBody {
    body: Incoming,
    framing: Option<ExchangeCheck>,
    /// For the whole body, after the head came.
    timeout: Duration,
}

/// Codes a small body (see [`SMALL_BODY`]) whole on a blocking thread, in
/// its turn.
/// A body the origin cuts, frames badly or does not finish in time is a
/// clean 502/504: the client has seen nothing yet.
async fn encode_whole(
    origin: OriginBody,
    coding: Coding,
    method: Method,
    uri: Uri,
) -> Result<Bytes, ProxyError> {
    let Coding {
        mut encoder,
        encoders,
        memory: _,
        store,
        stats,
        parking: _,
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
            let stats = task_stats;
            let mut out = Vec::with_capacity(body.len() / 2 + 4096);
            encoder.push(&body, &mut out)?;
            let summary = encoder.finish(&mut out)?;
            Stats::add(&stats.body_bytes, summary.body_len);
            Stats::add(&stats.stream_bytes, summary.stream_bytes);
            if let Some(store) = &store {
                store.insert(summary.digest, body.to_vec().into());
            }
            tracing::info!(
                %method, %uri, status = 200, mode = "hsync", basis = ?summary.basis,
                body = summary.body_len, stream = summary.stream_bytes,
                copied = summary.copied_bytes, uncoded_windows = summary.uncoded_windows,
                "request"
            );
            Ok::<_, EncodeError>(Bytes::from(out))
        })
        .await;
    match coded {
        Some(Ok(stream)) => Ok(stream),
        Some(Err(error)) => Err(ProxyError::internal(format!("hsync: {error}"))),
        None => Err(ProxyError::internal("the encoder panicked")),
    }
}

/// What a coded response is coded with.
struct Coding {
    encoder: Encoder,
    encoders: Encoders,
    /// The budget a streamed coding takes its share of, that share, and
    /// the body's announced length.
    memory: Option<(TransferMemory, u64, Option<u64>)>,
    /// Where the body is kept once coded, if it may be.
    store: Option<Arc<BasisStore>>,
    stats: Arc<Stats>,
    /// Where a streamed body is parked if its client stops reading
    /// (`None`: never).
    parking: Option<Parking>,
}

/// Where and how much of a streamed body may be parked for a client that
/// stopped reading ([`AcceleratorConfig::spool_dir`], `max_spool`).
#[derive(Debug, Clone)]
struct Parking {
    dir: Arc<std::path::Path>,
    limit: u64,
    /// What all spools take together.
    disk: SpoolDisk,
}

/// A body on its way into the basis store: the origin's chunks as they
/// came (copied once, when the body is complete), and its room in the
/// store's collecting budget, given back when it drops.
struct Kept {
    chunks: Vec<Bytes>,
    len: usize,
    room: OwnedSemaphorePermit,
}

impl Kept {
    fn new(store: &BasisStore) -> Option<Kept> {
        Some(Kept {
            chunks: Vec::new(),
            len: 0,
            room: store.reserve(0)?,
        })
    }

    /// Adds `chunk`; false when the body outgrew the store's limit or the
    /// budget is spent, and is not kept.
    fn add(&mut self, chunk: &Bytes, store: &BasisStore) -> bool {
        if self.len + chunk.len() > store.max_body() {
            return false;
        }
        let Some(room) = store.reserve(chunk.len()) else {
            return false;
        };
        self.room.merge(room);
        self.chunks.push(chunk.clone());
        self.len += chunk.len();
        true
    }

    fn into_body(self) -> Arc<[u8]> {
        let mut body = Vec::with_capacity(self.len);
        for chunk in &self.chunks {
            body.extend_from_slice(chunk);
        }
        body.into()
    }
}

/// How long an encoder waits, for the client to take bytes or for the
/// origin to send some, before it gives back the memory it can rebuild
/// ([`Encoder::release_buffers`]): longer than a reader that keeps up
/// pauses, so that such a reader's windows do not pay for allocating it
/// again.
const RELEASE_AFTER: Duration = Duration::from_millis(100);

/// Waits for `ready`; past [`RELEASE_AFTER`], calls `release` first and
/// keeps waiting.
async fn wait_releasing<T>(ready: impl Future<Output = T>, release: impl FnOnce()) -> T {
    let mut ready = std::pin::pin!(ready);
    if let Ok(value) = tokio::time::timeout(RELEASE_AFTER, ready.as_mut()).await {
        return value;
    }
    release();
    ready.await
}

type ToClient = mpsc::Sender<Result<Frame<Bytes>, BodyError>>;

/// How long a client may take nothing (sending it a frame would wait that
/// long) before its body is parked in a [`Spool`], as nginx's
/// `proxy_buffering` parks one in a temp file: the encoder then runs on at
/// the origin's pace, finishes and frees its context, window and buffers,
/// and the stalled client holds a follower task, a page and its channel
/// (L-13). As long as [`RELEASE_AFTER`]: a reader that pauses less keeps
/// its stream in memory.
const STALLED_AFTER: Duration = Duration::from_millis(100);

/// Where a coded stream goes.
enum Sink {
    /// Straight into the client's channel.
    Client(ToClient),
    /// Into a spool, whose follower feeds the client's channel.
    Spool(Spool),
}

impl Sink {
    /// Fails the client's body: a stream that went wrong never ends
    /// cleanly.
    async fn fail(self, error: BodyError) {
        match self {
            Sink::Client(to_client) => {
                let _ = to_client.send(Err(error)).await;
            }
            Sink::Spool(spool) => spool.finish(Err(error.to_string())).await,
        }
    }
}

/// Warned once per process: a spool directory that cannot take a file.
static SPOOL_FAILED: std::sync::Once = std::sync::Once::new();

/// Streams the origin body through the encoder: an async task owns the
/// encoder and moves it to a blocking thread, in its turn, only for the
/// CPU work of a chunk that completes a window; waiting for the origin or
/// the client holds no thread. The body is also collected, up to the
/// store's limits, and kept there once END's digest is known.
fn encode_body(
    origin: Incoming,
    framing: Option<ExchangeCheck>,
    coding: Coding,
    pacer: Option<Pacer>,
    method: Method,
    uri: Uri,
) -> ProxyBody {
    let Coding {
        encoder,
        encoders,
        memory,
        store,
        stats,
        parking,
    } = coding;
    let pacing = Pacing::new(encoder, pacer);
    let (to_encoder, from_origin) = mpsc::channel::<Result<Bytes, BodyError>>(CHANNEL_DEPTH);
    let (to_client, from_encoder) = mpsc::channel::<Result<Frame<Bytes>, BodyError>>(CLIENT_DEPTH);
    let from_encoder = BodyFeed::new(from_encoder);
    let link_idle = pacing.idle.clone();
    let origin_idle = pacing.idle.clone();
    let (mut taker, holder) = match memory {
        Some((memory, cost, known_len)) => {
            // A body announced larger than a small one waits before its
            // first byte: nothing of it is read (into hyper's buffer, the
            // channel and the window) while it waits.
            let past = match known_len {
                Some(len) if len > transfer_memory::SHARE_PAST => 0,
                _ => transfer_memory::SHARE_PAST,
            };
            let (taker, holder) = transfer_memory::share(&memory, cost, past);
            (Some(taker), Some(holder))
        }
        None => (None, None),
    };
    let read_origin = async move {
        let mut origin = origin;
        let mut read = 0u64;
        loop {
            if let Some(taker) = &mut taker {
                // Past a small body's size, the coding's state grows:
                // nothing more is read before its share (L-13, L-14).
                taker.take_past(read).await;
            }
            let Some(frame) = origin.frame().await else {
                break;
            };
            let item = match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(data) => Ok(data),
                    Err(_trailers) => continue,
                },
                Err(error) => Err(BodyError::from(error)),
            };
            if let Ok(data) = &item {
                read += data.len() as u64;
            }
            let failed = item.is_err();
            let sending = Instant::now();
            if to_encoder.send(item).await.is_err() || failed {
                return;
            }
            Idle::add(&origin_idle.origin, sending);
        }
        // No END (and nothing kept) for a body whose connection read bytes
        // past its end by now.
        if let Some(violation) = framing.as_ref().and_then(ExchangeCheck::violation) {
            let _ = to_encoder
                .send(Err(ExchangeCheck::error(violation).into()))
                .await;
        }
    };
    tokio::spawn(read_origin);
    tokio::spawn(
        Streaming {
            from_origin,
            sink: Sink::Client(to_client),
            feed: from_encoder.clone(),
            memory: holder,
            parking,
            encoders,
            store,
            stats,
            method,
            uri,
        }
        .run(pacing),
    );
    StreamBody::new(EncodedStream {
        frames: from_encoder,
        idle: link_idle,
        since: None,
    })
    .boxed()
}

/// What the task of [`encode_body`] works between.
struct Streaming {
    from_origin: mpsc::Receiver<Result<Bytes, BodyError>>,
    sink: Sink,
    /// The client's end of its channel, for a spool to take over.
    feed: BodyFeed,
    /// This coding's share of the transfer memory, held while it runs.
    memory: Option<ShareHolder>,
    /// Where the body may still be parked (taken when it is, or when that
    /// failed).
    parking: Option<Parking>,
    encoders: Encoders,
    store: Option<Arc<BasisStore>>,
    stats: Arc<Stats>,
    method: Method,
    uri: Uri,
}

impl Streaming {
    async fn run(mut self, mut pacing: Pacing) {
        let (method, uri) = (self.method.clone(), self.uri.clone());
        let mut out = Vec::new();
        let mut kept = self.store.as_deref().and_then(Kept::new);
        loop {
            let item = match self.from_origin.try_recv() {
                Ok(item) => Some(item),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    wait_releasing(self.from_origin.recv(), || {
                        pacing.encoder.release_buffers();
                        out = Vec::new();
                    })
                    .await
                }
            };
            let Some(item) = item else {
                break;
            };
            let chunk = match item {
                Ok(chunk) => chunk,
                Err(error) => {
                    // The client must see a cut stream, never a clean end.
                    tracing::warn!(%method, %uri, %error, "origin body failed; aborting the stream");
                    return self.sink.fail(error).await;
                }
            };
            if let Some(share) = &mut self.memory {
                share.collect();
            }
            if let (Some(body), Some(store)) = (&mut kept, &self.store)
                && !body.add(&chunk, store)
            {
                kept = None;
            }
            let pushed = if chunk.len() < pacing.encoder.window_room() {
                // Only copied into the window: no turn, no thread.
                pacing.push(&chunk, &mut out)
            } else {
                let parked = matches!(self.sink, Sink::Spool(_));
                if parked {
                    // Its turn may be far off: wait light.
                    pacing.encoder.release_buffers();
                    out = Vec::new();
                }
                let moved = self
                    .encoders
                    .run(&self.stats, parked, move || {
                        let pushed = pacing.push(&chunk, &mut out);
                        (pacing, out, pushed)
                    })
                    .await;
                let Some((back, back_out, pushed)) = moved else {
                    return self.sink.fail("the encoder panicked".into()).await;
                };
                (pacing, out) = (back, back_out);
                pushed
            };
            if let Err(error) = pushed {
                return self.sink.fail(error.into()).await;
            }
            if out.is_empty() {
                continue;
            }
            let wire_bytes = out.len() as u64;
            let sent = self.send(&mut out, Some(&mut pacing)).await;
            pacing.sent(wire_bytes);
            if !sent {
                return;
            }
        }
        let task_stats = self.stats.clone();
        let store = self.store.take();
        let parked = matches!(self.sink, Sink::Spool(_));
        let finished = self
            .encoders
            .run(&self.stats, parked, move || {
                let finished = pacing.encoder.finish(&mut out);
                if let Ok(summary) = &finished {
                    Stats::add(&task_stats.body_bytes, summary.body_len);
                    Stats::add(&task_stats.stream_bytes, summary.stream_bytes);
                    if let (Some(store), Some(body)) = (&store, kept) {
                        store.insert(summary.digest, body.into_body());
                    }
                }
                (out, finished)
            })
            .await;
        let Some((mut out, finished)) = finished else {
            return self.sink.fail("the encoder panicked".into()).await;
        };
        let summary = match finished {
            Ok(summary) => summary,
            Err(error) => return self.sink.fail(error.into()).await,
        };
        if !self.send(&mut out, None).await {
            return;
        }
        let spooled = matches!(self.sink, Sink::Spool(_));
        tracing::info!(
            %method, %uri, status = 200, mode = "hsync", basis = ?summary.basis,
            body = summary.body_len, stream = summary.stream_bytes,
            copied = summary.copied_bytes, uncoded_windows = summary.uncoded_windows,
            spooled, "request"
        );
        if let Sink::Spool(spool) = self.sink {
            spool.finish(Ok(())).await;
        }
    }

    /// Sends `out` to the client, or to the spool once the client stopped
    /// reading, and clears it; false if the client is gone or the spool
    /// failed. A window of a large body is many MiB (eight blocks at
    /// least, and blocks grow with the body to keep its signature small):
    /// it goes out in slices copied out of `out`, so the channel holds a
    /// few slices rather than a few windows (L-3: memory per request), and
    /// a client that stops reading keeps those slices alive, not the
    /// windows they were cut from (L-13). (Slices of one shared allocation
    /// kept a window per slice waiting: 2.5 MiB per stalled reader.)
    async fn send(&mut self, out: &mut Vec<u8>, mut pacing: Option<&mut Pacing>) -> bool {
        let mut at = 0;
        let mut stalled = false;
        while at < out.len() {
            let end = out.len().min(at + SEND_SLICE);
            let waiting = match &mut self.sink {
                Sink::Spool(spool) => {
                    let rest = match at {
                        0 => Bytes::from(std::mem::take(out)),
                        _ => Bytes::copy_from_slice(&out[at..]),
                    };
                    out.clear();
                    return write_spooled(spool, rest).await;
                }
                Sink::Client(to_client) => match to_client.try_reserve() {
                    Ok(room) => {
                        room.send(Ok(Frame::data(Bytes::copy_from_slice(&out[at..end]))));
                        at = end;
                        continue;
                    }
                    Err(mpsc::error::TrySendError::Closed(())) => return false,
                    Err(mpsc::error::TrySendError::Full(())) => to_client.clone(),
                },
            };
            let room = if stalled {
                // Not parked (parking is off, or no spool could be made):
                // this task waits here, holding no thread (L-13), and its
                // state, counted in its share of the transfer memory.
                waiting.reserve_owned().await.ok()
            } else {
                match tokio::time::timeout(STALLED_AFTER, waiting.reserve_owned()).await {
                    Ok(room) => room.ok(),
                    Err(_) => {
                        stalled = true;
                        if let Some(pacing) = pacing.as_deref_mut() {
                            pacing.encoder.release_buffers();
                        }
                        if !self.park(pacing.as_deref_mut()).await {
                            return false;
                        }
                        continue;
                    }
                }
            };
            let Some(room) = room else {
                return false;
            };
            room.send(Ok(Frame::data(Bytes::copy_from_slice(&out[at..end]))));
            at = end;
        }
        out.clear();
        true
    }

    /// Parks the rest of the body in a spool, what waited in the client's
    /// channel first, if it may be and one can be made; otherwise the
    /// caller goes on waiting for the client. False if the client left or
    /// the spool failed.
    async fn park(&mut self, pacing: Option<&mut Pacing>) -> bool {
        let Some(parking) = self.parking.take() else {
            return true;
        };
        if !matches!(self.sink, Sink::Client(_)) {
            return true;
        }
        let mut spool = match Spool::create(&parking.dir, parking.limit, &parking.disk) {
            Ok(spool) => spool,
            Err(error) if error.kind() == std::io::ErrorKind::StorageFull => {
                tracing::debug!(%error, "not parking a body: the encoder waits for its client");
                return true;
            }
            Err(error) => {
                SPOOL_FAILED.call_once(|| {
                    tracing::warn!(dir = %parking.dir.display(), %error,
                        "cannot spool for clients that stop reading; their encoders wait instead");
                });
                return true;
            }
        };
        for item in spool.take_over(&self.feed) {
            // Only data is sent before the end: a failure ends the stream.
            if let Ok(data) = item.map(Frame::into_data)
                && let Ok(data) = data
                && !write_spooled(&mut spool, data).await
            {
                return false;
            }
        }
        self.sink = Sink::Spool(spool);
        Stats::add(&self.stats.spooled, 1);
        tracing::debug!(method = %self.method, uri = %self.uri, "client stopped reading; body spooled");
        // What the stream waits for from now on is this client, which is
        // slower than the encoder: the pacer's measure of the link would
        // be the disk's, so literals keep their entropy coding.
        if let Some(pacing) = pacing {
            pacing.pacer = None;
            pacing.encoder.set_entropy_coding(true);
        }
        true
    }
}

/// Writes `data` to the spool; false if the client left or the spool
/// failed (then dropping it fails the client's body).
async fn write_spooled(spool: &mut Spool, data: Bytes) -> bool {
    match spool.write(data).await {
        Ok(()) => true,
        Err(_) if spool.reader_left() => false,
        Err(error) => {
            tracing::warn!(%error, "spool write failed; aborting the stream");
            false
        }
    }
}

/// The encoder's frames as the response body, timing how long the link
/// waits for them (hyper polls the body only when it can write).
struct EncodedStream {
    frames: BodyFeed,
    idle: Arc<Idle>,
    /// Since when the link has been waiting.
    since: Option<Instant>,
}

impl futures_core::Stream for EncodedStream {
    type Item = Result<Frame<Bytes>, BodyError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let polled = self.frames.poll_recv(cx);
        if polled.is_pending() {
            self.since.get_or_insert_with(Instant::now);
        } else if let Some(since) = self.since.take() {
            Idle::add(&self.idle.link, since);
        }
        polled
    }
}

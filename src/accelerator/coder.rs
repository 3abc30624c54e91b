//! Coding an answer for a client that offered hsync ([`Coder`]): whether
//! it may be coded (a GET without Range, a 200 without Content-Encoding or
//! `no-transform`, no larger than the limit), the head of a coded answer,
//! the encoder against the client's basis signature or against a body we
//! served and kept ([`BasisStore`]), and the choice between coding a small
//! body whole and streaming a large one. The accelerator codes its origin's
//! answers with it; a client proxy with downstream client proxies (a chain)
//! codes what it serves them with one of its own.
//!
//! Leaves out where the answer came from and what happens to one that is
//! not coded (the role passes it through).
//!
//! Main types: [`Coder`], [`CoderConfig`], [`Offer`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Full};

use crate::cache::freshness::Storability;
use crate::feed::primary::FeedCommit;
use crate::hsync::{Encoder, EncoderOptions};
use crate::http::access_log::Note;
use crate::http::body_pipe::Parking;
use crate::http::error::ProxyError;
use crate::http::headers::{
    HSYNC_ACCEPT, HSYNC_BASIS, HSYNC_CODING, HSYNC_ETAG, HSYNC_HELD, HSYNC_MISSED, HSYNC_SIGNATURE,
    HSYNC_SIGNATURE_LENGTH, HSYNC_VARY, accepts_coding, accepts_hsync, parse_byte_sequence,
    weaken_etag,
};
use crate::http::server::{BodyError, ProxyBody, RequestBody, slow_request_body};
use crate::http::spool::SpoolDisk;
use crate::http::transfer_memory::{TransferMemory, coded_transfer_cost};
use crate::http::upstream_guard::{self, ExchangeCheck};

use super::AcceleratorConfig;
use super::basis_store::{BasisStore, DiskTier, ServedAs, SharedTier, shareable};
use super::coding::Coding;
use super::pace::Pacer;
use super::probe;
use super::stats::Stats;
use super::stream::encode_body;
use super::turns::Encoders;
use super::whole::{OriginBody, SMALL_BODY, Whole, encode_whole};

/// How answers are coded: the accelerator's settings of the same names.
#[derive(Debug, Clone)]
pub struct CoderConfig {
    /// Encoder settings.
    pub encoder: EncoderOptions,
    /// Entropy-code literals only while that is faster than sending them
    /// without (see [`super::pace`]).
    pub adapt_entropy_coding: bool,
    /// Largest body coded (bytes); larger ones pass through.
    pub max_encode_len: u64,
    /// Largest basis signature accepted from a request (bytes, decoded).
    pub max_signature_bytes: usize,
    /// Largest basis signature accepted as a GET's body (bytes; at most
    /// `max_signature_bytes`: none).
    pub max_body_signature_bytes: usize,
    /// Memory for bodies served, kept as future bases (bytes; 0: none).
    pub basis_store_bytes: usize,
    /// Largest body kept there (bytes).
    pub max_stored_body: usize,
    /// The disk tier of the basis store, for larger bodies (`None`: off).
    pub basis_disk: Option<DiskTier>,
    /// The basis store shared with other accelerators (`None`: none).
    pub basis_shared: Option<SharedTier>,
    /// Keep every coded body there, shareable or not (D-B3).
    pub basis_store_private: bool,
    /// Encoders that run at once (0: one per core).
    pub max_encoders: usize,
    /// Where a coded body is parked for a client that stopped reading.
    pub spool_dir: PathBuf,
    /// Most bytes of a coded body parked ahead of its reader (0: never).
    pub max_spool: u64,
    /// Disk that all parked bodies take together (bytes).
    pub max_spool_total: u64,
    /// Memory that streamed codings hold at once (bytes; 0: no bound).
    pub transfer_memory: u64,
    /// Time for a small body to arrive whole once its head came.
    pub body_timeout: Duration,
}

impl From<&AcceleratorConfig> for CoderConfig {
    fn from(config: &AcceleratorConfig) -> CoderConfig {
        CoderConfig {
            encoder: config.encoder,
            adapt_entropy_coding: config.adapt_entropy_coding,
            max_encode_len: config.max_encode_len,
            max_signature_bytes: config.max_signature_bytes,
            max_body_signature_bytes: config.max_body_signature_bytes,
            basis_store_bytes: config.basis_store_bytes,
            max_stored_body: config.max_stored_body,
            basis_disk: config.basis_disk.clone(),
            basis_shared: config.basis_shared.clone(),
            basis_store_private: config.basis_store_private,
            max_encoders: config.max_encoders,
            spool_dir: config.spool_dir.clone(),
            max_spool: config.max_spool,
            max_spool_total: config.max_spool_total,
            transfer_memory: config.transfer_memory,
            body_timeout: config.origin_timeout,
        }
    }
}

/// Whether `headers` name a media type whose bodies are compressed
/// already (most images, audio and video, archives, web fonts).
fn is_compressed_media(headers: &HeaderMap) -> bool {
    let Some(media_type) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
    else {
        return false;
    };
    let media_type = media_type.trim().to_ascii_lowercase();
    match media_type.split_once('/') {
        // Text, or pixels stored as they are.
        Some(("image", sub)) => !matches!(
            sub,
            "svg+xml" | "bmp" | "x-ms-bmp" | "tiff" | "x-icon" | "vnd.microsoft.icon"
        ),
        Some(("audio", sub)) => !matches!(sub, "wav" | "x-wav" | "wave" | "vnd.wave"),
        Some(("video", _)) => true,
        Some(("font", sub)) => matches!(sub, "woff" | "woff2"),
        Some(("application", sub)) => matches!(
            sub,
            "zip"
                | "gzip"
                | "x-gzip"
                | "zstd"
                | "x-xz"
                | "x-bzip2"
                | "x-7z-compressed"
                | "vnd.rar"
                | "x-rar-compressed"
                | "java-archive"
                | "vnd.android.package-archive"
                | "vnd.debian.binary-package"
                | "x-debian-package"
                | "font-woff"
        ),
        _ => false,
    }
}

/// What a request offers of hsync, read before its head is rewritten.
#[derive(Debug, Clone)]
pub struct Offer {
    /// `Accept-Encoding` names hsync.
    pub offers_hsync: bool,
    /// A GET without Range that offers hsync: the answer may be coded.
    pub encodable: bool,
    /// The client's basis signature, decoded.
    signature: Option<Vec<u8>>,
    /// `Hsync-Basis` as sent (echoed in the answer) and the digest it names.
    basis_name: Option<HeaderValue>,
    basis_digest: Option<[u8; 32]>,
    /// `Accept-Encoding` names gzip: a small body may go gzipped where
    /// that is smaller than its stream.
    accepts_gzip: bool,
    /// `Hsync-Accept: no-sig=N`: the client computes the new signature
    /// itself and holds a body of at most N bytes until END, so a coding
    /// against a held basis may leave out its SIG frames.
    no_sig_up_to: u64,
}

impl Offer {
    /// What `headers` offer, taking a signature of at most `max_signature`
    /// bytes.
    pub fn read(method: &Method, headers: &HeaderMap, max_signature: usize) -> Offer {
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
            accepts_gzip: accepts_coding(headers, "gzip"),
            no_sig_up_to: headers
                .get_all(HSYNC_ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split([',', ';']))
                .filter_map(|item| item.split_once('='))
                .find(|(name, _)| name.trim() == "no-sig")
                .and_then(|(_, value)| value.trim().parse().ok())
                .unwrap_or(0),
        }
    }
}

/// The probes' budget for a transfer memory of `transfer_memory` bytes: a
/// sixteenth (8 MiB, 128 probes, of the accelerator's default), and none
/// at all (unbounded) where the transfer memory has none.
fn probe_memory(transfer_memory: u64) -> u64 {
    match transfer_memory {
        0 => 0,
        bytes => (bytes / 16).max(probe::PROBE_LEN as u64),
    }
}

/// Codes answers: the encoders' turns, the memory and disk they may take,
/// the bodies kept as bases, the counters.
pub struct Coder {
    config: CoderConfig,
    bodies: Arc<BasisStore>,
    stats: Arc<Stats>,
    encoders: Encoders,
    /// What streamed codings hold at once.
    memory: TransferMemory,
    /// What the first bytes read by probes hold at once (see
    /// [`Coder::probe`]).
    probes: TransferMemory,
    parking: Option<Parking>,
    /// What parked bodies take together, kept across reloads even while
    /// parking is off.
    disk: SpoolDisk,
}

impl Coder {
    /// A coder with `config`, counting into `stats`, with its own transfer
    /// memory and spool disk budgets (`config.transfer_memory`,
    /// `config.max_spool_total`).
    pub fn new(config: CoderConfig, stats: Arc<Stats>) -> Coder {
        let memory = TransferMemory::new(config.transfer_memory);
        let disk = SpoolDisk::new(config.max_spool_total);
        Coder::sharing(config, stats, memory, disk)
    }

    /// A coder whose streamed codings take their share of `memory` and
    /// park bodies within `disk`: a client proxy's, so that what it codes
    /// for the proxies behind it stays within its own budgets.
    pub fn sharing(
        config: CoderConfig,
        stats: Arc<Stats>,
        memory: TransferMemory,
        disk: SpoolDisk,
    ) -> Coder {
        let encoders = match config.max_encoders {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let parking = (config.max_spool > 0).then(|| Parking {
            disk: disk.clone(),
            dir: config.spool_dir.as_path().into(),
            limit: config.max_spool,
        });
        Coder {
            disk,
            bodies: Arc::new(
                BasisStore::new(config.basis_store_bytes, config.max_stored_body)
                    .with_disk_or_log(config.basis_disk.as_ref())
                    .with_shared_or_log(config.basis_shared.as_ref()),
            ),
            probes: TransferMemory::new(probe_memory(config.transfer_memory)),
            memory,
            encoders: Encoders::new(encoders),
            parking,
            stats,
            config,
        }
    }

    /// The transfer memory's shares now, for the metrics.
    pub fn memory_figures(&self) -> crate::http::transfer_memory::MemoryFigures {
        self.memory.figures()
    }

    /// This coder with new settings (a reload), sharing what outlives
    /// one: the kept bodies, the encoders' turns, the memory and the
    /// spool disk. Their sizes stay those of the first configuration
    /// (changing them needs a restart).
    pub fn reconfigured(&self, config: CoderConfig) -> Coder {
        let parking = (config.max_spool > 0).then(|| Parking {
            disk: self.disk.clone(),
            dir: config.spool_dir.as_path().into(),
            limit: config.max_spool,
        });
        Coder {
            bodies: self.bodies.clone(),
            memory: self.memory.clone(),
            probes: self.probes.clone(),
            encoders: self.encoders.clone(),
            disk: self.disk.clone(),
            parking,
            stats: self.stats.clone(),
            config,
        }
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// What the request offers, within our signature limit.
    pub fn offer(&self, method: &Method, headers: &HeaderMap) -> Offer {
        Offer::read(method, headers, self.config.max_signature_bytes)
    }

    /// What the request offers, reading a signature sent as its body
    /// (`Hsync-Signature-Length`, a GET whose basis is too large for a
    /// header's signature) within `max_body_signature_bytes` and a share
    /// of the transfer memory; the body left for the origin is then empty,
    /// and the head says so.
    ///
    /// # Errors
    /// The client's: a signature over the limit (the connection closes
    /// rather than read it), a body shorter or longer than announced, or
    /// one that does not arrive within the body timeout.
    pub async fn offer_reading_body(
        &self,
        parts: &mut http::request::Parts,
        body: RequestBody,
    ) -> Result<(Offer, ProxyBody), ProxyError> {
        let mut offer = self.offer(&parts.method, &parts.headers);
        let Some(announced) = parts.headers.remove(HSYNC_SIGNATURE_LENGTH) else {
            return Ok((offer, body.map_err(BodyError::from).boxed()));
        };
        let max = self.config.max_body_signature_bytes;
        let len = announced
            .to_str()
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|_| parts.method == Method::GET)
            .ok_or_else(|| {
                ProxyError::bad_request("Hsync-Signature-Length is a GET's body length in bytes")
                    .closing()
            })?;
        if len > max {
            return Err(ProxyError::bad_request(format!(
                "a basis signature of {len} bytes in the body is over the {max} taken \
                 (max-body-signature)"
            ))
            .closing());
        }
        // Reading it takes its share of the transfer memory, so that many
        // clients uploading signatures at once wait rather than hold
        // max-body-signature each; the coding then counts it in its own.
        let _share = self.memory.take(len as u64).await;
        let read = http_body_util::Limited::new(body, len).collect();
        let signature = match tokio::time::timeout(self.config.body_timeout, read).await {
            Err(_) => return Err(ProxyError::request_timeout()),
            Ok(Err(error)) if let Some(refusal) = slow_request_body(&*error) => {
                return Err(refusal);
            }
            Ok(Err(error)) => {
                return Err(
                    ProxyError::bad_request(format!("basis signature body: {error}")).closing(),
                );
            }
            Ok(Ok(collected)) => collected.to_bytes(),
        };
        if signature.len() != len {
            return Err(ProxyError::bad_request(format!(
                "Hsync-Signature-Length says {len} bytes, the body had {}",
                signature.len()
            )));
        }
        for name in [header::CONTENT_LENGTH, header::TRANSFER_ENCODING] {
            parts.headers.remove(name);
        }
        offer.signature = Some(signature.to_vec());
        Ok((offer, Empty::new().map_err(|never| match never {}).boxed()))
    }

    /// Whether an answer with this head may be coded for `offer`.
    pub fn codes(&self, offer: &Offer, response: &http::response::Parts) -> bool {
        let coded = response
            .headers
            .get(header::CONTENT_ENCODING)
            .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
        let no_transform = response
            .headers
            .get_all(header::CACHE_CONTROL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|d| d.trim().eq_ignore_ascii_case("no-transform"));
        offer.encodable
            && response.status == StatusCode::OK
            && !coded
            && !no_transform
            && content_length(&response.headers).is_none_or(|len| len <= self.config.max_encode_len)
    }

    /// Whether coding `response` for `offer` would only add bytes: a body
    /// larger than a small one (those are coded whole, and go plain where
    /// that is smaller) whose media type is compressed already, for a
    /// client that names no basis. No literal coding shrinks it and no
    /// delta can come of it, so the stream would be the body and its SIG
    /// frames (4.6 KB on 1 MB); it goes as the origin sent it ("never
    /// worse than plain", issue 20). Against a basis it is coded: a new
    /// version of an archive may share runs with the old one.
    pub fn gains_nothing(&self, offer: &Offer, response: &http::response::Parts) -> bool {
        self.may_gain_nothing(offer, response) && is_compressed_media(&response.headers)
    }

    /// Whether a coding of this response could gain nothing: a body larger
    /// than [`SMALL_BODY`] (or of unknown length; smaller ones are coded
    /// whole, and go plain when that is smaller) for a client that names no
    /// basis.
    fn may_gain_nothing(&self, offer: &Offer, response: &http::response::Parts) -> bool {
        offer.signature.is_none()
            && offer.basis_name.is_none()
            && content_length(&response.headers).is_none_or(|len| len > SMALL_BODY)
    }

    /// Whether to read this body's first bytes before answering, to see
    /// whether they compress ([`Coder::probe`]): one that
    /// [`Coder::may_gain_nothing`] but whose media type does not say, and
    /// whose length is announced. A body of unknown length is often one
    /// made as it goes (a page, events), whose first bytes we would hold
    /// back.
    pub fn probes(&self, offer: &Offer, response: &http::response::Parts) -> bool {
        self.may_gain_nothing(offer, response) && content_length(&response.headers).is_some()
    }

    /// Reads the first bytes of `body` (see [`probe::probe`]) and returns
    /// the body whole again and whether they do not compress. The bytes
    /// read are held within the probes' budget, a sixteenth of the
    /// transfer memory, until they are passed on; when it is spent, the
    /// body is not probed (false), and is coded as before. The probe never
    /// waits for the budget: a probe waiting would hold a client's head
    /// back, and one holding its bytes while its coding waits for a share
    /// must not take that share's room.
    pub async fn probe(&self, body: ProxyBody) -> (ProxyBody, bool) {
        let Some(share) = self.probes.try_take(probe::PROBE_LEN as u64) else {
            tracing::debug!("the probes' memory is spent: a body coded unprobed");
            return (body, false);
        };
        probe::probe(body, share, probe::PROBE_WAIT.min(self.config.body_timeout)).await
    }

    /// Codes an answer [`Coder::codes`] said yes to. `request` is the
    /// request's head as forwarded (what decides whether the body may be
    /// kept as a basis).
    ///
    /// # Errors
    /// A small body that fails to arrive whole, or the encoder's failure:
    /// the client has seen nothing yet.
    #[allow(clippy::too_many_arguments)]
    pub async fn code(
        &self,
        mut parts: http::response::Parts,
        body: ProxyBody,
        framing: Option<ExchangeCheck>,
        offer: Offer,
        request: &HeaderMap,
        method: Method,
        uri: Uri,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let content_length = content_length(&parts.headers);
        let signature_len = offer.signature.as_ref().map_or(0, Vec::len) as u64;
        let note = parts.extensions.get::<Note>().cloned();
        // What a shared cache may store: what the basis store keeps (unless
        // the operator opted in) and all a change feed ever lists (D-B3,
        // Read off the origin's head, once.
        let storability = shareable(request, &parts.headers);
        // Read before the tag is weakened and the length dropped.
        let served_as = ServedAs::of(&uri, request.get(header::HOST), &parts.headers);
        let feed = parts
            .extensions
            .remove::<FeedCommit>()
            .filter(|_| storability == Storability::Storable);
        // A small body may yet go plain, with the head the origin sent.
        let small = content_length.is_some_and(|len| len <= SMALL_BODY);
        let plain_headers = small.then(|| parts.headers.clone());
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(HSYNC_CODING),
        );
        parts
            .headers
            .append(header::VARY, HeaderValue::from_static(HSYNC_VARY));
        if let Some(strong) = weaken_etag(&mut parts.headers) {
            parts.headers.insert(HSYNC_ETAG, strong);
        }
        if let Some(note) = &note {
            let basis = offer
                .basis_name
                .as_ref()
                .and_then(|name| name.to_str().ok());
            note.coding("hsync", basis.map(str::to_owned));
        }
        // Named back, but to a client that named it by digest alone and
        // agreed to wait for END (`no-sig`): its digest check there is
        // enough, and the name is a tenth of a small update.
        if let Some(name) = offer.basis_name
            && offer.no_sig_up_to == 0
        {
            parts.headers.insert(HSYNC_BASIS, name);
        }
        // A client that agreed to do without SIG frames has our
        // advertisement from the answer that said we hold its basis: 68
        // bytes less on each small update.
        if offer.no_sig_up_to == 0 {
            parts.headers.insert(HSYNC_ACCEPT, self.hsync_accept());
        }
        // A basis we served and still hold: compress against the body itself.
        let held = match &offer.basis_digest {
            Some(digest) => self.bodies.get(digest).await.unwrap_or_else(|_| {
                // Redis slow or down: rsync against the client's
                // signature, as on a miss (never an error to the user).
                Stats::add(&self.stats.basis_fallbacks, 1);
                None
            }),
            None => None,
        };
        // Named by digest alone and not held (let go, or kept by another
        // accelerator behind the same balancer): the client is told, and
        // sends signatures to us for a while. Not with a shared store: the
        // stores are not apart, and a miss there is a body let go or a
        // store that could not be asked (and soon can).
        if offer.basis_digest.is_some()
            && offer.signature.is_none()
            && held.is_none()
            && !self.bodies.is_shared()
        {
            parts
                .headers
                .insert(HSYNC_MISSED, HeaderValue::from_static("1"));
        }
        // Against a held body, each window's prefix holds a slice of the
        // basis (at most BASIS_SPAN) twice over (slice and prefix).
        let basis_cost = held
            .as_ref()
            .map_or(0, |basis| 2 * basis.size().min(crate::hsync::BASIS_SPAN));
        let encoder = match held {
            Some(basis) => {
                let anchors = offer
                    .basis_digest
                    .as_ref()
                    .and_then(|digest| self.bodies.anchors_for(digest, basis.size()));
                let mut encoder =
                    Encoder::with_basis_body(basis, content_length, self.config.encoder);
                // Indexed once for every client updating from this body.
                if let Some(anchors) = anchors {
                    encoder.share_held_anchors(anchors);
                }
                // A delta against a held body is small: the client that
                // agreed loses little by holding the body until END, and
                // the SIG frames were a third of such a stream (issue 20).
                if content_length.is_some_and(|len| len <= offer.no_sig_up_to) {
                    encoder.leave_out_sig_frames();
                }
                encoder
            }
            None => Encoder::new(
                offer.signature.as_deref(),
                content_length,
                self.config.encoder,
            ),
        };
        tracing::debug!(basis = ?encoder.basis_use(), "encoding");
        // Windows as the encoder sized them: a large body's blocks make
        // them up to 8 MiB, where the configured window is 1 MiB (L-8 at
        // 1 GiB: transfers held 2.6 times the share counted for them).
        let window_cost = coded_transfer_cost(encoder.window_len(), content_length) + basis_cost;
        let keep = content_length.is_none_or(|len| len <= self.bodies.max_body())
            && self.may_keep(storability);
        let store = keep.then(|| self.bodies.clone());
        // With the longest body kept: one of unknown length (a chain's
        // middle proxy streams what it rebuilds) may turn out longer.
        if keep {
            parts
                .headers
                .insert(HSYNC_HELD, HeaderValue::from(self.bodies.held_limit()));
        }
        if let Some(mut plain_headers) = plain_headers {
            let origin = OriginBody {
                body,
                framing,
                timeout: self.config.body_timeout,
            };
            let coding = Coding {
                encoder,
                encoders: self.encoders.clone(),
                memory: None,
                store,
                // Small: kept in memory, where a copy costs little.
                served_as: None,
                stats: self.stats.clone(),
                parking: None,
                note,
                feed,
            };
            let body = match encode_whole(origin, coding, offer.accepts_gzip, method, uri).await? {
                Whole::Coded(stream) => stream,
                Whole::Plain(body) => {
                    // The answer depends on the offer all the same: an
                    // unaware cache between the proxies must not serve
                    // this copy to a request that offers a basis.
                    plain_headers.append(header::VARY, HeaderValue::from_static(HSYNC_VARY));
                    for name in [HSYNC_HELD, HSYNC_MISSED] {
                        if let Some(value) = parts.headers.get(&name) {
                            plain_headers.insert(name, value.clone());
                        }
                    }
                    plain_headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
                    parts.headers = plain_headers;
                    body
                }
                Whole::Excess(body) => {
                    // Nothing was kept: no Hsync-Held.
                    upstream_guard::refuse_storing(&mut plain_headers);
                    plain_headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
                    parts.headers = plain_headers;
                    body
                }
                Whole::Gzip(body) => {
                    plain_headers.append(header::VARY, HeaderValue::from_static(HSYNC_VARY));
                    for name in [HSYNC_HELD, HSYNC_MISSED] {
                        if let Some(value) = parts.headers.get(&name) {
                            plain_headers.insert(name, value.clone());
                        }
                    }
                    plain_headers
                        .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                    plain_headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
                    // Other bytes than the identity body's: the same tag
                    // would let a cache answer one with the other.
                    weaken_etag(&mut plain_headers);
                    parts.headers = plain_headers;
                    body
                }
            };
            return Ok(Response::from_parts(
                parts,
                Full::new(body).map_err(|never| match never {}).boxed(),
            ));
        }
        Stats::add(&self.stats.coded, 1);
        let pacer = self.config.adapt_entropy_coding.then(Pacer::new);
        let coding = Coding {
            encoder,
            encoders: self.encoders.clone(),
            memory: Some((
                self.memory.clone(),
                // The coding's state (with the basis signature's index,
                // about its size), and the copy of the body collected for
                // the basis store.
                window_cost
                    + signature_len
                    + if keep {
                        self.bodies.collecting_memory(content_length)
                    } else {
                        0
                    },
                content_length,
            )),
            store,
            served_as,
            stats: self.stats.clone(),
            parking: self.parking.clone(),
            note,
            feed,
        };
        let body = encode_body(body, framing, coding, pacer, method, uri);
        Ok(Response::from_parts(parts, body))
    }

    /// Whether the basis store may keep this response's body: only what a
    /// shared cache may store, unless the operator opted in (D-B3).
    fn may_keep(&self, storability: Storability) -> bool {
        if self.config.basis_store_private {
            return true;
        }
        match storability {
            Storability::Storable => true,
            Storability::NotStorable(reason) => {
                tracing::debug!(reason, "body not kept as a basis");
                false
            }
        }
    }

    /// What we advertise: version and the signature sizes we accept, in
    /// a header and in a body.
    fn hsync_accept(&self) -> HeaderValue {
        let mut value = format!("v=1, max-signature={}", self.config.max_signature_bytes);
        if self.config.max_body_signature_bytes > self.config.max_signature_bytes {
            value += &format!(
                ", max-body-signature={}",
                self.config.max_body_signature_bytes
            );
        }
        HeaderValue::from_str(&value).expect("digits and ASCII")
    }
}

/// The announced `Content-Length`, if any.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(content_type: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(content_type).unwrap(),
        );
        headers
    }

    #[test]
    fn compressed_media_types_are_told_from_text_and_raw_pixels() {
        for compressed in [
            "image/jpeg",
            "IMAGE/PNG",
            "image/webp; q=1",
            "video/mp4",
            "audio/mpeg",
            "font/woff2",
            "application/zip",
            "application/vnd.debian.binary-package",
        ] {
            assert!(is_compressed_media(&typed(compressed)), "{compressed}");
        }
        for plain in [
            "image/svg+xml",
            "image/bmp",
            "audio/wav",
            "text/html; charset=utf-8",
            "application/javascript",
            "application/json",
            "application/wasm",
            "application/octet-stream",
        ] {
            assert!(!is_compressed_media(&typed(plain)), "{plain}");
        }
        assert!(!is_compressed_media(&HeaderMap::new()));
    }
}

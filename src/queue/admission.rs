//! What goes into [`UploadQueue::admit`](super::UploadQueue::admit) and what comes out: the request
//! as the queue sees it, and the answers (serve, a place in the queue, a
//! refusal, a QUEUE callback) with the headers each one puts on the wire.
//! Deciding which answer a request gets is the dialects' (`parq.rs`,
//! `active.rs`).
//!
//! Main types: [`QueueRequest`], [`Admission`], [`QueuedReply`],
//! [`Refusal`], [`SlotToken`], [`Callback`].

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, header};

use super::headers::{self, LegacyStatus, QueueVersion, QueuedStatus};
use super::id::QueueId;

/// The `X-Queue` header.
pub static X_QUEUE: HeaderName = HeaderName::from_static("x-queue");
/// The `X-Queued` header.
pub static X_QUEUED: HeaderName = HeaderName::from_static("x-queued");
/// The `X-Node` header.
pub static X_NODE: HeaderName = HeaderName::from_static("x-node");

/// Identifies one client connection, so a held connection (Sq, legacy)
/// can be told apart from a new one. The caller numbers its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionId(pub u64);

/// What the queue needs to know about a request.
#[derive(Debug, Clone)]
pub struct QueueRequest<'a> {
    /// The client's address.
    pub peer: IpAddr,
    /// The connection the request came on.
    pub connection: ConnectionId,
    /// Whether the connection stays open after the response (HTTP/1.1
    /// without `Connection: close`); Sq and legacy queueing need it.
    pub persistent: bool,
    /// The parsed `X-Queue` of the request; `None` if absent or
    /// unparsable (passive queueing).
    pub offer: Option<QueueVersion>,
    /// The parsed `X-Queued` of the request (position and ID).
    pub queued: Option<QueuedStatus>,
    /// The parsed `X-Node` of the request: where a QUEUE callback goes.
    pub node: Option<SocketAddr>,
    /// The requested resource (the URL), for the legacy same-file rule.
    pub resource: &'a str,
    /// The body length, if known, for the ETA.
    pub expected_len: Option<u64>,
}

/// The queue's answer to a request.
#[derive(Debug)]
pub enum Admission {
    /// Send the response; give the token back with
    /// [`UploadQueue::release`](super::UploadQueue::release) when the body is sent or abandoned.
    Serve(SlotToken),
    /// Answer `503` with [`QueuedReply::to_headers`].
    Queued(QueuedReply),
    /// Answer `503` with [`Refusal::to_headers`]; no place was given.
    Refused(Refusal),
}

/// Proof of one upload slot in use. Not `Clone`: a slot is released once.
#[derive(Debug)]
#[must_use = "an unreleased token holds its upload slot for ever"]
pub struct SlotToken {
    pub(super) id: u64,
    /// Set for a legacy client: its connection, resource and address, for
    /// the partial follow-up rule.
    pub(super) legacy: Option<(ConnectionId, u64, IpAddr)>,
}

/// How an upload ended, for [`UploadQueue::release`](super::UploadQueue::release).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// A whole response (`200`) was sent.
    Complete,
    /// A partial response (`206`) was sent completely: a legacy client may
    /// follow it with another request without losing its place.
    Partial,
    /// The upload was cut short.
    Aborted,
}

/// Why a client's earlier place was freed before it got this reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostPlace {
    /// It came back before Retry-After (PARQ: "Sending the request too soon
    /// will cause the slot to be freed").
    TooEarly,
    /// Its `X-Queued` position was not the last one it was told (PARQ: "If
    /// there is a mismatch, the corresponding slot is immediately freed").
    PositionMismatch,
    /// Its ID names no live entry: the lifetime lapsed, or it never existed.
    UnknownId,
    /// A legacy client asked for a different file ("it is shifted back to
    /// the end of the queue").
    DifferentFile,
}

/// The dialect-specific part of a queued reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyForm {
    /// PARQ: `X-Queue: 1.0` and `X-Queued`; the lifetime is given in Aq
    /// only, as in the seed's examples.
    Parq {
        /// The advertised lifetime, `None` in Sq.
        lifetime: Option<Duration>,
    },
    /// Legacy Active Queueing: `X-Queue: position=…,length=…,limit=…,
    /// pollMin=…,pollMax=…`.
    Active {
        /// Upload slots.
        limit: u32,
        /// pollMin.
        poll_min: Duration,
        /// pollMax.
        poll_max: Duration,
    },
    /// Passive: only `Retry-After`; the client knows nothing of queues.
    Passive,
}

/// A queued answer: a `503` that tells the client its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedReply {
    /// The entry's ID (sent to PARQ clients; for logs and stats otherwise).
    pub id: QueueId,
    /// Position, 1 is next.
    pub position: u32,
    /// Entries in the queue.
    pub length: u32,
    /// Estimated wait for a slot.
    pub eta: Duration,
    /// When the client should come back.
    pub retry_after: Duration,
    /// Whether the connection stays open (Sq, legacy); otherwise the reply
    /// carries `Connection: close`.
    pub keep_alive: bool,
    /// The dialect's headers.
    pub form: ReplyForm,
    /// Set when the client had a place and lost it with this request.
    pub lost: Option<LostPlace>,
}

impl QueuedReply {
    /// The headers of the `503`: `X-Queue`, `X-Queued`, `Retry-After` and
    /// `Connection: close` as the dialect and the queue part call for.
    pub fn to_headers(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        match self.form {
            ReplyForm::Parq { lifetime } => {
                map.insert(
                    X_QUEUE.clone(),
                    ascii(headers::format_version(QueueVersion::PARQ_1_0)),
                );
                let status = QueuedStatus {
                    position: Some(self.position),
                    length: Some(self.length),
                    eta: Some(secs(self.eta)),
                    lifetime: lifetime.map(secs),
                    id: Some(self.id),
                };
                map.insert(X_QUEUED.clone(), ascii(headers::format_x_queued(&status)));
            }
            ReplyForm::Active {
                limit,
                poll_min,
                poll_max,
            } => {
                let status = LegacyStatus {
                    position: Some(self.position),
                    length: Some(self.length),
                    limit: Some(limit),
                    poll_min: Some(secs(poll_min)),
                    poll_max: Some(secs(poll_max)),
                };
                map.insert(X_QUEUE.clone(), ascii(headers::format_legacy(&status)));
            }
            ReplyForm::Passive => {}
        }
        map.insert(
            header::RETRY_AFTER,
            HeaderValue::from(secs(self.retry_after)),
        );
        if !self.keep_alive {
            map.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        map
    }
}

/// Why a request got no place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// The queue holds `queue_max` entries (seed 001: "any requests which
    /// would not fit within it are sent a standard, non-queued 503").
    QueueFull,
    /// The client's address holds `per_address_max` entries already.
    AddressFull,
    /// The address broke the rules or hammered too often within the flood
    /// window.
    Flooding,
    /// A legacy client polled sooner than pollMin ("will be seen as
    /// flooding, and cause a disconnection"): close the connection.
    PollTooFast,
}

/// A plain `503` with `Retry-After` and no queue place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: RefusalReason,
    /// When to try again.
    pub retry_after: Duration,
    /// Whether to close the connection after the reply.
    pub close: bool,
}

impl Refusal {
    /// The headers of the `503`: `Retry-After`, and `Connection: close`
    /// when the connection is to be closed.
    pub fn to_headers(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        map.insert(
            header::RETRY_AFTER,
            HeaderValue::from(secs(self.retry_after)),
        );
        if self.close {
            map.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        map
    }
}

/// A QUEUE callback to make: connect to `node` and send
/// [`Callback::line`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Callback {
    /// The entry's ID.
    pub id: QueueId,
    /// The client's `X-Node` address.
    pub node: SocketAddr,
}

impl Callback {
    /// The line to send: `QUEUE <ID> <server>\r\n`, where `server` is the
    /// address the client should come back to.
    pub fn line(&self, server: SocketAddr) -> String {
        headers::format_queue_callback(self.id, server)
    }
}

/// Seconds, rounded up, as header values carry them.
fn secs(duration: Duration) -> u32 {
    let whole = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    u32::try_from(whole).unwrap_or(u32::MAX)
}

fn ascii(text: String) -> HeaderValue {
    HeaderValue::try_from(text).expect("queue headers are formatted from numbers and hex")
}

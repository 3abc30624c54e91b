//! The accelerator's upload slots (issue 5): the I/O around the sans-IO
//! [`UploadQueue`]. A request reads its queue headers here, is admitted
//! or answered `503` with the dialect's headers, and gives its slot back
//! when its response body ends; a timer task lapses entries, makes the
//! QUEUE callbacks and writes the queue to disk (remanence) so a restart
//! keeps the places.
//!
//! Auth is checked before any of this ([`crate::http::auth::AuthGate`] wraps
//! the accelerator), so an unauthenticated flood takes no place.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use argon2::password_hash::rand_core::{OsRng, RngCore};
use http::{Request, Response, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use crate::http::error::ProxyError;
use crate::http::server::{
    ConnectionNumber, HoldConnection, Peer, ProxyBody, RequestBody, counted,
};
use crate::queue::headers::{parse_offer, parse_x_node, parse_x_queued};
use crate::queue::{
    Admission, Completion, ConnectionId, IdGenerator, QueueConfig, QueueRequest, ReplyForm,
    UploadQueue, X_NODE, X_QUEUE, X_QUEUED,
};

/// How often entries are lapsed, callbacks made and the queue saved.
const TICK: Duration = Duration::from_secs(1);
/// How much later than it should a client may come back on a held
/// connection before the connection is closed.
const HOLD_SLACK: Duration = Duration::from_secs(30);
/// Longest a QUEUE callback connection may take.
const CALLBACK_TIMEOUT: Duration = Duration::from_secs(5);

/// The upload slots of one accelerator.
pub struct Slots {
    queue: Mutex<UploadQueue>,
    state_file: Option<PathBuf>,
}

/// What a request may do: go on with its slot, or answer at once.
pub enum Admitted {
    /// Serve it; [`Slots::release_with`] its response.
    Serve(crate::queue::SlotToken),
    /// Answer this `503`.
    Answer(Response<ProxyBody>),
}

fn random_seed() -> [u8; 32] {
    let mut seed = [0; 32];
    OsRng.fill_bytes(&mut seed);
    seed
}

impl Slots {
    /// Slots as `config` says, reloading the places saved in `state_file`
    /// when it holds a queue from before a restart (an unreadable one is
    /// logged and ignored: a queue lost is better than none).
    pub fn new(config: QueueConfig, state_file: Option<PathBuf>) -> Slots {
        let ids = || IdGenerator::from_seed(random_seed());
        let reloaded = state_file.as_deref().and_then(|path| {
            let bytes = std::fs::read(path).ok()?;
            match UploadQueue::from_bytes(
                config.clone(),
                ids(),
                &bytes,
                Instant::now(),
                SystemTime::now(),
            ) {
                Ok(queue) => {
                    tracing::info!(entries = queue.len(), file = %path.display(), "queue reloaded");
                    Some(queue)
                }
                Err(error) => {
                    tracing::warn!(%error, file = %path.display(), "saved queue not used");
                    None
                }
            }
        });
        Slots {
            queue: Mutex::new(reloaded.unwrap_or_else(|| UploadQueue::new(config, ids()))),
            state_file,
        }
    }

    fn lock(&self) -> MutexGuard<'_, UploadQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Entries waiting now.
    pub fn queued(&self) -> usize {
        self.lock().len()
    }

    /// Admits `request` to a slot, or answers it.
    pub fn admit(&self, request: &Request<RequestBody>) -> Admitted {
        let headers = request.headers();
        let value = |name| headers.get(name).map(|v: &http::HeaderValue| v.as_bytes());
        let connection = request
            .extensions()
            .get::<ConnectionNumber>()
            .map_or(0, |number| number.0);
        let peer = request
            .extensions()
            .get::<Peer>()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |peer| peer.0.ip());
        let resource = request.uri().to_string();
        let queued = QueueRequest {
            peer,
            connection: ConnectionId(connection),
            persistent: request.version() == http::Version::HTTP_11
                && !crate::http::headers::closes_connection(headers),
            offer: value(&X_QUEUE).and_then(|v| parse_offer(v).ok()),
            queued: value(&X_QUEUED).and_then(|v| parse_x_queued(v).ok()),
            node: value(&X_NODE).and_then(|v| parse_x_node(v).ok()),
            resource: &resource,
            expected_len: None,
        };
        let admission = self.lock().admit(&queued, Instant::now());
        let mut hold = None;
        let (message, headers) = match admission {
            Admission::Serve(token) => return Admitted::Serve(token),
            Admission::Queued(reply) => {
                if reply.keep_alive {
                    // The client comes back on this connection: by
                    // pollMax (legacy) or at Retry-After (PARQ Sq).
                    let back_by = match reply.form {
                        ReplyForm::Active { poll_max, .. } => poll_max,
                        _ => reply.retry_after,
                    };
                    hold = Some(HoldConnection(back_by + HOLD_SLACK));
                }
                tracing::info!(
                    position = reply.position,
                    length = reply.length,
                    retry_after = reply.retry_after.as_secs(),
                    "queued for an upload slot"
                );
                (
                    format!(
                        "all upload slots are busy: position {} of {}, retry in {} s",
                        reply.position,
                        reply.length,
                        reply.retry_after.as_secs()
                    ),
                    reply.to_headers(),
                )
            }
            Admission::Refused(refusal) => {
                tracing::info!(reason = ?refusal.reason, "no queue place");
                (
                    format!(
                        "all upload slots are busy and no place was given ({:?}); retry in {} s",
                        refusal.reason,
                        refusal.retry_after.as_secs()
                    ),
                    refusal.to_headers(),
                )
            }
        };
        // Not logged as a refusal: the lines above say more (the place, the
        // reason no place was given), and the role counts these as queued.
        let mut response = ProxyError::slots_busy(message, headers).into_response();
        if let Some(hold) = hold {
            response.extensions_mut().insert(hold);
        }
        Admitted::Answer(response)
    }

    /// `response` with its slot given back when its body ends (complete,
    /// partial for a 206, or aborted when the client left).
    pub fn release_with(
        self: &Arc<Self>,
        token: crate::queue::SlotToken,
        response: Response<ProxyBody>,
    ) -> Response<ProxyBody> {
        let partial = response.status() == StatusCode::PARTIAL_CONTENT;
        let slots = self.clone();
        response.map(|body| {
            counted(body, move |_, clean| {
                let completion = match (clean, partial) {
                    (false, _) => Completion::Aborted,
                    (true, true) => Completion::Partial,
                    (true, false) => Completion::Complete,
                };
                slots.lock().release(token, completion, Instant::now());
            })
        })
    }

    /// A client connection ended: places held by it (Sq, legacy) follow
    /// their rules.
    pub fn disconnected(&self, number: ConnectionNumber) {
        self.lock()
            .disconnected(ConnectionId(number.0), Instant::now());
    }

    /// Saves the queue to its state file now, if it has one (the timer
    /// saves it every second; this is for the way out).
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn save(&self) -> std::io::Result<()> {
        let Some(path) = &self.state_file else {
            return Ok(());
        };
        let bytes = self.lock().to_bytes(Instant::now(), SystemTime::now());
        write_atomically(path, &bytes)
    }

    /// Lapses entries, makes QUEUE callbacks (telling clients to come back
    /// to `server`) and saves the queue, every second, for ever.
    pub async fn run_timer(self: Arc<Self>, server: SocketAddr) {
        let mut interval = tokio::time::interval(TICK);
        loop {
            interval.tick().await;
            let (callbacks, saved) = {
                let mut queue = self.lock();
                let callbacks = queue.tick(Instant::now());
                let saved = self
                    .state_file
                    .as_ref()
                    .map(|_| queue.to_bytes(Instant::now(), SystemTime::now()));
                (callbacks, saved)
            };
            for callback in callbacks {
                let line = callback.line(server);
                tokio::spawn(async move {
                    let send = async {
                        let mut stream = tokio::net::TcpStream::connect(callback.node).await?;
                        stream.write_all(line.as_bytes()).await?;
                        stream.shutdown().await
                    };
                    match tokio::time::timeout(CALLBACK_TIMEOUT, send).await {
                        Ok(Ok(())) => tracing::info!(node = %callback.node, "QUEUE callback sent"),
                        Ok(Err(error)) => {
                            tracing::info!(node = %callback.node, %error, "QUEUE callback failed");
                        }
                        Err(_) => tracing::info!(node = %callback.node, "QUEUE callback timed out"),
                    }
                });
            }
            if let (Some(path), Some(bytes)) = (&self.state_file, saved) {
                let path = path.clone();
                let written =
                    tokio::task::spawn_blocking(move || write_atomically(&path, &bytes)).await;
                if let Ok(Err(error)) = written {
                    tracing::warn!(%error, "cannot save the queue");
                }
            }
        }
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a
/// crash leaves the old queue or the new one, never half of one.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let mut file = std::fs::File::create(&tmp)?;
    std::io::Write::write_all(&mut file, bytes)?;
    file.sync_data()?;
    std::fs::rename(&tmp, path)
}

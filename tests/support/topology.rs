//! Starting what the black-box tests put together over real sockets, one
//! call each: an origin, an accelerator, a client proxy, and chains of
//! them (each takes the address of the one behind it). Every server
//! listens on its own `127.0.0.1:0` and comes back as a [`Server`]: its
//! address, its handler (for stats and the cache), and a listener that
//! stops accepting when the handle is dropped.
//!
//! What the tests vary is a parameter here rather than a copy per file:
//! the origin's service ([`origin`] for a bare hyper origin, [`serve`] for
//! one written as an rproxy [`Handler`]), the listener's
//! [`ConnectionLimits`] and TLS ([`Listen`]), each role's config (from
//! [`accelerator_config`] and [`super::proxy::client_config`]), and the client proxy's
//! cache ([`Cache`]).
//!
//! Deliberately left out: how a test talks to the servers (raw bytes,
//! hyper, the user agent in [`super::user_agent`]: each file asks what it
//! is about), and origins that speak broken HTTP over raw TCP, which exist
//! to be unlike any server here.
//!
//! Main types: [`Server`], [`Origin`], [`Accelerator`], [`ClientProxy`],
//! [`Listen`], [`Cache`].

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioIo;
use rproxy::accelerator::AcceleratorConfig;
use rproxy::accelerator::slots::Slots;
use rproxy::cache::CacheStore;
use rproxy::client_proxy::{ClientConfig, StatsSnapshot};
use rproxy::http::server::{ConnectionLimits, Handler};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::AbortHandle;

/// A running accelerator.
pub type Accelerator = Server<rproxy::accelerator::Accelerator>;

/// A running client proxy.
pub type ClientProxy = Server<rproxy::client_proxy::ClientProxy>;

/// How a server listens: its connection limits, and TLS when given.
#[derive(Clone, Default)]
pub struct Listen {
    pub limits: ConnectionLimits,
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Listen {
    /// Plain TCP with `limits`.
    pub fn with_limits(limits: ConnectionLimits) -> Listen {
        Listen { limits, tls: None }
    }

    /// TLS with `cert` and `key` (a [`self_signed`] pair), where ALPN
    /// offers h2 and HTTP/1.1; the default limits.
    pub fn tls(cert: &std::path::Path, key: &std::path::Path) -> Listen {
        Listen {
            tls: Some(rproxy::http::tls::server_config(cert, key).unwrap()),
            ..Listen::default()
        }
    }
}

/// Where a client proxy keeps its cache.
pub enum Cache {
    /// A fresh temporary directory with a budget of this many bytes,
    /// deleted with the server.
    Temp(u64),
    /// A store the test opened itself (on a faulty file system, or to look
    /// at it after the server is gone).
    Store(CacheStore),
}

/// The cache budget of [`ClientProxy::start`] (bytes).
pub const CACHE_BYTES: u64 = 64 << 20;

/// One server on `127.0.0.1`: what it serves and where. Dropping it stops
/// the listener (connections under way finish on their own) and the
/// background tasks started for it.
pub struct Server<H> {
    pub addr: SocketAddr,
    pub handler: Arc<H>,
    /// Dropped with the server: the accept loop's shutdown signal.
    _stop: oneshot::Sender<()>,
    tasks: Vec<AbortHandle>,
    _dir: Option<TempDir>,
}

impl<H> Server<H> {
    /// `http://{addr}{path}`: a URL on this server, as a user agent asks a
    /// client proxy for it.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Keeps `dir` (a cache directory, certificates) until the server is
    /// dropped.
    pub fn keeping(mut self, dir: TempDir) -> Self {
        self._dir = Some(dir);
        self
    }

    /// Runs `task` until the server is dropped (a role's own timers and
    /// checks).
    pub fn running(mut self, task: impl Future<Output = ()> + Send + 'static) -> Self {
        self.tasks.push(tokio::spawn(task).abort_handle());
        self
    }

    /// Runs the accelerator's queue timer (lapses, callbacks, saving the
    /// queue) for `slots`, as `rproxy accelerator` does once it listens.
    pub fn with_slot_timer(mut self, slots: Option<&Arc<Slots>>) -> Self {
        if let Some(slots) = slots {
            let timer = tokio::spawn(slots.clone().run_timer(self.addr));
            self.tasks.push(timer.abort_handle());
        }
        self
    }
}

/// The handler's own methods (an origin's counters, a role's store) on
/// the handle.
impl<H> std::ops::Deref for Server<H> {
    type Target = H;

    fn deref(&self) -> &H {
        &self.handler
    }
}

impl<H> Drop for Server<H> {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Serves `handler` (an origin written as an rproxy [`Handler`], or a role
/// wrapped in one, such as an `AuthGate`) with rproxy's own accept loop.
pub async fn serve<H: Handler>(handler: Arc<H>, listen: Listen) -> Server<H> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    // Sent or dropped, either way the server stops.
    let stopped = async {
        let _ = stopped.await;
    };
    match listen.tls {
        Some(tls) => tokio::spawn(rproxy::http::server::serve_tls(
            listener,
            handler.clone(),
            listen.limits,
            tls,
            stopped,
        )),
        None => tokio::spawn(rproxy::http::server::serve(
            listener,
            handler.clone(),
            listen.limits,
            stopped,
        )),
    };
    Server {
        addr,
        handler,
        _stop: stop,
        tasks: Vec::new(),
        _dir: None,
    }
}

/// What an [`Origin`] saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
}

impl Seen {
    /// The value of header `name`, when there is one.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// The requests an [`Origin`] saw, in arrival order.
pub struct Requests {
    seen: Mutex<Vec<Seen>>,
    count: watch::Sender<usize>,
}

/// A running origin, counting what it is asked.
pub type Origin = Server<Requests>;

/// A bare HTTP/1.1 origin: hyper calling `service` with each request and
/// the number of earlier requests for the same path, with none of
/// rproxy's own checks between the proxies and what the origin sees.
/// Requests are recorded before `service` is called.
pub async fn origin<F, Fut, B>(service: F) -> Origin
where
    F: Fn(Request<Incoming>, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    origin_over(listener, service, None).await
}

/// An origin whose every path answers its next release on each request
/// (`release(n)` for the request after `n` earlier ones), with
/// `Cache-Control: no-cache`, so that each request after the first is an
/// update the client proxy revalidates.
pub async fn releases_of(release: fn(usize) -> Vec<u8>) -> Origin {
    origin(move |_, earlier| async move {
        let mut response = Response::new(http_body_util::Full::new(Bytes::from(release(earlier))));
        response
            .headers_mut()
            .insert("cache-control", HeaderValue::from_static("no-cache"));
        response
    })
    .await
}

/// [`origin`] on a listener the test bound (an origin coming back on the
/// port it had).
pub async fn origin_on<F, Fut, B>(listener: TcpListener, service: F) -> Origin
where
    F: Fn(Request<Incoming>, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    origin_over(listener, service, None).await
}

/// [`origin`] over TLS with `tls` (an `https://` origin).
pub async fn tls_origin<F, Fut, B>(service: F, tls: Arc<rustls::ServerConfig>) -> Origin
where
    F: Fn(Request<Incoming>, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    origin_over(
        listener,
        service,
        Some(tokio_rustls::TlsAcceptor::from(tls)),
    )
    .await
}

async fn origin_over<F, Fut, B>(
    listener: TcpListener,
    service: F,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Origin
where
    F: Fn(Request<Incoming>, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(Requests {
        seen: Mutex::new(Vec::new()),
        count: watch::channel(0).0,
    });
    let log = requests.clone();
    let service = Arc::new(service);
    let (stop, mut stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                _ = &mut stopped => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => continue,
                },
            };
            let (service, log, tls) = (service.clone(), log.clone(), tls.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let earlier = log.record(&request);
                    let reply = service(request, earlier);
                    async move { Ok::<_, Infallible>(reply.await) }
                });
                let http1 = hyper::server::conn::http1::Builder::new();
                let _ = match tls {
                    None => http1.serve_connection(TokioIo::new(stream), service).await,
                    Some(tls) => match tls.accept(stream).await {
                        Ok(stream) => http1.serve_connection(TokioIo::new(stream), service).await,
                        Err(_) => return,
                    },
                };
            });
        }
    });
    Server {
        addr,
        handler: requests,
        _stop: stop,
        tasks: Vec::new(),
        _dir: None,
    }
}

impl Requests {
    /// Records `request`; returns how many requests for its path came
    /// before it.
    fn record(&self, request: &Request<Incoming>) -> usize {
        let earlier = {
            let mut seen = self.seen.lock().unwrap();
            let earlier = seen
                .iter()
                .filter(|s| s.uri.path() == request.uri().path())
                .count();
            seen.push(Seen {
                method: request.method().clone(),
                uri: request.uri().clone(),
                headers: request.headers().clone(),
            });
            earlier
        };
        self.count.send_modify(|count| *count += 1);
        earlier
    }
}

impl Server<Requests> {
    /// Every request so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.handler.seen.lock().unwrap().clone()
    }

    /// The requests so far for `path`.
    pub fn seen_for(&self, path: &str) -> Vec<Seen> {
        self.handler
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.uri.path() == path)
            .cloned()
            .collect()
    }

    /// How many requests the origin has seen.
    pub fn requests(&self) -> usize {
        self.handler.seen.lock().unwrap().len()
    }

    /// How many requests for `path` the origin has seen.
    pub fn requests_to(&self, path: &str) -> usize {
        self.seen_for(path).len()
    }

    /// Waits up to 5 s until the origin has seen `n` requests.
    pub async fn wait_for_requests(&self, n: usize) {
        let mut count = self.handler.count.subscribe();
        tokio::time::timeout(Duration::from_secs(5), count.wait_for(|c| *c >= n))
            .await
            .expect("the origin saw the request in time")
            .unwrap();
    }
}

/// The accelerator settings the tests start from (in front of `origin`):
/// `rproxy accelerator`'s defaults, named `accel-test` in Via, with
/// shorter timeouts and a smaller basis store; each test sets what it is
/// about with `..accelerator_config(origin)`.
pub fn accelerator_config(origin: SocketAddr) -> AcceleratorConfig {
    AcceleratorConfig {
        via_name: HeaderValue::from_static("accel-test"),
        connect_timeout: Duration::from_secs(2),
        origin_timeout: Duration::from_secs(5),
        basis_store_bytes: 16 << 20,
        max_stored_body: 4 << 20,
        // Tests that keep large bodies on disk give their own temp dir.
        basis_disk: None,
        ..AcceleratorConfig::for_origin(format!("http://{origin}").parse().unwrap())
    }
}

impl Server<rproxy::accelerator::Accelerator> {
    /// Starts an accelerator with `config` on plain TCP with the default
    /// limits.
    ///
    /// # Panics
    /// The config is refused.
    pub async fn start(config: AcceleratorConfig) -> Accelerator {
        Self::start_with(config, Listen::default()).await
    }

    /// [`Accelerator::start`] listening as `listen` says.
    pub async fn start_with(config: AcceleratorConfig, listen: Listen) -> Accelerator {
        let accelerator = rproxy::accelerator::Accelerator::new(config).unwrap();
        let server = serve(Arc::new(accelerator), listen).await;
        let slots = server.handler.slots().cloned();
        // As `rproxy accelerator` does once it listens.
        let checks = server.handler.health_checks();
        server.with_slot_timer(slots.as_ref()).running(checks)
    }

    /// The accelerator's `GET /.rproxy/stats`, on a connection of its own.
    pub async fn stats(&self) -> serde_json::Value {
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        stream
            .write_all(
                b"GET /.rproxy/stats HTTP/1.1\r\nHost: stats.test\r\nConnection: close\r\n\r\n",
            )
            .await
            .unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
            .await
            .expect("the stats within 10 s")
            .unwrap();
        let body = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        serde_json::from_slice(&answer[body..]).unwrap()
    }
}

impl Server<rproxy::client_proxy::ClientProxy> {
    /// Starts a client proxy with `config`, its cache in a temporary
    /// directory of [`CACHE_BYTES`], on plain TCP with the default limits.
    ///
    /// # Panics
    /// The config is refused.
    pub async fn start(config: ClientConfig) -> ClientProxy {
        Self::start_with(config, Cache::Temp(CACHE_BYTES), Listen::default()).await
    }

    /// [`ClientProxy::start`] with the cache `cache`, listening as `listen`
    /// says.
    pub async fn start_with(config: ClientConfig, cache: Cache, listen: Listen) -> ClientProxy {
        let (dir, store) = match cache {
            Cache::Temp(bytes) => {
                let (dir, store) = temp_store(bytes);
                (Some(dir), store)
            }
            Cache::Store(store) => (None, store),
        };
        let proxy = rproxy::client_proxy::ClientProxy::new(config, store).unwrap();
        let mut server = serve(Arc::new(proxy), listen).await;
        server._dir = dir;
        server
    }

    /// The client proxy's counters now.
    pub fn stats(&self) -> StatsSnapshot {
        self.handler.stats().snapshot()
    }

    /// The client proxy's cache.
    pub fn store(&self) -> &CacheStore {
        self.handler.store()
    }
}

/// An accelerator in front of an origin and client proxies chained behind
/// it: `clients[0]`'s upstream is the accelerator, each next one's the one
/// before; a user agent asks the last.
pub struct Chain {
    pub accelerator: Accelerator,
    pub clients: Vec<ClientProxy>,
}

impl Chain {
    /// Starts an accelerator in front of `origin` ([`accelerator_config`])
    /// and `clients` client proxies behind it, each with
    /// [`super::proxy::client_config`], named `client-test-N` in Via.
    pub async fn start(origin: SocketAddr, clients: usize) -> Chain {
        let accelerator = Accelerator::start(accelerator_config(origin)).await;
        let mut chained: Vec<ClientProxy> = Vec::with_capacity(clients);
        for n in 0..clients {
            let upstream = chained
                .last()
                .map_or(accelerator.addr, |client| client.addr);
            let config = ClientConfig {
                via_name: HeaderValue::from_str(&format!("client-test-{n}")).unwrap(),
                ..super::proxy::client_config(&format!("http://{upstream}"))
            };
            chained.push(ClientProxy::start(config).await);
        }
        Chain {
            accelerator,
            clients: chained,
        }
    }

    /// The client proxy user agents ask.
    pub fn nearest(&self) -> &ClientProxy {
        self.clients.last().expect("at least one client proxy")
    }
}

/// A self-signed certificate for 127.0.0.1 and localhost, as PEM files
/// `cert.pem` and `key.pem` in `dir` (the certificate is its own CA).
pub fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let made =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

/// A cache store of `bytes` in a fresh temporary directory, for a client
/// proxy a test wraps itself (keep the directory with
/// [`Server::keeping`]).
pub fn temp_store(bytes: u64) -> (TempDir, CacheStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path().join("cache"), bytes).unwrap();
    (dir, store)
}

//! `rproxy demo`: the whole pipeline on loopback, in one process. A static
//! origin serves a folder, an accelerator fronts it, a client proxy with an
//! empty cache sits in front of that, and a user agent fetches a page, an
//! older release and then a newer release of an asset through the client
//! proxy (as `curl -x` would). Each fetch is checked against the file on
//! disk and reported: bytes the user agent got, bytes that crossed the
//! hsync link, what gzip -9 would have sent, and the digests.
//!
//! Main items: [`DemoOptions`], [`run`], [`Fetch`]; the origin is
//! [`static_origin::StaticOrigin`].

pub mod static_origin;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use tokio::net::TcpListener;

use crate::accelerator::{Accelerator, AcceleratorConfig};
use crate::cache::CacheStore;
use crate::client_proxy::{ClientConfig, ClientProxy};
use crate::config::ClientSettings;
use crate::http::server::{ConnectionLimits, Handler, serve};
use static_origin::StaticOrigin;

/// What the demo serves and fetches.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The folder the origin serves.
    pub root: PathBuf,
    /// Paths fetched in order, relative to the root (`/a/b.js`).
    pub paths: Vec<String>,
    /// The client proxy's cache directory; emptied first.
    pub cache: PathBuf,
}

/// One fetch through the pair.
#[derive(Debug, Clone)]
pub struct Fetch {
    /// The URL fetched.
    pub url: String,
    /// Status the user agent got.
    pub status: StatusCode,
    /// Its `Cache-Status`.
    pub cache_status: String,
    /// Body bytes the user agent got.
    pub body_bytes: u64,
    /// Body bytes that crossed the hsync link (accelerator → client).
    pub link_bytes: u64,
    /// Basis signature bytes sent up the link.
    pub signature_bytes: u64,
    /// The body compressed with gzip -9, for comparison.
    pub gzip_bytes: u64,
    /// blake3 of the body received.
    pub digest: blake3::Hash,
    /// Whether the body equals the file on disk.
    pub matches_file: bool,
}

/// Runs the demo and returns one [`Fetch`] per path.
///
/// # Errors
/// A listener that cannot bind, a cache that cannot be opened, a file that
/// cannot be read, or a fetch that fails.
pub async fn run(options: &DemoOptions) -> anyhow::Result<Vec<Fetch>> {
    if options.cache.exists() {
        std::fs::remove_dir_all(&options.cache)
            .with_context(|| format!("cannot empty {}", options.cache.display()))?;
    }
    let origin = StaticOrigin::new(options.root.clone())
        .with_context(|| format!("cannot serve {}", options.root.display()))?;
    let origin_addr = start(Arc::new(origin)).await?;

    // The roles' defaults, as `rproxy accelerator` and `rproxy client`
    // run with no flags, but for the addresses and Via names, and no
    // basis store on disk: the demo's bodies are small, and it leaves
    // nothing in the temp directory.
    let accelerator = Accelerator::new(AcceleratorConfig {
        via_name: HeaderValue::from_static("demo-accelerator"),
        basis_disk: None,
        ..AcceleratorConfig::for_origin(format!("http://{origin_addr}").parse()?)
    })?;
    let accelerator_addr = start(Arc::new(accelerator)).await?;

    let cache = options.cache.clone();
    let cache_size = ClientSettings::default().cache_size.0;
    let store = tokio::task::spawn_blocking(move || CacheStore::open(cache, cache_size)).await??;
    let client = Arc::new(ClientProxy::new(
        ClientConfig {
            via_name: HeaderValue::from_static("demo-client"),
            ..ClientConfig::for_upstream(format!("http://{accelerator_addr}").parse()?)
        },
        store,
    )?);
    let client_addr = start(client.clone()).await?;

    let mut fetches = Vec::new();
    for path in &options.paths {
        let url = format!("http://{origin_addr}{path}");
        let before = client.stats().snapshot();
        // Through the client proxy as a forward proxy: absolute-form
        // target, as `curl -x` sends it, taking gzip as a browser does (a
        // small page goes gzipped where that beats its stream).
        let request = Request::get(url.as_str())
            .header(http::header::HOST, origin_addr.to_string())
            .header(http::header::ACCEPT_ENCODING, "gzip")
            .body(Empty::new())
            .expect("valid request");
        let stream = tokio::net::TcpStream::connect(client_addr).await?;
        let response = send_absolute(stream, request).await?;
        let status = response.status();
        let cache_status = response
            .headers()
            .get("cache-status")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let gzipped = response
            .headers()
            .get(http::header::CONTENT_ENCODING)
            .is_some_and(|v| v == "gzip");
        let mut body = response
            .into_body()
            .collect()
            .await
            .with_context(|| format!("fetching {url}"))?
            .to_bytes();
        if gzipped {
            body = gunzip(&body).with_context(|| format!("gunzipping {url}"))?;
        }
        let after = client.stats().snapshot();
        let file = options.root.join(path.trim_start_matches('/'));
        let on_disk =
            std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        fetches.push(Fetch {
            url,
            status,
            cache_status,
            body_bytes: body.len() as u64,
            link_bytes: after.upstream_bytes - before.upstream_bytes,
            signature_bytes: after.signature_bytes - before.signature_bytes,
            gzip_bytes: gzip9_len(&body),
            digest: blake3::hash(&body),
            matches_file: body == on_disk,
        });
    }
    Ok(fetches)
}

/// Sends one request with its absolute-form target on a fresh connection
/// (hyper's pooled client would rewrite it to origin-form).
async fn send_absolute(
    stream: tokio::net::TcpStream,
    request: Request<Empty<Bytes>>,
) -> anyhow::Result<http::Response<hyper::body::Incoming>> {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender.send_request(request).await?)
}

/// Serves `handler` on a fresh loopback port for the rest of the process.
async fn start<H: Handler>(handler: Arc<H>) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(
        listener,
        handler,
        ConnectionLimits::default(),
        std::future::pending(),
    ));
    Ok(addr)
}

fn gunzip(bytes: &[u8]) -> std::io::Result<bytes::Bytes> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes).read_to_end(&mut out)?;
    Ok(out.into())
}

fn gzip9_len(bytes: &[u8]) -> u64 {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).expect("writing to a Vec");
    encoder.finish().expect("writing to a Vec").len() as u64
}

/// Prints the report; fails when a body did not match its file.
///
/// # Errors
/// When any fetch failed or returned other bytes than the file's.
pub fn print_report(fetches: &[Fetch], out: &mut impl Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<44} {:>6} {:>10} {:>10} {:>9} {:>10}  cache status",
        "url", "status", "body", "hsync link", "sig up", "gzip -9"
    )?;
    for f in fetches {
        let path = f.url.splitn(4, '/').nth(3).unwrap_or(&f.url);
        writeln!(
            out,
            "/{:<43} {:>6} {:>10} {:>10} {:>9} {:>10}  {}",
            path,
            f.status.as_u16(),
            f.body_bytes,
            f.link_bytes,
            f.signature_bytes,
            f.gzip_bytes,
            f.cache_status
        )?;
    }
    writeln!(out)?;
    for f in fetches {
        writeln!(
            out,
            "blake3 {}  {}  {}",
            f.digest.to_hex(),
            if f.matches_file {
                "same bytes as the file"
            } else {
                "DIFFERS FROM THE FILE"
            },
            f.url
        )?;
    }
    if let Some(last) = fetches.last()
        && last.gzip_bytes > 0
    {
        let wire = last.link_bytes + last.signature_bytes;
        writeln!(
            out,
            "\nlast fetch: {} bytes on the hsync link (delta + signature) where gzip -9 sends {}: {:.3}x",
            wire,
            last.gzip_bytes,
            wire as f64 / last.gzip_bytes as f64
        )?;
    }
    if let Some(bad) = fetches
        .iter()
        .find(|f| !f.matches_file || f.status != StatusCode::OK)
    {
        bail!("{} came back wrong (status {})", bad.url, bad.status);
    }
    Ok(())
}

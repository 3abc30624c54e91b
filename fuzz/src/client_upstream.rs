//! F-6: the client proxy's whole response path, from the bytes its upstream
//! sends to what the user agent and the cache get. The upstream is a
//! [`MemoryDial`] whose connection hands out the fuzzer's bytes as the
//! accelerator's reply, in pieces of fuzzer-chosen sizes with `Pending`
//! between them (as h2's `fuzz_e2e` MockIo does); the user agent is a hyper
//! client over an in-memory duplex to `serve_connection`. Time is paused:
//! the proxy's timeouts pass as soon as nothing else can happen.
//!
//! Input: byte 0 = flags (bit 0: the cache first holds `/lib/1.js`, the
//! 64 KiB [`crate::text`], fetched plainly, so the request for `/lib/2.js`
//! offers it as a basis; bit 1: `Pending` before every read), byte 1 = the
//! largest read piece as a power of two (`% 13`: 1 B to 4 KiB) and the seed
//! of the piece sizes, then the reply's bytes (a raw HTTP/1.1 response).
//!
//! Oracle: no panic (libfuzzer-sys aborts on one, on any thread); a
//! committed `/lib/2.js` verifies against its own digest, carries the
//! signature of its own bytes, and equals what the user agent got whenever
//! the user agent's body ended cleanly; what the user agent got of a 200 is
//! never longer than what a complete entry holds.

use std::collections::VecDeque;
use std::io;
use std::io::Read;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rproxy::cache::{CacheKey, CacheStore, Completeness};
use rproxy::client_proxy::{ClientConfig, ClientProxy};
use rproxy::hsync::{Encoder, EncoderOptions, SignatureBuilder, SignatureParams};
use rproxy::http::dial::{MemoryDial, MemoryIo};
use rproxy::http::headers::byte_sequence;
use rproxy::http::server::{ConnectionLimits, serve_connection};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The upstream every route goes to (never resolved: the dial is in memory).
const UPSTREAM: &str = "http://upstream.test";
/// The basis the cache may hold, and the URL asked for.
const BASIS_PATH: &str = "/lib/1.js";
const ASKED_PATH: &str = "/lib/2.js";

/// Flag bits of byte 0.
const SEED_BASIS: u8 = 1;
const PENDING_BEFORE_READS: u8 = 2;

/// What one input came to, for a look at the seeds
/// (`examples/replay_client_upstream.rs`).
#[derive(Debug)]
pub struct Outcome {
    /// The user agent's status (0: no answer).
    pub status: u16,
    /// Bytes the user agent got, and whether its body ended cleanly.
    pub delivered: usize,
    pub clean: bool,
    /// `/lib/2.js` was committed complete.
    pub committed: bool,
}

/// Runs one input (see the module's doc); `None` for one too short.
pub fn run(data: &[u8]) -> Option<Outcome> {
    let [flags, pieces, reply @ ..] = data else {
        return None;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    Some(runtime.block_on(exchange(*flags, *pieces, reply)))
}

/// The plain answer that seeds the basis: the text, whole, closing its
/// connection (so the next request gets a connection of its own).
pub fn basis_reply() -> Vec<u8> {
    let body = crate::text();
    let mut reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nCache-Control: max-age=3600\r\nContent-Type: application/javascript\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    reply.extend_from_slice(body);
    reply
}

/// The new release the seeds' coded replies carry: the text with a few
/// edits, then the text again, edited once: past the 64 KiB the client
/// proxy relays whole, so it streams (SIG frames release it, or END does),
/// while its stream against the basis stays small.
pub fn new_release() -> Vec<u8> {
    let text = crate::text();
    let mut body = text.to_vec();
    body.splice(1000..1000, b"/* inserted in release 2 */".iter().copied());
    body.drain(30_000..30_100);
    body[50_000..50_008].copy_from_slice(b"CHANGED!");
    body.extend_from_slice(&text[..40_000]);
    body.extend_from_slice(b"/* and a second copy, edited */");
    body.extend_from_slice(&text[40_000..]);
    body
}

/// The plain seeds' body: small, so that mutations reach its head.
fn small_release() -> &'static [u8] {
    &crate::text()[..3000]
}

/// Seeds: well-formed replies (flags, pieces, reply), named.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let new = new_release();
    let basis = crate::text();
    let signature = {
        let mut builder = SignatureBuilder::new(SignatureParams {
            block_size: 1024,
            strong_len: rproxy::hsync::DEFAULT_STRONG_LEN,
        });
        builder.update(basis);
        builder.finish();
        builder.to_signature_bytes()
    };
    let options = EncoderOptions {
        zstd_level: 1,
        ..EncoderOptions::default()
    };
    let stream = |signature: Option<&[u8]>, sig_frames: bool| {
        let mut encoder = Encoder::new(signature, Some(new.len() as u64), options);
        if !sig_frames {
            encoder.leave_out_sig_frames();
        }
        let mut out = Vec::new();
        encoder.push(&new, &mut out).expect("encodes");
        encoder.finish(&mut out).expect("finishes");
        out
    };
    let name = byte_sequence(blake3::hash(basis).as_bytes());
    let name = name.to_str().expect("ASCII");
    let head = |extra: &str, length: Option<usize>| {
        let framing = match length {
            Some(len) => format!("Content-Length: {len}\r\n"),
            None => "Transfer-Encoding: chunked\r\n".to_owned(),
        };
        format!(
            "HTTP/1.1 200 OK\r\nCache-Control: max-age=3600\r\nContent-Type: application/javascript\r\n{extra}{framing}\r\n"
        )
        .into_bytes()
    };
    let chunked = |body: &[u8]| {
        let mut out = Vec::new();
        for piece in body.chunks(4000) {
            out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            out.extend_from_slice(piece);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    };
    let coded = |stream: &[u8], basis: bool| {
        let mut extra =
            "Content-Encoding: hsync\r\nVary: Accept-Encoding, Hsync-Basis\r\n".to_owned();
        if basis {
            extra.push_str(&format!("Hsync-Basis: {name}\r\n"));
        }
        let mut reply = head(&extra, None);
        reply.extend_from_slice(&chunked(stream));
        reply
    };
    let plain = {
        let mut reply = head("", Some(small_release().len()));
        reply.extend_from_slice(small_release());
        reply
    };
    let plain_chunked = {
        let mut reply = head("", None);
        reply.extend_from_slice(&chunked(small_release()));
        reply
    };
    let with_input = |flags: u8, pieces: u8, reply: Vec<u8>| {
        let mut input = vec![flags, pieces];
        input.extend_from_slice(&reply);
        input
    };
    vec![
        ("plain-whole", with_input(0, 12, plain.clone())),
        (
            "plain-split7-pending",
            with_input(PENDING_BEFORE_READS, 3, plain),
        ),
        ("plain-chunked", with_input(0, 12, plain_chunked)),
        (
            "hsync-scratch",
            with_input(0, 12, coded(&stream(None, true), false)),
        ),
        (
            "hsync-delta",
            with_input(SEED_BASIS, 12, coded(&stream(Some(&signature), true), true)),
        ),
        (
            "hsync-delta-split-pending",
            with_input(
                SEED_BASIS | PENDING_BEFORE_READS,
                6,
                coded(&stream(Some(&signature), true), true),
            ),
        ),
        (
            "hsync-delta-no-sig",
            with_input(
                SEED_BASIS,
                12,
                coded(&stream(Some(&signature), false), true),
            ),
        ),
    ]
}

/// The fetch of `/lib/2.js` (after the basis's, when asked), and the
/// oracle.
async fn exchange(flags: u8, pieces: u8, reply: &[u8]) -> Outcome {
    let dir = tempfile::Builder::new()
        .prefix("rproxy-fuzz-")
        .tempdir_in(scratch_dir())
        .expect("a scratch directory");
    let store = CacheStore::open(dir.path(), 64 << 20).expect("a cache");
    let replies = Arc::new(Mutex::new(VecDeque::new()));
    if flags & SEED_BASIS != 0 {
        replies
            .lock()
            .unwrap()
            .push_back(Upstream::new(basis_reply(), 12, false));
    }
    replies.lock().unwrap().push_back(Upstream::new(
        reply.to_vec(),
        pieces,
        flags & PENDING_BEFORE_READS != 0,
    ));
    let handed = replies.clone();
    let dial = MemoryDial(Arc::new(move || {
        let next = handed.lock().unwrap().pop_front();
        next.map(|io| Box::new(io) as Box<dyn MemoryIo>)
            .ok_or_else(|| io::Error::new(io::ErrorKind::ConnectionRefused, "no more replies"))
    }));
    let config = ClientConfig {
        upstream_dial: Some(dial),
        ..ClientConfig::for_upstream(UPSTREAM.parse().expect("a URL"))
    };
    let proxy = Arc::new(ClientProxy::new(config, store.clone()).expect("a client proxy"));

    if flags & SEED_BASIS != 0 {
        let (_, body) = get(&proxy, BASIS_PATH).await;
        assert_eq!(
            body.as_deref(),
            Ok(crate::text()),
            "the basis's plain fetch"
        );
        settle().await;
    }
    let (status, body) = get(&proxy, ASKED_PATH).await;
    settle().await;

    let mut outcome = Outcome {
        status,
        delivered: body.as_ref().map_or_else(Vec::len, Vec::len),
        clean: body.is_ok(),
        committed: false,
    };
    let key = CacheKey::parse(&format!("{UPSTREAM}{ASKED_PATH}")).expect("a key");
    let Some(mut entry) = store.get(&key) else {
        return outcome;
    };
    if entry.meta.completeness != Completeness::Complete {
        return outcome;
    }
    outcome.committed = true;
    assert!(
        entry.verify_body().expect("the body readable"),
        "a committed entry fails its own digest"
    );
    let mut stored = Vec::new();
    entry
        .body
        .read_to_end(&mut stored)
        .expect("the body readable");
    assert_eq!(stored.len() as u64, entry.meta.body_len);
    assert_eq!(
        entry.signature,
        signature_like(&stored, &entry.signature),
        "the kept signature is not its body's"
    );
    match body {
        Ok(delivered) if status == 200 => {
            assert!(delivered == stored, "the user agent and the cache differ");
        }
        Err(partial) if status == 200 => {
            assert!(partial.len() <= stored.len());
        }
        _ => {}
    }
    outcome
}

/// Where the per-run caches go: memory when there is a tmpfs.
fn scratch_dir() -> &'static std::path::Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        }
    })
}

/// Lets the relay, the cache writes and the commit finish: virtual time
/// passes at once while nothing else can happen.
async fn settle() {
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A user agent's GET for `path` on a connection of its own: the status,
/// and the body (`Err` with what came, when it did not end cleanly).
async fn get(proxy: &Arc<ClientProxy>, path: &str) -> (u16, Result<Vec<u8>, Vec<u8>>) {
    let (agent, server) = tokio::io::duplex(64 << 10);
    let peer = Some("127.0.0.1:40000".parse().expect("an address"));
    tokio::spawn(serve_connection(
        server,
        peer,
        proxy.clone(),
        ConnectionLimits::default(),
    ));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(agent))
        .await
        .expect("a handshake");
    tokio::spawn(connection);
    let request = Request::get(format!("{UPSTREAM}{path}"))
        .header("host", "upstream.test")
        .body(Empty::<Bytes>::new())
        .expect("a request");
    let Ok(response) = sender.send_request(request).await else {
        return (0, Err(Vec::new()));
    };
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut got = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Some(data) = frame.data_ref() {
                    got.extend_from_slice(data);
                }
            }
            Err(_) => return (status, Err(got)),
        }
    }
    (status, Ok(got))
}

/// The signature of `body` with the parameters of `like` (a librsync
/// signature: magic, block size, strong length).
fn signature_like(body: &[u8], like: &[u8]) -> Vec<u8> {
    let Some(params) = like.get(4..12) else {
        return Vec::new();
    };
    let block_size = u32::from_be_bytes(params[..4].try_into().expect("4 bytes"));
    let strong_len = u32::from_be_bytes(params[4..].try_into().expect("4 bytes"));
    let mut builder = SignatureBuilder::new(SignatureParams {
        block_size,
        strong_len,
    });
    builder.update(body);
    builder.finish();
    builder.to_signature_bytes()
}

/// The upstream's end of a connection: once the request's head was
/// written (a reply before it would be bytes no request asked for, which
/// the proxy refuses as such), the reply in pieces (sizes from an xorshift
/// seeded by the input), optionally `Pending` before each; what the proxy
/// writes is kept only to see the head's end.
struct Upstream {
    reply: Vec<u8>,
    at: usize,
    largest: usize,
    state: u64,
    pending_first: bool,
    pending_now: bool,
    asked: Vec<u8>,
    reader: Option<std::task::Waker>,
}

impl Upstream {
    fn new(reply: Vec<u8>, pieces: u8, pending: bool) -> Upstream {
        Upstream {
            reply,
            at: 0,
            largest: 1 << (pieces % 13),
            state: 0x9e37_79b9_7f4a_7c15 ^ u64::from(pieces),
            pending_first: pending,
            pending_now: pending,
            asked: Vec::new(),
            reader: None,
        }
    }

    fn next_piece(&mut self) -> usize {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        1 + (self.state % self.largest as u64) as usize
    }
}

impl AsyncRead for Upstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.asked.windows(4).any(|w| w == b"\r\n\r\n") {
            this.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        if this.pending_now {
            this.pending_now = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.pending_now = this.pending_first;
        let piece = this.next_piece().min(buf.remaining());
        let end = (this.at + piece).min(this.reply.len());
        buf.put_slice(&this.reply[this.at..end]);
        this.at = end;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // The head is all that is looked for: a GET has no body.
        if this.asked.len() < 64 << 10 {
            this.asked.extend_from_slice(buf);
        }
        if let Some(reader) = this.reader.take() {
            reader.wake();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

//! The access log: one line per request, with the same fields on every
//! path of both roles (a hit, a delta, a pass-through, a refusal, a
//! tunnel), as logfmt or JSON, to stderr or a file reopened on SIGUSR1
//! (for logrotate). Kept apart from the diagnostic log (`tracing`), whose
//! lines say why something happened rather than what was served.
//!
//! [`Logged`] wraps a role: it gives each request an id (kept from a valid
//! `X-Request-Id`, else made here, and sent upstream in that header so
//! both roles' lines match up), and a [`Note`] in the request's extensions
//! that the role fills as it learns the cache outcome, the coding, the
//! basis and the bytes on the upstream link. The line is written once the
//! response's body has ended and the role has let go of the note, whichever
//! is last, so a delta's figures are in it.
//!
//! Fields: `time id client user method url status cache coding basis
//! from_upstream to_upstream from_downstream to_downstream saved ms
//! complete`. A value not known on a path is `-` (logfmt) or `null`
//! (JSON); the keys never change. `saved` is what did not cross the
//! upstream link thanks to us, as the metrics count it (their sum is
//! `rproxy_delivered_bytes_total - rproxy_link_bytes_total`): on a client
//! proxy what was delivered less what came from upstream and the
//! signature sent up (a hit saves all it delivers); on an accelerator
//! what the origin sent less what went on the link (a delta saves the
//! difference, a plain answer nothing). It may be negative (a signature
//! sent for an answer that came whole). `from_downstream` is the request
//! body's declared length.
//!
//! Leaves out: sampling, and buffering (a line is one `write` to the
//! file, appended, so lines from many requests never interleave).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use http::header::{self, HeaderName, HeaderValue};
use hyper::{Request, Response};
use serde::{Deserialize, Serialize};

use super::server::{ConnectionNumber, Handler, Peer, ProxyBody, RequestBody, counted};

/// The header a request's id travels in, from the client proxy to the
/// accelerator and on to the origin.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest request id taken from a request; longer ones are replaced.
const MAX_REQUEST_ID: usize = 64;

/// How a line is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `key=value` pairs, values quoted when they hold spaces or quotes.
    #[default]
    Logfmt,
    /// One JSON object per line.
    Json,
}

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// Nowhere.
    Off,
    /// Standard error, between the diagnostic lines.
    Stderr,
    /// A file, appended to; reopened by [`AccessLog::reopen`].
    File(PathBuf),
}

impl Destination {
    /// `off`, `stderr` or a path.
    pub fn parse(text: &str) -> Destination {
        match text {
            "off" => Destination::Off,
            "stderr" | "-" => Destination::Stderr,
            path => Destination::File(PathBuf::from(path)),
        }
    }
}

enum Sink {
    Off,
    Stderr,
    File(File),
}

/// The access log's output: see the module documentation.
pub struct AccessLog {
    destination: Destination,
    format: LogFormat,
    sink: Mutex<Sink>,
}

impl AccessLog {
    /// Opens `destination` (a file is created if missing, and appended to).
    ///
    /// # Errors
    /// A file that cannot be opened for appending.
    pub fn open(destination: Destination, format: LogFormat) -> io::Result<AccessLog> {
        let sink = Self::open_sink(&destination)?;
        Ok(AccessLog {
            destination,
            format,
            sink: Mutex::new(sink),
        })
    }

    fn open_sink(destination: &Destination) -> io::Result<Sink> {
        Ok(match destination {
            Destination::Off => Sink::Off,
            Destination::Stderr => Sink::Stderr,
            Destination::File(path) => Sink::File(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?,
            ),
        })
    }

    /// Opens the file again under its name (after logrotate moved it); the
    /// old file keeps what was written. Stderr and `off` have nothing to
    /// reopen.
    ///
    /// # Errors
    /// The file cannot be opened; lines keep going to the old one.
    pub fn reopen(&self) -> io::Result<()> {
        if let Destination::File(_) = self.destination {
            let sink = Self::open_sink(&self.destination)?;
            *self.sink.lock().unwrap_or_else(PoisonError::into_inner) = sink;
        }
        Ok(())
    }

    fn write(&self, line: &Line) {
        let text = match self.format {
            LogFormat::Logfmt => line.logfmt(),
            LogFormat::Json => {
                serde_json::to_string(line).expect("strings and numbers serialise") + "\n"
            }
        };
        let mut sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        let written = match &mut *sink {
            Sink::Off => Ok(()),
            Sink::Stderr => io::stderr().lock().write_all(text.as_bytes()),
            Sink::File(file) => file.write_all(text.as_bytes()),
        };
        if let Err(error) = written {
            tracing::warn!(%error, "cannot write the access log");
        }
    }
}

/// One line of the access log.
#[derive(Debug, Clone, Default, Serialize)]
struct Line {
    time: String,
    id: String,
    client: Option<String>,
    user: Option<String>,
    method: String,
    url: String,
    status: Option<u16>,
    cache: Option<String>,
    coding: Option<&'static str>,
    basis: Option<String>,
    from_upstream: Option<u64>,
    to_upstream: Option<u64>,
    from_downstream: Option<u64>,
    to_downstream: Option<u64>,
    saved: Option<i64>,
    ms: f64,
    complete: bool,
    /// How `saved` is reckoned (not written).
    #[serde(skip)]
    side: Option<Side>,
}

impl Line {
    /// `saved` from the bytes each way, as the metrics count them: see the
    /// module documentation. Nothing for a line of neither side, or an
    /// accelerator's answer that never came from an origin.
    fn reckon_saved(&self) -> Option<i64> {
        let signed = |bytes: Option<u64>| i64::try_from(bytes.unwrap_or(0)).unwrap_or(i64::MAX);
        match self.side? {
            Side::Client => Some(
                signed(self.to_downstream) - signed(self.from_upstream) - signed(self.to_upstream),
            ),
            Side::Accelerator => {
                self.from_upstream?;
                Some(signed(self.from_upstream) - signed(self.to_downstream))
            }
        }
    }

    /// The fields in order, as logfmt writes them.
    fn fields(&self) -> [(&'static str, Field<'_>); 17] {
        fn text(value: &Option<String>) -> Field<'_> {
            Field::Text(value.as_deref())
        }
        [
            ("time", Field::Text(Some(&self.time))),
            ("id", Field::Text(Some(&self.id))),
            ("client", text(&self.client)),
            ("user", text(&self.user)),
            ("method", Field::Text(Some(&self.method))),
            ("url", Field::Text(Some(&self.url))),
            ("status", Field::Number(self.status.map(i64::from))),
            ("cache", text(&self.cache)),
            ("coding", Field::Text(self.coding)),
            ("basis", text(&self.basis)),
            ("from_upstream", Field::bytes(self.from_upstream)),
            ("to_upstream", Field::bytes(self.to_upstream)),
            ("from_downstream", Field::bytes(self.from_downstream)),
            ("to_downstream", Field::bytes(self.to_downstream)),
            ("saved", Field::Number(self.saved)),
            ("ms", Field::Float(self.ms)),
            ("complete", Field::Bool(self.complete)),
        ]
    }

    /// The line as `key=value` pairs, written straight into one string
    /// (it is built for every request).
    fn logfmt(&self) -> String {
        use std::fmt::Write as _;
        let mut text = String::with_capacity(320);
        for (key, value) in self.fields() {
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(key);
            text.push('=');
            let _ = match value {
                Field::Text(None) | Field::Number(None) => write!(text, "-"),
                Field::Text(Some(value)) if needs_quotes(value) => {
                    write!(text, "{}", serde_json::Value::from(value))
                }
                Field::Text(Some(value)) => write!(text, "{value}"),
                Field::Number(Some(number)) => write!(text, "{number}"),
                Field::Float(number) => write!(text, "{number}"),
                Field::Bool(flag) => write!(text, "{flag}"),
            };
        }
        text.push('\n');
        text
    }
}

/// One value of a logfmt line.
enum Field<'a> {
    Text(Option<&'a str>),
    Number(Option<i64>),
    Float(f64),
    Bool(bool),
}

impl Field<'_> {
    fn bytes(bytes: Option<u64>) -> Field<'static> {
        Field::Number(bytes.map(|bytes| i64::try_from(bytes).unwrap_or(i64::MAX)))
    }
}

/// Whether a logfmt value must be quoted: empty, or holding what would
/// split or end the field (spaces, quotes, `=`, controls).
fn needs_quotes(value: &str) -> bool {
    value.is_empty()
        || value
            .bytes()
            .any(|b| b <= b' ' || b == b'"' || b == b'=' || b == b'\\' || b >= 0x7f)
}

/// What a role knows about a request beyond its head and its answer's:
/// filled as it goes (see the module documentation), written when the
/// last clone is dropped.
#[derive(Clone)]
pub struct Note(Arc<Pending>);

struct Pending {
    line: Mutex<Line>,
    started: Instant,
    log: Arc<AccessLog>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let line = self.line.get_mut().unwrap_or_else(PoisonError::into_inner);
        line.saved = line.saved.or_else(|| line.reckon_saved());
        self.log.write(line);
    }
}

/// Which side of the hsync link a role is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client proxy: the link is what it receives from upstream.
    Client,
    /// The accelerator: the link is what it sends downstream.
    Accelerator,
}

impl Note {
    fn edit(&self, change: impl FnOnce(&mut Line)) {
        change(&mut self.0.line.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// The user the request authenticated as.
    pub fn user(&self, user: &str) {
        self.edit(|line| line.user = Some(user.to_owned()));
    }

    /// How the body crossed the upstream link (`hsync`, `identity`,
    /// `tunnel`), and the basis a delta was made against.
    pub fn coding(&self, coding: &'static str, basis: Option<String>) {
        self.edit(|line| {
            line.coding = Some(coding);
            line.basis = basis;
        });
    }

    /// Bytes received from upstream for this request: the hsync link's on
    /// the client proxy, the origin's on the accelerator.
    pub fn from_upstream(&self, bytes: u64) {
        self.edit(|line| line.from_upstream = Some(bytes));
    }

    /// Bytes sent upstream beyond the request line and ordinary headers:
    /// a basis signature.
    pub fn to_upstream(&self, bytes: u64) {
        self.edit(|line| line.to_upstream = Some(line.to_upstream.unwrap_or(0) + bytes));
    }

    /// A CONNECT tunnel that ended: `up` bytes went from the user agent to
    /// the target, `down` back; its time is the tunnel's.
    pub fn tunnelled(&self, up: u64, down: u64) {
        let ms = self.ms();
        self.edit(|line| {
            line.coding = Some("tunnel");
            (line.from_downstream, line.to_upstream) = (Some(up), Some(up));
            (line.from_upstream, line.to_downstream) = (Some(down), Some(down));
            // Relayed as it came: nothing saved, and none of it in the
            // metrics' link or delivered bytes.
            line.saved = Some(0);
            line.ms = ms;
        });
    }

    /// Milliseconds since the request arrived, to the microsecond.
    fn ms(&self) -> f64 {
        (self.0.started.elapsed().as_secs_f64() * 1e6).round() / 1e3
    }

    /// Which side of the link this role is on: how `saved` is reckoned
    /// when the line is written.
    pub fn side(&self, side: Side) {
        self.edit(|line| line.side = Some(side));
    }
}

/// A role whose requests are written to an [`AccessLog`].
pub struct Logged<H> {
    role: Arc<H>,
    log: Arc<AccessLog>,
}

impl<H: Handler> Logged<H> {
    /// `role`, each of its requests written to `log`.
    pub fn new(role: H, log: Arc<AccessLog>) -> Logged<H> {
        Logged {
            role: Arc::new(role),
            log,
        }
    }

    /// The role inside.
    pub fn role(&self) -> &H {
        &self.role
    }

    async fn serve(self: Arc<Self>, mut request: Request<RequestBody>) -> Response<ProxyBody> {
        let id = request_id(request.headers().get(&REQUEST_ID));
        request.headers_mut().insert(
            REQUEST_ID,
            HeaderValue::from_str(&id).expect("ids are visible ASCII"),
        );
        let line = Line {
            time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            id,
            client: request
                .extensions()
                .get::<Peer>()
                .map(|peer| peer.0.to_string()),
            method: request.method().to_string(),
            url: shown_url(&request),
            from_downstream: request
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok()),
            ..Line::default()
        };
        let note = Note(Arc::new(Pending {
            line: Mutex::new(line),
            started: Instant::now(),
            log: self.log.clone(),
        }));
        request.extensions_mut().insert(note.clone());
        let response = self.role.clone().handle(request).await;
        let (parts, body) = response.into_parts();
        note.edit(|line| {
            line.status = Some(parts.status.as_u16());
            if let Some(cache) = parts.headers.get("cache-status") {
                line.cache = cache.to_str().ok().map(str::to_owned);
            }
        });
        let body = counted(body, move |bytes, complete| {
            let ms = note.ms();
            note.edit(|line| {
                line.to_downstream = Some(bytes);
                line.complete = complete;
                line.ms = ms;
            });
        });
        Response::from_parts(parts, body)
    }
}

impl<H: Handler> Handler for Logged<H> {
    fn handle(
        self: Arc<Self>,
        request: Request<RequestBody>,
    ) -> impl Future<Output = Response<ProxyBody>> + Send {
        self.serve(request)
    }

    fn connection_closed(&self, number: ConnectionNumber) {
        self.role.connection_closed(number);
    }

    fn stopped(&self) {
        self.role.stopped();
    }

    fn reopen_logs(&self) {
        if let Err(error) = self.log.reopen() {
            tracing::error!(%error, "cannot reopen the access log; writing to the old file");
        }
        self.role.reopen_logs();
    }
}

/// The request's own id when it is a sane token, else a new one: 16 hex
/// digits, unique in the process and unlikely to repeat across processes.
fn request_id(given: Option<&HeaderValue>) -> String {
    if let Some(given) = given.and_then(|v| v.to_str().ok())
        && (1..=MAX_REQUEST_ID).contains(&given.len())
        && given
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
    {
        return given.to_owned();
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SALT: std::sync::OnceLock<[u8; 16]> = std::sync::OnceLock::new();
    let salt = SALT.get_or_init(|| {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let mut salt = [0; 16];
        salt[..8].copy_from_slice(&now.as_nanos().to_le_bytes()[..8]);
        salt[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        salt
    });
    let mut hasher = blake3::Hasher::new();
    hasher.update(salt);
    hasher.update(&NEXT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    hasher.finalize().to_hex()[..16].to_owned()
}

/// The URL as the request names it: absolute-form as it came, origin-form
/// with its Host.
fn shown_url(request: &Request<RequestBody>) -> String {
    let uri = request.uri();
    if uri.scheme().is_some() || request.method() == http::Method::CONNECT {
        return uri.to_string();
    }
    match request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    {
        Some(host) => format!("//{host}{uri}"),
        None => uri.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sane_request_id_is_kept_and_anything_else_replaced() {
        let kept = HeaderValue::from_static("abc-123.4:5_6");
        assert_eq!(request_id(Some(&kept)), "abc-123.4:5_6");
        for bad in ["", "has space", "quote\"", &"x".repeat(65)] {
            let value = HeaderValue::from_str(bad).unwrap();
            let made = request_id(Some(&value));
            assert_ne!(made, bad);
            assert_eq!(made.len(), 16);
        }
        assert_ne!(request_id(None), request_id(None), "ids repeat");
    }

    #[test]
    fn logfmt_quotes_what_would_split_a_field_and_shows_unknowns_as_a_dash() {
        let line = Line {
            id: "a1".into(),
            method: "GET".into(),
            url: "http://h/a b?x=\"y\"".into(),
            status: Some(200),
            cache: Some("rproxy; hit".into()),
            ms: 1.5,
            complete: true,
            ..Line::default()
        };
        let text = line.logfmt();
        assert!(text.ends_with('\n'));
        assert!(text.contains(r#"url="http://h/a b?x=\"y\"""#), "{text}");
        assert!(text.contains(r#"cache="rproxy; hit""#), "{text}");
        assert!(text.contains("user=- "), "{text}");
        assert!(text.contains("status=200 "), "{text}");
        assert!(text.contains("complete=true\n"), "{text}");
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn every_line_has_the_same_keys_in_json() {
        let keys = |line: &Line| {
            let value: serde_json::Value = serde_json::to_value(line).unwrap();
            value
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        };
        let full = Line {
            user: Some("u".into()),
            coding: Some("hsync"),
            saved: Some(5),
            ..Line::default()
        };
        assert_eq!(keys(&Line::default()), keys(&full));
        assert_eq!(keys(&full).len(), 17);
    }

    #[test]
    fn a_reopened_file_takes_the_next_lines_and_the_moved_one_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let log = AccessLog::open(Destination::File(path.clone()), LogFormat::Json).unwrap();
        log.write(&Line {
            id: "first".into(),
            ..Line::default()
        });
        let moved = dir.path().join("access.log.1");
        std::fs::rename(&path, &moved).unwrap();
        log.write(&Line {
            id: "second".into(),
            ..Line::default()
        });
        log.reopen().unwrap();
        log.write(&Line {
            id: "third".into(),
            ..Line::default()
        });
        let old = std::fs::read_to_string(&moved).unwrap();
        let new = std::fs::read_to_string(&path).unwrap();
        assert!(old.contains("first") && old.contains("second"), "{old}");
        assert!(new.contains("third") && !new.contains("first"), "{new}");
    }
}

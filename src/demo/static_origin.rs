//! A small static-file origin server: the web server `rproxy demo` starts
//! on a loopback port behind the accelerator, so the whole chain runs from
//! one command with no nginx around.
//!
//! It answers GET and HEAD for regular files under one root directory, with
//! the validators a plain nginx sends (strong `ETag` from mtime and size,
//! `Last-Modified`) and honours `If-None-Match` / `If-Modified-Since` with
//! 304, so the client proxy revalidates against it as it would against a
//! real origin. Bodies stream from the file in 64 KiB chunks; nothing is
//! read into memory whole.
//!
//! Path safety: the target is percent-decoded, then any `.`/`..` segment,
//! empty inner segment, NUL or backslash is a 404, and the canonical path
//! of what is served must stay under the canonical root (a symlink leading
//! out is a 404).
//!
//! Leaves out: ranges, compression, directory listings, redirects from
//! `/dir` to `/dir/`, `If-Match`/`If-Unmodified-Since`, non-UTF-8 file
//! names, and protection against the tree being changed while a request
//! resolves it (a symlink swapped in between the check and the open): it is
//! a demo origin over a directory you control, not a hardened file server.
//!
//! Main type: [`StaticOrigin`].

use std::io;
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::UNIX_EPOCH;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, ReadBuf};

use crate::http::error::ProxyError;
use crate::http::server::{BodyError, Handler, ProxyBody, RequestBody};

/// Largest chunk read from a file and sent as one body frame (bytes).
const CHUNK_LEN: usize = 64 << 10;

/// Serves the files under one directory over HTTP/1.1 (GET and HEAD).
#[derive(Debug)]
pub struct StaticOrigin {
    root: PathBuf,
    cache_control: Option<HeaderValue>,
    requests: AtomicU64,
}

impl StaticOrigin {
    /// A server for the files under `root`, sending no `Cache-Control`.
    ///
    /// # Errors
    /// The error of canonicalising `root` (it does not exist, cannot be
    /// read), or [`io::ErrorKind::NotADirectory`] if it is not a directory.
    pub fn new(root: PathBuf) -> io::Result<StaticOrigin> {
        let root = root.canonicalize()?;
        if !root.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", root.display()),
            ));
        }
        Ok(StaticOrigin {
            root,
            cache_control: None,
            requests: AtomicU64::new(0),
        })
    }

    /// Sends `value` as `Cache-Control` on every 200 and 304 (default:
    /// none, so caches fall back to heuristics and validators, as with a
    /// plain nginx).
    #[must_use]
    pub fn with_cache_control(mut self, value: HeaderValue) -> StaticOrigin {
        self.cache_control = Some(value);
        self
    }

    /// The canonical root directory files are served from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Requests answered so far, whatever their status.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    async fn answer(&self, request: &Request<RequestBody>) -> Response<ProxyBody> {
        let method = request.method();
        if method != Method::GET && method != Method::HEAD {
            return ProxyError::method_not_allowed("only GET and HEAD", "GET, HEAD")
                .into_response();
        }
        let uri = request.uri();
        // Origin-form, or absolute-form which a server must accept too
        // (RFC 9112 §3.2.2; a caching proxy in front sends it).
        let http = uri.scheme().is_none_or(|s| *s == http::uri::Scheme::HTTP);
        if !http || !uri.path().starts_with('/') {
            return ProxyError::bad_request("the target must be a path or an http URL")
                .into_response();
        }
        let Some(segments) = decode_path(uri.path()) else {
            return not_found();
        };
        let Some((file, path)) = self.open(&segments).await else {
            return not_found();
        };
        let metadata = match file.metadata().await {
            Ok(metadata) if metadata.is_file() => metadata,
            _ => return not_found(),
        };
        let len = metadata.len();
        let mtime = metadata.modified().ok();
        let mtime_secs = mtime
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_secs());

        let mut headers = HeaderMap::new();
        let etag = format!("\"{:x}-{:x}\"", mtime_secs.unwrap_or(0), len);
        headers.insert(
            header::ETAG,
            HeaderValue::from_str(&etag).expect("quoted hex digits"),
        );
        if let Some(mtime) = mtime.filter(|_| mtime_secs.is_some()) {
            headers.insert(
                header::LAST_MODIFIED,
                HeaderValue::from_str(&httpdate::fmt_http_date(mtime)).expect("an HTTP date"),
            );
        }
        if let Some(value) = &self.cache_control {
            headers.insert(header::CACHE_CONTROL, value.clone());
        }

        if is_not_modified(request.headers(), &etag, mtime_secs) {
            let mut response = Response::new(empty());
            *response.status_mut() = StatusCode::NOT_MODIFIED;
            *response.headers_mut() = headers;
            return response;
        }

        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        headers.insert(header::CONTENT_TYPE, content_type(&path));
        let body = if method == Method::HEAD {
            empty()
        } else {
            FileBody::new(file, len).boxed()
        };
        let mut response = Response::new(body);
        *response.headers_mut() = headers;
        response
    }

    /// Opens the regular file the segments name (a directory's
    /// `index.html`), checking that its canonical path stays under the
    /// root. `None` for anything that should be a 404.
    async fn open(&self, segments: &[String]) -> Option<(tokio::fs::File, PathBuf)> {
        let joined: PathBuf = segments.iter().fold(self.root.clone(), |p, s| p.join(s));
        let mut path = tokio::fs::canonicalize(&joined).await.ok()?;
        if !path.starts_with(&self.root) {
            return None;
        }
        if tokio::fs::metadata(&path).await.ok()?.is_dir() {
            path = tokio::fs::canonicalize(path.join("index.html"))
                .await
                .ok()?;
            if !path.starts_with(&self.root) {
                return None;
            }
        }
        // The canonical path has no symlinks left to follow out of root.
        let file = tokio::fs::File::open(&path).await.ok()?;
        Some((file, path))
    }
}

impl Handler for StaticOrigin {
    async fn handle(self: Arc<Self>, request: Request<RequestBody>) -> Response<ProxyBody> {
        let response = self.answer(&request).await;
        self.requests.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            method = %request.method(),
            uri = %request.uri(),
            status = response.status().as_u16(),
            bytes = response
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()),
            "static origin"
        );
        response
    }
}

/// The path's segments, percent-decoded, or `None` if any of them could
/// reach outside the directory it names: `.`, `..`, an empty segment other
/// than a trailing one, NUL, `\`, or anything a platform reads as more than
/// one plain name. `%2F` decodes to a separator before the check, so
/// `..%2F` is refused like `../`.
fn decode_path(path: &str) -> Option<Vec<String>> {
    let decoded = String::from_utf8(percent_decode(path.as_bytes())?).ok()?;
    let rest = decoded.strip_prefix('/')?;
    let parts: Vec<&str> = rest.split('/').collect();
    let last = parts.len() - 1;
    let mut segments = Vec::with_capacity(parts.len());
    for (i, part) in parts.into_iter().enumerate() {
        if part.is_empty() {
            if i == last {
                continue;
            }
            return None;
        }
        if part == "."
            || part == ".."
            || part.contains(['\0', '\\'])
            || !matches!(
                Path::new(part).components().collect::<Vec<_>>()[..],
                [Component::Normal(_)]
            )
        {
            return None;
        }
        segments.push(part.to_owned());
    }
    Some(segments)
}

/// `%XX` escapes decoded; `None` for a `%` not followed by two hex digits.
fn percent_decode(input: &[u8]) -> Option<Vec<u8>> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'%' {
            let high = hex(*input.get(i + 1)?)?;
            let low = hex(*input.get(i + 2)?)?;
            out.push(high << 4 | low);
            i += 3;
        } else {
            out.push(input[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Whether the request's validators match (RFC 9110 §13.1.2, §13.1.3):
/// `If-None-Match` by weak comparison when present, otherwise
/// `If-Modified-Since` against the mtime in whole seconds.
fn is_not_modified(headers: &HeaderMap, etag: &str, mtime_secs: Option<u64>) -> bool {
    let mut if_none_match = headers.get_all(header::IF_NONE_MATCH).iter().peekable();
    if if_none_match.peek().is_some() {
        let ours = opaque_tag(etag);
        return if_none_match
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.trim() == "*" || entity_tags(v).any(|tag| tag == ours));
    }
    let since = headers
        .get(header::IF_MODIFIED_SINCE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok());
    matches!((mtime_secs, since), (Some(mtime), Some(since)) if mtime <= since.as_secs())
}

/// The opaque tag of an entity-tag, without `W/` (weak comparison).
fn opaque_tag(tag: &str) -> &str {
    tag.strip_prefix("W/").unwrap_or(tag)
}

/// The opaque tags (quotes included, `W/` dropped) in a comma-separated
/// entity-tag list. Stops at the first malformed item; commas inside the
/// quotes are part of the tag.
fn entity_tags(list: &str) -> impl Iterator<Item = &str> {
    let mut rest = list;
    std::iter::from_fn(move || {
        rest = rest.trim_start_matches([' ', '\t', ',']);
        let tag = opaque_tag(rest);
        let close = tag.strip_prefix('"')?.find('"')? + 2;
        let (found, after) = tag.split_at(close);
        rest = after;
        Some(found)
    })
}

/// The media type for a file name's extension.
fn content_type(path: &Path) -> HeaderValue {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    HeaderValue::from_static(match extension.as_deref() {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("txt") => "text/plain; charset=utf-8",
        Some("wasm") => "application/wasm",
        _ => "application/octet-stream",
    })
}

fn empty() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed()
}

// The origin's refusals (here and in `answer`) are answers to its own
// clients, not incidents of a proxy: built, not logged.
fn not_found() -> Response<ProxyBody> {
    ProxyError::not_found().into_response()
}

/// A file's first `len` bytes as a body, read in chunks of at most
/// [`CHUNK_LEN`] as the client takes them (backpressure, bounded memory).
/// A file that ends early is an error, so the connection is cut rather
/// than the body looking whole.
struct FileBody {
    file: tokio::fs::File,
    remaining: u64,
    buf: Box<[u8]>,
}

impl FileBody {
    fn new(file: tokio::fs::File, len: u64) -> FileBody {
        let buf_len = usize::try_from(len).map_or(CHUNK_LEN, |len| len.min(CHUNK_LEN));
        FileBody {
            file,
            remaining: len,
            buf: vec![0; buf_len].into_boxed_slice(),
        }
    }
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let want =
            usize::try_from(this.remaining).map_or(this.buf.len(), |r| r.min(this.buf.len()));
        let mut buf = ReadBuf::new(&mut this.buf[..want]);
        match Pin::new(&mut this.file).poll_read(cx, &mut buf) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(error)) => {
                this.remaining = 0;
                Poll::Ready(Some(Err(error.into())))
            }
            Poll::Ready(Ok(())) if buf.filled().is_empty() => {
                let missing = this.remaining;
                this.remaining = 0;
                Poll::Ready(Some(Err(format!(
                    "file ended {missing} bytes short of its Content-Length"
                )
                .into())))
            }
            Poll::Ready(Ok(())) => {
                let chunk = Bytes::copy_from_slice(buf.filled());
                this.remaining -= chunk.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_path_splits_and_decodes_plain_paths() {
        assert_eq!(decode_path("/"), Some(vec![]));
        assert_eq!(
            decode_path("/a/b%20c.js"),
            Some(vec!["a".to_owned(), "b c.js".to_owned()])
        );
        assert_eq!(decode_path("/dir/"), Some(vec!["dir".to_owned()]));
        assert_eq!(
            decode_path("/.well-known/x"),
            Some(vec![".well-known".to_owned(), "x".to_owned()])
        );
    }

    #[test]
    fn decode_path_refuses_anything_that_could_leave_the_directory() {
        for path in [
            "/..",
            "/../x",
            "/%2e%2e/x",
            "/%2E%2E/x",
            "/a/..%2f..%2fx",
            "/a/./b",
            "/a//b",
            "//etc/passwd",
            "/a%00b",
            "/a%5c..%5cb",
            "/a\\b",
            "/%",
            "/%2",
            "/%zz",
            "/%ff",
            "x",
        ] {
            assert_eq!(decode_path(path), None, "{path}");
        }
    }

    #[test]
    fn entity_tag_lists_parse_with_weak_prefixes_and_quoted_commas() {
        let tags: Vec<&str> = entity_tags(r#" "a", W/"b" ,"c,d",bad "e""#).collect();
        assert_eq!(tags, [r#""a""#, r#""b""#, r#""c,d""#]);
    }

    #[test]
    fn if_none_match_overrides_if_modified_since() {
        let etag = r#""5-a""#;
        let mut headers = HeaderMap::new();
        headers.insert(
            header::IF_MODIFIED_SINCE,
            HeaderValue::from_static("Thu, 01 Jan 1970 00:00:10 GMT"),
        );
        assert!(is_not_modified(&headers, etag, Some(10)));
        assert!(!is_not_modified(&headers, etag, Some(11)));
        headers.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static(r#""other""#),
        );
        assert!(!is_not_modified(&headers, etag, Some(10)));
        headers.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static(r#""x", W/"5-a""#),
        );
        assert!(is_not_modified(&headers, etag, Some(11)));
        headers.insert(header::IF_NONE_MATCH, HeaderValue::from_static("*"));
        assert!(is_not_modified(&headers, etag, Some(11)));
    }

    #[tokio::test]
    async fn file_body_streams_bounded_chunks_of_exactly_len_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.bin");
        let content: Vec<u8> = (0..(3 * CHUNK_LEN + 123))
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&path, &content).unwrap();
        let file = tokio::fs::File::open(&path).await.unwrap();
        let mut body = FileBody::new(file, content.len() as u64);
        assert_eq!(body.size_hint().exact(), Some(content.len() as u64));
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            let chunk = frame.unwrap().into_data().unwrap();
            assert!(!chunk.is_empty() && chunk.len() <= CHUNK_LEN);
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, content);
    }

    #[tokio::test]
    async fn file_body_fails_when_the_file_is_shorter_than_promised() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short.bin");
        std::fs::write(&path, b"12345").unwrap();
        let file = tokio::fs::File::open(&path).await.unwrap();
        let mut body = FileBody::new(file, 10);
        assert_eq!(
            &body.frame().await.unwrap().unwrap().into_data().unwrap()[..],
            b"12345"
        );
        assert!(body.frame().await.unwrap().is_err());
        assert!(body.frame().await.is_none());
    }
}

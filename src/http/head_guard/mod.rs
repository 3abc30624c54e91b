//! A strict check of HTTP/1.1 request framing over the raw bytes of a
//! connection, before hyper parses them (RELIABILITY P-1 … P-7), and of
//! response framing on our upstream connections ([`ResponseFraming`]:
//! P-5, P-6 and P-17 on the response side).
//!
//! httparse is lenient where leniency lets two parsers cut a stream
//! differently: it takes a bare LF as a line end, strips blanks around a
//! `Content-Length` or after `chunked`, and hyper drops `Content-Length`
//! when `Transfer-Encoding` is present, all before a handler can see the
//! raw head. [`Framing`] follows the connection's requests itself: it is fed
//! every chunk read, checks each request head byte by byte, then skips the
//! body by its own framing (`Content-Length` bytes, or chunks with strictly
//! hex sizes, extensions and trailers) to the next head, so that pipelined
//! requests are checked too. It keeps no bytes (a head split across reads
//! is checked as it comes) and allocates nothing.
//!
//! What it refuses in a head (trailers are held to the same line rules):
//! a bare LF or a bare CR anywhere, a control byte, a field name that is
//! not a token (a space before the colon), a line without a colon, obs-fold;
//! `Content-Length` other than 1 to 19 digits with at most one blank before
//! them and none after, two different `Content-Length` values;
//! `Transfer-Encoding` other than exactly `chunked` (one field, at most one
//! blank before it, none after), on HTTP/1.0, or together with
//! `Content-Length`. In a chunked body: a chunk size that is not 1 to 16 hex
//! digits (blanks only before a `;`), a control byte in an extension, data
//! longer than its size, a bare CR or LF.
//!
//! What it leaves to hyper and to [`crate::http::headers::check_request_head`]: the
//! request line's shape and version, `Host`, underscores in names, sizes
//! and counts (431, 414). Two identical `Content-Length` fields count as
//! one, as hyper takes them.
//!
//! This module holds the verdict both directions share: [`Reason`] (the
//! rule broken), [`Part`] (head or body), [`Violation`] (rule, offset,
//! message) and [`Checked`] (how much of a chunk may go on). Its parts:
//!
//! - `framing`: [`Framing`], the byte-by-byte state machine over one
//!   direction of a connection (requests, or the responses to them);
//! - `response`: [`ResponseFraming`], which pairs the requests we write
//!   with the responses we read on an upstream connection;
//! - `byte_class`: the byte tables (token, field value, request line) and
//!   the fast scan over them that both directions use.
//!
//! Main types: [`Framing`], [`ResponseFraming`], [`Violation`].

mod byte_class;
mod framing;
mod response;

pub(crate) use byte_class::is_tchar;
pub use framing::Framing;
pub use response::ResponseFraming;

/// The rule a request broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reason {
    /// An LF not preceded by CR.
    #[error("a bare LF (lines end with CRLF)")]
    BareLineFeed,
    /// A CR not followed by LF.
    #[error("a bare CR")]
    BareCarriageReturn,
    /// A control byte other than HTAB where text belongs.
    #[error("control byte 0x{0:02x}")]
    ControlByte(u8),
    /// A field name with a byte that is not a token character (such as a
    /// blank before the colon).
    #[error("a header field name with a byte that is not a token character")]
    BadFieldName,
    /// A field line that ends without a colon.
    #[error("a header line without a colon")]
    MissingColon,
    /// A field line starting with a blank (RFC 9112 §5.2).
    #[error("a continuation line (obs-fold)")]
    ObsFold,
    /// `Content-Length` that is not 1 to 19 digits, with at most one blank
    /// before them and none after.
    #[error("Content-Length is not 1 to 19 digits (with at most one blank before, none after)")]
    BadContentLength,
    /// Two `Content-Length` fields with different values.
    #[error("two different Content-Length values")]
    DifferingContentLengths,
    /// `Transfer-Encoding` other than one field of exactly `chunked`.
    #[error("Transfer-Encoding must be exactly chunked")]
    BadTransferEncoding,
    /// Both `Content-Length` and `Transfer-Encoding` (RFC 9112 §6.1).
    #[error("both Content-Length and Transfer-Encoding")]
    ContentLengthWithTransferEncoding,
    /// `Transfer-Encoding` on an HTTP/1.0 message (RFC 9112 §6.1).
    #[error("Transfer-Encoding on an HTTP/1.0 message")]
    TransferEncodingOnHttp10,
    /// A chunk size that is not 1 to 16 hex digits, or blanks that are not
    /// before a `;`.
    #[error("a chunk size that is not 1 to 16 hex digits")]
    BadChunkSize,
    /// A chunk extension with a control byte.
    #[error("a control byte in a chunk extension")]
    BadChunkExtension,
    /// Chunk data not followed by CRLF where its size says it ends.
    #[error("chunk data longer than its size")]
    ChunkDataOverrun,
    /// A status line that does not begin `HTTP/1.x NNN`.
    #[error("a status line that does not begin HTTP/1.x and a three-digit status")]
    BadStatusLine,
    /// `101 Switching Protocols`, which no request of ours asks for.
    #[error("101 Switching Protocols to a request that asked for no upgrade")]
    UnrequestedSwitch,
    /// Bytes after a response's end before the next request was written:
    /// a body longer than its `Content-Length`, or a response nobody asked
    /// for (P-17).
    #[error("bytes after the end of a response, before the next request")]
    Unsolicited,
}

/// Where a violation lies, which decides what the connection owes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// In a request head that began at this stream offset (its leading
    /// empty lines included): the request never reaches the parser whole.
    Head {
        /// Stream offset of the head's first byte.
        start: u64,
    },
    /// In a chunked body or its trailers: the request's head has gone on.
    Body,
}

/// A broken rule and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Violation {
    /// The rule.
    pub reason: Reason,
    /// Stream offset of the byte that broke it.
    pub at: u64,
    /// In a head or a body.
    pub part: Part,
    /// Which message of the connection (0 for the first) broke it; bytes
    /// after a response's end count as that response's.
    pub message: u64,
}

/// What [`Framing::check`] found in one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// How many leading bytes of the chunk may go on to the HTTP parser:
    /// all of them without a violation; with one in a head, those before
    /// the head (none when it began in an earlier chunk); with one in a
    /// body, those before the offending byte.
    pub safe: usize,
    /// The rule broken, if any. Every later call repeats it, with `safe` 0.
    pub violation: Option<Violation>,
}

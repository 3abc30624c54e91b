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

/// Follows the request framing of one HTTP/1.1 connection over its raw
/// bytes, as they are read. Sans-IO.
#[derive(Debug, Clone)]
pub struct Framing {
    /// Requests, or the responses to them (see [`ResponseFraming`]).
    direction: Direction,
    state: State,
    /// Messages that ended (an interim 1xx response does not count).
    messages: u64,
    /// Start lines that ended.
    start_lines: u64,
    /// The first bytes of the current start line: the method, or the
    /// version and status.
    start_line: [u8; START_LINE_PREFIX],
    start_line_len: u8,
    /// Bit `n % 64` is set when message `n` is a HEAD request (as requests),
    /// or answers one (as responses, copied from the requests' side).
    head_requests: u64,
    /// As responses: requests whose request line was written.
    requests: u64,
    /// As responses: the status of the current head.
    status: u16,
    /// Bytes checked so far (the stream offset of the next byte).
    checked: u64,
    /// Stream offset of the current message's first byte.
    head_start: u64,
    /// Trailer fields of a chunked body, rather than a head's fields.
    in_trailer: bool,
    /// The field whose value is being read.
    field: Field,
    /// Bytes of the current field name.
    name_len: usize,
    /// The name read so far is a prefix of `content-length` …
    maybe_content_length: bool,
    /// … or of `transfer-encoding` (ASCII case-insensitive).
    maybe_transfer_encoding: bool,
    /// A blank was seen before a framing field's value.
    blank: bool,
    /// Digits of a Content-Length or chunk size, or letters of `chunked`
    /// matched.
    digits: u8,
    /// The Content-Length or chunk size read so far.
    number: u64,
    /// The last eight bytes of the request line (its version).
    request_line_tail: u64,
    http10: bool,
    content_length: Option<u64>,
    chunked: bool,
    failed: Option<Violation>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Requests,
    Responses,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a request line, where empty lines (CRLF) may come first.
    HeadStart,
    /// A CR before the request line; an LF must follow.
    HeadStartLf,
    /// The request or status line.
    StartLine,
    StartLineLf,
    /// The start of a field line, or of the empty line ending the section.
    LineStart,
    Name,
    /// After the colon, blanks included.
    Value,
    ValueLf,
    /// The CR of the empty line ending the section seen.
    SectionEndLf,
    /// A Content-Length body.
    Body {
        remaining: u64,
    },
    ChunkSize,
    /// Blanks after the chunk size: only a `;` may follow.
    ChunkSizeBlank,
    ChunkExtension,
    ChunkLineLf,
    ChunkData {
        remaining: u64,
    },
    ChunkDataCr,
    ChunkDataLf,
    /// A response body without a length: it ends with the connection.
    UntilClose,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Other,
    ContentLength,
    TransferEncoding,
}

const CONTENT_LENGTH: &[u8] = b"content-length";
const TRANSFER_ENCODING: &[u8] = b"transfer-encoding";
const CHUNKED: &[u8] = b"chunked";
/// 19 decimal digits always fit a u64.
const MAX_CONTENT_LENGTH_DIGITS: u8 = 19;
/// 16 hex digits always fit a u64; more is the CVE-2023-38697 class.
const MAX_CHUNK_SIZE_DIGITS: u8 = 16;
const HTTP_10: u64 = u64::from_be_bytes(*b"HTTP/1.0");
/// `HTTP/1.1 200`: what a status line's framing depends on.
const START_LINE_PREFIX: usize = 12;

/// Bytes of a field value or chunk extension: VCHAR, obs-text, SP and HTAB
/// (RFC 9110 §5.5).
static FIELD_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = b == 0x09 || (b >= 0x20 && b != 0x7f);
        b += 1;
    }
    table
};

/// Bytes of a request line: as in a value, but no HTAB.
static REQUEST_LINE_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = b >= 0x20 && b != 0x7f;
        b += 1;
    }
    table
};

/// Token characters (RFC 9110 §5.6.2), the bytes of a field name.
static TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

/// Whether `b` is a token character (RFC 9110 §5.6.2): may stand in a
/// field name.
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

/// The reason for a byte that does not belong: a bare LF or a control
/// byte say so; anything else (a CR ending a line too early, a blank where
/// none may be) is `otherwise`.
fn stray(b: u8, otherwise: Reason) -> Reason {
    match b {
        b'\n' => Reason::BareLineFeed,
        b'\r' | b'\t' => otherwise,
        0..=0x1f | 0x7f => Reason::ControlByte(b),
        _ => otherwise,
    }
}

/// How many leading bytes of `bytes` are in `table`.
fn span(bytes: &[u8], table: &[bool; 256]) -> usize {
    bytes
        .iter()
        .position(|&b| !table[usize::from(b)])
        .unwrap_or(bytes.len())
}

/// [`span`] for a table that holds every byte but the control bytes (and
/// perhaps HTAB): eight bytes at a time while none is a control byte,
/// since this runs over every byte of every head.
fn text_span(bytes: &[u8], table: &[bool; 256]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
    let mut i = 0;
    while let Some(word) = bytes.get(i..i + 8) {
        let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        // Whether a byte is below 0x20, or is 0x7f (the usual SWAR test
        // for a byte below n, and for a zero byte after xor).
        let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGH_BITS;
        let del = word ^ (ONES * 0x7f);
        let is_del = del.wrapping_sub(ONES) & !del & HIGH_BITS;
        if below_space | is_del != 0 {
            break;
        }
        i += 8;
    }
    i + span(&bytes[i..], table)
}

impl Default for Framing {
    fn default() -> Self {
        Framing::new()
    }
}

impl Framing {
    /// A connection's request framing before its first byte.
    pub fn new() -> Framing {
        Framing::with_direction(Direction::Requests)
    }

    fn with_direction(direction: Direction) -> Framing {
        Framing {
            direction,
            state: State::HeadStart,
            messages: 0,
            start_lines: 0,
            start_line: [0; START_LINE_PREFIX],
            start_line_len: 0,
            head_requests: 0,
            requests: 0,
            status: 0,
            checked: 0,
            head_start: 0,
            in_trailer: false,
            field: Field::Other,
            name_len: 0,
            maybe_content_length: false,
            maybe_transfer_encoding: false,
            blank: false,
            digits: 0,
            number: 0,
            request_line_tail: 0,
            http10: false,
            content_length: None,
            chunked: false,
            failed: None,
        }
    }

    /// Bytes checked so far: the stream offset of the next chunk's first
    /// byte (or of the violation, once there is one).
    pub fn checked(&self) -> u64 {
        self.checked
    }

    /// Whether the connection is between messages: nothing of a next
    /// message has come since the last one ended (or since it opened),
    /// empty lines aside, which RFC 9112 §2.2 lets a client send there.
    pub fn is_between_messages(&self) -> bool {
        self.state == State::HeadStart
    }

    /// Checks the next `chunk` of the connection's bytes.
    pub fn check(&mut self, chunk: &[u8]) -> Checked {
        if let Some(violation) = self.failed {
            return Checked {
                safe: 0,
                violation: Some(violation),
            };
        }
        let start = self.checked;
        let mut i = 0;
        while i < chunk.len() {
            let b = chunk[i];
            match self.state {
                State::HeadStart
                    if self.direction == Direction::Responses && self.messages >= self.requests =>
                {
                    return self.fail(Reason::Unsolicited, start, i);
                }
                State::HeadStart => match b {
                    b'\r' => self.state = State::HeadStartLf,
                    _ if REQUEST_LINE_BYTE[usize::from(b)] => {
                        self.state = State::StartLine;
                        continue;
                    }
                    _ => return self.fail(stray(b, Reason::BareCarriageReturn), start, i),
                },
                State::HeadStartLf | State::StartLineLf | State::ValueLf => {
                    if b != b'\n' {
                        return self.fail(Reason::BareCarriageReturn, start, i);
                    }
                    self.state = match self.state {
                        State::HeadStartLf => State::HeadStart,
                        _ => State::LineStart,
                    };
                }
                State::StartLine => {
                    // A reason phrase may hold HTAB; a request line may not.
                    let table = match self.direction {
                        Direction::Requests => &REQUEST_LINE_BYTE,
                        Direction::Responses => &FIELD_BYTE,
                    };
                    let n = text_span(&chunk[i..], table);
                    let line = &chunk[i..i + n];
                    let have = usize::from(self.start_line_len);
                    let take = (START_LINE_PREFIX - have).min(n);
                    self.start_line[have..have + take].copy_from_slice(&line[..take]);
                    self.start_line_len += take as u8;
                    for &b in &line[n.saturating_sub(8)..] {
                        self.request_line_tail = self.request_line_tail << 8 | u64::from(b);
                    }
                    i += n;
                    match chunk.get(i) {
                        None => break,
                        Some(b'\r') => {
                            if let Err(reason) = self.end_start_line() {
                                return self.fail(reason, start, i);
                            }
                            self.state = State::StartLineLf;
                        }
                        Some(&b) => {
                            return self.fail(stray(b, Reason::BareCarriageReturn), start, i);
                        }
                    }
                }
                State::LineStart => match b {
                    b'\r' => self.state = State::SectionEndLf,
                    b' ' | b'\t' => return self.fail(Reason::ObsFold, start, i),
                    _ => {
                        self.name_len = 0;
                        self.maybe_content_length = !self.in_trailer;
                        self.maybe_transfer_encoding = !self.in_trailer;
                        self.state = State::Name;
                        continue;
                    }
                },
                State::Name => {
                    let n = span(&chunk[i..], &TCHAR);
                    self.name_part(&chunk[i..i + n]);
                    i += n;
                    match chunk.get(i) {
                        None => break,
                        Some(b':') if self.name_len > 0 => {
                            let len = self.name_len;
                            self.field = if self.maybe_content_length && len == CONTENT_LENGTH.len()
                            {
                                Field::ContentLength
                            } else if self.maybe_transfer_encoding && len == TRANSFER_ENCODING.len()
                            {
                                Field::TransferEncoding
                            } else {
                                Field::Other
                            };
                            self.blank = false;
                            self.digits = 0;
                            self.number = 0;
                            self.state = State::Value;
                        }
                        Some(b'\r') => return self.fail(Reason::MissingColon, start, i),
                        Some(&b) => return self.fail(stray(b, Reason::BadFieldName), start, i),
                    }
                }
                State::Value => match self.field {
                    Field::Other => {
                        i += text_span(&chunk[i..], &FIELD_BYTE);
                        match chunk.get(i) {
                            None => break,
                            Some(b'\r') => self.state = State::ValueLf,
                            Some(&b) => {
                                return self.fail(stray(b, Reason::BareCarriageReturn), start, i);
                            }
                        }
                    }
                    Field::ContentLength => match b {
                        b'0'..=b'9' if self.digits < MAX_CONTENT_LENGTH_DIGITS => {
                            self.number = self.number * 10 + u64::from(b - b'0');
                            self.digits += 1;
                        }
                        b' ' | b'\t' if !self.blank && self.digits == 0 => self.blank = true,
                        b'\r' if self.digits > 0 => {
                            match self.content_length {
                                Some(earlier) if earlier != self.number => {
                                    return self.fail(Reason::DifferingContentLengths, start, i);
                                }
                                _ => self.content_length = Some(self.number),
                            }
                            self.state = State::ValueLf;
                        }
                        _ => return self.fail(stray(b, Reason::BadContentLength), start, i),
                    },
                    Field::TransferEncoding => match b {
                        b' ' | b'\t' if !self.blank && self.digits == 0 => self.blank = true,
                        b'\r' if usize::from(self.digits) == CHUNKED.len() && !self.chunked => {
                            self.chunked = true;
                            self.state = State::ValueLf;
                        }
                        _ if CHUNKED.get(usize::from(self.digits))
                            == Some(&b.to_ascii_lowercase()) =>
                        {
                            self.digits += 1;
                        }
                        _ => return self.fail(stray(b, Reason::BadTransferEncoding), start, i),
                    },
                },
                State::SectionEndLf => {
                    if b != b'\n' {
                        return self.fail(Reason::BareCarriageReturn, start, i);
                    }
                    if self.in_trailer {
                        self.next_message(start + i as u64 + 1);
                    } else if self.chunked && self.content_length.is_some() {
                        return self.fail(Reason::ContentLengthWithTransferEncoding, start, i);
                    } else if self.chunked && self.http10 {
                        return self.fail(Reason::TransferEncodingOnHttp10, start, i);
                    } else if self.direction == Direction::Responses && self.status == 101 {
                        return self.fail(Reason::UnrequestedSwitch, start, i);
                    } else if self.direction == Direction::Responses
                        && (100..200).contains(&self.status)
                    {
                        // Interim: the final response to the same request
                        // follows.
                        self.next_head(start + i as u64 + 1);
                    } else if self.direction == Direction::Responses && self.has_no_body() {
                        self.next_message(start + i as u64 + 1);
                    } else if self.chunked {
                        self.start_chunk();
                    } else {
                        match self.content_length {
                            Some(remaining) if remaining > 0 => {
                                self.state = State::Body { remaining };
                            }
                            None if self.direction == Direction::Responses => {
                                self.state = State::UntilClose;
                            }
                            _ => self.next_message(start + i as u64 + 1),
                        }
                    }
                }
                State::Body { remaining } | State::ChunkData { remaining } => {
                    let take = remaining.min((chunk.len() - i) as u64);
                    // `take` is at most what is left of the chunk.
                    i += take as usize;
                    let remaining = remaining - take;
                    match (self.state, remaining) {
                        (State::Body { .. }, 0) => self.next_message(start + i as u64),
                        (State::Body { .. }, _) => self.state = State::Body { remaining },
                        (_, 0) => self.state = State::ChunkDataCr,
                        (_, _) => self.state = State::ChunkData { remaining },
                    }
                    continue;
                }
                State::ChunkSize => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F'
                        if self.digits < MAX_CHUNK_SIZE_DIGITS =>
                    {
                        let digit = (b as char).to_digit(16).expect("a hex digit");
                        self.number = self.number << 4 | u64::from(digit);
                        self.digits += 1;
                    }
                    b';' if self.digits > 0 => self.state = State::ChunkExtension,
                    b' ' | b'\t' if self.digits > 0 => self.state = State::ChunkSizeBlank,
                    b'\r' if self.digits > 0 => self.state = State::ChunkLineLf,
                    _ => return self.fail(stray(b, Reason::BadChunkSize), start, i),
                },
                State::ChunkSizeBlank => match b {
                    b' ' | b'\t' => {}
                    b';' => self.state = State::ChunkExtension,
                    _ => return self.fail(stray(b, Reason::BadChunkSize), start, i),
                },
                State::ChunkExtension => {
                    i += text_span(&chunk[i..], &FIELD_BYTE);
                    match chunk.get(i) {
                        None => break,
                        Some(b'\r') => self.state = State::ChunkLineLf,
                        Some(&b) => {
                            return self.fail(stray(b, Reason::BadChunkExtension), start, i);
                        }
                    }
                }
                State::ChunkLineLf => {
                    if b != b'\n' {
                        return self.fail(Reason::BareCarriageReturn, start, i);
                    }
                    if self.number == 0 {
                        self.in_trailer = true;
                        self.state = State::LineStart;
                    } else {
                        self.state = State::ChunkData {
                            remaining: self.number,
                        };
                    }
                }
                State::ChunkDataCr => {
                    if b != b'\r' {
                        return self.fail(Reason::ChunkDataOverrun, start, i);
                    }
                    self.state = State::ChunkDataLf;
                }
                State::ChunkDataLf => {
                    if b != b'\n' {
                        return self.fail(Reason::BareCarriageReturn, start, i);
                    }
                    self.start_chunk();
                }
                State::UntilClose => break,
            }
            i += 1;
        }
        self.checked = start + chunk.len() as u64;
        Checked {
            safe: chunk.len(),
            violation: None,
        }
    }

    /// The next `part` of a field name (token characters).
    fn name_part(&mut self, part: &[u8]) {
        let at = self.name_len;
        let continues = |name: &[u8]| {
            name.get(at..at + part.len())
                .is_some_and(|expected| expected.eq_ignore_ascii_case(part))
        };
        // While a flag holds, `at` is at most the length of its name.
        self.maybe_content_length = self.maybe_content_length && continues(CONTENT_LENGTH);
        self.maybe_transfer_encoding = self.maybe_transfer_encoding && continues(TRANSFER_ENCODING);
        self.name_len = at.saturating_add(part.len());
    }

    fn start_chunk(&mut self) {
        self.digits = 0;
        self.number = 0;
        self.state = State::ChunkSize;
    }

    /// The start line ended: what the rest of the message depends on.
    fn end_start_line(&mut self) -> Result<(), Reason> {
        let line = &self.start_line[..usize::from(self.start_line_len)];
        match self.direction {
            Direction::Requests => {
                self.http10 = self.request_line_tail == HTTP_10;
                let bit = 1u64 << (self.messages % 64);
                if line.starts_with(b"HEAD ") {
                    self.head_requests |= bit;
                } else {
                    self.head_requests &= !bit;
                }
            }
            Direction::Responses => {
                let [
                    b'H',
                    b'T',
                    b'T',
                    b'P',
                    b'/',
                    b'1',
                    b'.',
                    minor,
                    b' ',
                    status @ ..,
                ] = line
                else {
                    return Err(Reason::BadStatusLine);
                };
                if !minor.is_ascii_digit() || !status.iter().all(u8::is_ascii_digit) {
                    return Err(Reason::BadStatusLine);
                }
                self.http10 = *minor == b'0';
                self.status = status.iter().fold(0, |n, d| n * 10 + u16::from(d - b'0'));
            }
        }
        self.start_lines += 1;
        Ok(())
    }

    /// A response that ends with its head (RFC 9112 §6.3): to HEAD, 204,
    /// 304.
    fn has_no_body(&self) -> bool {
        self.head_requests & 1 << (self.messages % 64) != 0
            || self.status == 204
            || self.status == 304
    }

    /// The message ended; the next one begins at stream offset `at`.
    fn next_message(&mut self, at: u64) {
        self.messages += 1;
        self.next_head(at);
    }

    /// A head (the next message's, or a final response after an interim
    /// one) begins at stream offset `at`.
    fn next_head(&mut self, at: u64) {
        self.state = State::HeadStart;
        self.start_line_len = 0;
        self.status = 0;
        self.head_start = at;
        self.in_trailer = false;
        self.request_line_tail = 0;
        self.http10 = false;
        self.content_length = None;
        self.chunked = false;
    }

    fn in_head(&self) -> bool {
        !self.in_trailer
            && matches!(
                self.state,
                State::HeadStart
                    | State::HeadStartLf
                    | State::StartLine
                    | State::StartLineLf
                    | State::LineStart
                    | State::Name
                    | State::Value
                    | State::ValueLf
                    | State::SectionEndLf
            )
    }

    /// Records that byte `i` of the chunk that began at stream offset
    /// `start` broke `reason`.
    fn fail(&mut self, reason: Reason, start: u64, i: usize) -> Checked {
        let at = start + i as u64;
        let (part, safe) = if self.in_head() {
            let before_head =
                usize::try_from(self.head_start.saturating_sub(start)).expect("within the chunk");
            (
                Part::Head {
                    start: self.head_start,
                },
                before_head,
            )
        } else {
            (Part::Body, i)
        };
        // Bytes after a response's end belong to it: it was longer than
        // its framing said.
        let message = match reason {
            Reason::Unsolicited => self.messages.saturating_sub(1),
            _ => self.messages,
        };
        let violation = Violation {
            reason,
            at,
            part,
            message,
        };
        self.checked = at;
        self.failed = Some(violation);
        Checked {
            safe,
            violation: Some(violation),
        }
    }
}

/// Follows the response framing of one HTTP/1.1 client connection: the
/// requests written on it (for which responses may come, and which were
/// HEAD) and the responses read. Sans-IO.
///
/// A response is held to the request rules above, and besides: its status
/// line must begin `HTTP/1.x NNN` (no control byte but HTAB after); 101 is
/// refused (no request of ours asks for an upgrade); 1xx is interim; a
/// response to HEAD, a 204 and a 304 end with their head, one with neither
/// `Content-Length` nor chunked with the connection. A byte read while no
/// request awaits its response (a body longer than its `Content-Length`,
/// a response nobody asked for) is [`Reason::Unsolicited`].
#[derive(Debug, Clone)]
pub struct ResponseFraming {
    requests: Framing,
    responses: Framing,
}

impl Default for ResponseFraming {
    fn default() -> Self {
        ResponseFraming::new()
    }
}

impl ResponseFraming {
    /// A connection's framing before its first byte either way.
    pub fn new() -> ResponseFraming {
        ResponseFraming {
            requests: Framing::new(),
            responses: Framing::with_direction(Direction::Responses),
        }
    }

    /// Notes `bytes` written to the connection (requests, ours). Were they
    /// malformed, no further request would count, and its response would be
    /// unsolicited: the connection fails rather than being misread.
    pub fn sent(&mut self, bytes: &[u8]) {
        self.requests.check(bytes);
        self.responses.requests = self.requests.start_lines;
        self.responses.head_requests = self.requests.head_requests;
    }

    /// Checks `bytes` read from the connection; the violation, if any, is
    /// repeated by every later call.
    pub fn received(&mut self, bytes: &[u8]) -> Option<Violation> {
        self.responses.check(bytes).violation
    }

    /// Requests whose request line was written: the last one's index is
    /// this less one.
    pub fn requests_sent(&self) -> u64 {
        self.requests.start_lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first violation in `bytes` fed at once, or `None`.
    fn violation(bytes: &[u8]) -> Option<Violation> {
        let checked = Framing::new().check(bytes);
        assert!(checked.safe <= bytes.len());
        checked.violation
    }

    fn reason(bytes: &[u8]) -> Option<Reason> {
        violation(bytes).map(|v| v.reason)
    }

    fn request(lines: &str, body: &str) -> Vec<u8> {
        format!("POST /page HTTP/1.1\r\nHost: example.com\r\n{lines}\r\n{body}").into_bytes()
    }

    const CHUNKS: &str = "5\r\nhello\r\n0\r\n\r\n";

    #[test]
    fn eight_bytes_at_a_time_stop_where_one_at_a_time_would() {
        for table in [&FIELD_BYTE, &REQUEST_LINE_BYTE] {
            for byte in 0..=255u8 {
                for at in 0..20 {
                    let mut bytes = vec![b'a'; 20];
                    bytes[at] = byte;
                    bytes.push(0xff);
                    assert_eq!(
                        text_span(&bytes, table),
                        span(&bytes, table),
                        "{byte} at {at}"
                    );
                }
            }
        }
    }

    #[test]
    fn well_formed_requests_pass_whole() {
        for bytes in [
            request("", ""),
            request("Content-Length: 5\r\n", "hello"),
            request("Content-Length:5\r\n", "hello"),
            request("content-length:\t5\r\n", "hello"),
            request("Content-Length: 5\r\nContent-Length: 5\r\n", "hello"),
            request("Content-Length: 0005\r\n", "hello"),
            request("Transfer-Encoding: chunked\r\n", CHUNKS),
            request("TRANSFER-ENCODING: Chunked\r\n", CHUNKS),
            request(
                "Transfer-Encoding: chunked\r\n",
                "5;name=value ; q=\"a b\"\r\nhello\r\nA  ;x\r\n0123456789\r\n0\r\nTrailer: t\r\n\r\n",
            ),
            request("X-Blanks:  a  b\t \r\nX-Empty:\r\nX-Obs: caf\u{e9}\r\n", ""),
            b"\r\n\r\nGET / HTTP/1.0\r\n\r\n".to_vec(),
        ] {
            let checked = Framing::new().check(&bytes);
            assert_eq!(
                checked.violation,
                None,
                "{}",
                String::from_utf8_lossy(&bytes)
            );
            assert_eq!(checked.safe, bytes.len());
        }
    }

    #[test]
    fn p1_content_length_with_transfer_encoding_in_either_order() {
        for lines in [
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
        ] {
            assert_eq!(
                reason(&request(lines, CHUNKS)),
                Some(Reason::ContentLengthWithTransferEncoding)
            );
        }
    }

    #[test]
    fn p2_content_lengths_that_differ_or_come_as_a_list() {
        let cases = [
            (
                "Content-Length: 5\r\nContent-Length: 6\r\n",
                Reason::DifferingContentLengths,
            ),
            ("Content-Length: 5, 6\r\n", Reason::BadContentLength),
            ("Content-Length: 5, 5\r\n", Reason::BadContentLength),
        ];
        for (lines, expected) in cases {
            assert_eq!(
                reason(&request(lines, "hello!")),
                Some(expected),
                "{lines:?}"
            );
        }
        // The same number twice is one length, as hyper takes it.
        let same = request("Content-Length: 5\r\nContent-Length: 05\r\n", "hello");
        assert_eq!(reason(&same), None);
    }

    #[test]
    fn p3_content_length_values_other_than_digits() {
        for value in [
            "+5",
            "0x5",
            " 5 ",
            "5 ",
            "  5",
            "-1",
            "5a",
            "",
            " ",
            "100000000000000000000",
            "00000000000000000005",
        ] {
            assert_eq!(
                reason(&request(&format!("Content-Length:{value}\r\n"), "hello")),
                Some(Reason::BadContentLength),
                "{value:?}"
            );
        }
        assert_eq!(
            reason(&request("Content-Length: 9999999999999999999\r\n", "")),
            None,
            "19 digits fit"
        );
    }

    #[test]
    fn p4_transfer_encodings_other_than_exactly_chunked() {
        for lines in [
            "Transfer-Encoding: chunked, chunked\r\n",
            "Transfer-Encoding: gzip, chunked\r\n",
            "Transfer-Encoding: xchunked\r\n",
            "Transfer-Encoding: chunked\t\r\n",
            "Transfer-Encoding: chunke\r\n",
            "Transfer-Encoding:  chunked\r\n",
            "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        ] {
            assert_eq!(
                reason(&request(lines, CHUNKS)),
                Some(Reason::BadTransferEncoding),
                "{lines:?}"
            );
        }
        assert_eq!(
            reason(&request("Transfer-Encoding : chunked\r\n", CHUNKS)),
            Some(Reason::BadFieldName)
        );
        let http10 = format!("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n{CHUNKS}");
        assert_eq!(
            reason(http10.as_bytes()),
            Some(Reason::TransferEncodingOnHttp10)
        );
    }

    #[test]
    fn p5_chunk_sizes_extensions_and_data_are_strict() {
        let cases = [
            (
                "10000000000000005\r\nhello\r\n0\r\n\r\n",
                Reason::BadChunkSize,
            ),
            (
                "00000000000000005\r\nhello\r\n0\r\n\r\n",
                Reason::BadChunkSize,
            ),
            ("+5\r\nhello\r\n0\r\n\r\n", Reason::BadChunkSize),
            ("0x5\r\nhello\r\n0\r\n\r\n", Reason::BadChunkSize),
            ("5 \r\nhello\r\n0\r\n\r\n", Reason::BadChunkSize),
            ("\r\nhello\r\n0\r\n\r\n", Reason::BadChunkSize),
            ("5\r\nhelloEXTRA\r\n0\r\n\r\n", Reason::ChunkDataOverrun),
            ("5\nhello\r\n0\r\n\r\n", Reason::BareLineFeed),
            ("5\r\nhello\n0\r\n\r\n", Reason::ChunkDataOverrun),
            ("5\r\nhello\r0\r\n\r\n", Reason::BareCarriageReturn),
            ("5;a=b\rc\r\nhello\r\n0\r\n\r\n", Reason::BareCarriageReturn),
            ("5;a=b\nc\r\nhello\r\n0\r\n\r\n", Reason::BareLineFeed),
            ("5;a=\0\r\nhello\r\n0\r\n\r\n", Reason::ControlByte(0)),
            (
                "5\r\nhello\r\n0\r\nX: a\nY: b\r\n\r\n",
                Reason::BareLineFeed,
            ),
            ("5\r\nhello\r\n0\r\n folded\r\n\r\n", Reason::ObsFold),
        ];
        for (body, expected) in cases {
            let bytes = request("Transfer-Encoding: chunked\r\n", body);
            let head_len = bytes.len() - body.len();
            let v = violation(&bytes).unwrap_or_else(|| panic!("{body:?} passed"));
            assert_eq!(v.reason, expected, "{body:?}");
            assert_eq!(v.part, Part::Body, "{body:?}");
            // The head and the body before the bad byte go on.
            let checked = Framing::new().check(&bytes);
            assert!(checked.safe >= head_len, "{body:?}");
            assert_eq!(checked.safe as u64, v.at);
        }
    }

    #[test]
    fn p6_obs_fold_in_a_head() {
        assert_eq!(
            reason(&request("X-Folded: a\r\n  b\r\n", "")),
            Some(Reason::ObsFold)
        );
    }

    #[test]
    fn p7_bare_line_ends_control_bytes_and_bad_names() {
        let cases = [
            ("X-Bad: a\nInjected: b\r\n", Reason::BareLineFeed),
            ("X-Bad: a\rb\r\n", Reason::BareCarriageReturn),
            ("X-Bad: a\0b\r\n", Reason::ControlByte(0)),
            ("X-Bad: a\x7fb\r\n", Reason::ControlByte(0x7f)),
            ("X Bad: a\r\n", Reason::BadFieldName),
            ("X-Bad\r\n", Reason::MissingColon),
            (": a\r\n", Reason::BadFieldName),
            ("X-Bad: a\r\n\n", Reason::BareLineFeed),
            ("X-Bad: a\r\n\rx", Reason::BareCarriageReturn),
        ];
        for (lines, expected) in cases {
            assert_eq!(reason(&request(lines, "")), Some(expected), "{lines:?}");
        }
        for head in [
            &b"GET / HTTP/1.1\nHost: a\r\n\r\n"[..],
            b"GET /\0 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\r\n\r\n",
            b"\nGET / HTTP/1.1\r\n\r\n",
            b"\r\rGET / HTTP/1.1\r\n\r\n",
        ] {
            let v = violation(head).expect("refused");
            assert_eq!(v.part, Part::Head { start: 0 });
        }
    }

    #[test]
    fn only_the_bytes_before_a_refused_head_go_on() {
        let good = request("Content-Length: 5\r\n", "hello");
        let bad = request(
            "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            CHUNKS,
        );
        let stream = [good.clone(), good.clone(), bad].concat();
        let checked = Framing::new().check(&stream);
        assert_eq!(checked.safe, 2 * good.len());
        let v = checked.violation.expect("refused");
        assert_eq!(
            v.part,
            Part::Head {
                start: 2 * good.len() as u64
            }
        );

        // The bad head split over two chunks: its first part went on with
        // the first, nothing of the second does.
        let mut framing = Framing::new();
        let split = 2 * good.len() + 10;
        assert_eq!(framing.check(&stream[..split]).safe, split);
        let second = framing.check(&stream[split..]);
        assert_eq!(second.safe, 0);
        assert_eq!(second.violation, Some(v));
        assert_eq!(framing.check(b"GET / HTTP/1.1\r\n\r\n").safe, 0, "sticky");
        assert_eq!(framing.checked(), v.at);
    }

    #[test]
    fn byte_at_a_time_finds_the_same() {
        let stream = [
            request("Transfer-Encoding: chunked\r\n", CHUNKS),
            request("Content-Length: 3\r\n", "abc"),
            request("X: a\nY: b\r\n", ""),
        ]
        .concat();
        let whole = violation(&stream).expect("refused");
        let mut framing = Framing::new();
        let mut passed = 0;
        for byte in stream.chunks(1) {
            let checked = framing.check(byte);
            passed += checked.safe;
            if let Some(v) = checked.violation {
                assert_eq!(v, whole);
                let Part::Head { start } = v.part else {
                    panic!("{v:?}")
                };
                assert!(passed as u64 <= v.at && start <= v.at);
                return;
            }
        }
        panic!("not found byte by byte");
    }

    /// Requests `sent`, then `received` whole: the violation, if any.
    fn response_violation(sent: &[&str], received: &[u8]) -> Option<Violation> {
        let mut framing = ResponseFraming::new();
        for request in sent {
            framing.sent(request.as_bytes());
        }
        framing.received(received)
    }

    const GET: &str = "GET /a HTTP/1.1\r\nHost: a\r\n\r\n";

    #[test]
    fn well_formed_responses_pass_whole_and_split_anywhere() {
        let head = "HEAD /a HTTP/1.1\r\nHost: a\r\n\r\n";
        let post = "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let exchanges: [(&[&str], &str); 7] = [
            (&[GET], "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
            (
                &[GET],
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nT: t\r\n\r\n",
            ),
            (&[head], "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"),
            (
                &[GET],
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
            ),
            (
                &[post],
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
            ),
            (
                &[GET],
                "HTTP/1.0 200 \tfine\u{ff}\r\n\r\nuntil the end, HTTP/1.1 200 OK\r\n\r\n",
            ),
            (
                &[GET, head],
                "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxHTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n",
            ),
        ];
        for (sent, received) in exchanges {
            // The test strings are Latin-1 where they go past ASCII.
            let received: Vec<u8> = received.chars().map(|c| c as u8).collect();
            assert_eq!(response_violation(sent, &received), None, "{received:?}");
            let mut framing = ResponseFraming::new();
            sent.iter().for_each(|r| framing.sent(r.as_bytes()));
            for byte in received.chunks(1) {
                assert_eq!(framing.received(byte), None, "{received:?} byte by byte");
            }
        }
    }

    #[test]
    fn p5_a_zero_padded_17_digit_response_chunk_size_is_refused() {
        let response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n00000000000000005\r\nhello\r\n0\r\n\r\n";
        let v = response_violation(&[GET], response).expect("refused");
        assert_eq!((v.reason, v.part), (Reason::BadChunkSize, Part::Body));
    }

    #[test]
    fn p17_bytes_past_a_response_are_unsolicited_and_belong_to_it() {
        let long = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\n\r\n";
        let v = response_violation(&[GET], long).expect("refused");
        assert_eq!((v.reason, v.message, v.at), (Reason::Unsolicited, 0, 43));
        // The same bytes arriving after the next request was written are
        // that request's response.
        assert_eq!(response_violation(&[GET, GET], long), None);
        // Nothing asked, nothing may come.
        let v = response_violation(&[], b"\r\n").expect("refused");
        assert_eq!((v.reason, v.message), (Reason::Unsolicited, 0));
        // Our own requests split anywhere still count once each.
        let mut framing = ResponseFraming::new();
        for byte in [GET, GET].concat().as_bytes().chunks(1) {
            framing.sent(byte);
        }
        assert_eq!(framing.requests_sent(), 2);
    }

    #[test]
    fn response_heads_are_held_to_the_request_rules_and_a_status_line() {
        let cases: [(&[u8], Reason); 7] = [
            (b"HTTP/1.1 200 O\x01K\r\n\r\n", Reason::ControlByte(1)),
            (
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
                Reason::UnrequestedSwitch,
            ),
            (b"HTTP/2 200 OK\r\n\r\n", Reason::BadStatusLine),
            (b"HTTP/1.1 20 OK\r\n\r\n", Reason::BadStatusLine),
            (b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", Reason::ObsFold),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                Reason::ContentLengthWithTransferEncoding,
            ),
            (
                b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                Reason::TransferEncodingOnHttp10,
            ),
        ];
        for (response, expected) in cases {
            let v = response_violation(&[GET], response).expect("refused");
            assert_eq!(
                v.reason,
                expected,
                "{:?}",
                String::from_utf8_lossy(response)
            );
        }
    }
}

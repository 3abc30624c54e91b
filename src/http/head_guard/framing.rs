//! [`Framing`]: the framing of one direction of an HTTP/1.1 connection,
//! followed over its raw bytes as they are read. Each head is checked byte
//! by byte against the rules in [the module doc](super); each body is
//! skipped by its own framing (`Content-Length` bytes, or strict chunks
//! and trailers) to the next head, so pipelined messages are checked too.
//! Sans-IO: it keeps no bytes and allocates nothing.
//!
//! As requests (the server side, before hyper) it notes which were HEAD and
//! which HTTP/1.0; as responses (inside [`super::ResponseFraming`]) it reads
//! the status line, and knows which responses end with their head or with
//! the connection.
//!
//! It leaves out the byte classes and the fast scan over them
//! (`byte_class`), the verdict types ([`super::Violation`] and friends),
//! and pairing requests written with responses read (`response`).

use super::byte_class::{FIELD_BYTE, REQUEST_LINE_BYTE, TCHAR, span, stray, text_span};
use super::{Checked, Part, Reason, Violation};

/// Follows the request framing of one HTTP/1.1 connection over its raw
/// bytes, as they are read. Sans-IO.
#[derive(Debug, Clone)]
pub struct Framing {
    /// Requests, or the responses to them (see
    /// [`ResponseFraming`](super::ResponseFraming)).
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
    /// Stream offset of the current body's first byte (the byte after its
    /// head), while one is under way.
    body_start: u64,
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
    /// As requests: the current one is a CONNECT, after whose head the
    /// connection is a tunnel (or is closed, when refused).
    connect: bool,
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
    /// A response body without a length, or what follows a CONNECT
    /// request's head (a tunnel's bytes, not HTTP): it ends with the
    /// connection.
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

    /// The framing of the responses to the requests another [`Framing`]
    /// follows; fed their count and HEAD marks by [`Framing::answer`].
    pub(super) fn responses() -> Framing {
        Framing::with_direction(Direction::Responses)
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
            body_start: 0,
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
            connect: false,
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

    /// Which message of the connection the next byte belongs to (0 for
    /// the first): the messages that ended so far.
    pub fn message(&self) -> u64 {
        self.messages
    }

    /// Bytes of the current message's body checked so far, its chunk
    /// framing and trailer included; `None` when no body is under way (in
    /// a head, between messages, or in a tunnel's bytes after a CONNECT,
    /// which are not a body).
    pub fn body_received(&self) -> Option<u64> {
        let in_body = self.in_trailer
            || matches!(
                self.state,
                State::Body { .. }
                    | State::ChunkSize
                    | State::ChunkSizeBlank
                    | State::ChunkExtension
                    | State::ChunkLineLf
                    | State::ChunkData { .. }
                    | State::ChunkDataCr
                    | State::ChunkDataLf
            );
        in_body.then(|| self.checked - self.body_start)
    }

    /// Start lines that ended: as requests, the requests written so far.
    pub(super) fn start_lines(&self) -> u64 {
        self.start_lines
    }

    /// As responses: takes from `requests` (the other direction) how many
    /// requests were written, for which responses may come, and which of
    /// them were HEAD.
    pub(super) fn answer(&mut self, requests: &Framing) {
        self.requests = requests.start_lines;
        self.head_requests = requests.head_requests;
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
                    } else if self.connect {
                        // RFC 9112 §3.2.3: a tunnel's bytes follow, which
                        // the role relays or refuses by closing.
                        self.messages += 1;
                        self.state = State::UntilClose;
                    } else if self.chunked {
                        self.body_start = start + i as u64 + 1;
                        self.start_chunk();
                    } else {
                        match self.content_length {
                            Some(remaining) if remaining > 0 => {
                                self.body_start = start + i as u64 + 1;
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
                self.connect = line.starts_with(b"CONNECT ");
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
        self.connect = false;
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
    fn a_body_counts_its_bytes_from_the_end_of_its_head_to_its_end() {
        let head = request("Content-Length: 10\r\n", "");
        let mut framing = Framing::new();
        framing.check(&head[..head.len() - 1]);
        assert_eq!(framing.body_received(), None, "still in the head");
        framing.check(&head[head.len() - 1..]);
        assert_eq!(framing.body_received(), Some(0));
        framing.check(b"hel");
        framing.check(b"lo wo");
        assert_eq!(framing.body_received(), Some(8));
        assert_eq!(framing.message(), 0);
        // Its last bytes and the next head in one read: that head's.
        framing.check(b"rlGET / HTTP/1.1\r\n");
        assert_eq!(framing.body_received(), None);
        assert_eq!(framing.message(), 1);

        // Chunked: the chunk lines and the trailer count, up to the end.
        let mut framing = Framing::new();
        framing.check(&request("Transfer-Encoding: chunked\r\n", "5\r\nhel"));
        assert_eq!(framing.body_received(), Some(6));
        framing.check(b"lo\r\n0\r\nX-T: t\r\n");
        assert_eq!(framing.body_received(), Some(21));
        framing.check(b"\r\n");
        assert_eq!(framing.body_received(), None);
        assert!(framing.is_between_messages());

        // No body at all, and a tunnel's bytes, are not a body.
        let mut framing = Framing::new();
        framing.check(&request("", ""));
        assert_eq!(framing.body_received(), None);
        framing.check(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nxyz");
        assert_eq!(framing.body_received(), None);
    }

    #[test]
    fn what_follows_a_connect_head_is_a_tunnel_not_a_request() {
        let mut tunnel =
            b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n".to_vec();
        tunnel.extend_from_slice(b"\x16\x03\x01\x02\x00\x01\r\x00 no request line");
        assert_eq!(reason(&tunnel), None);
        let mut framing = Framing::new();
        assert!(framing.check(&tunnel).violation.is_none());
        assert!(!framing.is_between_messages());
        // The same bytes after any other head are a broken next request.
        let mut get = b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n".to_vec();
        get.extend_from_slice(b"\x16\x03\x01\x02\x00\x01\r\x00 no request line");
        assert!(reason(&get).is_some());
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
}

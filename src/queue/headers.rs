//! Parsing and formatting of the queueing headers of both dialects, and of
//! the QUEUE callback line. Pure and total: any bytes give a value or a
//! [`HeaderError`], never a panic, and every input is checked against a
//! named length limit before it is looked at.
//!
//! - `X-Queue: 1.0` (PARQ 1.0.a §4): the version a side speaks. "Any
//!   X-Queue header not starting with "digit.digit" must belong to the
//!   legacy implementation" (§7), so [`parse_x_queue`] returns either a
//!   [`QueueVersion`] or a legacy [`LegacyStatus`].
//! - `X-Queued: position=1503; length=1840; ETA=4200; lifetime=3600;
//!   ID=6a07…` (PARQ §4): "a list of var=value settings, each separated by
//!   ';'. The spaces after each ';' are optional. Variables are
//!   case-insensitive". [`QueuedStatus`] holds every field as optional: a
//!   client's request carries only `position` and `ID`.
//! - `X-Queue: position=2,length=5,limit=4,pollMin=45,pollMax=120` (Active
//!   Queueing 0.1): "Every part is optional, and if desired it can be broken
//!   into multiple headers" ([`LegacyStatus::merge`]).
//! - `X-Node: 13.4.5.6:4567` ([`parse_x_node`]).
//! - `QUEUE <ID> <IP>:<port>\r\n` ([`format_queue_callback`],
//!   [`parse_queue_callback`]).
//!
//! Unknown variables are skipped (a later revision may add some); a
//! variable given twice is an error, since the two values cannot both be
//! believed. Deliberately left out: `HeaderMap` handling (the caller picks
//! the header values) and what to do with an error (the accelerator treats
//! an unparsable `X-Queue` as absent, i.e. passive queueing).

use std::net::SocketAddr;

use thiserror::Error;

use super::id::{QueueId, QueueIdError};

/// Longest `X-Queue` value accepted, in bytes.
pub const MAX_X_QUEUE_LEN: usize = 256;
/// Longest `X-Queued` value accepted, in bytes.
pub const MAX_X_QUEUED_LEN: usize = 512;
/// Longest `X-Node` value accepted, in bytes (a bracketed IPv6 with a scope
/// and a port fits).
pub const MAX_X_NODE_LEN: usize = 64;
/// Longest QUEUE callback line accepted, CRLF included, in bytes.
pub const MAX_CALLBACK_LINE_LEN: usize = 128;
/// Most `var=value` fields (empty ones included) in one header value.
pub const MAX_FIELDS: usize = 16;
/// Most digits in a number; 10 digits covers every `u32`.
const MAX_NUMBER_DIGITS: usize = 10;
/// Most digits in each half of a `digit.digit` version.
const MAX_VERSION_DIGITS: usize = 3;

/// Why a queueing header value (or callback line) was not understood.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HeaderError {
    /// The value is longer than its limit.
    #[error("value is {len} bytes, longer than {max}")]
    TooLong {
        /// Length of the value.
        len: usize,
        /// The limit it exceeded.
        max: usize,
    },
    /// The value is empty or only whitespace.
    #[error("value is empty")]
    Empty,
    /// A byte that no header value of ours may hold (control, non-ASCII).
    #[error("byte {byte:#04x} at offset {offset} is not allowed")]
    InvalidByte {
        /// The byte.
        byte: u8,
        /// Its offset in the value.
        offset: usize,
    },
    /// More than [`MAX_FIELDS`] fields.
    #[error("more than {max} fields")]
    TooManyFields {
        /// The limit.
        max: usize,
    },
    /// A field without `=`.
    #[error("field {index} has no '='")]
    MissingEquals {
        /// Zero-based index of the field.
        index: usize,
    },
    /// A known variable given twice.
    #[error("variable {name} appears twice")]
    DuplicateField {
        /// The variable.
        name: &'static str,
    },
    /// A variable whose value is not a decimal number below 2^32.
    #[error("variable {name} is not a decimal number below 2^32")]
    BadNumber {
        /// The variable.
        name: &'static str,
    },
    /// A queue ID that is not 32 hexadecimal digits.
    #[error("queue ID is not 32 hexadecimal digits")]
    BadId,
    /// A version that is not `digit.digit`, or a legacy list where a version
    /// was required.
    #[error("not a digit.digit version")]
    BadVersion,
    /// An address that is not `IP:port` with a non-zero port.
    #[error("not an IP:port address")]
    BadNode,
    /// A callback line that is not `QUEUE <ID> <IP>:<port>\r\n`.
    #[error("not a QUEUE callback line")]
    BadCallback,
}

impl From<QueueIdError> for HeaderError {
    fn from(_: QueueIdError) -> Self {
        HeaderError::BadId
    }
}

/// A queueing protocol version, as in `X-Queue: 1.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct QueueVersion {
    /// Major number: 0 is Active Queueing, 1 and above PARQ.
    pub major: u16,
    /// Minor number.
    pub minor: u16,
}

impl QueueVersion {
    /// PARQ 1.0, the version this server replies with (§4: "it will always
    /// downgrade its reply to match that of the client"; we have nothing
    /// newer to downgrade from).
    pub const PARQ_1_0: QueueVersion = QueueVersion { major: 1, minor: 0 };
    /// Active Queueing 0.1.
    pub const ACTIVE_0_1: QueueVersion = QueueVersion { major: 0, minor: 1 };

    /// Whether this version means PARQ (major 1 or more) rather than legacy
    /// Active Queueing.
    pub fn is_parq(self) -> bool {
        self.major >= 1
    }
}

/// What an `X-Queue` value says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XQueue {
    /// `digit.digit`: the version the sender speaks.
    Version(QueueVersion),
    /// A legacy Active Queueing status (only ever in a response).
    Legacy(LegacyStatus),
}

/// The variables of a PARQ `X-Queued` value, each optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueuedStatus {
    /// `position`: the queue position, 1 is next.
    pub position: Option<u32>,
    /// `length`: entries in the queue.
    pub length: Option<u32>,
    /// `ETA`: seconds until an upload slot, estimated.
    pub eta: Option<u32>,
    /// `lifetime`: seconds the place is held without a new request.
    pub lifetime: Option<u32>,
    /// `ID`: the queue ID.
    pub id: Option<QueueId>,
}

/// The variables of a legacy Active Queueing `X-Queue` value, each
/// optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LegacyStatus {
    /// `position`: the queue position, 1 is next.
    pub position: Option<u32>,
    /// `length`: entries in the queue.
    pub length: Option<u32>,
    /// `limit`: concurrent uploads allowed.
    pub limit: Option<u32>,
    /// `pollMin`: seconds; polling sooner is flooding.
    pub poll_min: Option<u32>,
    /// `pollMax`: seconds; not polling within it drops the place.
    pub poll_max: Option<u32>,
}

impl LegacyStatus {
    /// Combines the fields of two headers of one response ("it can be
    /// broken into multiple headers"); `self` wins where both have a field.
    pub fn merge(self, other: LegacyStatus) -> LegacyStatus {
        LegacyStatus {
            position: self.position.or(other.position),
            length: self.length.or(other.length),
            limit: self.limit.or(other.limit),
            poll_min: self.poll_min.or(other.poll_min),
            poll_max: self.poll_max.or(other.poll_max),
        }
    }
}

/// Checks length and bytes, and trims surrounding whitespace.
fn checked(value: &[u8], max: usize) -> Result<&[u8], HeaderError> {
    if value.len() > max {
        return Err(HeaderError::TooLong {
            len: value.len(),
            max,
        });
    }
    if let Some(offset) = value
        .iter()
        .position(|&b| !(b == b'\t' || (b' '..=b'~').contains(&b)))
    {
        return Err(HeaderError::InvalidByte {
            byte: value[offset],
            offset,
        });
    }
    let trimmed = value.trim_ascii();
    if trimmed.is_empty() {
        return Err(HeaderError::Empty);
    }
    Ok(trimmed)
}

fn parse_number(text: &[u8], name: &'static str) -> Result<u32, HeaderError> {
    if text.is_empty() || text.len() > MAX_NUMBER_DIGITS || !text.iter().all(u8::is_ascii_digit) {
        return Err(HeaderError::BadNumber { name });
    }
    let value = text
        .iter()
        .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0'));
    u32::try_from(value).map_err(|_| HeaderError::BadNumber { name })
}

/// Splits `value` at `separator` into trimmed `(name, value)` pairs, empty
/// fields skipped, and calls `field` on each.
fn for_each_field(
    value: &[u8],
    separator: u8,
    mut field: impl FnMut(&[u8], &[u8]) -> Result<(), HeaderError>,
) -> Result<(), HeaderError> {
    for (index, part) in value.split(|&b| b == separator).enumerate() {
        if index >= MAX_FIELDS {
            return Err(HeaderError::TooManyFields { max: MAX_FIELDS });
        }
        let part = part.trim_ascii();
        if part.is_empty() {
            continue;
        }
        let eq = part
            .iter()
            .position(|&b| b == b'=')
            .ok_or(HeaderError::MissingEquals { index })?;
        field(part[..eq].trim_ascii(), part[eq + 1..].trim_ascii())?;
    }
    Ok(())
}

fn set_once<T>(slot: &mut Option<T>, value: T, name: &'static str) -> Result<(), HeaderError> {
    if slot.is_some() {
        return Err(HeaderError::DuplicateField { name });
    }
    *slot = Some(value);
    Ok(())
}

fn parse_version(text: &[u8]) -> Option<QueueVersion> {
    let dot = text.iter().position(|&b| b == b'.')?;
    let (major, minor) = (&text[..dot], &text[dot + 1..]);
    let is_part = |p: &[u8]| {
        !p.is_empty() && p.len() <= MAX_VERSION_DIGITS && p.iter().all(u8::is_ascii_digit)
    };
    if !is_part(major) || !is_part(minor) {
        return None;
    }
    let number = |p: &[u8]| {
        p.iter()
            .fold(0u16, |acc, &d| acc * 10 + u16::from(d - b'0'))
    };
    Some(QueueVersion {
        major: number(major),
        minor: number(minor),
    })
}

/// Parses an `X-Queue` value: a `digit.digit` version, or else a legacy
/// Active Queueing status list.
///
/// # Errors
/// A [`HeaderError`] if the value is too long, holds a bad byte, starts
/// with a digit but is not a version ([`HeaderError::BadVersion`]), or is a
/// malformed legacy list.
pub fn parse_x_queue(value: &[u8]) -> Result<XQueue, HeaderError> {
    let value = checked(value, MAX_X_QUEUE_LEN)?;
    if value[0].is_ascii_digit() {
        return parse_version(value)
            .map(XQueue::Version)
            .ok_or(HeaderError::BadVersion);
    }
    parse_legacy(value).map(XQueue::Legacy)
}

/// Parses an `X-Queue` value of a request, which must be a version.
///
/// # Errors
/// As [`parse_x_queue`], and [`HeaderError::BadVersion`] for a legacy list.
pub fn parse_offer(value: &[u8]) -> Result<QueueVersion, HeaderError> {
    match parse_x_queue(value)? {
        XQueue::Version(version) => Ok(version),
        XQueue::Legacy(_) => Err(HeaderError::BadVersion),
    }
}

fn parse_legacy(value: &[u8]) -> Result<LegacyStatus, HeaderError> {
    let mut status = LegacyStatus::default();
    for_each_field(value, b',', |name, text| {
        let (slot, name) = if name.eq_ignore_ascii_case(b"position") {
            (&mut status.position, "position")
        } else if name.eq_ignore_ascii_case(b"length") {
            (&mut status.length, "length")
        } else if name.eq_ignore_ascii_case(b"limit") {
            (&mut status.limit, "limit")
        } else if name.eq_ignore_ascii_case(b"pollMin") {
            (&mut status.poll_min, "pollMin")
        } else if name.eq_ignore_ascii_case(b"pollMax") {
            (&mut status.poll_max, "pollMax")
        } else {
            return Ok(());
        };
        set_once(slot, parse_number(text, name)?, name)
    })?;
    Ok(status)
}

/// Parses a PARQ `X-Queued` value (request or response).
///
/// # Errors
/// A [`HeaderError`] if the value is too long, holds a bad byte, has too
/// many fields, a field without `=`, a known variable twice, a bad number
/// or a bad ID.
pub fn parse_x_queued(value: &[u8]) -> Result<QueuedStatus, HeaderError> {
    let value = checked(value, MAX_X_QUEUED_LEN)?;
    let mut status = QueuedStatus::default();
    for_each_field(value, b';', |name, text| {
        if name.eq_ignore_ascii_case(b"ID") {
            return set_once(&mut status.id, QueueId::parse_hex(text)?, "ID");
        }
        let (slot, name) = if name.eq_ignore_ascii_case(b"position") {
            (&mut status.position, "position")
        } else if name.eq_ignore_ascii_case(b"length") {
            (&mut status.length, "length")
        } else if name.eq_ignore_ascii_case(b"ETA") {
            (&mut status.eta, "ETA")
        } else if name.eq_ignore_ascii_case(b"lifetime") {
            (&mut status.lifetime, "lifetime")
        } else {
            return Ok(());
        };
        set_once(slot, parse_number(text, name)?, name)
    })?;
    Ok(status)
}

/// Formats a PARQ `X-Queued` value with the fields present, in the seed's
/// order (`position; length; ETA; lifetime; ID`).
pub fn format_x_queued(status: &QueuedStatus) -> String {
    let mut parts = Vec::with_capacity(5);
    let numbers = [
        ("position", status.position),
        ("length", status.length),
        ("ETA", status.eta),
        ("lifetime", status.lifetime),
    ];
    for (name, value) in numbers {
        if let Some(value) = value {
            parts.push(format!("{name}={value}"));
        }
    }
    if let Some(id) = status.id {
        parts.push(format!("ID={id}"));
    }
    parts.join("; ")
}

/// Formats a legacy `X-Queue` status value with the fields present, e.g.
/// `position=2,length=5,limit=4,pollMin=45,pollMax=120`.
pub fn format_legacy(status: &LegacyStatus) -> String {
    let fields = [
        ("position", status.position),
        ("length", status.length),
        ("limit", status.limit),
        ("pollMin", status.poll_min),
        ("pollMax", status.poll_max),
    ];
    fields
        .iter()
        .filter_map(|(name, value)| value.map(|v| format!("{name}={v}")))
        .collect::<Vec<_>>()
        .join(",")
}

/// Formats a version for an `X-Queue` header, e.g. `1.0`.
pub fn format_version(version: QueueVersion) -> String {
    format!("{}.{}", version.major, version.minor)
}

fn parse_socket_addr(text: &[u8]) -> Result<SocketAddr, HeaderError> {
    let text = std::str::from_utf8(text).map_err(|_| HeaderError::BadNode)?;
    let addr: SocketAddr = text.parse().map_err(|_| HeaderError::BadNode)?;
    if addr.port() == 0 {
        return Err(HeaderError::BadNode);
    }
    Ok(addr)
}

/// Parses an `X-Node` value, `IP:port` (IPv6 in brackets).
///
/// # Errors
/// A [`HeaderError`] if the value is too long, holds a bad byte, or is not
/// an address with a non-zero port ([`HeaderError::BadNode`]).
pub fn parse_x_node(value: &[u8]) -> Result<SocketAddr, HeaderError> {
    parse_socket_addr(checked(value, MAX_X_NODE_LEN)?)
}

/// The QUEUE callback line (PARQ §4): `QUEUE <ID> <IP>:<port>\r\n`, where
/// the address is the server's own, so a client can reach it again after
/// the server's address changed.
pub fn format_queue_callback(id: QueueId, server: SocketAddr) -> String {
    format!("QUEUE {id} {server}\r\n")
}

/// Parses a QUEUE callback line, with or without its trailing CRLF.
///
/// # Errors
/// [`HeaderError::TooLong`] past [`MAX_CALLBACK_LINE_LEN`], else
/// [`HeaderError::BadCallback`], [`HeaderError::BadId`] or
/// [`HeaderError::BadNode`] for a line of another shape.
pub fn parse_queue_callback(line: &[u8]) -> Result<(QueueId, SocketAddr), HeaderError> {
    if line.len() > MAX_CALLBACK_LINE_LEN {
        return Err(HeaderError::TooLong {
            len: line.len(),
            max: MAX_CALLBACK_LINE_LEN,
        });
    }
    let line = line.strip_suffix(b"\r\n").unwrap_or(line);
    let rest = line
        .strip_prefix(b"QUEUE ")
        .ok_or(HeaderError::BadCallback)?;
    let mut parts = rest.split(|&b| b == b' ');
    let (Some(id), Some(addr), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(HeaderError::BadCallback);
    };
    Ok((QueueId::parse_hex(id)?, parse_socket_addr(addr)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ID_TEXT: &str = "6a074979f3201edbf323b6425fef4a53";

    fn id() -> QueueId {
        QueueId::parse_hex(ID_TEXT.as_bytes()).expect("valid ID")
    }

    #[test]
    fn x_queue_version_and_legacy_forms() {
        assert_eq!(
            parse_x_queue(b"1.0"),
            Ok(XQueue::Version(QueueVersion::PARQ_1_0))
        );
        assert_eq!(
            parse_x_queue(b" 0.1 "),
            Ok(XQueue::Version(QueueVersion::ACTIVE_0_1))
        );
        assert_eq!(parse_offer(b"1.3"), Ok(QueueVersion { major: 1, minor: 3 }));
        assert!(parse_offer(b"1.3").expect("version").is_parq());
        assert!(!QueueVersion::ACTIVE_0_1.is_parq());
        assert_eq!(
            parse_x_queue(b"position=2,length=5,limit=4,pollMin=45,pollMax=120"),
            Ok(XQueue::Legacy(LegacyStatus {
                position: Some(2),
                length: Some(5),
                limit: Some(4),
                poll_min: Some(45),
                poll_max: Some(120),
            }))
        );
        assert_eq!(parse_offer(b"position=2"), Err(HeaderError::BadVersion));
    }

    #[test]
    fn x_queue_rejects_bad_versions() {
        for bad in [&b"1"[..], b"1.", b"1.0a", b"1.0.0", b"1234.0", b"1 .0"] {
            assert_eq!(parse_x_queue(bad), Err(HeaderError::BadVersion), "{bad:?}");
        }
        // Not starting with a digit: a (malformed) legacy list, per §7.
        assert_eq!(
            parse_x_queue(b".1"),
            Err(HeaderError::MissingEquals { index: 0 })
        );
        assert_eq!(
            parse_offer(b".1"),
            Err(HeaderError::MissingEquals { index: 0 })
        );
        assert_eq!(parse_x_queue(b"   "), Err(HeaderError::Empty));
    }

    #[test]
    fn x_queued_seed_example_round_trips() {
        let text = format!("position=1503; length=1840; ETA=4200; lifetime=3600; ID={ID_TEXT}");
        let status = parse_x_queued(text.as_bytes()).expect("seed example parses");
        assert_eq!(
            status,
            QueuedStatus {
                position: Some(1503),
                length: Some(1840),
                eta: Some(4200),
                lifetime: Some(3600),
                id: Some(id()),
            }
        );
        assert_eq!(format_x_queued(&status), text);
    }

    #[test]
    fn x_queued_is_case_insensitive_with_optional_spaces_and_unknown_vars() {
        let text = format!("POSITION = 14;id={ID_TEXT};foo=bar;;eta=2100;");
        let status = parse_x_queued(text.as_bytes()).expect("parses");
        assert_eq!(status.position, Some(14));
        assert_eq!(status.eta, Some(2100));
        assert_eq!(status.id, Some(id()));
        assert_eq!(status.lifetime, None);
    }

    #[test]
    fn x_queued_rejects_hostile_values() {
        let long = vec![b'a'; MAX_X_QUEUED_LEN + 1];
        assert_eq!(
            parse_x_queued(&long),
            Err(HeaderError::TooLong {
                len: MAX_X_QUEUED_LEN + 1,
                max: MAX_X_QUEUED_LEN
            })
        );
        assert_eq!(
            parse_x_queued(b"position=1\r\nX-Evil: 1"),
            Err(HeaderError::InvalidByte {
                byte: b'\r',
                offset: 10
            })
        );
        assert!(matches!(
            parse_x_queued("position=1é".as_bytes()),
            Err(HeaderError::InvalidByte { .. })
        ));
        assert_eq!(
            parse_x_queued(b"position=4294967296"),
            Err(HeaderError::BadNumber { name: "position" })
        );
        assert_eq!(
            parse_x_queued(b"position=99999999999999999999"),
            Err(HeaderError::BadNumber { name: "position" })
        );
        assert_eq!(
            parse_x_queued(b"position=-1"),
            Err(HeaderError::BadNumber { name: "position" })
        );
        assert_eq!(
            parse_x_queued(b"position=+1"),
            Err(HeaderError::BadNumber { name: "position" })
        );
        assert_eq!(
            parse_x_queued(b"position="),
            Err(HeaderError::BadNumber { name: "position" })
        );
        assert_eq!(
            parse_x_queued(b"position=1; position=2"),
            Err(HeaderError::DuplicateField { name: "position" })
        );
        assert_eq!(
            parse_x_queued(b"position=1; junk"),
            Err(HeaderError::MissingEquals { index: 1 })
        );
        assert_eq!(parse_x_queued(b"ID=xyz"), Err(HeaderError::BadId));
        let many = "a=1;".repeat(MAX_FIELDS + 1);
        assert_eq!(
            parse_x_queued(many.as_bytes()),
            Err(HeaderError::TooManyFields { max: MAX_FIELDS })
        );
        assert_eq!(
            parse_x_queued(b"position=4294967295").map(|s| s.position),
            Ok(Some(u32::MAX))
        );
    }

    #[test]
    fn legacy_status_round_trips_merges_and_rejects_duplicates() {
        let status = LegacyStatus {
            position: Some(2),
            length: Some(5),
            limit: Some(4),
            poll_min: Some(45),
            poll_max: Some(120),
        };
        let text = format_legacy(&status);
        assert_eq!(text, "position=2,length=5,limit=4,pollMin=45,pollMax=120");
        assert_eq!(parse_x_queue(text.as_bytes()), Ok(XQueue::Legacy(status)));
        let XQueue::Legacy(a) = parse_x_queue(b"position=2, length=5").expect("a") else {
            panic!("legacy expected");
        };
        let XQueue::Legacy(b) = parse_x_queue(b"POLLMIN=45,pollmax=120,limit=4").expect("b") else {
            panic!("legacy expected");
        };
        assert_eq!(a.merge(b), status);
        assert_eq!(
            parse_x_queue(b"pollMin=1,pollMin=2"),
            Err(HeaderError::DuplicateField { name: "pollMin" })
        );
        assert_eq!(format_legacy(&LegacyStatus::default()), "");
    }

    #[test]
    fn x_node_forms() {
        assert_eq!(
            parse_x_node(b"13.4.5.6:4567"),
            Ok("13.4.5.6:4567".parse().expect("addr"))
        );
        assert_eq!(
            parse_x_node(b" [2001:db8::1]:80 "),
            Ok("[2001:db8::1]:80".parse().expect("addr"))
        );
        for bad in [
            &b"13.4.5.6"[..],
            b"13.4.5.6:0",
            b"13.4.5.6:65536",
            b"host:80",
            b"2001:db8::1:80",
        ] {
            assert_eq!(parse_x_node(bad), Err(HeaderError::BadNode), "{bad:?}");
        }
        assert!(matches!(
            parse_x_node(&[b'1'; MAX_X_NODE_LEN + 1]),
            Err(HeaderError::TooLong { .. })
        ));
    }

    #[test]
    fn queue_callback_line_round_trips() {
        let server: SocketAddr = "45.56.67.78:1234".parse().expect("addr");
        let line = format_queue_callback(id(), server);
        assert_eq!(line, format!("QUEUE {ID_TEXT} 45.56.67.78:1234\r\n"));
        assert_eq!(parse_queue_callback(line.as_bytes()), Ok((id(), server)));
        assert_eq!(
            parse_queue_callback(b"GIV 1:abc/x\r\n"),
            Err(HeaderError::BadCallback)
        );
        let extra = format!("QUEUE {ID_TEXT} 45.56.67.78:1234 x\r\n");
        assert_eq!(
            parse_queue_callback(extra.as_bytes()),
            Err(HeaderError::BadCallback)
        );
        assert!(matches!(
            parse_queue_callback(&[b'Q'; MAX_CALLBACK_LINE_LEN + 1]),
            Err(HeaderError::TooLong { .. })
        ));
    }

    proptest! {
        #[test]
        fn parsers_are_total(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_x_queue(&bytes);
            let _ = parse_x_queued(&bytes);
            let _ = parse_x_node(&bytes);
            let _ = parse_queue_callback(&bytes);
        }

        #[test]
        fn x_queued_format_then_parse_is_identity(
            position in proptest::option::of(any::<u32>()),
            length in proptest::option::of(any::<u32>()),
            eta in proptest::option::of(any::<u32>()),
            lifetime in proptest::option::of(any::<u32>()),
            id in proptest::option::of(any::<[u8; 16]>()),
        ) {
            let status = QueuedStatus { position, length, eta, lifetime, id: id.map(QueueId::from_bytes) };
            let text = format_x_queued(&status);
            if text.is_empty() {
                prop_assert_eq!(parse_x_queued(text.as_bytes()), Err(HeaderError::Empty));
            } else {
                prop_assert_eq!(parse_x_queued(text.as_bytes()), Ok(status));
            }
        }
    }
}

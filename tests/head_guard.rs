//! Property tests of the request framing guard (`rproxy::http::head_guard`):
//! every well-formed pipeline of requests that httparse (hyper's parser)
//! accepts passes whole, however it is cut into reads; any bytes, cut any
//! way, never panic and find the same violation at the same offset.

use proptest::prelude::*;
use rproxy::http::head_guard::{Framing, Part, Violation};

/// One request: its head (as httparse must take it) and its body bytes.
#[derive(Debug, Clone)]
struct Request {
    head: Vec<u8>,
    body: Vec<u8>,
}

fn tchar() -> impl Strategy<Value = u8> {
    prop::sample::select(b"abcxyzABCXYZ0189!#$%&'*+-.^_`|~".to_vec())
}

/// A field name that is neither Content-Length nor Transfer-Encoding.
fn other_name() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(tchar(), 1..20).prop_filter("a framing field", |name| {
        !name.eq_ignore_ascii_case(b"content-length")
            && !name.eq_ignore_ascii_case(b"transfer-encoding")
    })
}

/// A field value: visible bytes and obs-text, blanks inside and around.
fn value() -> impl Strategy<Value = Vec<u8>> {
    let vchar = prop_oneof![0x21u8..=0x7e, 0x80u8..=0xff];
    let blank = prop::sample::select(vec![b' ', b'\t']);
    (
        prop::collection::vec(blank.clone(), 0..3),
        prop::collection::vec((vchar, prop::option::weighted(0.2, blank.clone())), 0..30),
        prop::collection::vec(blank, 0..3),
    )
        .prop_map(|(lead, inner, trail)| {
            let mut value = lead;
            for (b, blank) in inner {
                value.push(b);
                value.extend(blank);
            }
            if value.is_empty() || value.last().is_some_and(|&b| b == b' ' || b == b'\t') {
                // Trailing blanks only after some text.
                value.push(b'x');
            }
            value.extend(trail);
            value
        })
}

/// A name in a random mix of cases.
fn cased(name: &'static str) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<bool>(), name.len()).prop_map(move |upper| {
        name.bytes()
            .zip(upper)
            .map(|(b, up)| if up { b.to_ascii_uppercase() } else { b })
            .collect()
    })
}

/// At most one blank before a framing field's value.
fn lead() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["", " ", "\t"])
}

#[derive(Debug, Clone)]
enum Framed {
    Empty,
    Length(Vec<u8>),
    Chunked(Vec<u8>),
}

fn hex(size: usize, upper: bool, zeros: usize) -> String {
    let digits = if upper {
        format!("{size:X}")
    } else {
        format!("{size:x}")
    };
    format!("{}{digits}", "0".repeat(zeros.min(16 - digits.len())))
}

type Extension = Option<(&'static str, Vec<u8>, Option<&'static str>)>;

/// A chunk extension, blanks before its `;` included.
fn extension() -> impl Strategy<Value = Extension> {
    prop::option::of((
        prop::sample::select(vec!["", " ", "\t "]),
        other_name(),
        prop::option::of(prop::sample::select(vec!["1", "tok", "\"a b;c\""])),
    ))
}

/// A chunked body: chunks with extensions, the last chunk, trailers.
fn chunked_body() -> impl Strategy<Value = Vec<u8>> {
    let chunk = (
        prop::collection::vec(any::<u8>(), 1..40),
        any::<bool>(),
        0usize..4,
        extension(),
    );
    (
        prop::collection::vec(chunk, 0..4),
        0usize..3,
        extension(),
        prop::collection::vec((other_name(), value()), 0..3),
    )
        .prop_map(|(chunks, last_zeros, last_extension, trailers)| {
            let mut body = Vec::new();
            let line = |body: &mut Vec<u8>, size: String, extension: &Extension| {
                body.extend(size.as_bytes());
                if let Some((blank, name, value)) = extension {
                    body.extend(format!("{blank};").as_bytes());
                    body.extend(name);
                    if let Some(value) = value {
                        body.extend(format!("={value}").as_bytes());
                    }
                }
                body.extend(b"\r\n");
            };
            for (data, upper, zeros, extension) in &chunks {
                line(&mut body, hex(data.len(), *upper, *zeros), extension);
                body.extend(data);
                body.extend(b"\r\n");
            }
            line(&mut body, "0".repeat(last_zeros + 1), &last_extension);
            for (name, value) in trailers {
                body.extend(name);
                body.push(b':');
                body.extend(value);
                body.extend(b"\r\n");
            }
            body.extend(b"\r\n");
            body
        })
}

fn framed(http10: bool) -> BoxedStrategy<Framed> {
    let length = prop::collection::vec(any::<u8>(), 0..60).prop_map(Framed::Length);
    if http10 {
        prop_oneof![Just(Framed::Empty), length].boxed()
    } else {
        prop_oneof![
            Just(Framed::Empty),
            length,
            chunked_body().prop_map(Framed::Chunked)
        ]
        .boxed()
    }
}

fn request() -> impl Strategy<Value = Request> {
    let method = prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"]);
    let target = "/[a-zA-Z0-9/._~%?=&-]{0,30}";
    (method, target, any::<bool>(), 0usize..3)
        .prop_flat_map(|(method, target, http10, empty_lines)| {
            (
                Just((method, target, http10, empty_lines)),
                prop::collection::vec((other_name(), value()), 0..8),
                framed(http10),
                cased("content-length"),
                cased("transfer-encoding"),
                cased("chunked"),
                lead(),
                0usize..4,
                any::<prop::sample::Index>(),
                any::<bool>(),
            )
        })
        .prop_map(
            |(
                (method, target, http10, empty_lines),
                fields,
                framed,
                content_length,
                transfer_encoding,
                chunked,
                lead,
                zeros,
                position,
                twice,
            )| {
                let version = if http10 { "HTTP/1.0" } else { "HTTP/1.1" };
                let mut lines: Vec<Vec<u8>> = fields
                    .into_iter()
                    .map(|(name, value)| [name, b":".to_vec(), value].concat())
                    .collect();
                let framing_line = |name: Vec<u8>, value: Vec<u8>| {
                    [name, b":".to_vec(), lead.as_bytes().to_vec(), value].concat()
                };
                let body = match framed {
                    Framed::Empty => Vec::new(),
                    Framed::Length(body) => {
                        let value = format!("{}{}", "0".repeat(zeros), body.len());
                        let line = framing_line(content_length, value.into_bytes());
                        if twice {
                            // Two equal fields are one length.
                            lines.push(line.clone());
                        }
                        lines.insert(position.index(lines.len() + 1), line);
                        body
                    }
                    Framed::Chunked(body) => {
                        let line = framing_line(transfer_encoding, chunked);
                        lines.insert(position.index(lines.len() + 1), line);
                        body
                    }
                };
                let mut head = b"\r\n".repeat(empty_lines);
                head.extend(format!("{method} {target} {version}\r\n").as_bytes());
                for line in lines {
                    head.extend(line);
                    head.extend(b"\r\n");
                }
                head.extend(b"\r\n");
                Request { head, body }
            },
        )
}

/// Feeds `bytes` in pieces of the given sizes (cycled; 0 counts as 1).
/// Returns the bytes let through and the violation.
fn feed(bytes: &[u8], pieces: &[usize]) -> (usize, Option<Violation>) {
    let mut framing = Framing::new();
    let mut passed = 0;
    let mut at = 0;
    let mut sizes = pieces.iter().cycle();
    let mut found = None;
    while at < bytes.len() {
        let size = sizes.next().copied().unwrap_or(bytes.len()).max(1);
        let chunk = &bytes[at..bytes.len().min(at + size)];
        let before = framing.checked();
        let checked = framing.check(chunk);
        assert!(checked.safe <= chunk.len());
        if found.is_some() {
            assert_eq!(checked.safe, 0, "nothing goes on after a violation");
            assert_eq!(checked.violation, found);
        } else {
            assert_eq!(before, at as u64);
        }
        passed += checked.safe;
        found = found.or(checked.violation);
        at += chunk.len();
    }
    (passed, found)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn well_formed_pipelines_pass_whole_however_they_are_read(
        requests in prop::collection::vec(request(), 1..5),
        pieces in prop::collection::vec(0usize..64, 1..8),
    ) {
        let mut stream = Vec::new();
        for request in &requests {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let parsed = httparse::Request::new(&mut headers).parse(&request.head);
            prop_assert_eq!(
                parsed.map_err(|e| e.to_string()),
                Ok(httparse::Status::Complete(request.head.len())),
                "httparse takes the head as generated: {:?}",
                String::from_utf8_lossy(&request.head)
            );
            stream.extend(&request.head);
            stream.extend(&request.body);
        }
        let (passed, violation) = feed(&stream, &pieces);
        prop_assert_eq!(violation, None, "{:?}", String::from_utf8_lossy(&stream));
        prop_assert_eq!(passed, stream.len());
    }

    #[test]
    fn any_bytes_read_any_way_find_the_same_violation(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        pieces in prop::collection::vec(0usize..32, 1..8),
    ) {
        let (_, whole) = feed(&bytes, &[bytes.len()]);
        let (passed, pieced) = feed(&bytes, &pieces);
        prop_assert_eq!(whole, pieced);
        check_passed(passed, pieced, bytes.len())?;
    }

    #[test]
    fn edited_requests_read_any_way_find_the_same_violation(
        requests in prop::collection::vec(request(), 1..4),
        edits in prop::collection::vec(
            (any::<prop::sample::Index>(), 0u8..3, prop::sample::select(
                b"\r\n\t :;\x00\x7f0aF,-+xX".to_vec())),
            1..4,
        ),
        pieces in prop::collection::vec(0usize..32, 1..8),
    ) {
        let mut bytes: Vec<u8> = requests
            .iter()
            .flat_map(|r| [r.head.clone(), r.body.clone()].concat())
            .collect();
        for (index, kind, byte) in edits {
            let at = index.index(bytes.len());
            match kind {
                0 => bytes[at] = byte,
                1 => bytes.insert(at, byte),
                _ => {
                    bytes.remove(at);
                }
            }
            if bytes.is_empty() {
                break;
            }
        }
        let (_, whole) = feed(&bytes, &[bytes.len()]);
        let (passed, pieced) = feed(&bytes, &pieces);
        prop_assert_eq!(whole, pieced);
        check_passed(passed, pieced, bytes.len())?;
    }
}

/// What went on is everything, or stops before the violation: before the
/// refused head (or within its part read earlier), or at the bad body byte.
fn check_passed(
    passed: usize,
    violation: Option<Violation>,
    len: usize,
) -> Result<(), TestCaseError> {
    let passed = passed as u64;
    match violation {
        None => prop_assert_eq!(passed, len as u64),
        Some(Violation {
            at,
            part: Part::Body,
            ..
        }) => prop_assert_eq!(passed, at),
        Some(Violation {
            at,
            part: Part::Head { start },
            ..
        }) => prop_assert!(start <= passed && passed <= at && at < len as u64),
    }
    Ok(())
}

//! Shared helpers for the hsync integration tests: deterministic test data,
//! signatures made the way the accelerator makes them, encoding and decoding
//! with arbitrary chunking, and taking streams apart into frames or building
//! them by hand; the client proxy's test settings and user agent
//! ([`proxy`], [`user_agent`]); and starting origins, accelerators and
//! client proxies in one call each ([`topology`]); CONNECT tunnels
//! ([`tunnel`]); the real binary as a child process ([`process`]).
//!
//! Not every test binary uses every helper.
#![allow(dead_code)]

pub mod process;
pub mod proxy;
pub mod routing;
pub mod topology;
pub mod tunnel;
pub mod user_agent;

use std::io::Read;

use proptest::prelude::*;

use rproxy::hsync::{
    Basis, BasisUse, DEFAULT_STRONG_LEN, DecodeError, DecodeLimits, Decoded, Decoder, DeltaCommand,
    EncodeSummary, Encoder, EncoderOptions, Frame, HEADER_LEN, Header, LiteralCodec,
    SignatureBuilder, SignatureParams, choose_block_size, parse_commands,
};

/// A small deterministic PRNG (splitmix64): tests stay reproducible from a
/// seed that proptest can shrink, without another dev-dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// `len` uniformly random bytes.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0; len];
    Rng::new(seed).fill(&mut bytes);
    bytes
}

/// `len` bytes of text-like data (words, markup, newlines), the kind of
/// body the proxies carry: compressible, with repeated runs.
pub fn pseudo_text(seed: u64, len: usize) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "function",
        "return",
        "var",
        "const",
        "let",
        "the",
        "proxy",
        "cache",
        "delta",
        "window",
        "<div class=\"row\">",
        "</div>",
        "if",
        "else",
        "{",
        "}",
        "(",
        ");",
        "=>",
        "0x1f",
        "null",
        "undefined",
        "signature",
        "block",
        "copy",
        "literal",
        "// comment",
        "import",
        "export",
        "hsync",
        "rsync",
        "zstd",
    ];
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 32);
    while out.len() < len {
        let word = WORDS[rng.below(WORDS.len() as u64) as usize];
        out.extend_from_slice(word.as_bytes());
        out.push(match rng.below(10) {
            0 => b'\n',
            1 => b'\t',
            _ => b' ',
        });
        if rng.below(50) == 0 {
            out.extend_from_slice(format!("{}", rng.next_u64()).as_bytes());
        }
    }
    out.truncate(len);
    out
}

/// The basis signature as the accelerator expects it: block size from
/// `choose_block_size(len, default budget, 1024)`, 8-byte strong sums.
pub fn accelerator_signature(basis: &[u8]) -> Vec<u8> {
    let block_size = choose_block_size(
        basis.len() as u64,
        EncoderOptions::default().max_signature_bytes,
        1024,
    );
    signature_with_block(basis, block_size)
}

/// The signature of `body` with `block_size` and 8-byte strong sums, built
/// with our incremental builder.
pub fn signature_with_block(body: &[u8], block_size: u32) -> Vec<u8> {
    let mut builder = SignatureBuilder::new(SignatureParams {
        block_size,
        strong_len: DEFAULT_STRONG_LEN,
    });
    builder.update(body);
    builder.finish();
    builder.to_signature_bytes()
}

/// The reference: `fast_rsync::Signature::calculate` with `block_size` and
/// 8-byte strong sums.
pub fn reference_signature(body: &[u8], block_size: u32) -> Vec<u8> {
    fast_rsync::Signature::calculate(
        body,
        fast_rsync::SignatureOptions {
            block_size,
            crypto_hash_size: DEFAULT_STRONG_LEN,
        },
    )
    .into_serialized()
}

/// Encoder options for tests: small windows, a fast zstd level.
pub fn options(window_bytes: usize, codec: LiteralCodec) -> EncoderOptions {
    EncoderOptions {
        window_bytes,
        basis_window_bytes: window_bytes,
        codec,
        zstd_level: 3,
        ..EncoderOptions::default()
    }
}

/// Pieces of `data`, cut by cycling through `sizes` (a size of 0 counts as 1).
pub fn pieces<'a>(data: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < data.len() {
        let size = sizes
            .get(i % sizes.len().max(1))
            .copied()
            .unwrap_or(usize::MAX);
        let end = at + size.max(1).min(data.len() - at);
        out.push(&data[at..end]);
        at = end;
        i += 1;
    }
    out
}

/// Encodes `new` against `signature`, pushing it in pieces cut by `sizes`.
pub fn encode(
    signature: Option<&[u8]>,
    expected_len: Option<u64>,
    new: &[u8],
    options: EncoderOptions,
    sizes: &[usize],
) -> (Vec<u8>, EncodeSummary) {
    let mut encoder = Encoder::new(signature, expected_len, options);
    let mut stream = Vec::new();
    for piece in pieces(new, sizes) {
        encoder
            .push(piece, &mut stream)
            .expect("encoding cannot fail");
    }
    let summary = encoder.finish(&mut stream).expect("encoding cannot fail");
    assert_eq!(summary.stream_bytes, stream.len() as u64, "{summary:?}");
    (stream, summary)
}

/// Encodes `new` with the basis body itself (codec 3), pushing it in pieces
/// cut by `sizes`; `options.codec` must compress.
pub fn encode_with_body(
    basis: &[u8],
    new: &[u8],
    options: EncoderOptions,
    sizes: &[usize],
) -> Vec<u8> {
    let mut encoder =
        Encoder::with_basis_body(Box::new(basis.to_vec()), Some(new.len() as u64), options);
    let mut stream = Vec::new();
    for piece in pieces(new, sizes) {
        encoder
            .push(piece, &mut stream)
            .expect("encoding cannot fail");
    }
    let summary = encoder.finish(&mut stream).expect("encoding cannot fail");
    assert_eq!(summary.basis, BasisUse::Body);
    assert_eq!(summary.stream_bytes, stream.len() as u64);
    stream
}

/// The stream header tests build frames under: 1 KiB blocks, 8-byte sums.
pub fn header(codec: LiteralCodec) -> Header {
    Header {
        block_size: 1024,
        strong_len: 8,
        codec,
        sig_frames: true,
    }
}

/// Delta command bytes for `list`.
pub fn commands(list: &[DeltaCommand]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for command in list {
        command.write(&mut bytes);
    }
    bytes
}

/// Encodes `new` against the accelerator-style signature of `basis`, in one
/// push.
pub fn encode_against(basis: &[u8], new: &[u8], options: EncoderOptions) -> Vec<u8> {
    let signature = accelerator_signature(basis);
    encode(Some(&signature), Some(new.len() as u64), new, options, &[]).0
}

/// What a decode produced: the result of `finish` (or the first error) and
/// every byte that `push` handed out.
#[derive(Debug)]
pub struct DecodeRun {
    pub result: Result<Decoded, DecodeError>,
    pub out: Vec<u8>,
}

/// Decodes `stream` against `basis`, pushing it in pieces cut by `sizes`;
/// stops at the first error.
pub fn decode<B: Basis>(
    basis: B,
    stream: &[u8],
    sizes: &[usize],
    limits: DecodeLimits,
) -> DecodeRun {
    let mut decoder = Decoder::new(basis, limits);
    let mut out = Vec::new();
    for piece in pieces(stream, sizes) {
        if let Err(error) = decoder.push(piece, &mut out) {
            // After an error the decoder refuses everything.
            assert_eq!(decoder.push(b"x", &mut out), Err(DecodeError::Failed));
            assert_eq!(decoder.finish(), Err(DecodeError::Failed));
            return DecodeRun {
                result: Err(error),
                out,
            };
        }
    }
    DecodeRun {
        result: decoder.finish(),
        out,
    }
}

/// Decodes a stream that must be valid, in one push.
pub fn decode_ok(basis: &[u8], stream: &[u8]) -> (Vec<u8>, Decoded) {
    let run = decode(basis, stream, &[], DecodeLimits::default());
    let decoded = run.result.expect("a valid stream decodes");
    (run.out, decoded)
}

/// A frame with its payload copied out of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedFrame {
    Delta {
        commands: Vec<u8>,
        literals: Vec<u8>,
    },
    Sig {
        entries: Vec<u8>,
    },
    End {
        len: u64,
        digest: [u8; 32],
    },
}

impl OwnedFrame {
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            OwnedFrame::Delta { commands, literals } => {
                Frame::Delta { commands, literals }.write(out)
            }
            OwnedFrame::Sig { entries } => Frame::Sig { entries }.write(out),
            OwnedFrame::End { len, digest } => Frame::End {
                len: *len,
                digest: *digest,
            }
            .write(out),
        }
    }
}

/// Takes a valid stream apart: its header and its frames, in order.
pub fn split_stream(stream: &[u8]) -> (Header, Vec<OwnedFrame>) {
    let (header, mut at) = Header::parse(stream)
        .expect("valid header")
        .expect("whole header");
    let mut frames = Vec::new();
    while at < stream.len() {
        let (frame, len) = Frame::parse(&stream[at..])
            .expect("valid frame")
            .expect("whole frame");
        frames.push(match frame {
            Frame::Delta { commands, literals } => OwnedFrame::Delta {
                commands: commands.to_vec(),
                literals: literals.to_vec(),
            },
            Frame::Sig { entries } => OwnedFrame::Sig {
                entries: entries.to_vec(),
            },
            Frame::End { len, digest } => OwnedFrame::End { len, digest },
        });
        at += len;
    }
    (header, frames)
}

/// Builds a stream from a header and frames.
pub fn build_stream(header: Header, frames: &[OwnedFrame]) -> Vec<u8> {
    let mut stream = Vec::new();
    header.write(&mut stream);
    assert_eq!(stream.len(), HEADER_LEN);
    for frame in frames {
        frame.write(&mut stream);
    }
    stream
}

/// Bytes of literal data a run of (valid) command bytes needs.
pub fn literal_len(commands: &[u8]) -> usize {
    parse_commands(commands)
        .map(|c| match c.expect("valid commands") {
            rproxy::hsync::DeltaCommand::Literal { len } => len as usize,
            rproxy::hsync::DeltaCommand::Copy { .. } => 0,
        })
        .sum()
}

/// The DELTA frames of a valid stream as (commands, raw literal bytes),
/// undoing the literal codec (`None` or `Zstd`: one zstd stream across all
/// literal sections).
pub fn plain_windows(stream: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let (header, frames) = split_stream(stream);
    let deltas: Vec<(Vec<u8>, Vec<u8>)> = frames
        .into_iter()
        .filter_map(|f| match f {
            OwnedFrame::Delta { commands, literals } => Some((commands, literals)),
            _ => None,
        })
        .collect();
    match header.codec {
        LiteralCodec::None => deltas,
        LiteralCodec::Zstd => {
            let compressed: Vec<u8> = deltas.iter().flat_map(|(_, l)| l.iter().copied()).collect();
            let mut reader =
                zstd::stream::read::Decoder::new(&compressed[..]).expect("zstd context");
            deltas
                .into_iter()
                .map(|(commands, _)| {
                    let mut literals = vec![0; literal_len(&commands)];
                    reader.read_exact(&mut literals).expect("literals decode");
                    (commands, literals)
                })
                .collect()
        }
        #[allow(unreachable_patterns)]
        other => panic!("plain_windows does not undo {other:?}"),
    }
}

/// The blake3 of `bytes`.
pub fn blake3_of(bytes: &[u8]) -> [u8; 32] {
    *blake3::hash(bytes).as_bytes()
}

/// What the basis (and inserted data) looks like.
#[derive(Debug, Clone, Copy)]
pub enum Content {
    Text,
    Random,
    /// A short pattern repeated: many identical blocks, so copies may come
    /// from any of them.
    Repetitive,
}

pub fn content(kind: Content, seed: u64, len: usize) -> Vec<u8> {
    match kind {
        Content::Text => pseudo_text(seed, len),
        Content::Random => random_bytes(seed, len),
        Content::Repetitive => {
            let period = random_bytes(seed, 1 + (seed % 97) as usize);
            period.iter().copied().cycle().take(len).collect()
        }
    }
}

/// One step of the edit script that turns the basis into the new body.
/// Positions are raw numbers taken modulo the current length.
#[derive(Debug, Clone)]
pub enum Edit {
    Insert { at: u64, len: usize, seed: u64 },
    Delete { at: u64, len: usize },
    Move { from: u64, len: usize, to: u64 },
    Duplicate { from: u64, len: usize, to: u64 },
    Truncate { at: u64 },
    FlipByte { at: u64 },
}

pub fn apply_edits(basis: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut body = basis.to_vec();
    let pos = |raw: u64, len: usize| (raw % (len as u64 + 1)) as usize;
    for edit in edits {
        match *edit {
            Edit::Insert { at, len, seed } => {
                let at = pos(at, body.len());
                body.splice(at..at, pseudo_text(seed, len));
            }
            Edit::Delete { at, len } => {
                let at = pos(at, body.len());
                let end = (at + len).min(body.len());
                body.drain(at..end);
            }
            Edit::Move { from, len, to } => {
                let from = pos(from, body.len());
                let end = (from + len).min(body.len());
                let moved: Vec<u8> = body.drain(from..end).collect();
                let to = pos(to, body.len());
                body.splice(to..to, moved);
            }
            Edit::Duplicate { from, len, to } => {
                let from = pos(from, body.len());
                let end = (from + len).min(body.len());
                let copy = body[from..end].to_vec();
                let to = pos(to, body.len());
                body.splice(to..to, copy);
            }
            Edit::Truncate { at } => {
                let at = pos(at, body.len());
                body.truncate(at);
            }
            Edit::FlipByte { at } => {
                if !body.is_empty() {
                    let at = (at % body.len() as u64) as usize;
                    body[at] ^= 0x5a;
                }
            }
        }
    }
    body
}

pub fn content_kind() -> impl Strategy<Value = Content> {
    prop_oneof![
        3 => Just(Content::Text),
        2 => Just(Content::Random),
        1 => Just(Content::Repetitive),
    ]
}

pub fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<u64>(), 0usize..3000, any::<u64>()).prop_map(|(at, len, seed)| Edit::Insert {
            at,
            len,
            seed
        }),
        (any::<u64>(), 0usize..5000).prop_map(|(at, len)| Edit::Delete { at, len }),
        (any::<u64>(), 0usize..8000, any::<u64>()).prop_map(|(from, len, to)| Edit::Move {
            from,
            len,
            to
        }),
        (any::<u64>(), 0usize..4000, any::<u64>()).prop_map(|(from, len, to)| Edit::Duplicate {
            from,
            len,
            to
        }),
        any::<u64>().prop_map(|at| Edit::Truncate { at }),
        any::<u64>().prop_map(|at| Edit::FlipByte { at }),
    ]
}

/// A memory field of a process's /proc status (`VmRSS:`, `VmHWM:`), in
/// bytes: the L-13, L-14 and A-10 tests' measure.
#[allow(dead_code)] // Not every test binary measures memory.
pub fn memory_of(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kib: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib << 10
}

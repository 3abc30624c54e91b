//! Codec 3 (`ZstdBasis`, `Encoder::with_basis_body`): round trips against a
//! known basis, and a basis one byte off never verifies a wrong body
//! (RELIABILITY D-A11, D-A10, D-A4 for codec 3).
//!
//! Input (every field reads 0 once the bytes run out):
//! - u8 flags: bit 0 = `expected_len` is a fuzzer-chosen u32 (a wrong
//!   Content-Length) instead of the body's length; bit 1 = large (below);
//! - u8 `n` then `n % 4` basis edits, (large: u16 start of the body in the
//!   basis), u8 `m` then `m % 8` body edits; each edit = kind u8, a u16,
//!   b u16 (+ a u16 destination for a move or duplicate, + `b % 256`
//!   inserted bytes for an insertion). The basis starts as the fixed 64 KiB
//!   text (`rproxy_fuzz::text()`), the body as the edited basis. Large: the
//!   basis is the text 20 times (1.25 MiB, so the encoder's prefix passes
//!   1 MiB and zstd's long-distance matching is on) and the body a 64 KiB
//!   stretch of it;
//! - u8 window: `window_bytes = 512 * (1 + w % 32)` (the encoder raises it
//!   to two blocks); large: 32 or 64 KiB;
//! - u32 expected length (read only with bit 0);
//! - 2 × u16 encoder push sizes, 2 × u16 decoder push sizes (`% 8192 + 1`,
//!   cycled);
//! - u32 position and u8 xor of the wrong basis's changed byte (xor 0 counts
//!   as 0x20; an empty basis gets one byte appended instead).
//!
//! Oracle: the stream (basis zstd level 1) decodes against the same basis,
//! in the chosen pieces, to exactly the body, with END's digest and the
//! summary's lengths; against the wrong basis it either fails or gives
//! exactly the body; `push` hands out exactly `rebuilt_len()` bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rproxy::hsync::{
    BasisUse, DecodeLimits, Decoder, Encoder, EncoderOptions, Header, LiteralCodec,
};

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (taken, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        taken
    }
}

/// A position in `0..=len` from a raw u16: every position of a short
/// buffer, evenly spread ones of a long one.
fn pos(raw: u16, len: usize) -> usize {
    let raw = usize::from(raw);
    if len < 1 << 16 {
        raw % (len + 1)
    } else {
        (raw * (len + 1)) >> 16
    }
}

/// Applies one edit read from `r` to `buf`. Ranges are short (≤ 4 KiB) so
/// that bodies stay near their starting size.
fn edit(r: &mut Reader<'_>, buf: &mut Vec<u8>) {
    let kind = r.u8() % 8;
    let (raw_at, b) = (r.u16(), usize::from(r.u16()));
    let a = usize::from(raw_at);
    let len = buf.len();
    let at = pos(raw_at, len);
    let span = (b % 4096).min(len - at);
    match kind {
        0 => buf.truncate(at),
        1 => {
            buf.drain(at..at + span);
        }
        2 => {
            let inserted = r.bytes(b % 256).to_vec();
            buf.splice(at..at, inserted);
        }
        3 => {
            // Duplicate [at, at + span) to a position chosen by the next u16.
            let copy = buf[at..at + span].to_vec();
            let to = pos(r.u16(), len);
            buf.splice(to..to, copy);
        }
        4 => {
            let moved: Vec<u8> = buf.drain(at..at + span).collect();
            let to = pos(r.u16(), buf.len());
            buf.splice(to..to, moved);
        }
        5 => {
            if at < len {
                buf[at] ^= (b as u8) | 1;
            }
        }
        6 => {
            buf.drain(..at);
        }
        _ => {
            // A slice of the text (small bases and bodies, other offsets).
            let text = rproxy_fuzz::text();
            let start = a % text.len();
            let end = (start + b).min(text.len());
            *buf = text[start..end].to_vec();
        }
    }
}

/// Pieces of `data`, cut by cycling through `sizes`.
fn pieces<'a>(data: &'a [u8], sizes: &[usize]) -> impl Iterator<Item = &'a [u8]> {
    let mut at = 0;
    let mut i = 0;
    std::iter::from_fn(move || {
        if at >= data.len() {
            return None;
        }
        let end = (at + sizes[i % sizes.len()]).min(data.len());
        i += 1;
        let piece = &data[at..end];
        at = end;
        Some(piece)
    })
}

/// Decodes `stream` against `basis` in `sizes` pieces: the bytes handed out
/// and whether the stream verified.
fn decode(basis: &[u8], stream: &[u8], sizes: &[usize]) -> (Vec<u8>, Option<[u8; 32]>) {
    let mut decoder = Decoder::new(basis, DecodeLimits::default());
    let mut out = Vec::new();
    for piece in pieces(stream, sizes) {
        let result = decoder.push(piece, &mut out);
        assert_eq!(out.len() as u64, decoder.rebuilt_len());
        if result.is_err() {
            assert!(decoder.finish().is_err());
            return (out, None);
        }
    }
    let verified = decoder.finish().ok().map(|decoded| {
        assert_eq!(decoded.len, out.len() as u64);
        decoded.digest
    });
    (out, verified)
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader(data);
    let flags = r.u8();
    // Large: a basis of the text 20 times over (1.25 MiB), so the prefix
    // reaches LONG_DISTANCE_PREFIX (1 MiB) and the encoder turns on zstd's
    // long-distance matching, as for real bodies; the body is a 64 KiB
    // stretch of it, so that a run stays cheap.
    let large = flags & 2 != 0;
    let mut basis = if large {
        rproxy_fuzz::text().repeat(20)
    } else {
        rproxy_fuzz::text().to_vec()
    };
    for _ in 0..r.u8() % 4 {
        edit(&mut r, &mut basis);
    }
    let mut new = if large {
        let start = pos(r.u16(), basis.len());
        basis[start..(start + rproxy_fuzz::TEXT_LEN).min(basis.len())].to_vec()
    } else {
        basis.clone()
    };
    for _ in 0..r.u8() % 8 {
        edit(&mut r, &mut new);
    }
    let window_bytes = if large {
        (32 << 10) * (1 + usize::from(r.u8() % 2))
    } else {
        512 * (1 + usize::from(r.u8() % 32))
    };
    let expected_len = if flags & 1 != 0 {
        u64::from(r.u32())
    } else {
        new.len() as u64
    };
    let size = |r: &mut Reader<'_>| usize::from(r.u16()) % 8192 + 1;
    let encode_sizes = [size(&mut r), size(&mut r)];
    let decode_sizes = [size(&mut r), size(&mut r)];
    let (wrong_at, wrong_xor) = (r.u32() as usize, r.u8());

    let options = EncoderOptions {
        basis_zstd_level: 1,
        zstd_level: 1,
        window_bytes,
        ..EncoderOptions::default()
    };
    let mut encoder =
        Encoder::with_basis_body(Box::new(basis.clone()), Some(expected_len), options);
    assert_eq!(*encoder.basis_use(), BasisUse::Body);
    let mut stream = Vec::new();
    for piece in pieces(&new, &encode_sizes) {
        encoder.push(piece, &mut stream).expect("encoder push");
    }
    let summary = encoder.finish(&mut stream).expect("encoder finish");
    assert_eq!(summary.basis, BasisUse::Body);
    assert_eq!(summary.body_len, new.len() as u64);
    assert_eq!(summary.stream_bytes, stream.len() as u64);
    assert_eq!(summary.copied_bytes, 0);
    let (header, _) = Header::parse(&stream).unwrap().unwrap();
    assert_eq!(header.codec, LiteralCodec::ZstdBasis);

    // The same basis: exactly the body.
    let (out, verified) = decode(&basis, &stream, &decode_sizes);
    let digest = *blake3::hash(&new).as_bytes();
    assert!(out == new, "round trip: {} bytes out, {} expected", out.len(), new.len());
    assert_eq!(verified, Some(digest), "round trip did not verify");
    assert_eq!(summary.digest, digest);

    // A basis one byte off: a failure or exactly the body.
    let mut wrong = basis.clone();
    if wrong.is_empty() {
        wrong.push(wrong_xor);
    } else {
        let at = wrong_at % wrong.len();
        wrong[at] ^= if wrong_xor == 0 { 0x20 } else { wrong_xor };
    }
    let (out, verified) = decode(&wrong, &stream, &decode_sizes);
    if verified.is_some() {
        assert!(out == new, "a wrong basis verified a wrong body");
        assert_eq!(verified, Some(digest));
    }
});

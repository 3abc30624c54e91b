//! hsync/1: the streaming delta codec between the client proxy and the
//! accelerator, sans-IO (no sockets, no files, no clock).
//!
//! The accelerator holds only the *signature* of the client's basis, so it
//! speaks rsync: the new body is cut into windows, each window is diffed
//! against the basis signature with `fast_rsync`, and the result is sent as
//! librsync delta commands whose literal bytes are compressed with zstd
//! against the body around them. The new body's own signature is interleaved so that an
//! interrupted transfer leaves the client a usable prefix plus its signature.
//!
//! Main types: [`Encoder`] (accelerator side), [`Decoder`] (client side),
//! [`Frame`] and [`Header`] (the framing), [`BasisSignature`] (a
//! validated, possibly truncated, client signature) and
//! [`SignatureBuilder`] (incremental signatures of a body).
//!
//! # Wire format
//!
//! All integers are big-endian. A stream is a header followed by frames.
//!
//! ```text
//! header (12 bytes)
//! +------+------+------+------+-------+-------+--------+-------+------+------+------+------+
//! | 'h'  | 's'  | 'y'  | 'n'  |version| codec |strong  | flags |      block_size (u32)     |
//! +------+------+------+------+-------+-------+--------+-------+------+------+------+------+
//!   magic "hsyn"               = 1     codec   8..=16   0 or 1    512 ..= 1 MiB
//!                                      0 none    bytes of MD4 kept in each signature entry
//!                                      1 zstd (one stream)
//!                                      2 zstd per window (the default)
//!                                      3 zstd per window against the basis
//!   flags: bit 0 (NO_SIG) set: the stream has no SIG frames. A client
//!   asks for that (`Hsync-Accept: no-sig=N` on its request) when it
//!   computes the new signature itself and can hold the body until END;
//!   other bits are reserved and refused.
//!
//! frame
//! +------+------+------+------+------+====================+
//! | kind |      payload length (u32)  |  payload ...       |   length <= MAX_FRAME_LEN
//! +------+------+------+------+------+====================+
//!
//! kind 1, DELTA: one window of the new body
//! +------+------+------+------+==========================+============================+
//! |   commands length (u32)   | librsync delta commands  | compressed literal bytes   |
//! +------+------+------+------+==========================+============================+
//!   commands: the librsync op codes (LITERAL_1..LITERAL_N8, COPY_N*_N*) exactly as
//!   `rdiff` writes them, but without the delta magic, without RS_OP_END, and with
//!   each literal's data moved out into the literal section; COPY offsets are
//!   absolute offsets in the basis. The literal section is the concatenation of
//!   the literal data of this window's commands, compressed by the codec:
//!     0: as it is;
//!     1: one zstd stream for the whole hsync stream, flushed at the end of
//!        every DELTA frame so each frame decodes as soon as it arrives;
//!     2: one complete zstd frame per DELTA frame (empty when the window has
//!        no literals), compressed with a zstd reference prefix that both
//!        ends build: the last min(CONTEXT_LEN = 1 MiB, 64 × W) bytes of the
//!        body before this window (W = bytes the window rebuilds), then this
//!        window's copied bytes in command order, keeping the last
//!        MAX_PREFIX_LEN (8 MiB) bytes of that; zstd window log <= 25.
//!        Literals compress against the text around them, which the client
//!        already has.
//!     3: as 2, for an encoder that holds the basis body itself (the client
//!        named it by blake3 and the accelerator kept it): the prefix is a
//!        slice of the basis, S = min(6 MiB, 64 × W) long, starting
//!        min(2 MiB, S / 3) before the window's offset (clamped to the
//!        basis), then the body context as for 2. COPY commands may
//!        name any offset in the basis. Our encoder sends a small body
//!        (and a large one's first MiBs when its length is not known) as
//!        one LITERAL per window, zstd finding the basis text itself; a
//!        large one as the COPY commands of the runs it finds by an index
//!        of the basis, and the edited bytes as LITERALs compressed
//!        against a tail of the prefix (the context's). It keeps these
//!        windows within MAX_BASIS_WINDOW (3 MiB), so that the slice
//!        covers each with 1 MiB to spare; decoders do not rely on it.
//!   A window rebuilds at most MAX_WINDOW_OUTPUT bytes.
//!
//! kind 2, SIG: signature entries for the next blocks of the new body
//! +------+------+------+------+============+  ... repeated, each entry 4 + strong bytes:
//! |  rollsum (u32)            | MD4[..strong]|  the fast_rsync/librsync MD4 entry format
//! +------+------+------+------+============+
//!   Entries cover blocks of `block_size` bytes, in order; the last one may
//!   be short. A SIG frame follows each DELTA frame with the entries of the
//!   blocks that the rebuilt prefix completed; the concatenation of all SIG
//!   frames, after the 12-byte librsync signature header, is the new body's
//!   whole signature (equal to `Signature::calculate(body)`).
//!
//! kind 3, END: the whole body, once, last
//! +------+------+------+------+------+------+------+------+==============================+
//! |                    total length (u64)                 |  blake3 of the body (32 B)   |
//! +------+------+------+------+------+------+------+------+==============================+
//! ```
//!
//! Nothing may follow END. Unknown frame kinds are an error (version 1 has
//! no optional frames; SIG frames are left out only by the NO_SIG flag,
//! and one in such a stream is an error). The decoder never trusts the SIG entries: it
//! recomputes the signature from the bytes it rebuilt and rejects a stream
//! whose entries disagree (unless its caller needs neither the signature
//! checked nor bytes vouched for before END, and says so:
//! `Decoder::trust_signature_entries`), and it rejects a stream whose END
//! does not match what it rebuilt.

mod basis;
mod decode;
mod delta;
mod encode;
mod frame;
mod matcher;
mod signature;

pub use basis::{Basis, FileBasis};
pub use decode::{DecodeError, DecodeLimits, Decoded, Decoder, Partial};
pub use delta::{DELTA_MAGIC, DeltaCommand, DeltaError, join_delta, parse_commands, split_delta};
pub use encode::{
    BasisUse, EncodeError, EncodeSummary, Encoder, EncoderOptions, HeldAnchors, SharedAnchors,
    UNCODED_LEVEL, min_window_len,
};
pub use frame::{Frame, FrameError, FrameKind, Header, LiteralCodec};
pub use signature::{
    BasisSignature, SignatureBuilder, SignatureError, SignatureLimits, choose_block_size, sign,
};

use fast_rsync::SignatureOptions;

/// The 4-byte magic that opens every hsync/1 stream.
pub const MAGIC: [u8; 4] = *b"hsyn";
/// The format version this crate reads and writes.
pub const VERSION: u8 = 1;
/// Length of the stream header in bytes.
pub const HEADER_LEN: usize = 12;
/// Length of a frame's kind + length prefix in bytes.
pub const FRAME_PREFIX_LEN: usize = 5;
/// The smallest block size we accept or choose (bytes).
pub const MIN_BLOCK_SIZE: u32 = 512;
/// The largest block size we accept or choose (bytes).
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;
/// The smallest strong-sum length (bytes of MD4) we accept.
pub const MIN_STRONG_LEN: u32 = 8;
/// The largest strong-sum length we accept (a whole MD4 digest).
pub const MAX_STRONG_LEN: u32 = 16;
/// The strong-sum length we write: 8 bytes, as rdiff's `-S 8`.
pub const DEFAULT_STRONG_LEN: u32 = 8;
/// The largest new-body span one DELTA frame may rebuild (bytes).
pub const MAX_WINDOW_OUTPUT: usize = 16 << 20;
/// The largest frame payload the decoder accepts (bytes).
pub const MAX_FRAME_LEN: usize = MAX_WINDOW_OUTPUT + (1 << 20);
/// Length of the librsync signature header (magic, block size, strong length).
pub const SIGNATURE_HEADER_LEN: usize = 12;
/// Length of the END frame payload.
pub const END_LEN: usize = 8 + 32;
/// Bytes of body before a window that the `ZstdWindow` codec's prefix
/// starts with.
pub const CONTEXT_LEN: usize = 1 << 20;
/// Longest `ZstdWindow` reference prefix (bytes); longer ones lose their
/// front.
pub const MAX_PREFIX_LEN: usize = 8 << 20;

/// Largest zstd window (log2 bytes) either end uses or accepts: covers
/// [`MAX_PREFIX_LEN`] plus a window's literals.
pub(crate) const ZSTD_WINDOW_LOG_MAX: u32 = 25;

/// Bytes of basis before a window's offset that the `ZstdBasis` prefix
/// starts at, at most.
pub const BASIS_LOOKBEHIND: u64 = 2 << 20;
/// Longest slice of basis in a `ZstdBasis` prefix (bytes).
pub const BASIS_SPAN: u64 = 6 << 20;
/// Largest window our encoder writes in codec 3 (bytes). A window of at
/// least 96 KiB gets a basis slice of [`BASIS_SPAN`] bytes that starts
/// [`BASIS_LOOKBEHIND`] before its offset, so it reaches 4 MiB past the
/// offset. A window of 3 MiB leaves 1 MiB of that for old text that the
/// new body moved back (deletions), as the lookbehind leaves 2 MiB for
/// text moved forward. Windows sized by the new signature's blocks (8 of
/// them, up to 8 MiB on large bodies) left their back half without old
/// text. Only the encoder depends on it: the decoder builds each window's
/// slice from its offset and length alone.
pub const MAX_BASIS_WINDOW: usize = (BASIS_SPAN - BASIS_LOOKBEHIND) as usize - (1 << 20);

/// A window's prefix parts (context, basis slice) hold at most this many
/// bytes per byte the window rebuilds, so the decoder's work stays in
/// proportion to its output whatever the window sizes (a stream of 1-byte
/// windows must not cost a 7 MiB prefix each). 1 MiB windows are not
/// limited by it.
pub const PREFIX_PER_OUTPUT: u64 = 64;

/// The slice of basis in the `ZstdBasis` prefix of the window that starts
/// at body offset `window_start` and rebuilds `window_len` bytes: it spans
/// at most min([`BASIS_SPAN`], [`PREFIX_PER_OUTPUT`] × `window_len`) and
/// starts a third of that (at most [`BASIS_LOOKBEHIND`]) before the
/// window's offset, so that in-place edits of large bodies find their old
/// text.
pub(crate) fn basis_slice(
    window_start: u64,
    window_len: u64,
    basis_len: u64,
) -> std::ops::Range<u64> {
    let span = BASIS_SPAN.min(PREFIX_PER_OUTPUT.saturating_mul(window_len));
    let lookbehind = BASIS_LOOKBEHIND.min(span / 3);
    let start = window_start.saturating_sub(lookbehind).min(basis_len);
    start..start.saturating_add(span).min(basis_len)
}

/// Builds the zstd reference prefix of a window that rebuilds
/// `window_len` bytes, from what both ends hold: `basis` (`ZstdBasis`: the
/// [`basis_slice`]; empty otherwise), the last min([`CONTEXT_LEN`],
/// [`PREFIX_PER_OUTPUT`] × `window_len`) bytes of `context` (the body
/// before the window), and `copied` (`ZstdWindow`: the window's copied
/// bytes in order; empty otherwise), keeping the last [`MAX_PREFIX_LEN`]
/// bytes. The encoder calls this and the decoder builds the tail of it
/// that a zstd frame reaches, so it is part of the format.
pub(crate) fn window_prefix(
    basis: &[u8],
    context: &[u8],
    copied: &[u8],
    window_len: u64,
    prefix: &mut Vec<u8>,
) {
    let context = context_tail(context, window_len);
    prefix.clear();
    let mut skip = (basis.len() + context.len() + copied.len()).saturating_sub(MAX_PREFIX_LEN);
    for part in [basis, context, copied] {
        let dropped = skip.min(part.len());
        prefix.extend_from_slice(&part[dropped..]);
        skip -= dropped;
    }
}

/// The part of `context` (the body before a window that rebuilds
/// `window_len` bytes) that goes into the window's prefix: its last
/// min([`CONTEXT_LEN`], [`PREFIX_PER_OUTPUT`] × `window_len`) bytes.
pub(crate) fn context_tail(context: &[u8], window_len: u64) -> &[u8] {
    let len = (CONTEXT_LEN as u64).min(PREFIX_PER_OUTPUT.saturating_mul(window_len)) as usize;
    &context[context.len().saturating_sub(len)..]
}

/// Keeps at least the last [`CONTEXT_LEN`] bytes of the body in `context`
/// (its tail is what [`window_prefix`] uses) after `more` of it was
/// rebuilt. It holds up to twice that and shifts only when full, so a
/// stream of tiny windows does not move 1 MiB per window.
pub(crate) fn extend_context(context: &mut Vec<u8>, more: &[u8]) {
    if more.len() >= CONTEXT_LEN {
        context.clear();
        context.extend_from_slice(&more[more.len() - CONTEXT_LEN..]);
        return;
    }
    if context.len() + more.len() > 2 * CONTEXT_LEN {
        let keep = CONTEXT_LEN - more.len();
        context.drain(..context.len() - keep);
    }
    context.extend_from_slice(more);
}

/// librsync's magic for MD4 signatures.
pub(crate) const MD4_MAGIC: u32 = 0x7273_0136;

/// The parameters of a signature: block size and strong-sum length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignatureParams {
    /// Bytes per block.
    pub block_size: u32,
    /// Bytes of MD4 kept per entry.
    pub strong_len: u32,
}

impl SignatureParams {
    /// Bytes of one signature entry.
    pub fn entry_len(&self) -> usize {
        4 + self.strong_len as usize
    }

    /// The 12-byte librsync signature header for these parameters.
    pub fn header_bytes(&self) -> [u8; SIGNATURE_HEADER_LEN] {
        let mut header = [0; SIGNATURE_HEADER_LEN];
        header[..4].copy_from_slice(&MD4_MAGIC.to_be_bytes());
        header[4..8].copy_from_slice(&self.block_size.to_be_bytes());
        header[8..].copy_from_slice(&self.strong_len.to_be_bytes());
        header
    }

    pub(crate) fn options(&self) -> SignatureOptions {
        SignatureOptions {
            block_size: self.block_size,
            crypto_hash_size: self.strong_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes `new` against `basis` in `chunk`-byte pushes and decodes it.
    pub(crate) fn round_trip(
        basis: &[u8],
        new: &[u8],
        chunk: usize,
        options: EncoderOptions,
    ) -> (Vec<u8>, Vec<u8>, EncodeSummary) {
        let signature = SignatureBuilder::new(SignatureParams {
            block_size: choose_block_size(
                basis.len() as u64,
                options.max_signature_bytes,
                options.min_block_size,
            ),
            strong_len: DEFAULT_STRONG_LEN,
        });
        let mut signature = signature;
        signature.update(basis);
        signature.finish();
        let mut encoder = Encoder::new(
            Some(&signature.to_signature_bytes()),
            Some(new.len() as u64),
            options,
        );
        let mut stream = Vec::new();
        for piece in new.chunks(chunk.max(1)) {
            encoder.push(piece, &mut stream).unwrap();
        }
        let summary = encoder.finish(&mut stream).unwrap();
        let mut decoder = Decoder::new(basis, DecodeLimits::default());
        let mut body = Vec::new();
        for piece in stream.chunks(chunk.max(1)) {
            decoder.push(piece, &mut body).unwrap();
        }
        let decoded = decoder.finish().unwrap();
        assert_eq!(decoded.len, new.len() as u64);
        (body, stream, summary)
    }

    /// A decoder that takes the SIG entries as the signature gives the
    /// recomputed one for a good stream, still refuses a wrong body, and
    /// with a SIG entry changed still rebuilds the right body (END vouches
    /// for it) but hands the entry on as sent.
    #[test]
    fn trusted_signature_entries_verify_the_body_by_blake3() {
        let basis: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
            .collect();
        let mut new = basis.clone();
        new.splice(50_000..50_004, b"edit".iter().copied());
        let (_, stream, _) = round_trip(&basis, &new, 1 << 20, EncoderOptions::default());
        let decode = |stream: &[u8], trust: bool| -> Result<(Vec<u8>, Decoded), DecodeError> {
            let mut decoder = Decoder::new(&basis[..], DecodeLimits::default());
            if trust {
                decoder.trust_signature_entries();
            }
            let mut body = Vec::new();
            decoder.push(stream, &mut body)?;
            assert_eq!(decoder.verified_len(), body.len() as u64);
            decoder.finish().map(|decoded| (body, decoded))
        };
        let (body, strict) = decode(&stream, false).unwrap();
        let (trusted_body, trusted) = decode(&stream, true).unwrap();
        assert_eq!((&body, &strict), (&trusted_body, &trusted));
        assert_eq!(body, new);

        // The first SIG frame: kind 2 after the header and the DELTA frame.
        let frame_len = |at: usize| {
            FRAME_PREFIX_LEN
                + u32::from_be_bytes(stream[at + 1..at + 5].try_into().unwrap()) as usize
        };
        let sig_at = HEADER_LEN + frame_len(HEADER_LEN);
        assert_eq!(stream[sig_at], 2, "a SIG frame follows the first DELTA");
        let mut wrong_entry = stream.clone();
        wrong_entry[sig_at + FRAME_PREFIX_LEN + 5] ^= 1;
        assert!(matches!(
            decode(&wrong_entry, false),
            Err(DecodeError::SignatureMismatch { block: 0 })
        ));
        let (body, decoded) = decode(&wrong_entry, true).unwrap();
        assert_eq!(body, new);
        assert_ne!(decoded.signature, strict.signature);
        assert_eq!(decoded.signature.len(), strict.signature.len());

        // A wrong body still fails; so does a missing entry.
        let mut wrong_digest = stream.clone();
        let last = wrong_digest.len() - 1;
        wrong_digest[last] ^= 1;
        assert_eq!(
            decode(&wrong_digest, true).unwrap_err(),
            DecodeError::DigestMismatch
        );
        let mut short_sig = stream[..sig_at].to_vec();
        let sig_len = frame_len(sig_at);
        let entry_len = (sig_len - FRAME_PREFIX_LEN) as u32 - 12;
        short_sig.push(2);
        short_sig.extend_from_slice(&entry_len.to_be_bytes());
        short_sig.extend_from_slice(&stream[sig_at + FRAME_PREFIX_LEN..sig_at + sig_len - 12]);
        short_sig.extend_from_slice(&stream[sig_at + sig_len..]);
        assert!(matches!(
            decode(&short_sig, true),
            Err(DecodeError::SignatureMismatch { .. })
        ));
    }

    /// Every window our codec 3 encoder writes lies within its basis
    /// slice, with 1 MiB to spare from 96 KiB windows on.
    #[test]
    fn the_basis_slice_covers_every_codec3_window() {
        for start in [0, 1 << 20, 5 << 20, 1 << 30] {
            for len in [1, 4096, 96 << 10, 1 << 20, MAX_BASIS_WINDOW as u64] {
                let slice = basis_slice(start, len, u64::MAX);
                let spare = if len >= 96 << 10 { 1 << 20 } else { 0 };
                assert!(
                    slice.start <= start && slice.end >= start + len + spare,
                    "window {start}+{len}: slice {slice:?}"
                );
            }
        }
    }

    #[test]
    fn edited_body_round_trips_as_mostly_copies() {
        let basis: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let mut new = basis.clone();
        new.splice(100_000..100_010, b"an edit in the middle".iter().copied());
        new.extend_from_slice(b"and a tail");
        let options = EncoderOptions {
            window_bytes: 64 << 10,
            ..EncoderOptions::default()
        };
        let (body, stream, summary) = round_trip(&basis, &new, 7777, options);
        assert_eq!(body, new);
        assert!(summary.copied_bytes > 290_000, "{summary:?}");
        assert!(stream.len() < 10_000, "stream {} bytes", stream.len());
    }
}

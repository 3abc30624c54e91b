//! The encoder's side of the literal codecs (the `codec` byte of the
//! header, see `hsync/mod.rs`): compresses a window's literal bytes into
//! its DELTA frame's literal section, and chooses how hard to try. The
//! choice is the part that changes most: a high zstd level while the
//! stream's budget lasts and the literals repay it, then a fast level, the
//! entropy level after literals without redundancy, and stored or
//! match-only frames when the caller turns entropy coding off.
//!
//! It leaves out which bytes are literals and what the reference prefix
//! holds (the encoder's window work builds both; both ends build the
//! prefix the same way, `window_prefix` in `hsync/mod.rs`).
//!
//! Main types: [`LiteralCompressor`], [`UNCODED_LEVEL`].

use std::io::Write;

use super::EncoderOptions;
use crate::hsync::ZSTD_WINDOW_LOG_MAX;
use crate::hsync::frame::LiteralCodec;

/// zstd window of codec 1's single stream (log2 bytes): within what the
/// decoder accepts, and a bounded buffer on both ends.
const STREAM_WINDOW_LOG: u32 = 23;

/// The high zstd level is used only when a window's prefix is at most this
/// many times its literal bytes.
const HIGH_LEVEL_PREFIX_RATIO: usize = 32;

/// Prefix tail kept at the fast level for `literal_len` literal bytes:
/// 1.5 to 4 times the literals (about 256 KiB at least), so that tail and
/// literals fill a power of two exactly. zstd declares its window in
/// powers of two and the decoder builds as much of the prefix as that
/// window reaches: a tail that rounded the window up made it build up to
/// twice the bytes the matches can use. On the 64 MiB 1 %-edited bench
/// body this sends 0.03 % less than the 8× tail it replaced (which sent
/// 0.002 % more than the whole prefix), and decoding took 15-20 % less CPU.
pub(super) fn fast_prefix_len(literal_len: usize) -> usize {
    let wanted = literal_len.saturating_mul(5).max((256 << 10) + literal_len);
    let window = 1usize << wanted.ilog2();
    window - literal_len
}

/// zstd level of the fast stage's literals without entropy coding, when
/// the last coded window found redundancy: zstd's negative levels store
/// literals raw, and -1 keeps its fast match finder whole, so text still
/// compresses by its repeats. After a window without redundancy the
/// literals are stored instead ([`store_frame`]): on random base64 level
/// -1 found nothing, at about 2.7 GB/s, and its match search and two
/// copies were a sixth of the accelerator's CPU.
pub const UNCODED_LEVEL: i32 = -1;

/// Largest block of a zstd frame (bytes); also the window that
/// [`store_frame`] declares, so that a decoder builds no more prefix.
const ZSTD_BLOCK_MAX: usize = 128 << 10;

/// Appends `data` as a zstd frame of raw blocks: what zstd's encoder
/// would write for data it cannot compress, without the search.
fn store_frame(data: &[u8], out: &mut Vec<u8>) {
    out.reserve(6 + data.len() + data.len().div_ceil(ZSTD_BLOCK_MAX) * 3);
    out.extend_from_slice(&0xFD2F_B528u32.to_le_bytes());
    // Frame header: no content size, not a single segment, no checksum,
    // no dictionary; window 2^(10 + 7) bytes.
    out.extend_from_slice(&[0x00, 7 << 3]);
    let mut blocks = data.chunks(ZSTD_BLOCK_MAX).peekable();
    while let Some(block) = blocks.next() {
        // Block header (little-endian, 3 bytes): size, type 0 (raw), and
        // whether this is the last block.
        let last = u32::from(blocks.peek().is_none());
        let header = (block.len() as u32) << 3 | last;
        out.extend_from_slice(&header.to_le_bytes()[..3]);
        out.extend_from_slice(block);
    }
}

/// Prefixes from this size on get zstd's long-distance matcher (bytes).
const LONG_DISTANCE_PREFIX: usize = 1 << 20;

/// Compresses `data` as one zstd frame against `prefix` at `level`,
/// appending it to `out`; returns its length.
fn compress_frame(
    level: i32,
    prefix: &[u8],
    long_distance: bool,
    data: &[u8],
    out: &mut Vec<u8>,
) -> std::io::Result<usize> {
    use zstd_safe::{CCtx, CParameter};
    let zstd_error = |code| std::io::Error::other(zstd_safe::get_error_name(code));
    let span = (prefix.len() + data.len()) as u64;
    let window_log = (64 - span.saturating_sub(1).leading_zeros()).clamp(10, ZSTD_WINDOW_LOG_MAX);
    // A context per frame: `ref_prefix` borrows the prefix for the
    // context's lifetime.
    let mut cctx = CCtx::create();
    for parameter in [
        CParameter::CompressionLevel(level),
        CParameter::WindowLog(window_log),
        CParameter::ContentSizeFlag(false),
        CParameter::ChecksumFlag(false),
    ] {
        cctx.set_parameter(parameter).map_err(zstd_error)?;
    }
    if long_distance {
        // The regular match finders of the fast levels index too little of
        // a prefix of several MiB to find the basis text in it;
        // long-distance matching does (as `zstd --patch-from` turns it on
        // for large inputs).
        cctx.set_parameter(CParameter::EnableLongDistanceMatching(true))
            .map_err(zstd_error)?;
    }
    if !prefix.is_empty() {
        cctx.ref_prefix(prefix).map_err(zstd_error)?;
    }
    // Straight into `out`'s spare capacity, after its bytes.
    let start = out.len();
    out.reserve(zstd_safe::compress_bound(data.len()));
    let mut cursor = std::io::Cursor::new(&mut *out);
    cursor.set_position(start as u64);
    cctx.compress2(&mut cursor, data).map_err(zstd_error)
}

/// The literal codec's compressing side.
pub(super) enum LiteralCompressor {
    None,
    /// One context for the whole stream.
    Zstd(Box<zstd::stream::write::Encoder<'static, Vec<u8>>>),
    /// A fresh frame per window against the window's prefix.
    ZstdWindow {
        level: i32,
        fast_level: i32,
        entropy_level: i32,
        /// The last window at a fast level compressed no better than half.
        little_redundancy: bool,
        /// The fast stage entropy-codes its literals (else
        /// [`UNCODED_LEVEL`]).
        entropy_coding: bool,
        /// zstd work left at `level` (bytes).
        budget: u64,
        /// Use zstd's long-distance matcher on large prefixes (codec 3).
        long_distance: bool,
    },
}

impl LiteralCompressor {
    /// `known_len` is the body's length when known up front: a body larger
    /// than the high-level budget gets the fast level throughout, rather
    /// than spending the budget on its first windows for nothing.
    pub(super) fn new(
        codec: LiteralCodec,
        options: &EncoderOptions,
        known_len: Option<u64>,
    ) -> Self {
        let level = options.zstd_level;
        let budget = |budget: u64| match known_len {
            Some(len) if len > budget => 0,
            _ => budget,
        };
        match codec {
            LiteralCodec::None => LiteralCompressor::None,
            LiteralCodec::Zstd => {
                let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), level)
                    .expect("creating a zstd context only fails on allocation");
                // Levels 21-22 would pick a window the decoder refuses.
                encoder
                    .window_log(STREAM_WINDOW_LOG)
                    .expect("a valid window log");
                LiteralCompressor::Zstd(Box::new(encoder))
            }
            LiteralCodec::ZstdWindow => LiteralCompressor::ZstdWindow {
                level,
                fast_level: options.fast_zstd_level,
                entropy_level: options.entropy_zstd_level,
                little_redundancy: false,
                entropy_coding: true,
                budget: budget(options.high_level_budget),
                long_distance: false,
            },
            LiteralCodec::ZstdBasis => LiteralCompressor::ZstdWindow {
                level: options.basis_zstd_level,
                fast_level: options.fast_zstd_level,
                entropy_level: options.entropy_zstd_level,
                little_redundancy: false,
                entropy_coding: true,
                budget: budget(options.basis_high_level_budget),
                long_distance: true,
            },
        }
    }

    /// A frame per window against the window's prefix (codecs 2 and 3):
    /// the encoder then keeps the body's context for the prefixes.
    pub(super) fn is_windowed(&self) -> bool {
        matches!(self, LiteralCompressor::ZstdWindow { .. })
    }

    /// The high-level budget is spent: literals go at the fast levels.
    pub(super) fn is_in_fast_stage(&self) -> bool {
        matches!(self, LiteralCompressor::ZstdWindow { budget: 0, .. })
    }

    /// Whether the fast stage entropy-codes its literals; true for the
    /// codecs that have no fast stage.
    pub(super) fn entropy_coding(&self) -> bool {
        !matches!(
            self,
            LiteralCompressor::ZstdWindow {
                entropy_coding: false,
                ..
            }
        )
    }

    /// Turns the fast stage's entropy coding on or off; nothing for the
    /// codecs that have no fast stage.
    pub(super) fn set_entropy_coding(&mut self, on: bool) {
        if let LiteralCompressor::ZstdWindow { entropy_coding, .. } = self {
            *entropy_coding = on;
        }
    }

    /// Whether `data_len` literal bytes against a prefix of `prefix_len`
    /// bytes go at the high level (`ZstdWindow` only).
    fn high_level(&self, data_len: usize, prefix_len: usize) -> bool {
        let LiteralCompressor::ZstdWindow { budget, .. } = self else {
            return false;
        };
        // The high level's cost is mostly indexing the prefix: only
        // worth it when the literals are not a sliver of it (an
        // unchanged 1 MiB body spent 370 ms at level 19 on 64
        // literal bytes).
        let worth_it = data_len.saturating_mul(HIGH_LEVEL_PREFIX_RATIO) >= prefix_len;
        worth_it && *budget >= (prefix_len + data_len) as u64
    }

    /// How many bytes at the end of a `prefix_len`-byte prefix
    /// [`compress`](Self::compress) will use for `data_len` literal bytes
    /// (codec 2, no long-distance matching): the caller builds no more.
    pub(super) fn prefix_needed(&self, data_len: usize, prefix_len: usize) -> usize {
        match self {
            LiteralCompressor::ZstdWindow { .. } if data_len == 0 => 0,
            LiteralCompressor::ZstdWindow {
                long_distance: true,
                ..
            } => prefix_len,
            LiteralCompressor::ZstdWindow { .. } if self.high_level(data_len, prefix_len) => {
                prefix_len
            }
            LiteralCompressor::ZstdWindow {
                entropy_coding: false,
                little_redundancy: true,
                ..
            } => 0,
            LiteralCompressor::ZstdWindow { .. } => fast_prefix_len(data_len).min(prefix_len),
            _ => 0,
        }
    }

    /// Compresses `data`, appending to `out`, so that it decodes from those
    /// bytes alone (given the window's whole reference prefix, for
    /// `ZstdWindow`, of `full_prefix_len` bytes; `prefix` is its tail, at
    /// least [`prefix_needed`](Self::prefix_needed) bytes of it, and its
    /// first `basis_in_prefix` bytes are basis text, for `ZstdBasis`). When
    /// `data` follows `prefix` in memory, zstd's match finder takes them as
    /// one stretch of text, which is faster than a prefix apart.
    pub(super) fn compress(
        &mut self,
        data: &[u8],
        prefix: &[u8],
        full_prefix_len: usize,
        basis_in_prefix: usize,
        out: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let high_level = self.high_level(data.len(), full_prefix_len);
        match self {
            LiteralCompressor::None => out.extend_from_slice(data),
            LiteralCompressor::Zstd(encoder) => {
                encoder.write_all(data)?;
                encoder.flush()?;
                out.append(encoder.get_mut());
            }
            LiteralCompressor::ZstdWindow {
                level,
                fast_level,
                entropy_level,
                little_redundancy,
                entropy_coding,
                budget,
                long_distance,
            } => {
                // The zstd window must reach from the literals back to the
                // start of the prefix.
                let span = (full_prefix_len + data.len()) as u64;
                // Long-distance matching finds basis text in a prefix of
                // several MiB; a small basis slice (a 1 KiB file chosen as
                // the basis of a 1 GiB body) gains nothing from it, and it
                // took a quarter of such an encoder's time.
                let long_distance = *long_distance && basis_in_prefix >= LONG_DISTANCE_PREFIX;
                if high_level {
                    debug_assert_eq!(prefix.len(), full_prefix_len);
                    // The high level finds nothing more than the entropy
                    // level in literals with little redundancy (random
                    // text, images, anything compressed) at 30-100 times
                    // its cost (level 19 spent about 80 µs on each 1 KiB
                    // random body of the pass-through bench): a pass at the
                    // entropy level against the same prefix tells, and is
                    // kept when it compresses no better than half (with
                    // entropy coding even if the fast stage's level goes
                    // without: a small body's bytes matter most).
                    let start = out.len();
                    let probe_level = (*entropy_level).max(1);
                    let written = compress_frame(probe_level, prefix, long_distance, data, out)?;
                    if written * 2 > data.len() {
                        *little_redundancy = true;
                        return Ok(());
                    }
                    out.truncate(start);
                    *budget -= span;
                    compress_frame(*level, prefix, long_distance, data, out)?;
                } else {
                    *budget = 0;
                    if !*entropy_coding && *little_redundancy {
                        store_frame(data, out);
                        return Ok(());
                    }
                    let level = if !*entropy_coding {
                        UNCODED_LEVEL.min(*fast_level)
                    } else if *little_redundancy {
                        *entropy_level
                    } else {
                        *fast_level
                    };
                    // At the fast level most of zstd's time went into
                    // indexing the prefix (a 1 %-edited window's literals
                    // are a twentieth of it). Matches are distances back
                    // from the literals, so compressing against the
                    // prefix's tail alone still decodes against the whole
                    // prefix.
                    let prefix = if long_distance {
                        prefix
                    } else {
                        let keep = fast_prefix_len(data.len());
                        &prefix[prefix.len().saturating_sub(keep)..]
                    };
                    let written = compress_frame(level, prefix, long_distance, data, out)?;
                    // Without entropy coding the ratio says little about
                    // what the entropy levels would do.
                    if *entropy_coding {
                        *little_redundancy = written * 2 > data.len();
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{
        EncoderOptions, LiteralCodec, LiteralCompressor, compress_frame, fast_prefix_len,
        store_frame,
    };
    use crate::hsync::encode::tests::{random_base64, words};

    fn little_redundancy(compressor: &LiteralCompressor) -> bool {
        match compressor {
            LiteralCompressor::ZstdWindow {
                little_redundancy, ..
            } => *little_redundancy,
            _ => unreachable!("a ZstdWindow compressor"),
        }
    }

    /// A window that compresses no better than half sends the next to the
    /// entropy level, and one that compresses better brings it back.
    #[test]
    fn the_fast_stage_drops_to_the_entropy_level_only_after_a_window_without_redundancy() {
        let options = EncoderOptions::default();
        // A known length beyond the budget: the fast stage from the start.
        let mut compressor =
            LiteralCompressor::new(LiteralCodec::ZstdWindow, &options, Some(1 << 30));
        let random = random_base64(256 << 10, 7);
        let text = b"the quick brown fox jumps over the lazy dog; ".repeat(6000);
        let mut out = Vec::new();
        compressor.compress(&text, &[], 0, 0, &mut out).unwrap();
        assert!(!little_redundancy(&compressor));
        assert!(out.len() * 10 < text.len(), "{}", out.len());

        out.clear();
        compressor
            .compress(&random, &text, text.len(), 0, &mut out)
            .unwrap();
        assert!(little_redundancy(&compressor));
        // Entropy coding still takes its quarter off.
        assert!(out.len() * 100 < random.len() * 80, "{}", out.len());

        // At the entropy level, random stays there and text comes back.
        out.clear();
        compressor
            .compress(&random, &random, random.len(), 0, &mut out)
            .unwrap();
        assert!(little_redundancy(&compressor));
        out.clear();
        compressor
            .compress(&text, &random, random.len(), 0, &mut out)
            .unwrap();
        assert!(!little_redundancy(&compressor));
        assert!(out.len() * 10 < text.len(), "{}", out.len());
    }

    fn high_level_budget(compressor: &LiteralCompressor) -> u64 {
        match compressor {
            LiteralCompressor::ZstdWindow { budget, .. } => *budget,
            _ => unreachable!("a ZstdWindow compressor"),
        }
    }

    /// Within the high-level budget, literals that the entropy level
    /// compresses no better than half are sent as it compressed them and
    /// spend none of the budget; compressible ones get the high level,
    /// which beats the entropy level on them.
    #[test]
    fn the_high_level_is_spent_only_on_literals_with_redundancy() {
        let options = EncoderOptions::default();
        let mut compressor = LiteralCompressor::new(LiteralCodec::ZstdWindow, &options, None);
        let budget = high_level_budget(&compressor);
        let random = random_base64(64 << 10, 3);
        let mut out = Vec::new();
        compressor.compress(&random, &[], 0, 0, &mut out).unwrap();
        assert_eq!(high_level_budget(&compressor), budget);
        assert!(out.len() * 100 < random.len() * 80, "{}", out.len());
        let mut probe = Vec::new();
        compress_frame(options.entropy_zstd_level, &[], false, &random, &mut probe).unwrap();
        assert_eq!(out, probe, "the entropy level's frame is what is sent");

        let text = words(64 << 10, 5);
        out.clear();
        compressor.compress(&text, &[], 0, 0, &mut out).unwrap();
        assert_eq!(high_level_budget(&compressor), budget - text.len() as u64);
        probe.clear();
        compress_frame(options.entropy_zstd_level, &[], false, &text, &mut probe).unwrap();
        assert!(out.len() < probe.len(), "{} vs {}", out.len(), probe.len());
    }

    /// A stored frame is a zstd frame of the data, in blocks no larger
    /// than zstd allows, after what `out` holds.
    #[test]
    fn a_stored_frame_decodes_with_zstd() {
        let block = super::ZSTD_BLOCK_MAX;
        for len in [1, 1000, block - 1, block, block + 1, 3 * block + 17] {
            let data = random_base64(len, len as u64);
            let mut out = b"before".to_vec();
            store_frame(&data, &mut out);
            assert_eq!(&out[..6], b"before");
            let frame = &out[6..];
            assert_eq!(frame.len(), 6 + len + len.div_ceil(block) * 3);
            let decoded = zstd::bulk::decompress(frame, len).unwrap();
            assert!(decoded == data, "len {len}");
        }
    }

    /// Without entropy coding, literals after a window without redundancy
    /// are stored; after one with redundancy they still get level -1's
    /// match finder.
    #[test]
    fn uncoded_literals_are_stored_only_after_a_window_without_redundancy() {
        let options = EncoderOptions::default();
        let mut compressor =
            LiteralCompressor::new(LiteralCodec::ZstdWindow, &options, Some(1 << 30));
        let random = random_base64(256 << 10, 9);
        let text = b"the quick brown fox jumps over the lazy dog; ".repeat(6000);
        let mut out = Vec::new();
        compressor.compress(&random, &[], 0, 0, &mut out).unwrap();
        assert!(little_redundancy(&compressor));
        let LiteralCompressor::ZstdWindow { entropy_coding, .. } = &mut compressor else {
            unreachable!()
        };
        *entropy_coding = false;
        out.clear();
        compressor
            .compress(&random, &random, random.len(), 0, &mut out)
            .unwrap();
        let mut stored = Vec::new();
        store_frame(&random, &mut stored);
        assert!(out == stored);

        // Redundancy seen by a coded window: level -1 for the next ones.
        let LiteralCompressor::ZstdWindow {
            little_redundancy, ..
        } = &mut compressor
        else {
            unreachable!()
        };
        *little_redundancy = false;
        out.clear();
        compressor
            .compress(&text, &random, random.len(), 0, &mut out)
            .unwrap();
        assert!(out.len() * 10 < text.len(), "{}", out.len());
        assert!(zstd::bulk::decompress(&out, text.len()).unwrap() == text);
    }

    /// The literal section is appended after what `out` already holds.
    #[test]
    fn literals_are_appended_to_the_stream() {
        let options = EncoderOptions::default();
        let text = b"the quick brown fox jumps over the lazy dog; ".repeat(100);
        let mut compressor = LiteralCompressor::new(LiteralCodec::ZstdWindow, &options, None);
        let mut out = b"kept".to_vec();
        compressor.compress(&text, &[], 0, 0, &mut out).unwrap();
        assert_eq!(&out[..4], b"kept");
        let decoded = zstd::bulk::decompress(&out[4..], text.len()).unwrap();
        assert_eq!(decoded, text);
    }

    /// The tail and the literals fill a power of two exactly, so the zstd
    /// window the frame declares reaches no further back than the tail.
    #[test]
    fn the_fast_prefix_tail_and_its_literals_fill_a_power_of_two() {
        for literal_len in [1, 100, 52_000, 52_429, 60_000, 525_696, 1 << 20, 5_081_728] {
            let tail = fast_prefix_len(literal_len);
            assert!((tail + literal_len).is_power_of_two(), "{literal_len}");
            assert!(tail * 2 >= literal_len * 3, "{literal_len}: tail {tail}");
            assert!(
                tail <= (4 * literal_len).max(256 << 10),
                "{literal_len}: tail {tail}"
            );
        }
    }
}

//! The accelerator side: turns a new body, arriving in chunks of any size,
//! into an hsync/1 stream against a client's basis signature.
//!
//! Memory is bounded by one window, the indexed basis signature and the
//! literal compressor, whatever the body size: the encoder keeps no
//! signature of the new body beyond the entries of the current window.
//!
//! It leaves out how the literals are compressed and at which zstd level
//! (`literals.rs`): here a window is matched, framed and counted.
//!
//! Main types: [`Encoder`], [`EncoderOptions`], [`EncodeSummary`].

use super::SignatureParams;
use super::basis::Basis;
use super::delta::DeltaCommand;
use super::frame::{Frame, Header, LiteralCodec};
use super::matcher::SIMD_BLOCKS;
use super::signature::{
    BasisSignature, SignatureBuilder, SignatureError, SignatureLimits, choose_block_size,
};
use super::{CONTEXT_LEN, DEFAULT_STRONG_LEN, MAX_BASIS_WINDOW, MAX_PREFIX_LEN, MAX_WINDOW_OUTPUT};

use held::HeldIndex;
pub use held::{HeldAnchors, SharedAnchors};
use literals::LiteralCompressor;
pub use literals::UNCODED_LEVEL;

mod held;
mod literals;

/// Codec 3's fast stage sends a window as the matcher's copies and
/// literals when its literals are at most this share of it (1 / N);
/// otherwise the window goes whole through zstd against the basis slice,
/// whose match finder also finds runs shorter than an anchor (text that
/// was changed all over).
const HELD_LITERAL_SHARE: usize = 4;

/// What can go wrong while encoding.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The zstd compressor failed.
    #[error("literal compressor failed: {0}")]
    Compressor(#[from] std::io::Error),
    /// Reading the basis body failed.
    #[error("reading the basis body failed: {0}")]
    Basis(std::io::Error),
    /// Reading the new body failed ([`Encoder::read_from`]).
    #[error("reading the body failed: {0}")]
    Input(std::io::Error),
}

/// Encoder settings; the defaults are what the proxies use.
#[derive(Debug, Clone, Copy)]
pub struct EncoderOptions {
    /// Budget for the new body's whole signature (raw bytes; the request
    /// header carries it in base64, so 4,608 bytes is 6 KiB of header).
    pub max_signature_bytes: usize,
    /// Smallest block size to choose (bytes); 1 KiB did best on the corpus.
    pub min_block_size: u32,
    /// Target window size (bytes); rounded to a multiple of the block size.
    /// Codec 3 uses `basis_window_bytes` instead.
    pub window_bytes: usize,
    /// Literal codec.
    pub codec: LiteralCodec,
    /// zstd level for literals while the stream's zstd work (prefix +
    /// literal bytes) is within `high_level_budget`.
    pub zstd_level: i32,
    /// zstd level for literals after that, so large bodies keep the
    /// throughput target.
    pub fast_zstd_level: i32,
    /// zstd level instead of `fast_zstd_level` for a window that follows
    /// one whose literals compressed no better than half: there the match
    /// finder found little to pay for its search. Random base64 compresses
    /// to 0.754x by entropy alone at levels 1 and 3 alike, and level 3 took
    /// twice the time (with the prefix to index, 2.5-3.0 s per GiB against
    /// 1.3); a window at this level that compresses better than half goes
    /// back to `fast_zstd_level`.
    pub entropy_zstd_level: i32,
    /// Bytes of zstd work (prefix + literals) per stream done at
    /// `zstd_level`; web assets fit, large bodies move on to
    /// `fast_zstd_level`.
    pub high_level_budget: u64,
    /// zstd level for codec 3 (against the basis body), within
    /// `basis_high_level_budget`: measured on the corpus, level 12 sends
    /// 0.228x gzip -9 where 19 sends 0.215x, in a quarter of the time.
    pub basis_zstd_level: i32,
    /// Bytes of zstd work per stream at `basis_zstd_level`; its prefix
    /// holds up to 6 MiB of basis, so this is larger than for codec 2.
    pub basis_high_level_budget: u64,
    /// Target window size for codec 3 (bytes), at most
    /// [`MAX_BASIS_WINDOW`](super::MAX_BASIS_WINDOW) and not rounded to
    /// blocks: there is no basis signature to match. Each window's zstd
    /// work starts by indexing its prefix (up to 7 MiB of basis and
    /// context, whatever the window's size), so larger windows are faster:
    /// on a 64 MiB text with 1 % edits, 1.4 MiB windows took 0.47 s of CPU
    /// and 3 MiB ones 0.29 s, sending 2 % more.
    pub basis_window_bytes: usize,
    /// Caps for the basis signature.
    pub signature_limits: SignatureLimits,
}

/// The smallest window our encoder makes for a new body of
/// `block_size`-byte blocks, whatever its configured window: eight blocks,
/// the batch the signature builder hashes at once, so that every window
/// sends SIG entries. A large body's 1 MiB blocks make 8 MiB windows
/// where 1 MiB is configured; the decoding end, which learns the block size
/// from the stream's header, sizes its share of memory by it too.
pub fn min_window_len(block_size: u32) -> usize {
    SIMD_BLOCKS * block_size as usize
}

impl Default for EncoderOptions {
    fn default() -> Self {
        EncoderOptions {
            max_signature_bytes: 4608,
            min_block_size: 1024,
            window_bytes: 1 << 20,
            codec: LiteralCodec::ZstdWindow,
            zstd_level: 19,
            fast_zstd_level: 3,
            entropy_zstd_level: 1,
            high_level_budget: 2 << 20,
            basis_zstd_level: 12,
            basis_high_level_budget: 16 << 20,
            basis_window_bytes: MAX_BASIS_WINDOW,
            signature_limits: SignatureLimits::default(),
        }
    }
}

/// How the basis signature was used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BasisUse {
    /// No signature was offered: a from-scratch stream.
    Absent,
    /// The signature was used whole.
    Whole,
    /// The signature was cut inside an entry; its whole entries were used.
    Truncated,
    /// The signature failed validation: a from-scratch stream.
    Unusable(SignatureError),
    /// The encoder held the basis body itself (codec 3).
    Body,
}

/// What an encoding produced, for logs, stats and the caller's choices.
#[derive(Debug, Clone)]
pub struct EncodeSummary {
    /// Bytes of new body encoded.
    pub body_len: u64,
    /// blake3 of the new body.
    pub digest: [u8; 32],
    /// Bytes of new body sent as basis copies.
    pub copied_bytes: u64,
    /// Bytes of new body sent as literals (before compression).
    pub literal_bytes: u64,
    /// Bytes of compressed literal sections.
    pub literal_wire_bytes: u64,
    /// Bytes of signature entries sent in SIG frames.
    pub signature_wire_bytes: u64,
    /// Bytes of the whole stream.
    pub stream_bytes: u64,
    /// Windows whose literals went without entropy coding because the
    /// caller said it did not pay ([`Encoder::set_entropy_coding`]).
    pub uncoded_windows: u64,
    /// How the basis signature was used.
    pub basis: BasisUse,
    /// The new body's signature parameters.
    pub params: SignatureParams,
    /// True when the stream is estimated larger than the body compressed
    /// alone at the same level (the estimate assumes copied bytes would
    /// have compressed as well as the literals did). Callers may use it to
    /// stop offering the basis, or to report it. Always false for codec 3,
    /// whose literals are compressed against the basis: telling would take
    /// a second compression.
    pub is_larger_than_plain: bool,
}

/// Streams a new body into an hsync/1 stream.
pub struct Encoder {
    basis: Option<BasisSignature>,
    /// The basis body, when the encoder holds it (codec `ZstdBasis`).
    basis_body: Option<Box<dyn Basis + Send + Sync>>,
    /// The matcher over `basis_body`'s anchors, made for the first window
    /// encoded in the fast stage.
    held: Option<HeldIndex>,
    /// Anchors of `basis_body` shared with other encoders, if the caller
    /// keeps them ([`Encoder::share_held_anchors`]).
    shared_anchors: Option<SharedAnchors>,
    basis_use: BasisUse,
    header: Header,
    window_bytes: usize,
    /// New-body bytes not yet encoded; starts with the held-back tail of
    /// the previous window.
    window: Vec<u8>,
    /// The held-back tail's length, at the window's front: those bytes are
    /// already in the new signature. A window fills to `window_bytes` past
    /// them, so the signature builder gets whole windows (a multiple of
    /// its SIMD batch) and copies nothing to complete a batch: when every
    /// window followed a held-back tail, completing batches copied most of
    /// the body (5 % of the encoder's CPU on 1 KiB basis blocks).
    carried: usize,
    literals: LiteralCompressor,
    signature: SignatureBuilder,
    signature_sent: usize,
    hasher: blake3::Hasher,
    header_written: bool,
    // Scratch buffers reused across windows.
    matches: Vec<(DeltaCommand, std::ops::Range<usize>)>,
    /// The last window ended with a copy (nothing held back).
    after_copy: bool,
    commands: Vec<u8>,
    /// The body's last bytes before the window (codecs 2 and 3).
    context: Vec<u8>,
    /// The basis slice (`ZstdBasis`) and the window's reference prefix
    /// (codec 2: the context, then the window's copied bytes).
    basis_part: Vec<u8>,
    prefix: Vec<u8>,
    summary: Counters,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    body_len: u64,
    copied_bytes: u64,
    literal_bytes: u64,
    literal_wire_bytes: u64,
    signature_wire_bytes: u64,
    stream_bytes: u64,
    windows: u64,
    uncoded_windows: u64,
}

impl Encoder {
    /// An encoder against `basis_signature` (absent or unusable gives a
    /// from-scratch stream, never an error), for a body expected to be
    /// `expected_len` bytes (from Content-Length; else pass the basis size
    /// or `None`), which sizes the new signature's blocks.
    pub fn new(
        basis_signature: Option<&[u8]>,
        expected_len: Option<u64>,
        mut options: EncoderOptions,
    ) -> Self {
        // Codec 3 needs the basis body (`with_basis_body`); without it the
        // nearest codec is 2.
        if options.codec == LiteralCodec::ZstdBasis {
            options.codec = LiteralCodec::ZstdWindow;
        }
        let (basis, basis_use) = match basis_signature {
            None => (None, BasisUse::Absent),
            Some(bytes) => match BasisSignature::parse(bytes, options.signature_limits) {
                Ok(sig) if sig.is_truncated() => (Some(sig), BasisUse::Truncated),
                Ok(sig) => (Some(sig), BasisUse::Whole),
                Err(error) => (None, BasisUse::Unusable(error)),
            },
        };
        let known_len = expected_len;
        let expected_len = expected_len.unwrap_or_else(|| {
            basis
                .as_ref()
                .map_or(0, |b| b.blocks() as u64 * u64::from(b.params().block_size))
        });
        let params = SignatureParams {
            block_size: choose_block_size(
                expected_len,
                options.max_signature_bytes,
                options.min_block_size,
            ),
            strong_len: DEFAULT_STRONG_LEN,
        };
        // The window must hold the largest basis block twice so that the
        // held-back tail (< one block) never stops progress, and stay a
        // multiple of the new signature's block size. It also holds at
        // least SIMD_BLOCKS new blocks, the batch the signature builder
        // hashes in SIMD lanes, so that every window sends SIG entries; and
        // up to four of the matcher's batches of basis blocks (within
        // 8 MiB), so that window ends do not cut most batches short: a
        // batch of fewer than 8 blocks is hashed one block at a time.
        let largest_block = basis.as_ref().map_or(params.block_size, |b| {
            b.params().block_size.max(params.block_size)
        }) as usize;
        let basis_block = basis.as_ref().map_or(0, |b| b.params().block_size) as usize;
        let block = params.block_size as usize;
        let window_bytes = options
            .window_bytes
            .max(2 * largest_block)
            .max(min_window_len(params.block_size))
            .max((4 * SIMD_BLOCKS * basis_block).min(8 << 20))
            .div_ceil(block)
            .saturating_mul(block)
            .min(MAX_WINDOW_OUTPUT - largest_block);
        Encoder {
            basis,
            basis_use,
            header: Header {
                block_size: params.block_size,
                strong_len: params.strong_len,
                codec: options.codec,
                sig_frames: true,
            },
            window_bytes,
            window: Vec::new(),
            carried: 0,
            literals: LiteralCompressor::new(options.codec, &options, known_len),
            signature: SignatureBuilder::new(params),
            signature_sent: 0,
            hasher: blake3::Hasher::new(),
            header_written: false,
            matches: Vec::new(),
            after_copy: false,
            commands: Vec::new(),
            context: Vec::new(),
            basis_part: Vec::new(),
            prefix: Vec::new(),
            summary: Counters::default(),
            basis_body: None,
            held: None,
            shared_anchors: None,
        }
    }

    /// An encoder that holds the client's basis body itself (the client
    /// named it by blake3 and the accelerator kept a copy): literals are
    /// compressed against the basis text around each window (codec
    /// `ZstdBasis`), which needs no signature and finds edits smaller than a
    /// block. With `LiteralCodec::None` the body is not used (from scratch).
    pub fn with_basis_body(
        basis_body: Box<dyn Basis + Send + Sync>,
        expected_len: Option<u64>,
        mut options: EncoderOptions,
    ) -> Self {
        let expected_len = expected_len.unwrap_or(basis_body.size());
        if options.codec == LiteralCodec::None {
            return Encoder::new(None, Some(expected_len), options);
        }
        options.codec = LiteralCodec::ZstdBasis;
        let mut encoder = Encoder::new(None, Some(expected_len), options);
        // None of `new`'s window rules apply: there are no basis blocks to
        // hold back or batch, and the new signature's builder batches its
        // blocks itself. The window must stay within its basis slice (see
        // `MAX_BASIS_WINDOW`).
        encoder.window_bytes = options.basis_window_bytes.clamp(1, MAX_BASIS_WINDOW);
        encoder.header.codec = LiteralCodec::ZstdBasis;
        encoder.literals =
            LiteralCompressor::new(LiteralCodec::ZstdBasis, &options, Some(expected_len));
        encoder.basis_body = Some(basis_body);
        encoder.basis_use = BasisUse::Body;
        encoder
    }

    /// Takes the held body's anchors from `anchors`, or builds them there
    /// for the encoders after this one, instead of indexing the body for
    /// this stream alone (a quarter of codec 3's encode on a 64 MiB body).
    /// `anchors` must be for the very body given to
    /// [`Encoder::with_basis_body`] (the accelerator keys them by its
    /// digest); other anchors would only cost matches, never a wrong byte.
    pub fn share_held_anchors(&mut self, anchors: SharedAnchors) {
        self.shared_anchors = Some(anchors);
    }

    /// Leaves the SIG frames out of the stream, by the client's agreement:
    /// it computes the new body's signature from the bytes it rebuilds
    /// (our decoder does anyway) and holds the body until END verifies it,
    /// since no SIG entry vouches for a prefix. Call before the first push.
    pub fn leave_out_sig_frames(&mut self) {
        debug_assert!(!self.header_written, "the header says it");
        self.header.sig_frames = false;
    }

    /// How the basis signature is being used.
    pub fn basis_use(&self) -> &BasisUse {
        &self.basis_use
    }

    /// True once literals are compressed at the fast levels (past the
    /// high-level budget, or from the start for a body known to exceed
    /// it): from then on [`Encoder::set_entropy_coding`] applies.
    pub fn is_in_fast_stage(&self) -> bool {
        self.literals.is_in_fast_stage()
    }

    /// Whether the fast stage's literals get entropy coding (the default).
    /// Without it they are stored, or compressed at [`UNCODED_LEVEL`]
    /// (matches only) after a window with redundancy: several times faster
    /// on each end, for a caller whose link drains faster than entropy
    /// coding can feed it (see `crate::accelerator::pace`).
    pub fn set_entropy_coding(&mut self, on: bool) {
        self.literals.set_entropy_coding(on);
    }

    /// DELTA frames written so far.
    pub fn windows_encoded(&self) -> u64 {
        self.summary.windows
    }

    /// See [`Encoder::set_entropy_coding`].
    pub fn entropy_coding(&self) -> bool {
        self.literals.entropy_coding()
    }

    /// The window's size as this encoder chose it: the configured
    /// `window_bytes`, or more where the body's blocks need it (eight of
    /// them at least: a large body's 1 MiB blocks make 8 MiB windows).
    pub fn window_len(&self) -> usize {
        self.window_bytes
    }

    /// Bytes that [`Encoder::push`] takes before the window is full and
    /// gets encoded: a shorter push only copies (cheap enough for an async
    /// task; a push this long or longer is CPU work).
    pub fn window_room(&self) -> usize {
        self.window_full() - self.window.len()
    }

    /// Gives back the scratch memory that each window rebuilds anyway (the
    /// prefix, literals, commands and matches: a few MiB after a large
    /// window), shrinks the window buffer to what it holds and the context
    /// to the last [`CONTEXT_LEN`] bytes that the next prefix reads. For a
    /// caller about to wait long (a reader that stopped reading): the
    /// stream is the same, the next window allocates again.
    pub fn release_buffers(&mut self) {
        self.matches = Vec::new();
        self.commands = Vec::new();
        self.basis_part = Vec::new();
        self.prefix = Vec::new();
        self.window.shrink_to_fit();
        let extra = self.context.len().saturating_sub(CONTEXT_LEN);
        self.context.drain(..extra);
        self.context.shrink_to_fit();
    }

    /// Feeds the next bytes of the body, appending any completed frames to
    /// `out` (possibly none until a window fills).
    ///
    /// # Errors
    /// The literal compressor failed.
    pub fn push(&mut self, mut chunk: &[u8], out: &mut Vec<u8>) -> Result<(), EncodeError> {
        self.write_header(out);
        while !chunk.is_empty() {
            let room = self.window_full() - self.window.len();
            let take = room.min(chunk.len());
            self.window.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if self.window.len() == self.window_full() {
                self.encode_window(false, out)?;
            }
        }
        Ok(())
    }

    /// Reads the next bytes of the body from `input` straight into the
    /// window, until the window is full (then encodes it, appending its
    /// frames to `out`, as [`push`](Self::push) would) or `input` ends.
    /// For a caller that reads the body from a file or pipe: `push` would
    /// copy each byte from the caller's buffer into the window (6 % of
    /// the command-line encoder's instructions), and std's `read_to_end`
    /// reads into the window's spare capacity without zeroing it first.
    /// Returns the bytes read: 0 once `input` is at its end.
    ///
    /// # Errors
    /// [`EncodeError::Input`] when reading fails; the literal compressor
    /// failed.
    pub fn read_from(
        &mut self,
        input: &mut (impl std::io::Read + ?Sized),
        out: &mut Vec<u8>,
    ) -> Result<usize, EncodeError> {
        use std::io::Read;
        self.write_header(out);
        let room = self.window_full() - self.window.len();
        self.window.reserve(room);
        let read = input
            .take(room as u64)
            .read_to_end(&mut self.window)
            .map_err(EncodeError::Input)?;
        if self.window.len() == self.window_full() {
            self.encode_window(false, out)?;
        }
        Ok(read)
    }

    /// Ends the body: encodes what is left, then the last SIG entries and
    /// END.
    ///
    /// # Errors
    /// The literal compressor failed.
    pub fn finish(mut self, out: &mut Vec<u8>) -> Result<EncodeSummary, EncodeError> {
        self.write_header(out);
        if !self.window.is_empty() {
            self.encode_window(true, out)?;
        }
        self.signature.finish();
        self.write_signature(out);
        let digest = *self.hasher.finalize().as_bytes();
        let start = out.len();
        Frame::End {
            len: self.summary.body_len,
            digest,
        }
        .write(out);
        self.summary.stream_bytes += (out.len() - start) as u64;
        let c = self.summary;
        let plain_estimate = if c.literal_bytes == 0 || self.basis_body.is_some() {
            u64::MAX
        } else {
            (c.literal_wire_bytes as u128 * u128::from(c.body_len) / u128::from(c.literal_bytes))
                as u64
        };
        Ok(EncodeSummary {
            body_len: c.body_len,
            digest,
            copied_bytes: c.copied_bytes,
            literal_bytes: c.literal_bytes,
            literal_wire_bytes: c.literal_wire_bytes,
            signature_wire_bytes: c.signature_wire_bytes,
            stream_bytes: c.stream_bytes,
            uncoded_windows: c.uncoded_windows,
            basis: self.basis_use,
            params: self.signature.params(),
            is_larger_than_plain: c.stream_bytes > plain_estimate,
        })
    }

    fn write_header(&mut self, out: &mut Vec<u8>) {
        if !self.header_written {
            self.header.write(out);
            self.header_written = true;
            self.summary.stream_bytes += super::HEADER_LEN as u64;
        }
    }

    /// Encodes the window buffer as one DELTA frame (+ SIG). Unless this is
    /// the last window, a trailing literal shorter than a basis block is
    /// held back for the next window, where it may start a match.
    fn encode_window(&mut self, is_last: bool, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        self.commands.clear();
        self.prefix.clear();
        let mut covered = self.window.len();
        // With a basis signature, `prefix` holds the reference prefix's
        // tail and then the literals, which start at `prefix_end`; the
        // whole prefix would be `full_prefix_len` bytes.
        let mut prefix_end = 0;
        let mut full_prefix_len = 0;
        // Codec 3's fast stage: the literals that the held basis's copies
        // leave, in `prefix` after the context's tail.
        let matched = self.match_held_body(covered)?;
        match &self.basis {
            None if matched.is_some() => {
                (prefix_end, full_prefix_len) = matched.expect("checked");
            }
            None => {
                DeltaCommand::Literal {
                    len: covered as u64,
                }
                .write(&mut self.commands);
                // The literals are the window itself: compressed from it
                // below, not copied.
                self.summary.literal_bytes += covered as u64;
            }
            Some(basis) => {
                let mut parsed = std::mem::take(&mut self.matches);
                parsed.clear();
                basis.diff(&self.window, self.after_copy, &mut parsed);
                // The body's tail may be exactly the basis's short last block.
                if is_last
                    && let Some(&(DeltaCommand::Literal { len }, _)) = parsed.last()
                    && let Some(offset) =
                        basis.last_block_offset(&self.window[covered - len as usize..covered])
                {
                    parsed.pop();
                    parsed.push((DeltaCommand::Copy { offset, len }, 0..0));
                }
                if !is_last && let Some((DeltaCommand::Literal { len }, range)) = parsed.last_mut()
                {
                    let hold = (*len).min(u64::from(basis.params().block_size) - 1);
                    *len -= hold;
                    range.end -= hold as usize;
                    covered -= hold as usize;
                    if *len == 0 {
                        parsed.pop();
                    }
                }
                // Codec 2's prefix is the context and then the window's
                // copied bytes (see `window_prefix`). Only the tail that
                // the compressor will use is built (at the fast level a
                // few times the literals, not the window's megabytes of
                // copies), and the literals go right after it in the same
                // buffer: zstd then takes them as the continuation of the
                // prefix, not as data against an external dictionary, and
                // its faster contiguous match finder runs.
                let (mut copied, mut literal_len) = (0, 0);
                for (command, _) in &parsed {
                    command.write(&mut self.commands);
                    match *command {
                        DeltaCommand::Copy { len, .. } => copied += len as usize,
                        DeltaCommand::Literal { len } => literal_len += len as usize,
                    }
                }
                self.summary.copied_bytes += copied as u64;
                self.summary.literal_bytes += literal_len as u64;
                if self.literals.is_windowed() {
                    let context = super::context_tail(&self.context, covered as u64);
                    let whole = context.len() + copied;
                    full_prefix_len = whole.min(MAX_PREFIX_LEN);
                    let keep = self.literals.prefix_needed(literal_len, full_prefix_len);
                    let skip = whole - keep;
                    self.prefix.reserve(keep + literal_len);
                    self.prefix
                        .extend_from_slice(&context[skip.min(context.len())..]);
                    // `in_prefix`: where the next copy starts in [context | copies].
                    let (mut at, mut in_prefix) = (0, context.len());
                    for (command, _) in &parsed {
                        let len = command.output_len() as usize;
                        if let DeltaCommand::Copy { .. } = command {
                            let end = in_prefix + len;
                            if end > skip {
                                let from = skip.saturating_sub(in_prefix);
                                self.prefix
                                    .extend_from_slice(&self.window[at + from..at + len]);
                            }
                            in_prefix = end;
                        }
                        at += len;
                    }
                }
                prefix_end = self.prefix.len();
                for (_, range) in &parsed {
                    self.prefix.extend_from_slice(&self.window[range.clone()]);
                }
                self.after_copy = matches!(parsed.last(), Some((DeltaCommand::Copy { .. }, _)))
                    && covered == self.window.len();
                self.matches = parsed;
            }
        }
        let windowed = self.literals.is_windowed();
        if windowed
            && self.basis.is_none()
            && matched.is_none()
            && covered > 0
            && let Some(body) = &self.basis_body
        {
            let range = super::basis_slice(self.summary.body_len, covered as u64, body.size());
            self.basis_part.clear();
            body.append_range(
                range.start,
                (range.end - range.start) as usize,
                &mut self.basis_part,
            )
            .map_err(EncodeError::Basis)?;
            super::window_prefix(
                &self.basis_part,
                &self.context,
                &[],
                covered as u64,
                &mut self.prefix,
            );
            full_prefix_len = self.prefix.len();
            prefix_end = full_prefix_len;
        }
        let literals = match self.basis {
            None if matched.is_none() => &self.window[..covered],
            _ => &self.prefix[prefix_end..],
        };
        // Without a basis the prefix is the context's tail (what
        // `window_prefix` would copy out of it).
        let reference = if windowed && self.basis.is_none() && self.basis_body.is_none() {
            let tail = super::context_tail(&self.context, covered as u64);
            let tail = &tail[tail.len().saturating_sub(MAX_PREFIX_LEN)..];
            full_prefix_len = tail.len();
            tail
        } else {
            &self.prefix[prefix_end.saturating_sub(MAX_PREFIX_LEN)..prefix_end]
        };
        // The prefix is [basis slice | context tail], cut from the front;
        // the matched windows use a tail of the context alone.
        let basis_in_prefix = match &self.basis_body {
            Some(_) if matched.is_some() => 0,
            Some(_) => reference
                .len()
                .saturating_sub(super::context_tail(&self.context, covered as u64).len()),
            None => 0,
        };
        self.summary.windows += 1;
        if !literals.is_empty() && self.is_in_fast_stage() && !self.entropy_coding() {
            self.summary.uncoded_windows += 1;
        }
        // Room for this window's frames: the DELTA, then SIG entries for
        // its blocks (and END), so that appending them never moves the
        // window's bytes (a realloc of `out` was 6 % of the encoder's CPU).
        let entries = covered / self.header.block_size as usize + 2;
        out.reserve(
            2 * super::FRAME_PREFIX_LEN
                + 4
                + self.commands.len()
                + zstd_safe::compress_bound(literals.len())
                + entries * self.signature.params().entry_len()
                + super::END_LEN
                + super::FRAME_PREFIX_LEN,
        );
        let start = out.len();
        let mut literal_wire_bytes = 0;
        super::frame::write_delta_with(&self.commands, out, |out| {
            let before = out.len();
            self.literals
                .compress(literals, reference, full_prefix_len, basis_in_prefix, out)?;
            literal_wire_bytes = out.len() - before;
            Ok::<_, std::io::Error>(())
        })?;
        self.summary.stream_bytes += (out.len() - start) as u64;
        self.summary.literal_wire_bytes += literal_wire_bytes as u64;

        self.hasher.update(&self.window[..covered]);
        if self.header.sig_frames {
            // The held-back tail too: it is the body's next bytes whatever
            // the next window makes of them (see `carried`).
            self.signature.update(&self.window[self.carried..]);
        }
        self.summary.body_len += covered as u64;
        if windowed && covered >= CONTEXT_LEN {
            // The window's bytes are the whole context now: the window
            // becomes the context, and the old context's buffer the next
            // window. Copying the window's last MiB into the context was
            // most of the encoder's memcpy.
            let mut next = std::mem::take(&mut self.context);
            next.clear();
            next.extend_from_slice(&self.window[covered..]);
            self.window.truncate(covered);
            self.context = std::mem::replace(&mut self.window, next);
        } else {
            if windowed {
                super::extend_context(&mut self.context, &self.window[..covered]);
            }
            self.window.drain(..covered);
        }
        self.carried = self.window.len();
        self.write_signature(out);
        Ok(())
    }

    /// Codec 3's fast stage: diffs the window's first `covered` bytes
    /// against the held basis body. When the literals are few enough
    /// (`HELD_LITERAL_SHARE`), writes the commands, counts them, puts the
    /// context's tail that the fast level compresses against in `prefix`
    /// with the literals after it, and returns (where the literals start,
    /// the prefix's length): a tail of the window's reference prefix
    /// ([basis slice | context tail], see `window_prefix`), so it decodes
    /// as any codec 3 window does, while zstd indexes some 256 KiB of
    /// context instead of up to 7 MiB of basis and context. `None`, with
    /// nothing written, when the window goes the whole-literal way.
    ///
    /// # Errors
    /// Reading the basis failed.
    fn match_held_body(&mut self, covered: usize) -> Result<Option<(usize, usize)>, EncodeError> {
        let Some(body) = &self.basis_body else {
            return Ok(None);
        };
        if covered == 0 || !self.literals.is_windowed() || !self.literals.is_in_fast_stage() {
            return Ok(None);
        }
        let index = match &mut self.held {
            Some(index) => index,
            None => {
                let anchors = match &self.shared_anchors {
                    Some(shared) => shared.get_or_build(body.as_ref()),
                    None => HeldAnchors::build(body.as_ref()).map(std::sync::Arc::new),
                };
                self.held
                    .insert(HeldIndex::over(anchors.map_err(EncodeError::Basis)?))
            }
        };
        let mut parsed = std::mem::take(&mut self.matches);
        parsed.clear();
        index
            .diff(body.as_ref(), &self.window[..covered], &mut parsed)
            .map_err(EncodeError::Basis)?;
        let literal_len: usize = parsed.iter().map(|(_, range)| range.len()).sum();
        if literal_len * HELD_LITERAL_SHARE > covered {
            self.matches = parsed;
            return Ok(None);
        }
        for (command, _) in &parsed {
            command.write(&mut self.commands);
        }
        self.summary.copied_bytes += (covered - literal_len) as u64;
        self.summary.literal_bytes += literal_len as u64;
        let context = super::context_tail(&self.context, covered as u64);
        let keep = literals::fast_prefix_len(literal_len).min(context.len());
        self.prefix.reserve(keep + literal_len);
        self.prefix
            .extend_from_slice(&context[context.len() - keep..]);
        for (_, range) in &parsed {
            self.prefix.extend_from_slice(&self.window[range.clone()]);
        }
        self.matches = parsed;
        Ok(Some((keep, keep)))
    }

    /// The window's length when it is encoded (but the last).
    fn window_full(&self) -> usize {
        self.window_bytes + self.carried
    }

    /// Sends the signature entries completed since the last SIG frame, of
    /// blocks the DELTA frames have covered (the builder may be ahead by a
    /// held-back tail).
    fn write_signature(&mut self, out: &mut Vec<u8>) {
        if !self.header.sig_frames {
            return;
        }
        let params = self.signature.params();
        let all = self.signature.entries();
        let covered = if self.signature.is_finished() {
            all.len()
        } else {
            let blocks = self.summary.body_len / u64::from(params.block_size);
            (blocks as usize * params.entry_len()).min(all.len())
        };
        let entries = &all[self.signature_sent..covered.max(self.signature_sent)];
        if entries.is_empty() {
            return;
        }
        let start = out.len();
        Frame::Sig { entries }.write(out);
        self.summary.stream_bytes += (out.len() - start) as u64;
        self.summary.signature_wire_bytes += entries.len() as u64;
        self.signature_sent += entries.len();
    }
}

#[cfg(test)]
mod tests {
    use super::EncoderOptions;

    /// Base64-like bytes from a xorshift generator: 6 bits of entropy per
    /// byte and no repeats for zstd's match finder.
    pub(super) fn random_base64(len: usize, mut seed: u64) -> Vec<u8> {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ALPHABET[(seed % 64) as usize]
            })
            .collect()
    }

    /// Text of words drawn at random from a small vocabulary: redundant,
    /// but not a repeat that every level finds alike.
    pub(super) fn words(len: usize, mut seed: u64) -> Vec<u8> {
        const WORDS: [&str; 16] = [
            "proxy ",
            "delta ",
            "window ",
            "basis ",
            "signature ",
            "cache ",
            "stream ",
            "literal ",
            "block ",
            "origin ",
            "client ",
            "header ",
            "frame ",
            "digest ",
            "accelerator ",
            "rsync\n",
        ];
        let mut text = Vec::with_capacity(len + 16);
        while text.len() < len {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            text.extend_from_slice(WORDS[(seed % 16) as usize].as_bytes());
        }
        text.truncate(len);
        text
    }

    /// The window a large body gets is far past the configured one (its
    /// 1 MiB blocks, eight to a window): what a transfer's share of the
    /// memory budget must count (`Encoder::window_len`).
    #[test]
    fn a_large_bodys_window_is_eight_of_its_blocks_whatever_is_configured() {
        let options = EncoderOptions::default();
        assert_eq!(options.window_bytes, 1 << 20);
        let small = super::Encoder::new(None, Some(10 << 20), options);
        // The configured size, rounded up to whole blocks.
        assert!((1 << 20..2 << 20).contains(&small.window_len()));
        let large = super::Encoder::new(None, Some(1 << 30), options);
        assert_eq!(large.window_len(), 8 << 20);
    }

    /// `--bulk-level -1`: zstd's fast levels leave the literals of large
    /// bodies without entropy coding, and the stream still decodes.
    #[test]
    fn a_negative_fast_level_sends_random_literals_uncoded_and_decodes() {
        let options = EncoderOptions {
            fast_zstd_level: -1,
            entropy_zstd_level: -1,
            high_level_budget: 0,
            window_bytes: 64 << 10,
            ..EncoderOptions::default()
        };
        let new = random_base64(512 << 10, 11);
        let (decoded, _, summary) = super::super::tests::round_trip(&[], &new, 10_000, options);
        assert!(decoded == new);
        assert!(
            summary.literal_wire_bytes >= summary.literal_bytes,
            "{summary:?}"
        );
        let coded = super::super::tests::round_trip(
            &[],
            &new,
            10_000,
            EncoderOptions {
                fast_zstd_level: 3,
                entropy_zstd_level: 1,
                ..options
            },
        );
        assert!(coded.2.literal_wire_bytes * 100 < coded.2.literal_bytes * 80);
    }

    /// Entropy coding switched off and on window by window: the uncoded
    /// windows send random text whole, the coded ones take their quarter
    /// off, and the stream decodes to the body either way.
    #[test]
    fn entropy_coding_switches_per_window_and_decodes() {
        use crate::hsync::{DecodeLimits, Decoder};
        let window = 64 << 10;
        let options = EncoderOptions {
            high_level_budget: 0,
            window_bytes: window,
            // 1 KiB blocks, so that windows are exactly 64 KiB.
            max_signature_bytes: 16 << 10,
            ..EncoderOptions::default()
        };
        let new = random_base64(16 * window, 5);
        let mut encoder = super::Encoder::new(None, Some(new.len() as u64), options);
        assert!(encoder.is_in_fast_stage() && encoder.entropy_coding());
        let mut stream = Vec::new();
        let mut wire = [0usize; 2];
        for (n, piece) in new.chunks(window).enumerate() {
            let coded = n % 4 == 0;
            encoder.set_entropy_coding(coded);
            assert_eq!(encoder.entropy_coding(), coded);
            let before = stream.len();
            encoder.push(piece, &mut stream).unwrap();
            wire[usize::from(coded)] += stream.len() - before;
        }
        let summary = encoder.finish(&mut stream).unwrap();
        assert_eq!(summary.uncoded_windows, 12, "{summary:?}");
        assert!(wire[0] >= 12 * window, "{wire:?}");
        assert!(wire[1] * 100 < 4 * window * 80, "{wire:?}");
        let mut decoder = Decoder::new(&[], DecodeLimits::default());
        let mut body = Vec::new();
        decoder.push(&stream, &mut body).unwrap();
        decoder.finish().unwrap();
        assert!(body == new);
    }

    /// Releasing the buffers between pushes changes nothing in the stream,
    /// for each codec that keeps context between windows; a push shorter
    /// than the window's room only copies.
    /// `read_from` gives the stream that `push` gives, whatever pieces the
    /// reader hands out, for each codec's encoder.
    #[test]
    fn reading_from_a_reader_gives_the_pushed_stream() {
        use crate::hsync::SignatureParams;
        use std::io::Read;
        /// Hands out at most `piece` bytes per read.
        struct Trickle<'a>(&'a [u8], usize);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(self.1).min(buf.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let options = EncoderOptions {
            window_bytes: 64 << 10,
            ..EncoderOptions::default()
        };
        let basis = words(300 << 10, 4);
        let mut new = basis.clone();
        new.splice(70_000..70_000, random_base64(3000, 5));
        let signature = crate::hsync::sign(
            &basis,
            SignatureParams {
                block_size: 2048,
                strong_len: crate::hsync::DEFAULT_STRONG_LEN,
            },
        )
        .unwrap();
        let encoders = || {
            [
                super::Encoder::new(None, None, options),
                super::Encoder::new(Some(&signature), None, options),
                super::Encoder::with_basis_body(Box::new(basis.clone()), None, options),
            ]
        };
        for piece in [1000, 100_000] {
            for (mut pushed, mut read) in encoders().into_iter().zip(encoders()) {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                for chunk in new.chunks(7000) {
                    pushed.push(chunk, &mut a).unwrap();
                }
                let mut input = Trickle(&new, piece);
                while read.read_from(&mut input, &mut b).unwrap() > 0 {}
                let (sa, sb) = (pushed.finish(&mut a).unwrap(), read.finish(&mut b).unwrap());
                assert!(a == b, "piece {piece}: streams differ");
                assert_eq!(sa.body_len, sb.body_len);
            }
        }
    }

    #[test]
    fn releasing_buffers_between_pushes_leaves_the_stream_unchanged() {
        use crate::hsync::SignatureParams;
        let options = EncoderOptions {
            window_bytes: 64 << 10,
            ..EncoderOptions::default()
        };
        let basis = words(600 << 10, 1);
        let mut new = basis.clone();
        new.splice(100_000..100_000, random_base64(3000, 2));
        new.extend_from_slice(&random_base64(200 << 10, 3));
        let signature = crate::hsync::sign(
            &basis,
            SignatureParams {
                block_size: 2048,
                strong_len: crate::hsync::DEFAULT_STRONG_LEN,
            },
        )
        .unwrap();
        let encoders = || {
            [
                super::Encoder::new(None, None, options),
                super::Encoder::new(Some(&signature), None, options),
                super::Encoder::with_basis_body(Box::new(basis.clone()), None, options),
            ]
        };
        for (mut plain, mut releasing) in encoders().into_iter().zip(encoders()) {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for piece in new.chunks(5000) {
                plain.push(piece, &mut a).unwrap();
                let before = b.len();
                let copies_only = piece.len() < releasing.window_room();
                releasing.push(piece, &mut b).unwrap();
                if copies_only && before > 0 {
                    assert_eq!(b.len(), before);
                }
                releasing.release_buffers();
            }
            plain.finish(&mut a).unwrap();
            releasing.finish(&mut b).unwrap();
            assert!(a == b);
        }
    }

    /// Codec 3 windows are `basis_window_bytes`, at most
    /// `MAX_BASIS_WINDOW`, unrounded, whatever the new signature's blocks:
    /// 8 of them made 8 MiB windows on large bodies.
    #[test]
    fn codec3_windows_follow_basis_window_bytes_not_the_blocks() {
        use crate::hsync::MAX_BASIS_WINDOW;
        let basis = words(64 << 10, 6);
        let encoder = |len: u64, options| {
            super::Encoder::with_basis_body(Box::new(basis.clone()), Some(len), options)
        };
        let options = EncoderOptions::default();
        // 1 MiB blocks: `Encoder::new` would make 8 MiB windows.
        let large = encoder(1 << 30, options);
        assert_eq!(large.signature.params().block_size, 1 << 20);
        assert_eq!(large.window_room(), MAX_BASIS_WINDOW);
        let odd = EncoderOptions {
            basis_window_bytes: 5000,
            ..options
        };
        assert_eq!(encoder(1 << 30, odd).window_room(), 5000);
        let too_large = EncoderOptions {
            basis_window_bytes: 16 << 20,
            ..options
        };
        assert_eq!(encoder(1 << 20, too_large).window_room(), MAX_BASIS_WINDOW);
    }

    /// Encoders sharing a held body's anchors send the very stream each
    /// sends alone; the first builds them, the second finds them built.
    #[test]
    fn shared_held_anchors_leave_the_stream_unchanged_and_are_built_once() {
        let options = EncoderOptions {
            basis_high_level_budget: 0,
            ..EncoderOptions::default()
        };
        let basis = words(2 << 20, 8);
        let mut new = basis.clone();
        new.splice(500_000..500_000, random_base64(2000, 9));
        new[1_500_000..1_500_016].copy_from_slice(b"sixteen edited b");
        use super::SharedAnchors;
        let encode = |shared: Option<&SharedAnchors>| {
            let mut encoder = super::Encoder::with_basis_body(
                Box::new(basis.clone()),
                Some(new.len() as u64),
                options,
            );
            if let Some(shared) = shared {
                encoder.share_held_anchors(shared.clone());
            }
            let mut out = Vec::new();
            encoder.push(&new, &mut out).unwrap();
            let summary = encoder.finish(&mut out).unwrap();
            assert!(summary.copied_bytes > 2_000_000, "the fast stage copied");
            out
        };
        let alone = encode(None);
        let shared = SharedAnchors::default();
        assert!(!shared.is_built());
        assert!(encode(Some(&shared)) == alone);
        assert!(shared.is_built());
        let built = shared.get_or_build(&basis).unwrap();
        assert!(encode(Some(&shared)) == alone);
        assert!(std::sync::Arc::ptr_eq(
            &built,
            &shared.get_or_build(&basis).unwrap()
        ));
    }
}

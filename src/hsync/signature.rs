//! rsync signatures: validating the client's (untrusted) basis signature
//! before `fast_rsync` sees it, choosing the block size of a new signature,
//! and computing a body's signature incrementally as the body streams.
//!
//! Signatures use the librsync/fast_rsync MD4 format: a 12-byte header
//! (magic `0x72730136`, block size, strong-sum length) then one entry per
//! block (4-byte rollsum + `strong_len` bytes of MD4).
//!
//! Main types: [`BasisSignature`], [`SignatureBuilder`], [`SignatureParams`].

use std::ops::Range;

use fast_rsync::Signature;

use super::basis::Basis;
use super::delta::DeltaCommand;
use super::matcher::{BlockIndex, SIMD_BLOCKS};

use super::{
    DEFAULT_STRONG_LEN, MAX_BLOCK_SIZE, MAX_STRONG_LEN, MD4_MAGIC, MIN_BLOCK_SIZE, MIN_STRONG_LEN,
    SIGNATURE_HEADER_LEN, SignatureParams,
};

/// Why a basis signature cannot be used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SignatureError {
    /// More bytes than the configured cap.
    #[error("signature of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Shorter than the 12-byte header.
    #[error("signature of {len} bytes is shorter than its 12-byte header")]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// Not an MD4 signature (BLAKE2 signatures are not supported).
    #[error("signature magic {magic:#010x} is not the MD4 signature magic")]
    WrongMagic {
        /// The magic found.
        magic: u32,
    },
    /// Block size outside the accepted range (0 would hang fast_rsync).
    #[error("signature block size {block_size} outside {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}")]
    BlockSizeOutOfRange {
        /// The block size found.
        block_size: u32,
    },
    /// Strong-sum length outside the accepted range.
    #[error("signature strong sum length {strong_len} outside {MIN_STRONG_LEN}..={MAX_STRONG_LEN}")]
    StrongLenOutOfRange {
        /// The strong-sum length found.
        strong_len: u32,
    },
    /// The basis the signature describes is larger than we accept.
    #[error("signature describes a basis of {implied_len} bytes, over the limit of {max}")]
    BasisTooLarge {
        /// Blocks × block size.
        implied_len: u64,
        /// The limit.
        max: u64,
    },
}

/// Caps applied to a basis signature that came from the network.
#[derive(Debug, Clone, Copy)]
pub struct SignatureLimits {
    /// Largest signature accepted (bytes).
    pub max_bytes: usize,
    /// Largest basis a signature may describe (bytes).
    pub max_basis_len: u64,
}

impl Default for SignatureLimits {
    fn default() -> Self {
        SignatureLimits {
            max_bytes: 8 << 20,
            max_basis_len: 4 << 30,
        }
    }
}

/// Picks the block size for a body of `expected_len` bytes so that its whole
/// signature fits `max_signature_bytes`: never below `min_block_size` (itself
/// kept within [`MIN_BLOCK_SIZE`]..=[`MAX_BLOCK_SIZE`]), never above
/// [`MAX_BLOCK_SIZE`] (a body too large for that gets a signature over
/// budget, which the client sends truncated).
pub fn choose_block_size(
    expected_len: u64,
    max_signature_bytes: usize,
    min_block_size: u32,
) -> u32 {
    let entry_len = 4 + DEFAULT_STRONG_LEN as u64;
    let entries =
        (max_signature_bytes.saturating_sub(SIGNATURE_HEADER_LEN) as u64 / entry_len).max(1);
    let needed = expected_len.div_ceil(entries);
    // Round up to a multiple of 64 bytes: no reason beyond tidy numbers.
    let rounded = needed.div_ceil(64).saturating_mul(64);
    let min_block_size = min_block_size.clamp(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE);
    rounded.clamp(u64::from(min_block_size), u64::from(MAX_BLOCK_SIZE)) as u32
}

/// A client's basis signature that passed validation, indexed for diffing.
pub struct BasisSignature {
    index: BlockIndex,
    params: SignatureParams,
    blocks: usize,
    truncated: bool,
    /// The last entry, which describes the basis's (often short) last block.
    last_entry: Vec<u8>,
}

impl std::fmt::Debug for BasisSignature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasisSignature")
            .field("params", &self.params)
            .field("blocks", &self.blocks)
            .field("truncated", &self.truncated)
            .finish()
    }
}

impl BasisSignature {
    /// Validates a signature from the network and indexes it. A signature
    /// cut inside an entry (a header budget truncated it) keeps its whole
    /// entries: the blocks present are still good.
    ///
    /// # Errors
    /// Every check of [`SignatureError`], made before `fast_rsync` parses it.
    pub fn parse(bytes: &[u8], limits: SignatureLimits) -> Result<Self, SignatureError> {
        if bytes.len() > limits.max_bytes {
            return Err(SignatureError::TooLarge {
                len: bytes.len(),
                max: limits.max_bytes,
            });
        }
        let Some(header) = bytes.get(..SIGNATURE_HEADER_LEN) else {
            return Err(SignatureError::TooShort { len: bytes.len() });
        };
        let field =
            |i: usize| u32::from_be_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        let (magic, block_size, strong_len) = (field(0), field(4), field(8));
        if magic != MD4_MAGIC {
            return Err(SignatureError::WrongMagic { magic });
        }
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
            return Err(SignatureError::BlockSizeOutOfRange { block_size });
        }
        if !(MIN_STRONG_LEN..=MAX_STRONG_LEN).contains(&strong_len) {
            return Err(SignatureError::StrongLenOutOfRange { strong_len });
        }
        let params = SignatureParams {
            block_size,
            strong_len,
        };
        let body = &bytes[SIGNATURE_HEADER_LEN..];
        let blocks = body.len() / params.entry_len();
        let truncated = !body.len().is_multiple_of(params.entry_len());
        let implied_len = blocks as u64 * u64::from(block_size);
        if implied_len > limits.max_basis_len {
            return Err(SignatureError::BasisTooLarge {
                implied_len,
                max: limits.max_basis_len,
            });
        }
        let end = SIGNATURE_HEADER_LEN + blocks * params.entry_len();
        let last_entry = bytes[end
            .saturating_sub(params.entry_len())
            .max(SIGNATURE_HEADER_LEN)..end]
            .to_vec();
        Ok(BasisSignature {
            index: BlockIndex::new(params, &bytes[SIGNATURE_HEADER_LEN..end]),
            params,
            blocks,
            truncated,
            last_entry,
        })
    }

    /// The basis offset of its last block when `tail` (shorter than a
    /// block) is exactly that block. The matcher matches whole
    /// blocks only, so without this an unchanged body would send the
    /// basis's short last block as a literal.
    pub(crate) fn last_block_offset(&self, tail: &[u8]) -> Option<u64> {
        let block_size = self.params.block_size as usize;
        if tail.is_empty() || tail.len() >= block_size || self.last_entry.is_empty() {
            return None;
        }
        let signature = Signature::calculate(tail, self.params.options());
        (signature.serialized()[SIGNATURE_HEADER_LEN..] == self.last_entry[..])
            .then(|| (self.blocks as u64 - 1) * block_size as u64)
    }

    /// The signature's block size and strong-sum length.
    pub fn params(&self) -> SignatureParams {
        self.params
    }

    /// Number of whole blocks the signature describes.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Whether the signature was cut inside an entry.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }

    /// Matches `data` against the basis blocks: delta commands, with the
    /// literals as ranges of `data` (see [`BlockIndex::diff`]).
    pub(crate) fn diff(
        &self,
        data: &[u8],
        after_copy: bool,
        out: &mut Vec<(DeltaCommand, Range<usize>)>,
    ) {
        self.index.diff(data, after_copy, out);
    }
}

/// Computes a body's signature as the body arrives in pieces of any size;
/// the result equals `Signature::calculate` over the whole body.
#[derive(Debug, Clone)]
pub struct SignatureBuilder {
    params: SignatureParams,
    /// Body bytes not hashed yet: fewer than `SIMD_BLOCKS` blocks.
    pending: Vec<u8>,
    /// Entries of the completed blocks (no header).
    entries: Vec<u8>,
    finished: bool,
}

/// The whole signature (header + entries) of `basis` at `params`, read a
/// MiB at a time (a file basis by positional reads).
///
/// # Errors
/// Reading the basis failed.
pub fn sign(basis: &(impl Basis + ?Sized), params: SignatureParams) -> std::io::Result<Vec<u8>> {
    const CHUNK: u64 = 1 << 20;
    let mut builder = SignatureBuilder::new(params);
    let mut chunk = Vec::with_capacity(CHUNK as usize);
    let mut at = 0;
    while at < basis.size() {
        let len = CHUNK.min(basis.size() - at);
        chunk.clear();
        basis.append_range(at, len as usize, &mut chunk)?;
        builder.update(&chunk);
        at += len;
    }
    builder.finish();
    Ok(builder.to_signature_bytes())
}

impl SignatureBuilder {
    /// A builder for a body signed with `params`.
    ///
    /// # Panics
    /// If `params` are outside the accepted ranges (callers validate first).
    pub fn new(params: SignatureParams) -> Self {
        assert!((MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&params.block_size));
        assert!((MIN_STRONG_LEN..=MAX_STRONG_LEN).contains(&params.strong_len));
        SignatureBuilder {
            params,
            pending: Vec::new(),
            entries: Vec::new(),
            finished: false,
        }
    }

    /// The parameters this builder signs with.
    pub fn params(&self) -> SignatureParams {
        self.params
    }

    /// Adds the next bytes of the body. Whole blocks are hashed
    /// [`SIMD_BLOCKS`] at a time: fast_rsync hashes that many equal blocks
    /// in parallel lanes and one at a time otherwise, about four times
    /// slower. So entries lag the body by fewer than `SIMD_BLOCKS` blocks
    /// until [`finish`](Self::finish), and up to that many blocks are held
    /// (8 MiB at the largest block size).
    pub fn update(&mut self, mut data: &[u8]) {
        debug_assert!(!self.finished, "update after finish");
        let batch = SIMD_BLOCKS * self.params.block_size as usize;
        if !self.pending.is_empty() {
            let take = (batch - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.pending.len() < batch {
                return;
            }
            let pending = std::mem::take(&mut self.pending);
            self.push_blocks(&pending);
            self.pending = pending;
            self.pending.clear();
        }
        let whole = data.len() / batch * batch;
        if whole > 0 {
            self.push_blocks(&data[..whole]);
        }
        self.pending.extend_from_slice(&data[whole..]);
    }

    fn push_blocks(&mut self, blocks: &[u8]) {
        let signature = Signature::calculate(blocks, self.params.options());
        self.entries
            .extend_from_slice(&signature.serialized()[SIGNATURE_HEADER_LEN..]);
    }

    /// Entries of the blocks hashed so far (all but fewer than
    /// [`SIMD_BLOCKS`] of the completed ones; every block, the short last
    /// one included, once [`finish`](Self::finish) was called), without
    /// the header.
    pub fn entries(&self) -> &[u8] {
        &self.entries
    }

    /// Ends the body: the blocks still held, the short last one included,
    /// get their entries.
    pub fn finish(&mut self) {
        if !self.finished && !self.pending.is_empty() {
            let mut pending = std::mem::take(&mut self.pending);
            let block = self.params.block_size as usize;
            let whole = pending.len() / block;
            if whole >= 3 {
                // Three to seven whole blocks: hashed in SIMD lanes beside
                // copies of the first, whose entries are dropped, rather
                // than one at a time (a 64 MiB body's last ones were 1.6 %
                // of its encoding).
                let tail = pending.split_off(whole * block);
                for _ in whole..SIMD_BLOCKS {
                    pending.extend_from_within(..block);
                }
                let before = self.entries.len();
                self.push_blocks(&pending);
                self.entries
                    .truncate(before + whole * self.params.entry_len());
                pending = tail;
            }
            self.push_blocks(&pending);
        }
        self.finished = true;
    }

    /// Whether [`finish`](Self::finish) was called.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The whole serialized signature (header + entries) so far.
    pub fn to_signature_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(SIGNATURE_HEADER_LEN + self.entries.len());
        bytes.extend_from_slice(&self.params.header_bytes());
        bytes.extend_from_slice(&self.entries);
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS: SignatureParams = SignatureParams {
        block_size: 1024,
        strong_len: 8,
    };

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 13) as u8).collect()
    }

    fn calculate(body: &[u8]) -> Vec<u8> {
        Signature::calculate(body, PARAMS.options()).into_serialized()
    }

    #[test]
    fn builder_equals_fast_rsync_for_any_split() {
        let body = sample(5000);
        for split in [0, 1, 1023, 1024, 1025, 3000, 4999, 5000] {
            let mut builder = SignatureBuilder::new(PARAMS);
            builder.update(&body[..split]);
            builder.update(&body[split..]);
            builder.finish();
            assert_eq!(
                builder.to_signature_bytes(),
                calculate(&body),
                "split {split}"
            );
        }
    }

    /// Past eight blocks the builder hashes in batches; pieces of any size
    /// still give fast_rsync's signature, and entries never lag the body
    /// by `SIMD_BLOCKS` blocks or more.
    #[test]
    fn batched_builder_equals_fast_rsync_and_lags_less_than_a_batch() {
        let block = PARAMS.block_size as usize;
        let body = sample(21 * block + 77);
        for piece in [
            1,
            700,
            block,
            block + 1,
            3 * block - 5,
            8 * block,
            9 * block + 3,
        ] {
            let mut builder = SignatureBuilder::new(PARAMS);
            let mut fed = 0;
            for chunk in body.chunks(piece) {
                builder.update(chunk);
                fed += chunk.len();
                let hashed = builder.entries().len() / PARAMS.entry_len();
                assert!(fed / block - hashed < SIMD_BLOCKS, "piece {piece} at {fed}");
            }
            builder.finish();
            assert_eq!(
                builder.to_signature_bytes(),
                calculate(&body),
                "piece {piece}"
            );
        }
    }

    /// `finish` hashes three to seven whole blocks beside padding copies
    /// in SIMD lanes: the entries are still fast_rsync's, with or without
    /// a short last block.
    #[test]
    fn finish_of_any_count_of_blocks_equals_fast_rsync() {
        let block = PARAMS.block_size as usize;
        for blocks in 0..=17 {
            for tail in [0, 1, block - 1] {
                let body = sample(blocks * block + tail);
                let mut builder = SignatureBuilder::new(PARAMS);
                builder.update(&body);
                builder.finish();
                assert_eq!(
                    builder.to_signature_bytes(),
                    calculate(&body),
                    "{blocks} blocks + {tail}"
                );
            }
        }
    }

    #[test]
    fn builder_of_empty_body_is_just_a_header() {
        let mut builder = SignatureBuilder::new(PARAMS);
        builder.finish();
        assert_eq!(builder.to_signature_bytes(), calculate(&[]));
    }

    #[test]
    fn block_size_fits_the_budget_within_its_range() {
        assert_eq!(choose_block_size(0, 4608, 1024), 1024);
        assert_eq!(choose_block_size(100_000, 4608, 1024), 1024);
        let big = choose_block_size(10 << 20, 4608, 1024);
        let entries = (10u64 << 20).div_ceil(u64::from(big));
        assert!(
            12 + entries * 12 <= 4608,
            "block {big} gives {entries} entries"
        );
        assert_eq!(choose_block_size(u64::MAX, 4608, 1024), MAX_BLOCK_SIZE);
    }

    #[test]
    fn parse_rejects_each_bad_field_before_fast_rsync_sees_it() {
        let good = calculate(&sample(4096));
        let limits = SignatureLimits::default();
        assert_eq!(BasisSignature::parse(&good, limits).unwrap().blocks(), 4);
        let with_field = |i: usize, v: u32| {
            let mut bad = good.clone();
            bad[i..i + 4].copy_from_slice(&v.to_be_bytes());
            BasisSignature::parse(&bad, limits).unwrap_err()
        };
        // D-S1, D-S2: block sizes that hang or blow up fast_rsync.
        for block_size in [0, 1, 511, (1 << 20) + 1, u32::MAX] {
            assert_eq!(
                with_field(4, block_size),
                SignatureError::BlockSizeOutOfRange { block_size }
            );
        }
        // D-S3: strong sum lengths, BLAKE2 magic, short header, cap.
        for strong_len in [0, 7, 17, u32::MAX] {
            assert_eq!(
                with_field(8, strong_len),
                SignatureError::StrongLenOutOfRange { strong_len }
            );
        }
        assert!(matches!(
            with_field(0, 0x7273_0137),
            SignatureError::WrongMagic { .. }
        ));
        assert_eq!(
            BasisSignature::parse(&good[..11], limits).unwrap_err(),
            SignatureError::TooShort { len: 11 }
        );
        let tight = SignatureLimits {
            max_bytes: good.len() - 1,
            ..limits
        };
        assert!(matches!(
            BasisSignature::parse(&good, tight),
            Err(SignatureError::TooLarge { .. })
        ));
        let small_basis = SignatureLimits {
            max_basis_len: 4095,
            ..limits
        };
        assert!(matches!(
            BasisSignature::parse(&good, small_basis),
            Err(SignatureError::BasisTooLarge { .. })
        ));
    }

    #[test]
    fn truncated_signature_keeps_its_whole_entries() {
        let good = calculate(&sample(4096));
        let cut =
            BasisSignature::parse(&good[..good.len() - 5], SignatureLimits::default()).unwrap();
        assert_eq!(cut.blocks(), 3);
        assert!(cut.is_truncated());
    }
}

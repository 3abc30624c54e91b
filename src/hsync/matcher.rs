//! The encoder's block matcher: finds the basis blocks in a window of the
//! new body (rsync's algorithm, as `fast_rsync::diff`), and returns delta
//! commands with the literals as ranges of the window.
//!
//! Why not `fast_rsync::diff`: it checks each candidate block with a scalar
//! MD4 and looks two hash maps up at every byte. On a 64 MiB body with 1 %
//! edits those took 40 % of the encoder. Here:
//! - after a matched block, the next 8 are checked together, so that
//!   fast_rsync hashes them in SIMD lanes ([`Signature::calculate`]); a run
//!   that breaks wastes at most the rest of one batch (the cost of about
//!   two blocks hashed one at a time), and a window that follows a copy
//!   starts as a run. A weak hit found by scanning is hashed with the 7
//!   blocks after it too, since a hit usually starts a run (7 % less
//!   encode time on the 1 %-edited bench body); after 16 hits without a
//!   strong match in a window, hits are hashed alone;
//! - a bit filter of the basis's weak sums rejects almost every byte
//!   position before any map is looked at;
//! - the delta is not written and parsed again: literals stay in the
//!   window.
//!
//! The weak sum and its rolling update reproduce fast_rsync's (librsync's
//! `rollsum`) bit for bit; a test holds them to `Signature::calculate`.

use std::collections::HashMap;
use std::ops::Range;

use fast_rsync::Signature;

use super::SIGNATURE_HEADER_LEN;
use super::SignatureParams;
use super::delta::DeltaCommand;

/// Blocks hashed together, in fast_rsync's SIMD lanes (8 with AVX2).
pub(crate) const SIMD_BLOCKS: usize = 8;

/// librsync's `RS_CHAR_OFFSET`, added to every byte of the weak sum.
const CHAR_OFFSET: u16 = 31;

/// Strong-sum failures after which a weak sum is ignored, as fast_rsync
/// does: a hostile signature cannot make every byte cost an MD4.
const MAX_WEAK_COLLISIONS: u32 = 1024;

/// Weak hits without a strong match after which, in one window, a hit is
/// hashed alone: a hostile signature whose weak sums occur everywhere then
/// costs one block per hit, not eight.
const MAX_BATCHED_FALSE_HITS: u32 = 16;

/// The rolling weak sum of one block (librsync's rollsum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WeakSum {
    s1: u16,
    s2: u16,
}

impl WeakSum {
    /// The weak sum of `block`, as fast_rsync computes it (including its
    /// wrapping of the length terms).
    fn of(block: &[u8]) -> WeakSum {
        let (mut s1, mut s2) = (0u16, 0u16);
        for &byte in block {
            s1 = s1.wrapping_add(u16::from(byte));
            s2 = s2.wrapping_add(s1);
        }
        let len = block.len() as u32;
        s1 = s1.wrapping_add((len as u16).wrapping_mul(CHAR_OFFSET));
        s2 = s2.wrapping_add(
            ((len.wrapping_mul(len.wrapping_add(1)) / 2) as u16).wrapping_mul(CHAR_OFFSET),
        );
        WeakSum { s1, s2 }
    }

    fn from_u32(value: u32) -> WeakSum {
        WeakSum {
            s1: value as u16,
            s2: (value >> 16) as u16,
        }
    }

    fn value(self) -> u32 {
        u32::from(self.s1) | (u32::from(self.s2) << 16)
    }

    /// The sum of the block one byte further: `old` leaves, `new` enters.
    #[inline]
    fn rotate(self, block_size: u16, old: u8, new: u8) -> WeakSum {
        let (old, new) = (u16::from(old), u16::from(new));
        let s1 = self.s1.wrapping_add(new).wrapping_sub(old);
        let s2 = self
            .s2
            .wrapping_add(s1)
            .wrapping_sub(block_size.wrapping_mul(old.wrapping_add(CHAR_OFFSET)));
        WeakSum { s1, s2 }
    }
}

/// A basis signature's blocks, indexed by weak sum.
pub(crate) struct BlockIndex {
    params: SignatureParams,
    /// (weak sum, block number), sorted.
    weak: Vec<(u32, u32)>,
    /// Where the entries of each range of weak sums start in `weak`
    /// (bucket `w >> bucket_shift`, about one block per bucket), and
    /// `weak.len()` last: a lookup searches one bucket, not the whole
    /// table, whose binary searches were 7 % of the encoder on 1 KiB
    /// blocks.
    bucket_start: Vec<u32>,
    bucket_shift: u32,
    /// Weak sums by block number: a run's next block is checked against
    /// the block that extends its copy without a search.
    weak_by_block: Vec<u32>,
    /// Strong sums by block number, `strong_len` bytes each.
    strong: Vec<u8>,
    /// One bit per hash of a weak sum present; `filter_shift` maps a hash
    /// to its bit.
    filter: Vec<u64>,
    filter_shift: u32,
}

impl BlockIndex {
    /// Indexes the whole entries of a validated signature (`entries`
    /// without the header, a multiple of the entry length).
    pub(crate) fn new(params: SignatureParams, entries: &[u8]) -> BlockIndex {
        let entry_len = params.entry_len();
        let strong_len = params.strong_len as usize;
        let blocks = entries.len() / entry_len;
        let mut weak_by_block = Vec::with_capacity(blocks);
        let mut strong = Vec::with_capacity(blocks * strong_len);
        for entry in entries.chunks_exact(entry_len) {
            weak_by_block.push(u32::from_be_bytes(entry[..4].try_into().expect("4 bytes")));
            strong.extend_from_slice(&entry[4..]);
        }
        // Sorted by bucket (a counting sort), then each bucket's few
        // entries in place: cheaper than sorting the whole table.
        let bucket_bits = (usize::BITS - blocks.leading_zeros()).clamp(1, 20);
        let bucket_shift = 32 - bucket_bits;
        let bucket_of = |sum: u32| (sum >> bucket_shift) as usize;
        let mut bucket_start = vec![0u32; (1 << bucket_bits) + 1];
        for &sum in &weak_by_block {
            bucket_start[bucket_of(sum) + 1] += 1;
        }
        for bucket in 1..bucket_start.len() {
            bucket_start[bucket] += bucket_start[bucket - 1];
        }
        let mut weak = vec![(0, 0); blocks];
        let mut next = bucket_start.clone();
        for (block, &sum) in weak_by_block.iter().enumerate() {
            let at = &mut next[bucket_of(sum)];
            weak[*at as usize] = (sum, block as u32);
            *at += 1;
        }
        for bucket in bucket_start.windows(2) {
            if bucket[1] - bucket[0] > 1 {
                weak[bucket[0] as usize..bucket[1] as usize].sort_unstable();
            }
        }
        // At least 64 bits per block, and 16 KiB: a false positive (then
        // two binary searches) on fewer than 1 in 64 positions, in a table
        // that stays in cache (16 KiB up to 2048 blocks, at most 2 MiB).
        // The default 4.5 KB signature has 383 blocks: a 4 KiB table let 1
        // scanned byte in 86 through, 16 KiB lets 1 in 340.
        let bits = (blocks * 64).next_power_of_two().clamp(1 << 17, 1 << 24);
        let mut index = BlockIndex {
            params,
            weak,
            bucket_start,
            bucket_shift,
            weak_by_block,
            strong,
            filter: vec![0; bits / 64],
            filter_shift: 64 - bits.trailing_zeros(),
        };
        for i in 0..index.weak.len() {
            let bit = index.filter_bit(index.weak[i].0);
            index.filter[bit / 64] |= 1 << (bit % 64);
        }
        index
    }

    #[inline]
    fn filter_bit(&self, weak: u32) -> usize {
        (u64::from(weak).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.filter_shift) as usize
    }

    #[inline]
    fn may_contain(&self, weak: u32) -> bool {
        let bit = self.filter_bit(weak);
        self.filter[bit / 64] & (1 << (bit % 64)) != 0
    }

    /// The entries with this weak sum (a range of `self.weak`).
    fn candidates(&self, weak: u32) -> Range<usize> {
        let bucket = (weak >> self.bucket_shift) as usize;
        let (first, last) = (
            self.bucket_start[bucket] as usize,
            self.bucket_start[bucket + 1] as usize,
        );
        let in_bucket = &self.weak[first..last];
        let start = in_bucket.partition_point(|&(w, _)| w < weak);
        let end = start + in_bucket[start..].partition_point(|&(w, _)| w == weak);
        first + start..first + end
    }

    /// Whether basis block `block` has these sums (false past the last).
    #[inline]
    fn is_block(&self, block: u32, weak: u32, strong: &[u8]) -> bool {
        let len = self.params.strong_len as usize;
        let at = block as usize * len;
        self.weak_by_block.get(block as usize) == Some(&weak)
            && self.strong[at..at + len] == strong[..len]
    }

    /// A block among `candidates` whose strong sum starts with `strong`:
    /// `preferred` if it is one (it extends the previous copy), else the
    /// first.
    fn find(&self, candidates: Range<usize>, strong: &[u8], preferred: u32) -> Option<u32> {
        let len = self.params.strong_len as usize;
        let mut found = None;
        for &(_, block) in &self.weak[candidates] {
            let at = block as usize * len;
            if self.strong[at..at + len] == strong[..len] {
                if block == preferred {
                    return Some(block);
                }
                found.get_or_insert(block);
            }
        }
        found
    }

    /// Matches `data` against the basis blocks, appending commands to
    /// `out`: copies (with `0..0`) and literals (with their range of
    /// `data`), adjacent copies merged, in order and covering `data`.
    /// `after_copy`: the body just before `data` was copied, so `data`
    /// likely starts with more (it only decides how blocks are hashed).
    pub(crate) fn diff(
        &self,
        data: &[u8],
        after_copy: bool,
        out: &mut Vec<(DeltaCommand, Range<usize>)>,
    ) {
        let block = self.params.block_size as usize;
        let options = self.params.options();
        let entry_len = self.params.entry_len();
        let mut emitter = Emitter {
            out,
            literal_start: 0,
            block: block as u64,
        };
        let mut collisions: HashMap<u32, u32> = HashMap::new();
        // Weak hits whose strong sum did not match: past a few, a hit is
        // hashed alone rather than with the blocks after it.
        let mut false_hits = 0;
        let mut here = 0;
        // Whether the block before `here` matched (else: scanning).
        let mut in_run = after_copy;
        // The weak sum at `here`, when a batch already computed it.
        let mut known_weak = None;
        'outer: while here + block <= data.len() {
            if in_run {
                // In a run: check the next blocks together.
                let count = SIMD_BLOCKS.min((data.len() - here) / block);
                let (signature, skip) = hash_blocks(data, here, count, options);
                let entries = &signature.serialized()[SIGNATURE_HEADER_LEN + skip * entry_len..];
                in_run = self.follow_run(entries, &mut here, &mut emitter, &mut known_weak);
                continue;
            }
            let mut weak = known_weak
                .take()
                .map_or_else(|| WeakSum::of(&data[here..here + block]), WeakSum::from_u32);
            loop {
                (here, weak) = self.next_candidate(data, here, weak);
                let value = weak.value();
                if self.may_contain(value)
                    && collisions
                        .get(&value)
                        .is_none_or(|&count| count < MAX_WEAK_COLLISIONS)
                {
                    let candidates = self.candidates(value);
                    if !candidates.is_empty() {
                        // A hit usually starts a run: hash the blocks after
                        // it in the same SIMD batch (one block alone costs
                        // about half as much as eight together).
                        let count = if false_hits < MAX_BATCHED_FALSE_HITS {
                            SIMD_BLOCKS.min((data.len() - here) / block)
                        } else {
                            1
                        };
                        let (signature, skip) = hash_blocks(data, here, count, options);
                        let entries =
                            &signature.serialized()[SIGNATURE_HEADER_LEN + skip * entry_len..];
                        let strong = &entries[4..entry_len];
                        if let Some(matched) = self.find(candidates, strong, emitter.next_block()) {
                            emitter.copy(here, matched);
                            here += block;
                            in_run = self.follow_run(
                                &entries[entry_len..],
                                &mut here,
                                &mut emitter,
                                &mut known_weak,
                            );
                            continue 'outer;
                        }
                        false_hits += 1;
                        *collisions.entry(value).or_insert(0) += 1;
                    }
                }
                if here + block >= data.len() {
                    break 'outer;
                }
                weak = weak.rotate(block as u16, data[here], data[here + block]);
                here += 1;
            }
        }
        emitter.finish(data.len());
    }

    /// Rolls the weak sum `weak` of the block at `here` on to the first
    /// position whose sum passes the filter, or to the last position of
    /// `data` (where it may not): that position and its sum. The scan's
    /// inner loop, kept to the roll and the filter test, without bounds
    /// checks: a byte costs a few instructions, and the scan covers every
    /// literal byte. Not inlined: inside `diff` its loop ran short of
    /// registers and reloaded three of them from the stack on every byte.
    #[inline(never)]
    fn next_candidate(&self, data: &[u8], here: usize, weak: WeakSum) -> (usize, WeakSum) {
        let block = self.params.block_size as usize;
        // The sums roll in u32: wrapping arithmetic modulo 2^32 agrees
        // with it modulo 2^16, so their low halves are `WeakSum::rotate`'s,
        // without narrowing every step.
        let (mut s1, mut s2) = (u32::from(weak.s1), u32::from(weak.s2));
        let sum = |s1: u32, s2: u32| WeakSum {
            s1: s1 as u16,
            s2: s2 as u16,
        };
        let leaving = &data[here..data.len() - block];
        let entering = &data[here + block..];
        for (i, (&old, &new)) in leaving.iter().zip(entering).enumerate() {
            if self.may_contain((s1 & 0xFFFF) | (s2 << 16)) {
                return (here + i, sum(s1, s2));
            }
            let old = u32::from(old);
            s1 = s1.wrapping_add(u32::from(new)).wrapping_sub(old);
            s2 = s2
                .wrapping_add(s1)
                .wrapping_sub((block as u32).wrapping_mul(old + u32::from(CHAR_OFFSET)));
        }
        (data.len() - block, sum(s1, s2))
    }

    /// Follows a run through the entries of the blocks from `here` on:
    /// copies each block found, and stops at the first that is not, leaving
    /// its weak sum in `known_weak`. Whether every block was found.
    fn follow_run(
        &self,
        entries: &[u8],
        here: &mut usize,
        emitter: &mut Emitter<'_>,
        known_weak: &mut Option<u32>,
    ) -> bool {
        for entry in entries.chunks_exact(self.params.entry_len()) {
            let weak = u32::from_be_bytes(entry[..4].try_into().expect("4 bytes"));
            let preferred = emitter.next_block();
            // Most blocks of a run extend its copy: that block is checked
            // first, without the two binary searches of `candidates` (a
            // tenth of the encoder on 1 KiB blocks). `find` would prefer
            // it too, so the outcome is the same.
            let found = if self.is_block(preferred, weak, &entry[4..]) {
                Some(preferred)
            } else {
                self.may_contain(weak)
                    .then(|| self.find(self.candidates(weak), &entry[4..], preferred))
                    .flatten()
            };
            match found {
                Some(matched) => {
                    emitter.copy(*here, matched);
                    *here += self.params.block_size as usize;
                }
                None => {
                    *known_weak = Some(weak);
                    return false;
                }
            }
        }
        true
    }
}

/// The signature of the `count` blocks of `data` from `at`, and how many
/// entries to skip at its front. fast_rsync hashes a batch of fewer than
/// [`SIMD_BLOCKS`] blocks one block at a time, and eight in SIMD lanes cost
/// about as much as two alone: so when three to seven are left (the end of
/// a window) and `data` holds enough blocks before `at` to make up a whole
/// batch, the batch starts that much earlier and those entries are
/// skipped. The short batches at window ends were a third of the matcher's
/// MD4 instructions on the 1 %-edited bench body.
fn hash_blocks(
    data: &[u8],
    at: usize,
    count: usize,
    options: fast_rsync::SignatureOptions,
) -> (Signature, usize) {
    let block = options.block_size as usize;
    let missing = SIMD_BLOCKS - count;
    let skip = if (3..SIMD_BLOCKS).contains(&count) && at >= missing * block {
        missing
    } else {
        0
    };
    let start = at - skip * block;
    (
        Signature::calculate(&data[start..at + count * block], options),
        skip,
    )
}

/// Appends commands, merging adjacent copies.
struct Emitter<'a> {
    out: &'a mut Vec<(DeltaCommand, Range<usize>)>,
    /// Where the literal bytes not yet emitted start.
    literal_start: usize,
    block: u64,
}

impl Emitter<'_> {
    /// The basis block that would extend the last copy (none: `u32::MAX`).
    fn next_block(&self) -> u32 {
        match self.out.last() {
            Some((DeltaCommand::Copy { offset, len }, _)) => ((offset + len) / self.block) as u32,
            _ => u32::MAX,
        }
    }

    fn copy(&mut self, here: usize, block: u32) {
        self.literal(here);
        let offset = u64::from(block) * self.block;
        if let Some((DeltaCommand::Copy { offset: last, len }, _)) = self.out.last_mut()
            && *last + *len == offset
        {
            *len += self.block;
        } else {
            self.out.push((
                DeltaCommand::Copy {
                    offset,
                    len: self.block,
                },
                0..0,
            ));
        }
        self.literal_start = here + self.block as usize;
    }

    /// Emits the literal bytes before `end`.
    fn literal(&mut self, end: usize) {
        if end > self.literal_start {
            self.out.push((
                DeltaCommand::Literal {
                    len: (end - self.literal_start) as u64,
                },
                self.literal_start..end,
            ));
        }
    }

    fn finish(mut self, end: usize) {
        self.literal(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hsync::delta::join_delta;

    fn params(block_size: u32) -> SignatureParams {
        SignatureParams {
            block_size,
            strong_len: 8,
        }
    }

    fn text(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                b"abcdefgh ijklmnop\n"[(state >> 59) as usize % 18]
            })
            .collect()
    }

    fn index_of(basis: &[u8], block_size: u32) -> BlockIndex {
        let signature = Signature::calculate(basis, params(block_size).options());
        BlockIndex::new(
            params(block_size),
            &signature.serialized()[SIGNATURE_HEADER_LEN..],
        )
    }

    /// Rebuilds `data` from the commands against `basis`.
    fn apply(basis: &[u8], data: &[u8], commands: &[(DeltaCommand, Range<usize>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (command, range) in commands {
            match *command {
                DeltaCommand::Copy { offset, len } => {
                    out.extend_from_slice(&basis[offset as usize..(offset + len) as usize]);
                }
                DeltaCommand::Literal { len } => {
                    assert_eq!(range.len() as u64, len);
                    out.extend_from_slice(&data[range.clone()]);
                }
            }
        }
        out
    }

    #[test]
    fn weak_sums_equal_fast_rsync_at_every_size_and_after_rolling() {
        let data = text(300_000, 1);
        for block in [512usize, 1000, 65_535, 65_536, 70_000, 262_144] {
            let signature = Signature::calculate(&data[..block], params(block as u32).options());
            let expected = u32::from_be_bytes(
                signature.serialized()[SIGNATURE_HEADER_LEN..][..4]
                    .try_into()
                    .unwrap(),
            );
            assert_eq!(
                WeakSum::of(&data[..block]).value(),
                expected,
                "block {block}"
            );
            // Rolled 1,000 bytes on equals computed there.
            let mut rolled = WeakSum::of(&data[..block]);
            for at in 0..1000 {
                rolled = rolled.rotate(block as u16, data[at], data[at + block]);
            }
            assert_eq!(
                rolled,
                WeakSum::of(&data[1000..1000 + block]),
                "block {block}"
            );
        }
    }

    #[test]
    fn diff_rebuilds_the_data_and_finds_moved_and_repeated_blocks() {
        let basis = text(64 * 1024, 2);
        let mut new = basis[10_000..40_000].to_vec();
        new.extend_from_slice(b"an insertion that is not in the basis");
        new.extend_from_slice(&basis[..20_000]);
        new.extend_from_slice(&basis[..20_000]);
        new.extend_from_slice(&text(3000, 9));
        let index = index_of(&basis, 1024);
        let mut commands = Vec::new();
        index.diff(&new, false, &mut commands);
        assert!(apply(&basis, &new, &commands) == new);
        let copied: u64 = commands
            .iter()
            .filter(|(c, _)| matches!(c, DeltaCommand::Copy { .. }))
            .map(|(c, _)| c.output_len())
            .sum();
        // Every whole basis block of the copied stretches is found.
        assert!(copied >= 2 * 19 * 1024 + 28 * 1024, "copied {copied}");
        // The stretch from 10,000 starts 240 bytes before a block boundary;
        // from there its 29 blocks are one merged copy.
        assert_eq!(commands[0].0, DeltaCommand::Literal { len: 240 });
        assert_eq!(
            commands[1].0,
            DeltaCommand::Copy {
                offset: 10 * 1024,
                len: 29 * 1024
            }
        );
    }

    #[test]
    fn diff_applies_like_a_fast_rsync_delta() {
        let basis = text(100_000, 3);
        let mut new = basis.clone();
        for at in [5_000, 33_333, 77_777] {
            new[at] ^= 1;
        }
        new.truncate(98_765);
        let index = index_of(&basis, 2048);
        let mut commands = Vec::new();
        index.diff(&new, false, &mut commands);
        let mut command_bytes = Vec::new();
        let mut literals = Vec::new();
        for (command, range) in &commands {
            command.write(&mut command_bytes);
            literals.extend_from_slice(&new[range.clone()]);
        }
        let delta = join_delta(&command_bytes, &literals).unwrap();
        let mut rebuilt = Vec::new();
        fast_rsync::apply(&basis, &delta, &mut rebuilt).unwrap();
        assert!(rebuilt == new);
    }

    #[test]
    fn empty_short_and_unrelated_data_are_literal() {
        let basis = text(10_000, 4);
        let index = index_of(&basis, 1024);
        for data in [Vec::new(), basis[..1000].to_vec(), text(5000, 5)] {
            let mut commands = Vec::new();
            index.diff(&data, false, &mut commands);
            assert!(
                commands
                    .iter()
                    .all(|(c, _)| matches!(c, DeltaCommand::Literal { .. }))
            );
            assert!(apply(&basis, &data, &commands) == data);
        }
    }

    /// A hostile signature: every block has the weak sum of the data but
    /// another strong sum. Nothing matches (and after 1,024 failures the
    /// weak sum is no longer checked).
    #[test]
    fn weak_sums_without_their_strong_sums_give_literals() {
        let data = vec![b'x'; 200_000];
        let real = Signature::calculate(&data[..1024], params(1024).options());
        let mut entries = Vec::new();
        for block in 0..500u32 {
            entries.extend_from_slice(&real.serialized()[SIGNATURE_HEADER_LEN..][..4]);
            entries.extend_from_slice(&(u64::from(block) + 1).to_be_bytes());
        }
        let index = BlockIndex::new(params(1024), &entries);
        let mut commands = Vec::new();
        index.diff(&data, false, &mut commands);
        assert!(apply(&[], &data, &commands) == data);
        assert_eq!(commands.len(), 1, "all literal");
    }
}

//! The codec 3 encoder's matcher: finds the runs of a window that the held
//! basis body has, anywhere in it, so that only the edited bytes go
//! through zstd. Without it every byte of a window went through zstd's
//! long-distance matcher against a 6 MiB basis slice that zstd indexed
//! first: on a 64 MiB text with 1 % edits that indexing was 60 % of the
//! encoder's CPU, for the 99 % of the body that is a plain copy.
//!
//! The basis is indexed once per encoder by anchors: a gear hash of the
//! [`ANCHOR_LEN`] bytes at every `stride`-th offset (128 bytes up to
//! 128 MiB of basis, more beyond, so the index stays within 16 MiB). A
//! window is scanned with the same hash rolled byte by byte; an anchor
//! whose bytes really match (compared with the basis, never trusted from
//! the hash) is extended byte by byte forwards and back, so copies end
//! exactly at the edits. After a copy, the next window first tries to
//! continue where it ended, so an unchanged stretch costs a comparison.
//!
//! The anchors of a body ([`HeldAnchors`]) depend on the body alone, so
//! encoders coding against the same held body may share them
//! ([`SharedAnchors`]): the first builds them, the others find them built.
//! A wrong table could only cost matches: every match is checked against
//! the basis bytes.
//!
//! It leaves out how literals are compressed (`literals.rs`) and whether
//! the matched commands are worth sending (the encoder decides).
//!
//! Main types: [`HeldIndex`], [`HeldAnchors`], [`SharedAnchors`].

use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};

use crate::hsync::basis::Basis;
use crate::hsync::delta::DeltaCommand;

/// Bytes an anchor hashes: the reach of a 64-bit gear hash, whose state
/// shifts one bit per byte.
const ANCHOR_LEN: usize = 64;

/// Smallest distance between anchors in the basis (bytes). A run is found
/// within about this many bytes plus [`ANCHOR_LEN`] after an edit, then
/// extended back to it.
const MIN_STRIDE: u64 = 128;

/// Most anchors indexed: the stride grows beyond 128 MiB of basis.
const MAX_ANCHORS: u64 = 1 << 20;

/// Basis bytes read at once while a copy extends.
const READ_CHUNK: usize = 256 << 10;

/// Basis bytes read to check an anchor that may not match.
const CHECK_READ: usize = 4 << 10;

/// Shortest continuation at the offset where the last copy ended that is
/// sent as a copy (a COPY command costs up to 9 bytes).
const MIN_CONTINUATION: usize = 32;

/// Anchors per window whose bytes did not match after which the window's
/// rest is sent as literals: a body crafted to collide with the hash costs
/// a bounded number of basis reads.
const MAX_FALSE_ANCHORS: u32 = 1024;

/// The gear hash's byte values: splitmix64 of the byte's index.
static GEAR: [u64; 256] = gear_table();

const fn gear_table() -> [u64; 256] {
    let mut table = [0u64; 256];
    let mut state = 0u64;
    let mut i = 0;
    while i < 256 {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        table[i] = z ^ (z >> 31);
        i += 1;
    }
    table
}

#[inline]
fn gear(hash: u64, byte: u8) -> u64 {
    (hash << 1).wrapping_add(GEAR[usize::from(byte)])
}

/// Length of the common start of `a` and `b`.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    for step in [4096, 64] {
        while i + step <= n && a[i..i + step] == b[i..i + step] {
            i += step;
        }
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// Length of the common end of `a` and `b`.
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut i = 0;
    for step in [4096, 64] {
        while i + step <= n && a[n - i - step..n - i] == b[n - i - step..n - i] {
            i += step;
        }
    }
    while i < n && a[n - i - 1] == b[n - i - 1] {
        i += 1;
    }
    i
}

/// The basis bytes last read, to compare windows with.
#[derive(Default)]
struct Cursor {
    start: u64,
    bytes: Vec<u8>,
}

impl Cursor {
    /// The basis from `offset` on: at least `want` bytes (fewer at the
    /// basis's end), reading `read` or more when they are not at hand.
    fn at(
        &mut self,
        basis: &dyn Basis,
        offset: u64,
        want: usize,
        read: usize,
    ) -> std::io::Result<&[u8]> {
        let size = basis.size();
        let end = self.start + self.bytes.len() as u64;
        let want_end = offset.saturating_add(want as u64).min(size);
        if offset < self.start || want_end > end {
            let len = (size - offset).min(want.max(read) as u64) as usize;
            self.bytes.clear();
            basis.append_range(offset, len, &mut self.bytes)?;
            self.start = offset;
        }
        Ok(&self.bytes[(offset - self.start) as usize..])
    }
}

/// The anchors of a held basis body: what [`HeldIndex`] looks windows
/// up in. Read-only once built.
pub struct HeldAnchors {
    stride: u64,
    /// By the hash's top bits: its low 32 bits, then the anchor number + 1
    /// (0: empty). An anchor whose slot is taken tries the next one.
    slots: Vec<u64>,
    shift: u32,
    /// One bit per value of the hash's top bits that some anchor has,
    /// eight bits per anchor: small enough to stay in cache, so that most
    /// scanned bytes are rejected without a cache miss on `slots` (the
    /// scan's main cost before it).
    filter: Vec<u64>,
    filter_shift: u32,
}

/// A held body's [`HeldAnchors`], built by the first encoder that needs
/// them and then shared by every encoder coding against the same body
/// (the accelerator keeps one beside a large held body).
#[derive(Clone, Default)]
pub struct SharedAnchors(Arc<Mutex<Option<Arc<HeldAnchors>>>>);

impl std::fmt::Debug for SharedAnchors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedAnchors")
            .field("built", &self.is_built())
            .finish()
    }
}

impl SharedAnchors {
    /// The anchors of `basis`, built now if nobody has yet (an encoder
    /// that asks meanwhile waits for them).
    ///
    /// # Errors
    /// Reading the basis failed (nothing is kept then).
    pub(crate) fn get_or_build(&self, basis: &dyn Basis) -> std::io::Result<Arc<HeldAnchors>> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(anchors) = &*slot {
            return Ok(anchors.clone());
        }
        let anchors = Arc::new(HeldAnchors::build(basis)?);
        *slot = Some(anchors.clone());
        Ok(anchors)
    }

    /// Whether they have been built.
    pub fn is_built(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

/// The matcher of one encoding against a held body: its anchors, and
/// where it reads the basis and expects the next copy.
pub(super) struct HeldIndex {
    anchors: Arc<HeldAnchors>,
    cursor: Cursor,
    /// Where the last copy ended in the basis: the next window tries to
    /// continue there first.
    expected: Option<u64>,
}

impl HeldIndex {
    /// A matcher over anchors built before (or just now).
    pub(super) fn over(anchors: Arc<HeldAnchors>) -> HeldIndex {
        HeldIndex {
            anchors,
            cursor: Cursor::default(),
            expected: Some(0),
        }
    }

    /// Indexes `basis` for this matcher alone.
    ///
    /// # Errors
    /// Reading the basis failed.
    #[cfg(test)]
    pub(super) fn build(basis: &dyn Basis) -> std::io::Result<HeldIndex> {
        Ok(HeldIndex::over(Arc::new(HeldAnchors::build(basis)?)))
    }
}

impl HeldAnchors {
    /// Indexes `basis`, reading it once, a chunk at a time.
    ///
    /// # Errors
    /// Reading the basis failed.
    pub(super) fn build(basis: &dyn Basis) -> std::io::Result<HeldAnchors> {
        let size = basis.size();
        let stride = MIN_STRIDE.max(size.div_ceil(MAX_ANCHORS).next_power_of_two());
        let anchors = match size.checked_sub(ANCHOR_LEN as u64) {
            Some(last) => last / stride + 1,
            None => 0,
        };
        let slot_count = (2 * anchors).next_power_of_two().max(1 << 10);
        let filter_bits = 4 * slot_count;
        let mut index = HeldAnchors {
            stride,
            slots: vec![0; slot_count as usize],
            shift: 64 - slot_count.trailing_zeros(),
            filter: vec![0; (filter_bits / 64) as usize],
            filter_shift: 64 - filter_bits.trailing_zeros(),
        };
        // Chunks of whole strides, each read with the anchor that starts
        // at its last stride.
        let chunk = (READ_CHUNK as u64).div_ceil(stride) * stride;
        let mut buf = Vec::new();
        let mut anchor = 0u64;
        let mut start = 0;
        while anchor < anchors {
            let len = (chunk + ANCHOR_LEN as u64).min(size - start) as usize;
            buf.clear();
            basis.append_range(start, len, &mut buf)?;
            let first = anchor;
            let last = anchors.min((start + chunk) / stride);
            // Eight anchors at a time: their hashes are independent chains,
            // which the CPU runs side by side (one at a time took 3 times
            // as long).
            let at = |n: u64| (n * stride - start) as usize;
            while anchor + 8 <= last {
                let blocks: [&[u8; ANCHOR_LEN]; 8] = std::array::from_fn(|k| {
                    buf[at(anchor + k as u64)..][..ANCHOR_LEN]
                        .try_into()
                        .expect("ANCHOR_LEN bytes")
                });
                let mut hashes = [0u64; 8];
                for i in 0..ANCHOR_LEN {
                    for (hash, block) in hashes.iter_mut().zip(&blocks) {
                        *hash = gear(*hash, block[i]);
                    }
                }
                for (k, hash) in hashes.into_iter().enumerate() {
                    index.insert(hash, anchor + k as u64);
                }
                anchor += 8;
            }
            while anchor < last {
                let hash = buf[at(anchor)..][..ANCHOR_LEN]
                    .iter()
                    .fold(0, |h, &b| gear(h, b));
                index.insert(hash, anchor);
                anchor += 1;
            }
            debug_assert!(anchor > first || anchors == 0);
            start += chunk;
        }
        Ok(index)
    }

    fn slot(&self, hash: u64) -> usize {
        (hash >> self.shift) as usize
    }

    fn may_have(&self, hash: u64) -> bool {
        let bit = hash >> self.filter_shift;
        self.filter[(bit / 64) as usize] & (1 << (bit % 64)) != 0
    }

    fn insert(&mut self, hash: u64, anchor: u64) {
        let bit = hash >> self.filter_shift;
        self.filter[(bit / 64) as usize] |= 1 << (bit % 64);
        let mask = self.slots.len() - 1;
        let slot = self.slot(hash);
        // The first of equal anchors stays: it is as good as any later one.
        for probe in [slot, (slot + 1) & mask] {
            let entry = self.slots[probe];
            if entry == 0 {
                self.slots[probe] = (hash << 32) | (anchor + 1);
                return;
            }
            if entry >> 32 == hash & 0xFFFF_FFFF {
                return;
            }
        }
    }

    /// Basis offsets of the anchors whose hash may be `hash`.
    fn candidates(&self, hash: u64) -> impl Iterator<Item = u64> + '_ {
        let mask = self.slots.len() - 1;
        let slot = self.slot(hash);
        [slot, (slot + 1) & mask]
            .into_iter()
            .filter_map(move |probe| {
                let entry = self.slots[probe];
                (entry != 0 && entry >> 32 == hash & 0xFFFF_FFFF)
                    .then(|| ((entry & 0xFFFF_FFFF) - 1) * self.stride)
            })
    }

    /// Memory they take (bytes).
    pub fn bytes(&self) -> usize {
        8 * (self.slots.len() + self.filter.len())
    }
}

impl HeldIndex {
    /// How many bytes of `new` the basis has at `offset`.
    fn forward(&mut self, basis: &dyn Basis, offset: u64, new: &[u8]) -> std::io::Result<usize> {
        let mut matched = 0;
        let mut read = CHECK_READ;
        while matched < new.len() && offset + (matched as u64) < basis.size() {
            let rest = &new[matched..];
            let have =
                self.cursor
                    .at(basis, offset + matched as u64, rest.len().min(read), read)?;
            let n = rest.len().min(have.len());
            let same = common_prefix(&rest[..n], &have[..n]);
            matched += same;
            if same < n {
                break;
            }
            read = READ_CHUNK;
        }
        Ok(matched)
    }

    /// How many bytes at the end of `new` the basis has just before
    /// `offset`.
    fn backward(&mut self, basis: &dyn Basis, offset: u64, new: &[u8]) -> std::io::Result<usize> {
        let len = new.len().min(offset as usize);
        if len == 0 {
            return Ok(0);
        }
        let have = self.cursor.at(basis, offset - len as u64, len, len)?;
        Ok(common_suffix(new, &have[..len]))
    }

    /// Diffs `window` (the next bytes of the body) against the basis,
    /// appending commands and, for literals, their ranges in `window`.
    ///
    /// # Errors
    /// Reading the basis failed.
    pub(super) fn diff(
        &mut self,
        basis: &dyn Basis,
        window: &[u8],
        out: &mut Vec<(DeltaCommand, Range<usize>)>,
    ) -> std::io::Result<()> {
        let mut literal_start = 0;
        let mut at = 0;
        let mut false_anchors = 0;
        let push = |out: &mut Vec<_>, literal: Range<usize>, offset: u64, len: usize| {
            if !literal.is_empty() {
                let len = literal.len() as u64;
                out.push((DeltaCommand::Literal { len }, literal));
            }
            let len = len as u64;
            out.push((DeltaCommand::Copy { offset, len }, 0..0));
        };
        while at < window.len() {
            if let Some(offset) = self.expected.take() {
                let same = self.forward(basis, offset, &window[at..])?;
                if same >= MIN_CONTINUATION || (same > 0 && at + same == window.len()) {
                    push(out, literal_start..at, offset, same);
                    at += same;
                    literal_start = at;
                    self.expected = Some(offset + same as u64);
                    continue;
                }
            }
            // Roll the anchor hash from `at` to the first anchor that matches.
            if window.len() - at < ANCHOR_LEN || false_anchors >= MAX_FALSE_ANCHORS {
                break;
            }
            let mut hash = window[at..at + ANCHOR_LEN - 1]
                .iter()
                .fold(0, |h, &b| gear(h, b));
            let mut found = None;
            'scan: for end in at + ANCHOR_LEN - 1..window.len() {
                hash = gear(hash, window[end]);
                if !self.anchors.may_have(hash) {
                    continue;
                }
                let start = end + 1 - ANCHOR_LEN;
                let mut candidates = [None; 2];
                for (slot, offset) in candidates.iter_mut().zip(self.anchors.candidates(hash)) {
                    *slot = Some(offset);
                }
                for offset in candidates.into_iter().flatten() {
                    let same = self.forward(basis, offset, &window[start..])?;
                    if same >= ANCHOR_LEN {
                        found = Some((start, offset, same));
                        break 'scan;
                    }
                    false_anchors += 1;
                    if false_anchors >= MAX_FALSE_ANCHORS {
                        break 'scan;
                    }
                }
            }
            let Some((start, offset, same)) = found else {
                break;
            };
            let back = self.backward(basis, offset, &window[literal_start..start])?;
            push(
                out,
                literal_start..start - back,
                offset - back as u64,
                back + same,
            );
            at = start + same;
            literal_start = at;
            self.expected = Some(offset + same as u64);
        }
        if literal_start < window.len() {
            let len = (window.len() - literal_start) as u64;
            out.push((DeltaCommand::Literal { len }, literal_start..window.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hsync::encode::tests::words;

    /// Rebuilds a window from `diff`'s commands.
    fn apply(basis: &[u8], window: &[u8], commands: &[(DeltaCommand, Range<usize>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (command, range) in commands {
            match *command {
                DeltaCommand::Copy { offset, len } => {
                    out.extend_from_slice(&basis[offset as usize..(offset + len) as usize])
                }
                DeltaCommand::Literal { len } => {
                    assert_eq!(range.len() as u64, len);
                    out.extend_from_slice(&window[range.clone()]);
                }
            }
        }
        out
    }

    fn literal_bytes(commands: &[(DeltaCommand, Range<usize>)]) -> usize {
        commands.iter().map(|(_, range)| range.len()).sum()
    }

    /// Edits, an insertion, a deletion and a moved stretch: each window
    /// rebuilds, and the literals are the edited bytes and little more.
    #[test]
    fn finds_the_runs_around_edits_to_the_byte() {
        let basis = words(2 << 20, 3);
        let mut new = basis.clone();
        new[100_000..100_008].copy_from_slice(b"EDIT0001");
        new.splice(700_000..700_000, b"inserted text".iter().copied());
        new.drain(1_200_000..1_200_500);
        let moved = basis[1_800_000..1_850_000].to_vec();
        new.splice(300_000..300_000, moved);
        let mut index = HeldIndex::build(&basis).unwrap();
        let mut commands = Vec::new();
        let mut rebuilt = Vec::new();
        for window in new.chunks(512 << 10) {
            commands.clear();
            index.diff(&basis, window, &mut commands).unwrap();
            assert_eq!(apply(&basis, window, &commands), window);
            rebuilt.extend_from_slice(window);
            let literals = literal_bytes(&commands);
            assert!(literals <= 64, "{literals} literal bytes");
        }
        assert!(rebuilt == new);
    }

    /// Unrelated bytes are all literal; a basis shorter than an anchor
    /// indexes nothing; an empty window gives no command.
    #[test]
    fn unrelated_bodies_and_tiny_bases_give_literals() {
        for basis in [words(100_000, 1), b"short".to_vec(), Vec::new()] {
            let new = super::super::tests::random_base64(200_000, 9);
            let mut index = HeldIndex::build(&basis).unwrap();
            let mut commands = Vec::new();
            index.diff(&basis, &new, &mut commands).unwrap();
            assert_eq!(apply(&basis, &new, &commands), new);
            assert!(literal_bytes(&commands) >= new.len() - 64);
            commands.clear();
            index.diff(&basis, &[], &mut commands).unwrap();
            assert!(commands.is_empty());
        }
    }

    #[test]
    fn common_ends_are_found_past_the_step_sizes() {
        let a: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for cut in [0, 1, 63, 64, 65, 4095, 4096, 5000, 9999] {
            let mut b = a.clone();
            b[cut] ^= 1;
            assert_eq!(common_prefix(&a, &b), cut);
            assert_eq!(common_suffix(&a, &b), a.len() - cut - 1);
        }
        assert_eq!(common_prefix(&a, &a[..77]), 77);
        assert_eq!(common_suffix(&a[..5000], &a[..5000]), 5000);
    }
}

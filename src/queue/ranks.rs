//! Positions, ETAs and slot claims in O(log n): a Fenwick tree (binary
//! indexed tree) over the entries' sequence numbers, holding for each
//! entry a count of one, its body length (KiB) and whether it claims a
//! free upload slot (see the module docs of [`super`]).
//!
//! A position is the count of entries with a smaller sequence number, the
//! ETA the sum of the body lengths up to the entry, and "may this entry be
//! served" the count of claims before it: all prefix sums. Counting them
//! by walking the order tree cost O(position), about 0.5 ms per request
//! at 100,000 entries.
//!
//! The tree covers a window of `capacity` sequence numbers from `base`;
//! the caller ([`super::UploadQueue`]) rebuilds it from its entries when a
//! new sequence number falls outside ([`Ranks::rebuild`]), with room to
//! spare, so a rebuild costs O(capacity) once per capacity/2 insertions or
//! so. Sequence numbers are not reused, so a window could grow with the
//! churn of entries rather than their number; the caller renumbers its
//! entries instead when the window would be much wider than the queue.
//!
//! Counts are kept modulo 2^32 (claims, entries) and 2^64 (KiB): every
//! update is a wrapping add of a signed delta, which gives exact prefix
//! sums as long as the true sums fit, and they do (at most 2^32 entries of
//! at most 2^32 KiB each).
//!
//! Main type: [`Ranks`].

use super::Seq;

/// Sums over a range of entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Sums {
    /// Entries.
    pub entries: u32,
    /// Entries that claim a free slot.
    pub claims: u32,
    /// Body lengths, KiB.
    pub kib: u64,
}

impl Sums {
    fn add(&mut self, other: Sums) {
        self.entries = self.entries.wrapping_add(other.entries);
        self.claims = self.claims.wrapping_add(other.claims);
        self.kib = self.kib.wrapping_add(other.kib);
    }

    fn sub(&mut self, other: Sums) {
        self.entries = self.entries.wrapping_sub(other.entries);
        self.claims = self.claims.wrapping_sub(other.claims);
        self.kib = self.kib.wrapping_sub(other.kib);
    }
}

/// The smallest window a rebuild makes.
const MIN_CAPACITY: u64 = 64;

/// A Fenwick tree of [`Sums`] over the sequence numbers
/// `base..base + capacity`.
#[derive(Debug)]
pub(super) struct Ranks {
    base: Seq,
    /// 1-based: `tree[i]` sums the `i & i.wrapping_neg()` indexes ending at
    /// `i`; `tree[0]` is unused. Its length is `capacity + 1`, a power of
    /// two plus one.
    tree: Vec<Sums>,
}

impl Ranks {
    /// An empty tree covering nothing, so the first insertion rebuilds it.
    pub fn new() -> Self {
        Ranks {
            base: 0,
            tree: vec![Sums::default()],
        }
    }

    pub fn capacity(&self) -> u64 {
        self.tree.len() as u64 - 1
    }

    /// Whether `seq` is inside the window.
    pub fn covers(&self, seq: Seq) -> bool {
        seq.checked_sub(self.base)
            .is_some_and(|offset| offset < self.capacity())
    }

    /// How wide a window [`Ranks::rebuild`] would make for entries
    /// spanning `lo..=hi`: at least twice the span, a power of two.
    pub fn capacity_for(lo: Seq, hi: Seq) -> u64 {
        let span = hi.saturating_sub(lo).saturating_add(1);
        span.saturating_mul(2)
            .max(MIN_CAPACITY)
            .checked_next_power_of_two()
            .unwrap_or(1 << 63)
    }

    /// Rebuilds the tree over a window that holds `lo..=hi` with room on
    /// both sides (a quarter of the spare room before `lo`, for entries put
    /// back at the head), from `items` (sequence number and sums, each in
    /// `lo..=hi`). O(capacity).
    pub fn rebuild(&mut self, lo: Seq, hi: Seq, items: impl IntoIterator<Item = (Seq, Sums)>) {
        let capacity = Self::capacity_for(lo, hi);
        let span = hi - lo + 1;
        self.base = lo.saturating_sub((capacity - span) / 4);
        let len = usize::try_from(capacity).expect("the window fits in memory") + 1;
        self.tree = vec![Sums::default(); len];
        for (seq, sums) in items {
            let i = self.index(seq);
            self.tree[i].add(sums);
        }
        // Linear-time construction: each node passes its sum to its parent.
        for i in 1..len {
            let parent = i + (i & i.wrapping_neg());
            if parent < len {
                let sums = self.tree[i];
                self.tree[parent].add(sums);
            }
        }
    }

    /// 1-based tree index of `seq`, which must be covered.
    fn index(&self, seq: Seq) -> usize {
        debug_assert!(self.covers(seq), "sequence number outside the window");
        usize::try_from(seq - self.base).expect("covered offsets fit") + 1
    }

    /// Adds `delta` at `seq` (covered).
    pub fn add(&mut self, seq: Seq, delta: Sums) {
        let mut i = self.index(seq);
        while i < self.tree.len() {
            self.tree[i].add(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Takes `delta` away at `seq` (covered).
    pub fn sub(&mut self, seq: Seq, delta: Sums) {
        let mut i = self.index(seq);
        while i < self.tree.len() {
            self.tree[i].sub(delta);
            i += i & i.wrapping_neg();
        }
    }

    /// Sums over the first `i` indexes.
    fn prefix(&self, mut i: usize) -> Sums {
        let mut sums = Sums::default();
        while i > 0 {
            sums.add(self.tree[i]);
            i &= i - 1;
        }
        sums
    }

    /// Sums over the entries before `seq` (covered).
    pub fn before(&self, seq: Seq) -> Sums {
        self.prefix(self.index(seq) - 1)
    }

    /// Sums over the entries up to and including `seq` (covered).
    pub fn through(&self, seq: Seq) -> Sums {
        self.prefix(self.index(seq))
    }

    /// Sums over every entry.
    pub fn total(&self) -> Sums {
        // The capacity is a power of two: the last node sums everything.
        self.tree[self.tree.len() - 1]
    }

    /// The sequence number of the `k`-th claim (1-based), if there are
    /// that many: binary lifting down the tree, O(log capacity).
    pub fn nth_claim(&self, k: u32) -> Option<Seq> {
        if k == 0 || self.total().claims < k {
            return None;
        }
        let mut at = 0usize;
        let mut left = k;
        let mut step = self.tree.len() - 1;
        while step > 0 {
            let next = at + step;
            if next < self.tree.len() && self.tree[next].claims < left {
                at = next;
                left -= self.tree[next].claims;
            }
            step /= 2;
        }
        // `at` is the last index whose prefix holds fewer than k claims;
        // the k-th is the next one (1-based index at + 1, offset at).
        Some(self.base + at as u64)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn one(claim: bool, kib: u64) -> Sums {
        Sums {
            entries: 1,
            claims: u32::from(claim),
            kib,
        }
    }

    /// Naive sums over a map, for comparison.
    fn naive(map: &BTreeMap<Seq, Sums>, range: impl std::ops::RangeBounds<Seq>) -> Sums {
        let mut sums = Sums::default();
        for (_, s) in map.range(range) {
            sums.add(*s);
        }
        sums
    }

    #[test]
    fn prefix_sums_and_the_kth_claim() {
        let mut ranks = Ranks::new();
        assert!(!ranks.covers(100));
        ranks.rebuild(100, 103, [(100, one(false, 5)), (102, one(true, 7))]);
        assert!(ranks.covers(100) && ranks.covers(103));
        ranks.add(103, one(true, 1));
        assert_eq!(ranks.before(100), Sums::default());
        assert_eq!(
            ranks.before(103),
            Sums {
                entries: 2,
                claims: 1,
                kib: 12
            }
        );
        assert_eq!(ranks.through(103).kib, 13);
        assert_eq!(ranks.total().entries, 3);
        assert_eq!(ranks.nth_claim(1), Some(102));
        assert_eq!(ranks.nth_claim(2), Some(103));
        assert_eq!(ranks.nth_claim(3), None);
        assert_eq!(ranks.nth_claim(0), None);
        ranks.sub(102, one(true, 7));
        assert_eq!(ranks.nth_claim(1), Some(103));
        assert_eq!(ranks.total().kib, 6);
    }

    #[test]
    fn a_rebuild_leaves_room_before_and_after() {
        let mut ranks = Ranks::new();
        ranks.rebuild(1000, 1099, []);
        // 100 entries: a window of 256, a quarter of the 156 spare before.
        assert_eq!(ranks.capacity(), 256);
        assert!(ranks.covers(1000 - 39) && !ranks.covers(1000 - 40));
        assert!(ranks.covers(1000 - 39 + 255) && !ranks.covers(1000 - 39 + 256));
    }

    proptest! {
        /// Whatever is added and taken away, the sums match a naive count.
        #[test]
        fn sums_match_a_naive_count(
            ops in proptest::collection::vec((0u64..300, any::<bool>(), 0u64..1000, any::<bool>()), 1..200),
        ) {
            let mut map: BTreeMap<Seq, Sums> = BTreeMap::new();
            let mut ranks = Ranks::new();
            for (offset, claim, kib, insert) in ops {
                let seq = 1_000_000 + offset;
                if let Some(old) = map.remove(&seq) {
                    ranks.sub(seq, old);
                }
                if insert {
                    let sums = one(claim, kib);
                    map.insert(seq, sums);
                    if !ranks.covers(seq) {
                        let lo = map.keys().next().copied().unwrap_or(seq);
                        let hi = map.keys().next_back().copied().unwrap_or(seq);
                        ranks.rebuild(lo, hi, map.iter().map(|(&s, &v)| (s, v)));
                    } else {
                        ranks.add(seq, sums);
                    }
                }
                for &probe in map.keys() {
                    prop_assert_eq!(ranks.before(probe), naive(&map, ..probe));
                    prop_assert_eq!(ranks.through(probe), naive(&map, ..=probe));
                }
                prop_assert_eq!(ranks.total(), naive(&map, ..));
                let claims: Vec<Seq> = map.iter().filter(|(_, s)| s.claims == 1).map(|(&k, _)| k).collect();
                for (k, &seq) in claims.iter().enumerate() {
                    prop_assert_eq!(ranks.nth_claim(k as u32 + 1), Some(seq));
                }
                prop_assert_eq!(ranks.nth_claim(claims.len() as u32 + 1), None);
            }
        }
    }
}

//! Chunk-level verification of stored bodies: a blake3 *outboard* (as the
//! `bao` format keeps it, flattened to one level), so a hit can check each
//! group of bytes before it leaves instead of finding a bad digest after
//! the last byte went out (C-V3).
//!
//! A body is cut into groups of [`group_len`] bytes (64 KiB, more for
//! bodies over 256 MiB so that at most [`MAX_GROUPS`] are kept). The
//! outboard is the blake3 chaining value of each group, hashed at its
//! offset in the body, so the values are the interior nodes of the body's
//! own blake3 tree: merged pairwise they give the body's blake3. That is
//! how an outboard is itself checked, against the digest the metadata
//! already holds ([`Outboard::matches`]); a stray write into the metadata
//! cannot make a bad group pass.
//!
//! Costs: one blake3 pass when the entry is written (it replaces the
//! writer's whole-body hash: the digest is derived from the outboard), 32
//! bytes per group in the metadata (64 KiB per 128 MiB of body), and one
//! blake3 pass per hit, group by group, as before.
//!
//! Main types: [`Outboard`], [`OutboardBuilder`].

use blake3::hazmat::{
    ChainingValue, HasherExt, Mode, left_subtree_len, merge_subtrees_non_root, merge_subtrees_root,
};

/// The smallest group (bytes): a power of two, a multiple of blake3's
/// 1 KiB chunk, large enough that blake3 hashes it with all its SIMD lanes.
pub const MIN_GROUP_LEN: u64 = 64 << 10;

/// Most groups kept for one body; longer bodies get larger groups.
pub const MAX_GROUPS: u64 = 4096;

/// The group length for a body of `body_len` bytes: [`MIN_GROUP_LEN`],
/// doubled until at most [`MAX_GROUPS`] groups cover the body.
pub fn group_len(body_len: u64) -> u64 {
    let mut len = MIN_GROUP_LEN;
    while body_len.div_ceil(len) > MAX_GROUPS {
        len *= 2;
    }
    len
}

/// The chaining values of a body's groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outboard {
    body_len: u64,
    group_len: u64,
    values: Vec<ChainingValue>,
}

/// Why stored outboard bytes are unusable.
#[derive(Debug, thiserror::Error)]
#[error("outboard of {found} bytes does not describe a body of {body_len} bytes")]
pub struct OutboardError {
    found: usize,
    body_len: u64,
}

impl Outboard {
    /// The outboard of `body` (tests, and entries written before outboards
    /// were kept).
    pub fn of(body: &[u8]) -> Outboard {
        let mut builder = OutboardBuilder::new();
        builder.update(body);
        builder.finish().1
    }

    /// The outboard stored as `bytes` for a body of `body_len` bytes.
    ///
    /// # Errors
    ///
    /// [`OutboardError`] when the length does not fit the body.
    pub fn from_bytes(body_len: u64, bytes: &[u8]) -> Result<Outboard, OutboardError> {
        let group_len = group_len(body_len);
        let groups = body_len.div_ceil(group_len).max(1) as usize;
        if bytes.len() != groups * 32 {
            return Err(OutboardError {
                found: bytes.len(),
                body_len,
            });
        }
        let values = bytes
            .chunks_exact(32)
            .map(|c| c.try_into().expect("32 bytes"))
            .collect();
        Ok(Outboard {
            body_len,
            group_len,
            values,
        })
    }

    /// The bytes to store.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.values.concat()
    }

    /// The body length it describes.
    pub fn body_len(&self) -> u64 {
        self.body_len
    }

    /// The group length.
    pub fn group_len(&self) -> u64 {
        self.group_len
    }

    /// How many groups.
    pub fn groups(&self) -> usize {
        self.values.len()
    }

    /// The byte range of group `index` in the body.
    pub fn group_range(&self, index: usize) -> std::ops::Range<u64> {
        let start = index as u64 * self.group_len;
        start..(start + self.group_len).min(self.body_len)
    }

    /// Whether the values merge into `digest`, the body's blake3: only then
    /// do they say anything about the body.
    pub fn matches(&self, digest: &blake3::Hash) -> bool {
        self.root() == *digest
    }

    /// Whether `bytes` are exactly group `index` of the body. A body of one
    /// group is checked against nothing here: use [`Outboard::matches`]'s
    /// digest with `blake3::hash` for those.
    pub fn check_group(&self, index: usize, bytes: &[u8]) -> bool {
        let range = self.group_range(index);
        if bytes.len() as u64 != range.end - range.start {
            return false;
        }
        if self.values.len() == 1 {
            return blake3::hash(bytes).as_bytes() == &self.values[0];
        }
        group_value(range.start, bytes) == self.values[index]
    }

    /// The root of the tree over the groups.
    fn root(&self) -> blake3::Hash {
        if self.values.len() == 1 {
            return blake3::Hash::from_bytes(self.values[0]);
        }
        let (left, right) = self.children(0, self.body_len);
        merge_subtrees_root(&left, &right, Mode::Hash)
    }

    /// The two children of the subtree of `len` bytes at `offset` (more than
    /// one group). blake3's left subtree is the largest power of two of
    /// chunks shorter than the whole, which for more than one group is a
    /// whole number of groups, since groups are powers of two too.
    fn children(&self, offset: u64, len: u64) -> (ChainingValue, ChainingValue) {
        let left = left_subtree_len(len);
        (
            self.subtree(offset, left),
            self.subtree(offset + left, len - left),
        )
    }

    fn subtree(&self, offset: u64, len: u64) -> ChainingValue {
        if len <= self.group_len {
            return self.values[(offset / self.group_len) as usize];
        }
        let (left, right) = self.children(offset, len);
        merge_subtrees_non_root(&left, &right, Mode::Hash)
    }
}

/// The non-root chaining value of the group `bytes` at body `offset`.
fn group_value(offset: u64, bytes: &[u8]) -> ChainingValue {
    let mut hasher = blake3::Hasher::new();
    hasher.set_input_offset(offset);
    hasher.update(bytes);
    hasher.finalize_non_root()
}

/// Builds an outboard from a body given in pieces of any size, its length
/// unknown until the end: it hashes [`MIN_GROUP_LEN`] groups, and
/// [`OutboardBuilder::finish`] merges them into the larger groups a long
/// body gets (each is a subtree of the smaller ones).
pub struct OutboardBuilder {
    /// The body while it may still be one group: its hash is a root then,
    /// not a chaining value.
    whole: blake3::Hasher,
    group: blake3::Hasher,
    in_group: u64,
    len: u64,
    values: Vec<ChainingValue>,
}

impl Default for OutboardBuilder {
    fn default() -> Self {
        OutboardBuilder::new()
    }
}

impl OutboardBuilder {
    /// A builder for a body of any length.
    pub fn new() -> OutboardBuilder {
        OutboardBuilder {
            whole: blake3::Hasher::new(),
            group: blake3::Hasher::new(),
            in_group: 0,
            len: 0,
            values: Vec::new(),
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds the next bytes of the body.
    pub fn update(&mut self, mut data: &[u8]) {
        // The whole-body hasher is needed only while the body may still be
        // one group; past the first group the tree gives the root.
        if self.len < MIN_GROUP_LEN {
            let head = data.len().min((MIN_GROUP_LEN - self.len) as usize);
            self.whole.update(&data[..head]);
        }
        while !data.is_empty() {
            let take = data.len().min((MIN_GROUP_LEN - self.in_group) as usize);
            self.group.update(&data[..take]);
            self.in_group += take as u64;
            self.len += take as u64;
            data = &data[take..];
            if self.in_group == MIN_GROUP_LEN {
                self.close_group();
            }
        }
    }

    fn close_group(&mut self) {
        let offset = self.values.len() as u64 * MIN_GROUP_LEN;
        let done = std::mem::replace(&mut self.group, blake3::Hasher::new());
        self.group.set_input_offset(offset + MIN_GROUP_LEN);
        self.values.push(done.finalize_non_root());
        self.in_group = 0;
    }

    /// The body's blake3 and its outboard.
    pub fn finish(mut self) -> (blake3::Hash, Outboard) {
        if self.len <= MIN_GROUP_LEN {
            // One group (or none): its hash is the root.
            let root = self.whole.finalize();
            let outboard = Outboard {
                body_len: self.len,
                group_len: MIN_GROUP_LEN,
                values: vec![*root.as_bytes()],
            };
            return (root, outboard);
        }
        if self.in_group > 0 {
            self.close_group_short();
        }
        let outboard = Outboard {
            body_len: self.len,
            group_len: MIN_GROUP_LEN,
            values: self.values,
        };
        let root = outboard.root();
        (root, outboard.regrouped(group_len(self.len)))
    }

    fn close_group_short(&mut self) {
        let done = std::mem::replace(&mut self.group, blake3::Hasher::new());
        self.values.push(done.finalize_non_root());
        self.in_group = 0;
    }
}

impl Outboard {
    /// The same tree cut into larger groups (`group_len` a power-of-two
    /// multiple of this one's): each larger group is a subtree of the old.
    fn regrouped(self, group_len: u64) -> Outboard {
        if group_len == self.group_len {
            return self;
        }
        let groups = self.body_len.div_ceil(group_len);
        let values = (0..groups)
            .map(|i| {
                let start = i * group_len;
                let len = group_len.min(self.body_len - start);
                self.subtree(start, len)
            })
            .collect();
        Outboard {
            body_len: self.body_len,
            group_len,
            values,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
            .collect()
    }

    #[test]
    fn the_groups_merge_into_the_bodys_blake3_for_every_shape() {
        let g = MIN_GROUP_LEN as usize;
        for len in [
            0,
            1,
            1024,
            g - 1,
            g,
            g + 1,
            2 * g,
            3 * g + 17,
            5 * g,
            8 * g,
            9 * g - 1,
        ] {
            let data = body(len);
            for piece in [1000, g, 7 * g] {
                let mut builder = OutboardBuilder::new();
                for part in data.chunks(piece) {
                    builder.update(part);
                }
                let (root, outboard) = builder.finish();
                assert_eq!(root, blake3::hash(&data), "len {len}");
                assert!(outboard.matches(&root), "len {len}");
                let again = Outboard::from_bytes(len as u64, &outboard.to_bytes()).unwrap();
                assert_eq!(again, outboard);
                for i in 0..outboard.groups() {
                    let r = outboard.group_range(i);
                    assert!(outboard.check_group(i, &data[r.start as usize..r.end as usize]));
                }
            }
        }
    }

    #[test]
    fn c_v3_any_changed_byte_fails_its_group_only() {
        let g = MIN_GROUP_LEN as usize;
        let data = body(3 * g + 500);
        let outboard = Outboard::of(&data);
        for at in [0, g - 1, g, 2 * g + 7, 3 * g + 499] {
            let mut bad = data.clone();
            bad[at] ^= 0x20;
            for i in 0..outboard.groups() {
                let r = outboard.group_range(i);
                let ok = outboard.check_group(i, &bad[r.start as usize..r.end as usize]);
                assert_eq!(ok, !r.contains(&(at as u64)), "byte {at}, group {i}");
            }
        }
        // A changed value no longer merges into the digest.
        let mut bytes = outboard.to_bytes();
        bytes[40] ^= 1;
        let forged = Outboard::from_bytes(data.len() as u64, &bytes).unwrap();
        assert!(!forged.matches(&blake3::hash(&data)));
        assert!(Outboard::from_bytes(data.len() as u64, &bytes[..64]).is_err());
    }

    #[test]
    fn large_bodies_get_larger_groups() {
        assert_eq!(group_len(256 << 20), MIN_GROUP_LEN);
        assert_eq!(group_len((256 << 20) + 1), 2 * MIN_GROUP_LEN);
        assert_eq!(group_len(1 << 30), 4 * MIN_GROUP_LEN);
        let data = body((256 << 20) + 100_000);
        let (root, outboard) = {
            let mut builder = OutboardBuilder::new();
            builder.update(&data);
            builder.finish()
        };
        assert_eq!(root, blake3::hash(&data));
        assert_eq!(outboard.group_len(), 2 * MIN_GROUP_LEN);
        assert_eq!(outboard.groups(), 2049);
        assert!(outboard.matches(&root));
        let last = outboard.group_range(2048);
        assert!(outboard.check_group(2048, &data[last.start as usize..]));
        let first = outboard.group_range(0);
        assert!(outboard.check_group(0, &data[..first.end as usize]));
    }
}

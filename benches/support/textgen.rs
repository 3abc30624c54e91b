//! Deterministic, text-like test bodies for the hsync benches and for
//! `scripts/bench-hsync.sh` (which compiles this file on its own with a tiny
//! `main`, so both measure the same kind of data).
//!
//! Text, not random bytes: random bytes neither compress nor repeat, so they
//! would hide what zstd costs on literals and flatter every peer that
//! compresses. Words come from a small fixed vocabulary with a skewed
//! (roughly Zipf-like) choice, in sentences and lines, which zstd -3
//! compresses about as well as English prose. A xorshift generator keeps it
//! fast (hundreds of MB/s) and the same on every machine; nothing here reads
//! a clock or the environment.

/// The number of distinct words.
const VOCABULARY: usize = 2048;

/// A xorshift64* generator: fast, deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value; zero is remapped).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n > 0`; the slight bias is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (((self.next_u64() >> 32) * n as u64) >> 32) as usize
    }
}

/// The fixed vocabulary: pronounceable words of 1 to 4 syllables, the same
/// for every seed so that different bodies share words (as pages of one
/// site do) while staying unrelated to the rsync matcher.
fn vocabulary() -> Vec<Vec<u8>> {
    const ONSETS: &[&[u8]] = &[
        b"b", b"c", b"d", b"f", b"g", b"h", b"l", b"m", b"n", b"p", b"r", b"s", b"t", b"v", b"w",
        b"st", b"th", b"pr", b"ch", b"sh", b"", b"",
    ];
    const NUCLEI: &[&[u8]] = &[b"a", b"e", b"i", b"o", b"u", b"ea", b"ou", b"ai", b"io"];
    const CODAS: &[&[u8]] = &[b"", b"", b"", b"n", b"r", b"s", b"t", b"nd", b"ng", b"l"];
    let mut rng = Rng::new(0x7E57_0ADA);
    (0..VOCABULARY)
        .map(|i| {
            // Frequent words (small indices) are short, as in real text.
            let syllables = 1 + usize::from(i >= 64) + usize::from(i >= 512) + rng.below(2);
            let mut word = Vec::new();
            for _ in 0..syllables {
                word.extend_from_slice(ONSETS[rng.below(ONSETS.len())]);
                word.extend_from_slice(NUCLEI[rng.below(NUCLEI.len())]);
                word.extend_from_slice(CODAS[rng.below(CODAS.len())]);
            }
            word
        })
        .collect()
}

/// Appends `len` bytes of text for `seed` to `out`.
pub fn append_text(out: &mut Vec<u8>, len: usize, seed: u64) {
    let words = vocabulary();
    let mut rng = Rng::new(seed);
    let end = out.len() + len;
    out.reserve(len + 64);
    let mut sentence_start = true;
    while out.len() < end {
        let r = rng.next_u64();
        // A cubed uniform picks small indices far more often: a cheap
        // stand-in for Zipf's law.
        let u = (r >> 43) as f64 / (1u64 << 21) as f64;
        let word = &words[((u * u * u) * VOCABULARY as f64) as usize];
        let at = out.len();
        out.extend_from_slice(word);
        if sentence_start {
            out[at] = out[at].to_ascii_uppercase();
        }
        // The low bits (unused by the word choice) end sentences and lines.
        sentence_start = r & 15 == 0;
        out.extend_from_slice(match (sentence_start, (r >> 4) & 7 == 0) {
            (true, true) => b".\n".as_slice(),
            (true, false) => b". ",
            (false, _) if (r >> 7) & 31 == 0 => b", ",
            (false, _) => b" ",
        });
    }
    out.truncate(end);
}

/// `len` bytes of text for `seed`.
pub fn text(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    append_text(&mut out, len, seed);
    out
}

/// Number of edit runs [`edit`] makes.
pub const EDIT_RUNS: usize = 32;

/// A copy of `base` with `percent` % of its bytes edited, in [`EDIT_RUNS`]
/// runs of equal length scattered over the body (one per 1/32 of it, at a
/// seeded offset), cycling through replace, insert and delete; new bytes
/// are fresh text. The result's length is within one run of `base`'s.
pub fn edit(base: &[u8], percent: usize, seed: u64) -> Vec<u8> {
    let run = (base.len() * percent / 100 / EDIT_RUNS).max(1);
    let segment = base.len() / EDIT_RUNS;
    assert!(
        segment > run,
        "body too small to edit: {} bytes",
        base.len()
    );
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(base.len() + run);
    let mut copied = 0;
    for i in 0..EDIT_RUNS {
        let at = i * segment + rng.below(segment - run);
        out.extend_from_slice(&base[copied..at]);
        let fresh = seed ^ ((i as u64 + 1) << 32);
        copied = match i % 3 {
            0 => {
                append_text(&mut out, run, fresh);
                at + run
            }
            1 => {
                append_text(&mut out, run, fresh);
                at
            }
            _ => at + run,
        };
    }
    out.extend_from_slice(&base[copied..]);
    out
}

/// A copy of `base` with `percent` % of its `page`-byte pages (at least
/// one) rewritten whole with fresh text, chosen at random over the body:
/// the same length, as a database file or a disk image changes
/// (RELIABILITY.md D-B2, "1 % scattered changes at 4 KiB granularity").
/// Used by `scripts/bench-big.sh`, not by the criterion benches.
#[allow(dead_code)]
pub fn edit_pages(base: &[u8], percent: usize, page: usize, seed: u64) -> Vec<u8> {
    let pages = base.len() / page;
    assert!(pages > 0, "body shorter than a page: {} bytes", base.len());
    let count = (pages * percent / 100).max(1);
    let mut rng = Rng::new(seed);
    let mut chosen = std::collections::BTreeSet::new();
    while chosen.len() < count {
        chosen.insert(rng.below(pages));
    }
    let mut out = base.to_vec();
    let mut fresh = Vec::with_capacity(page + 64);
    for index in chosen {
        fresh.clear();
        append_text(&mut fresh, page, seed ^ ((index as u64 + 1) << 20));
        out[index * page..(index + 1) * page].copy_from_slice(&fresh[..page]);
    }
    out
}

//! Fixed data shared by the fuzz targets and by the seed generator
//! (`examples/fixtures.rs`), so that committed seeds were encoded against
//! exactly the basis and body the targets use.

use std::sync::OnceLock;

pub mod client_upstream;

/// Length of the decoder targets' basis.
pub const BASIS_LEN: usize = 64 << 10;
/// Length of the body the `signature` target encodes.
pub const BODY_LEN: usize = 32 << 10;

/// Deterministic pseudo-random bytes (xorshift64*), the same on every run.
pub fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The fixed 64 KiB basis of `decoder` and `decoder_differential`.
pub fn basis() -> &'static [u8] {
    static BASIS: OnceLock<Vec<u8>> = OnceLock::new();
    BASIS.get_or_init(|| pseudo_random(0x6873_796e_6675_7a7a, BASIS_LEN))
}

/// The fixed 32 KiB body of `signature`: the basis's first 40 KiB with a few
/// edits cut to 32 KiB, so that signatures of the basis find copies in it.
pub fn body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| {
        let mut body = basis()[..40 << 10].to_vec();
        body.splice(5000..5010, b"an edit near the start".iter().copied());
        body.splice(20_000..20_000, b"an insertion".iter().copied());
        body.drain(30_000..31_500);
        body.truncate(BODY_LEN);
        body
    })
}

/// Length of the `known_basis` target's text.
pub const TEXT_LEN: usize = 64 << 10;

/// The fixed 64 KiB text of `known_basis`: words, markup, numbers and
/// newlines from a fixed seed, the kind of body codec 3 compresses against
/// (zstd finds the basis text in it; pseudo-random bytes would not).
pub fn text() -> &'static [u8] {
    static TEXT: OnceLock<Vec<u8>> = OnceLock::new();
    TEXT.get_or_init(|| {
        const WORDS: &[&str] = &[
            "function",
            "return",
            "var",
            "const",
            "the",
            "proxy",
            "cache",
            "delta",
            "window",
            "<div class=\"row\">",
            "</div>",
            "if",
            "else",
            "{",
            "}",
            "(",
            ");",
            "=>",
            "null",
            "signature",
            "block",
            "copy",
            "literal",
            "// comment",
            "import",
            "export",
            "hsync",
            "zstd",
        ];
        let random = pseudo_random(0x7465_7874_6b6e_6f77, TEXT_LEN);
        let mut out = Vec::with_capacity(TEXT_LEN + 32);
        let mut i = 0;
        while out.len() < TEXT_LEN {
            let r = random[i % random.len()];
            i += 1;
            out.extend_from_slice(WORDS[usize::from(r) % WORDS.len()].as_bytes());
            out.push(match r % 11 {
                0 => b'\n',
                1 => b'\t',
                _ => b' ',
            });
            if r.is_multiple_of(37) {
                out.extend_from_slice(format!("{}", u32::from(r) * 7919 + i as u32).as_bytes());
            }
        }
        out.truncate(TEXT_LEN);
        out
    })
}

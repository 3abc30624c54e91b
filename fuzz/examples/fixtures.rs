//! Writes the fuzz targets' fixed data and the seeds the CLI cannot make.
//!
//! `cargo run --example fixtures -- DIR` writes `DIR/basis.bin` (the 64 KiB
//! basis of `decoder` / `decoder_differential`), `DIR/body.bin` (the 32 KiB
//! body of `signature`) and a few edited bodies, for `rproxy hsync
//! sign|encode` to make the real-stream seeds from (`make-seeds.sh`), and
//! writes the `decoder_differential` seeds into `corpus/decoder_differential/`
//! (that target's input is not a stream) and the `client_upstream` seeds
//! into `corpus/client_upstream/`. See README.md, "Seeds".

use std::path::{Path, PathBuf};

use rproxy::hsync::{
    DeltaCommand, Encoder, EncoderOptions, Frame, Header, LiteralCodec, SignatureBuilder,
    SignatureParams,
};

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).expect("usage: fixtures DIR"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("basis.bin"), rproxy_fuzz::basis()).unwrap();
    std::fs::write(dir.join("body.bin"), rproxy_fuzz::body()).unwrap();
    let text: Vec<u8> = (0..400)
        .flat_map(|i| format!("line {i}: the quick brown fox\n").into_bytes())
        .collect();
    let text2 = String::from_utf8(text.clone())
        .unwrap()
        .replace("line 17:", "LINE 17 changed:")
        .replace("fox\nline 300", "dog\nline 300");
    std::fs::write(dir.join("text.bin"), &text).unwrap();
    std::fs::write(dir.join("text2.bin"), text2).unwrap();
    std::fs::write(dir.join("small.bin"), b"hello hsync\n").unwrap();
    // Over the decoder targets' 1 MiB output limit, yet a small stream.
    std::fs::write(dir.join("big.bin"), text.repeat(130)).unwrap();

    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/decoder_differential");
    std::fs::create_dir_all(&seeds).unwrap();
    let write = |name: &str, commands: &[u8], literals: &[u8]| {
        let mut seed = (commands.len() as u16).to_be_bytes().to_vec();
        seed.extend_from_slice(commands);
        seed.extend_from_slice(literals);
        std::fs::write(seeds.join(name), seed).unwrap();
    };

    // Real windows: the encoder (codec None, so literals are plain) against
    // the basis's signature, block 1024 as the target's header says.
    let basis = rproxy_fuzz::basis();
    let mut edited = basis.to_vec();
    edited.splice(1000..1010, b"an edit".iter().copied());
    edited.splice(
        30_000..30_000,
        b"an insertion in the middle".iter().copied(),
    );
    edited.drain(50_000..52_000);
    edited.extend_from_slice(b"and a new tail");
    std::fs::write(dir.join("edited.bin"), &edited).unwrap();
    codec_2_and_3_seeds(basis, &edited);
    let mut reordered = basis[32 << 10..].to_vec();
    reordered.extend_from_slice(&basis[..32 << 10]);
    for (name, new, signed) in [
        ("real-edited", &edited[..], true),
        ("real-reordered", &reordered[..], true),
        ("real-from-scratch", &basis[..300], false),
    ] {
        let (commands, literals) = first_window(basis, new, signed);
        write(name, &commands, &literals);
    }

    // One per failure class (ApplyError and our own), hand made.
    let mut cmd = Vec::new();
    DeltaCommand::Copy {
        offset: 65_000,
        len: 1000,
    }
    .write(&mut cmd);
    write("err-copy-out-of-bounds", &cmd, b"");
    write("err-copy-zero", &[0x45, 0x10, 0x00], b"");
    write("err-literal-zero", &[0x41, 0x00], b"");
    write("err-unknown-command", &[0x55], b"");
    write("err-end-inside", &[0x02, 0x00], b"ab");
    write("err-truncated-operand", &[0x54, 0, 0, 0], b"");
    write("err-literal-short", &[0x05], b"abc");
    write("err-literal-long", &[0x01], b"abc");
    let mut over = Vec::new();
    for _ in 0..17 {
        DeltaCommand::Copy {
            offset: 0,
            len: 65_536,
        }
        .write(&mut over);
    }
    write("err-output-limit", &over, b"");
    let mut at_limit = Vec::new();
    for _ in 0..16 {
        DeltaCommand::Copy {
            offset: 0,
            len: 65_536,
        }
        .write(&mut at_limit);
    }
    write("ok-output-at-limit", &at_limit, b"");
    let mut wide = Vec::new();
    wide.extend_from_slice(&[0x54]);
    wide.extend_from_slice(&0u64.to_be_bytes());
    wide.extend_from_slice(&(1u64 << 40).to_be_bytes());
    write("err-copy-huge", &wide, b"");

    // client_upstream: whole replies, as the target reads them.
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/client_upstream");
    std::fs::create_dir_all(&seeds).unwrap();
    for (name, input) in rproxy_fuzz::client_upstream::seeds() {
        std::fs::write(seeds.join(name), input).unwrap();
    }
}

/// `decoder` seeds of codec 2 (`ZstdWindow`, against the basis's
/// signature) and codec 3 (`ZstdBasis`, encoded with the basis body
/// itself); the `make-seeds.sh` ones predate both and are codec 1. Then the
/// `known_basis` inputs (field layout in `fuzz_targets/known_basis.rs`).
fn codec_2_and_3_seeds(basis: &[u8], edited: &[u8]) {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let decoder = corpus.join("decoder");
    std::fs::create_dir_all(&decoder).unwrap();
    let mut builder = SignatureBuilder::new(SignatureParams {
        block_size: 1024,
        strong_len: 8,
    });
    builder.update(basis);
    builder.finish();
    let signature = builder.to_signature_bytes();
    for (name, split, window_bytes) in [
        ("window-edited-split256", 255u8, None),
        ("window-edited-window4k-split100", 99, Some(4096)),
    ] {
        let mut options = EncoderOptions::default();
        assert_eq!(options.codec, LiteralCodec::ZstdWindow);
        if let Some(window_bytes) = window_bytes {
            options.window_bytes = window_bytes;
        }
        let mut encoder = Encoder::new(Some(&signature), Some(edited.len() as u64), options);
        let mut seed = vec![split];
        encoder.push(edited, &mut seed).unwrap();
        encoder.finish(&mut seed).unwrap();
        std::fs::write(decoder.join(name), seed).unwrap();
    }
    for (name, split, window_bytes) in [
        ("known-edited-split256", 255u8, None),
        ("known-edited-split7", 6, None),
        ("known-edited-window4k-split100", 99, Some(4096)),
    ] {
        let mut options = EncoderOptions::default();
        if let Some(window_bytes) = window_bytes {
            options.window_bytes = window_bytes;
        }
        let mut encoder =
            Encoder::with_basis_body(Box::new(basis.to_vec()), Some(edited.len() as u64), options);
        let mut seed = vec![split];
        encoder.push(edited, &mut seed).unwrap();
        encoder.finish(&mut seed).unwrap();
        std::fs::write(decoder.join(name), seed).unwrap();
    }

    let known = corpus.join("known_basis");
    std::fs::create_dir_all(&known).unwrap();
    let edit = |kind: u8, a: u16, b: u16| {
        let mut e = vec![kind];
        e.extend_from_slice(&a.to_be_bytes());
        e.extend_from_slice(&b.to_be_bytes());
        e
    };
    let tail = |window: u8, sizes: [u16; 4], wrong_at: u32, xor: u8| {
        let mut t = vec![window];
        for size in sizes {
            t.extend_from_slice(&size.to_be_bytes());
        }
        t.extend_from_slice(&wrong_at.to_be_bytes());
        t.push(xor);
        t
    };
    let mut seeds: Vec<(&str, Vec<u8>)> = Vec::new();
    // Unedited basis, body with an insertion, a deletion and a flipped byte.
    let mut s = vec![0, 0, 3];
    s.extend(edit(2, 30_000, 20));
    s.extend_from_slice(b"an inserted sentence");
    s.extend(edit(1, 10_000, 300));
    s.extend(edit(5, 50_000, 7));
    s.extend(tail(7, [4095, 999, 99, 6], 30_123, 1));
    seeds.push(("edited-body", s));
    // Basis and body both edited, a moved and a duplicated stretch.
    let mut s = vec![0, 2];
    s.extend(edit(6, 1000, 0));
    s.extend(edit(4, 20_000, 2000));
    s.extend_from_slice(&5000u16.to_be_bytes());
    s.push(2);
    s.extend(edit(3, 40_000, 3000));
    s.extend_from_slice(&100u16.to_be_bytes());
    s.extend(edit(0, 60_000, 0));
    s.extend(tail(31, [8191, 1, 8191, 8191], 7, 0x80));
    seeds.push(("edited-basis-and-body", s));
    // A small slice of the text as the basis, an empty body.
    let mut s = vec![0, 1];
    s.extend(edit(7, 123, 700));
    s.push(1);
    s.extend(edit(0, 0, 0));
    s.extend(tail(0, [63, 63, 0, 0], 5, 0x20));
    seeds.push(("small-basis-empty-body", s));
    // A wrong Content-Length (1 MiB: 1 MiB blocks, one window).
    let mut s = vec![1, 0, 1];
    s.extend(edit(5, 33_333, 1));
    s.push(0);
    s.extend_from_slice(&(1u32 << 30).to_be_bytes());
    s.extend_from_slice(&[0x10, 0, 0x01, 0, 0x02, 0, 0x00, 0x40, 0, 0, 0x80, 0, 9]);
    seeds.push(("wrong-content-length", s));
    // Large: 1.25 MiB basis, a 64 KiB stretch of it with edits.
    let mut s = vec![2, 1];
    s.extend(edit(5, 40_000, 3));
    s.extend_from_slice(&30_000u16.to_be_bytes());
    s.push(2);
    s.extend(edit(2, 1000, 12));
    s.extend_from_slice(b"hello, world");
    s.extend(edit(1, 50_000, 100));
    s.extend(tail(1, [8191, 8191, 1000, 4000], 700_000, 1));
    seeds.push(("large-basis", s));
    for (name, seed) in seeds {
        std::fs::write(known.join(name), seed).unwrap();
    }
}

/// The commands and plain literals of the first DELTA frame the encoder
/// writes for `new`, against `basis`'s signature or from scratch.
fn first_window(basis: &[u8], new: &[u8], signed: bool) -> (Vec<u8>, Vec<u8>) {
    let mut builder = SignatureBuilder::new(SignatureParams {
        block_size: 1024,
        strong_len: 8,
    });
    builder.update(basis);
    builder.finish();
    let signature = builder.to_signature_bytes();
    let options = EncoderOptions {
        codec: LiteralCodec::None,
        ..EncoderOptions::default()
    };
    let mut encoder = Encoder::new(
        signed.then_some(&signature[..]),
        Some(new.len() as u64),
        options,
    );
    let mut stream = Vec::new();
    encoder.push(new, &mut stream).unwrap();
    encoder.finish(&mut stream).unwrap();
    let (_, mut at) = Header::parse(&stream).unwrap().unwrap();
    loop {
        let (frame, used) = Frame::parse(&stream[at..]).unwrap().unwrap();
        at += used;
        if let Frame::Delta { commands, literals } = frame {
            return (commands.to_vec(), literals.to_vec());
        }
    }
}

//! Writes the fuzz targets' fixed data and the seeds the CLI cannot make.
//!
//! `cargo run --example fixtures -- DIR` writes `DIR/basis.bin` (the 64 KiB
//! basis of `decoder` / `decoder_differential`), `DIR/body.bin` (the 32 KiB
//! body of `signature`) and a few edited bodies, for `rproxy hsync
//! sign|encode` to make the real-stream seeds from (`make-seeds.sh`), and
//! writes the `decoder_differential` seeds into `corpus/decoder_differential/`
//! (that target's input is not a stream). See README.md, "Seeds".

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

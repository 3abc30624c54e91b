//! Interop with the real librsync tool, `rdiff` (the format doc promises
//! "librsync delta commands exactly as rdiff writes them" and signatures
//! "equal to `rdiff -H md4 -R rollsum -S 8 -b BLOCK signature`"). These
//! tests run `/usr/bin/rdiff` (or `rdiff` on PATH) and fail, not skip, when
//! it is missing.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use rproxy::hsync::{
    DecodeLimits, DeltaCommand, EncoderOptions, Header, LiteralCodec, SIGNATURE_HEADER_LEN,
    choose_block_size, join_delta, split_delta,
};
use support::{
    OwnedFrame, accelerator_signature, blake3_of, build_stream, decode, encode, options,
    plain_windows, pseudo_text, random_bytes, reference_signature,
};

/// The rdiff binary; a missing one fails the test with the fix.
fn rdiff() -> PathBuf {
    let installed = Path::new("/usr/bin/rdiff");
    if installed.exists() {
        return installed.to_path_buf();
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("rdiff"))
            .find(|p| p.exists())
    });
    on_path.unwrap_or_else(|| {
        panic!("rdiff is not installed: these interop tests need it (apt-get install rdiff)")
    })
}

fn run_rdiff(args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let mut command = Command::new(rdiff());
    command.args(["-H", "md4", "-R", "rollsum"]);
    for arg in args {
        command.arg(arg);
    }
    let output = command.output().expect("rdiff runs");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `rdiff -H md4 -R rollsum -S 8 -b BLOCK signature` of `body`.
fn rdiff_signature(dir: &Path, body: &[u8], block_size: u32) -> Vec<u8> {
    let input = dir.join("body");
    let output = dir.join("body.sig");
    std::fs::write(&input, body).expect("write body");
    let _ = std::fs::remove_file(&output);
    run_rdiff(&[
        &"-S",
        &"8",
        &"-b",
        &block_size.to_string(),
        &"signature",
        &input,
        &output,
    ]);
    std::fs::read(&output).expect("read signature")
}

/// `rdiff patch BASIS DELTA OUT`, returning OUT.
fn rdiff_patch(dir: &Path, basis: &[u8], delta: &[u8]) -> Vec<u8> {
    let (basis_path, delta_path, out_path) =
        (dir.join("basis"), dir.join("delta"), dir.join("out"));
    std::fs::write(&basis_path, basis).expect("write basis");
    std::fs::write(&delta_path, delta).expect("write delta");
    let _ = std::fs::remove_file(&out_path);
    run_rdiff(&[&"patch", &basis_path, &delta_path, &out_path]);
    std::fs::read(&out_path).expect("read patched")
}

fn sample_bodies() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("empty", Vec::new()),
        ("tiny", pseudo_text(1, 100)),
        ("one block", pseudo_text(2, 1024)),
        ("text 300 KB", pseudo_text(3, 300_000)),
        ("random 5000", random_bytes(4, 5000)),
        // Large enough that the accelerator picks a block size above 1 KiB.
        ("text 1 MiB + 123", pseudo_text(5, (1 << 20) + 123)),
    ]
}

/// Our signatures (incremental builder, accelerator block size) equal
/// rdiff's byte for byte.
#[test]
fn signature_equals_rdiff_md4_rollsum_signature() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut block_sizes = Vec::new();
    for (name, body) in sample_bodies() {
        let block_size = choose_block_size(
            body.len() as u64,
            EncoderOptions::default().max_signature_bytes,
            1024,
        );
        block_sizes.push(block_size);
        let ours = accelerator_signature(&body);
        assert_eq!(
            ours,
            rdiff_signature(dir.path(), &body, block_size),
            "{name}, block {block_size}"
        );
    }
    assert!(
        block_sizes.iter().any(|&b| b != 1024),
        "no sample exercises a non-default block size: {block_sizes:?}"
    );
}

/// A whole stream's DELTA frames, commands joined and literals joined into
/// one librsync delta (one magic, one END), patch with `rdiff` into the new
/// body; and each window's delta alone patches into that window.
#[test]
fn joined_delta_frames_patch_with_rdiff() {
    let dir = tempfile::tempdir().expect("temp dir");
    let basis = pseudo_text(6, 240_000);
    let mut new = basis.clone();
    new.splice(30_000..30_050, pseudo_text(7, 2000));
    new.drain(80_000..85_000);
    let moved: Vec<u8> = new.drain(10_000..14_000).collect();
    new.extend_from_slice(&moved);
    for codec in [LiteralCodec::None, LiteralCodec::Zstd] {
        let stream = support::encode_against(&basis, &new, options(16 << 10, codec));
        let windows = plain_windows(&stream);
        assert!(windows.len() > 4, "{codec:?}: want several windows");
        let mut all_commands = Vec::new();
        let mut all_literals = Vec::new();
        for (commands, literals) in &windows {
            all_commands.extend_from_slice(commands);
            all_literals.extend_from_slice(literals);
        }
        let delta = join_delta(&all_commands, &all_literals).expect("frames join");
        assert!(
            rdiff_patch(dir.path(), &basis, &delta) == new,
            "{codec:?}: rdiff patch of the joined delta differs from the new body"
        );

        let mut by_window = Vec::new();
        for (commands, literals) in windows.iter().take(3) {
            let delta = join_delta(commands, literals).expect("a frame joins");
            by_window.extend_from_slice(&rdiff_patch(dir.path(), &basis, &delta));
        }
        assert!(new.starts_with(&by_window) && !by_window.is_empty());
    }
}

/// The other direction: a delta written by `rdiff delta`, split into
/// commands and literal data, is a valid DELTA frame for our decoder.
#[test]
fn rdiff_delta_decodes_as_a_delta_frame() {
    let dir = tempfile::tempdir().expect("temp dir");
    let basis = pseudo_text(8, 50_000);
    let mut new = basis.clone();
    new.splice(20_000..20_000, pseudo_text(9, 3000));
    new.truncate(45_000);
    let sig_path = dir.path().join("basis.sig");
    std::fs::write(&sig_path, rdiff_signature(dir.path(), &basis, 1024)).expect("write sig");
    let (new_path, delta_path) = (dir.path().join("new"), dir.path().join("delta"));
    std::fs::write(&new_path, &new).expect("write new");
    run_rdiff(&[&"delta", &sig_path, &new_path, &delta_path]);
    let delta = std::fs::read(&delta_path).expect("read delta");

    let (mut commands, mut literals, mut copies) = (Vec::new(), Vec::new(), 0);
    split_delta(&delta, |command, data| {
        command.write(&mut commands);
        literals.extend_from_slice(data);
        copies += matches!(command, DeltaCommand::Copy { .. }) as usize;
    })
    .expect("rdiff writes a librsync delta");
    assert!(copies > 0, "rdiff found no copies");
    assert_eq!(
        join_delta(&commands, &literals).expect("joins"),
        delta,
        "split + join does not give back rdiff's delta"
    );

    let signature = reference_signature(&new, 1024);
    let frames = [
        OwnedFrame::Delta { commands, literals },
        OwnedFrame::Sig {
            entries: signature[SIGNATURE_HEADER_LEN..].to_vec(),
        },
        OwnedFrame::End {
            len: new.len() as u64,
            digest: blake3_of(&new),
        },
    ];
    let header = Header {
        block_size: 1024,
        strong_len: 8,
        codec: LiteralCodec::None,
        sig_frames: true,
    };
    let run = decode(
        &basis[..],
        &build_stream(header, &frames),
        &[777],
        DecodeLimits::default(),
    );
    assert!(run.result.is_ok(), "{:?}", run.result);
    assert!(run.out == new);
}

/// `rproxy hsync sign` writes rdiff's signature too.
#[test]
fn cli_sign_equals_rdiff_signature() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, body) in sample_bodies() {
        let path = dir.path().join("cli-body");
        std::fs::write(&path, &body).expect("write body");
        let output = Command::new(env!("CARGO_BIN_EXE_rproxy"))
            .args(["hsync", "sign"])
            .arg(&path)
            .output()
            .expect("rproxy runs");
        assert!(output.status.success(), "{name}: {output:?}");
        let block_size = choose_block_size(
            body.len() as u64,
            EncoderOptions::default().max_signature_bytes,
            1024,
        );
        assert_eq!(
            output.stdout,
            rdiff_signature(dir.path(), &body, block_size),
            "{name}"
        );
    }
}

/// A from-scratch stream (no basis signature) is all literals: rdiff
/// patches it against an empty basis.
#[test]
fn from_scratch_stream_patches_with_rdiff_against_an_empty_basis() {
    let dir = tempfile::tempdir().expect("temp dir");
    let new = pseudo_text(10, 40_000);
    let (stream, _) = encode(None, None, &new, options(8192, LiteralCodec::Zstd), &[3000]);
    let (mut commands, mut literals) = (Vec::new(), Vec::new());
    for (c, l) in plain_windows(&stream) {
        commands.extend_from_slice(&c);
        literals.extend_from_slice(&l);
    }
    let delta = join_delta(&commands, &literals).expect("joins");
    assert!(rdiff_patch(dir.path(), b"", &delta) == new);
}

/// The bundled pair of real releases (tests/data/jquery, in the repo): our
/// signature is rdiff's, the joined DELTA frames of a default-options
/// stream patch with rdiff, and our decoder rebuilds the same bytes.
#[test]
fn jquery_release_pair_interoperates_with_rdiff() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jquery");
    let basis = std::fs::read(data.join("3.7.0/jquery.js")).expect("bundled jquery 3.7.0");
    let new = std::fs::read(data.join("3.7.1/jquery.js")).expect("bundled jquery 3.7.1");
    let dir = tempfile::tempdir().expect("temp dir");
    let signature = accelerator_signature(&basis);
    let block_size = choose_block_size(
        basis.len() as u64,
        EncoderOptions::default().max_signature_bytes,
        1024,
    );
    assert_eq!(signature, rdiff_signature(dir.path(), &basis, block_size));

    let options = EncoderOptions {
        codec: LiteralCodec::Zstd,
        zstd_level: 3,
        ..EncoderOptions::default()
    };
    let (stream, summary) = encode(Some(&signature), Some(new.len() as u64), &new, options, &[]);
    assert!(summary.copied_bytes > new.len() as u64 / 2, "{summary:?}");
    let (mut commands, mut literals) = (Vec::new(), Vec::new());
    for (c, l) in plain_windows(&stream) {
        commands.extend_from_slice(&c);
        literals.extend_from_slice(&l);
    }
    let delta = join_delta(&commands, &literals).expect("joins");
    assert!(rdiff_patch(dir.path(), &basis, &delta) == new);
    let run = decode(&basis[..], &stream, &[4096], DecodeLimits::default());
    assert!(run.result.is_ok(), "{:?}", run.result);
    assert!(run.out == new);
}

//! The `rproxy hsync` tools as a user runs them: the built binary, real
//! files in a temp dir. `decode` must never leave a complete-looking output
//! file (or its temp file) behind a stream that fails (D-A3, D-A4, D-A8's
//! "no commit"), and exit codes follow STYLE: 0 ok, 64 usage, 1 failure.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::{pseudo_text, reference_signature, split_stream};

fn rproxy(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("rproxy runs")
}

fn rproxy_with_stdin(dir: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("rproxy runs");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        // A decoder may stop reading early; a broken pipe is fine.
        let _ = input.write_all(&data);
    });
    let output = child.wait_with_output().expect("rproxy finishes");
    writer.join().expect("stdin writer");
    output
}

fn assert_success(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what}: {:?}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// A temp dir with `basis`, `new`, `basis.sig` and `stream` (new encoded
/// against basis by the CLI).
fn prepared() -> (tempfile::TempDir, Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let basis = pseudo_text(1, 200_000);
    let mut new = basis.clone();
    new.splice(60_000..60_000, pseudo_text(2, 5000));
    new.drain(150_000..151_000);
    std::fs::write(dir.path().join("basis"), &basis).expect("write");
    std::fs::write(dir.path().join("new"), &new).expect("write");
    let d = dir.path();
    assert_success(
        &rproxy(d, &["hsync", "sign", "basis", "-o", "basis.sig"]),
        "sign",
    );
    let out = rproxy(
        d,
        &[
            "hsync",
            "encode",
            "--signature",
            "basis.sig",
            "new",
            "-o",
            "stream",
        ],
    );
    assert_success(&out, "encode");
    (dir, basis, new)
}

/// sign → encode → decode through files gives back the new body and its
/// verified signature.
#[test]
fn sign_encode_decode_round_trip_through_files() {
    let (dir, basis, new) = prepared();
    let d = dir.path();
    assert_eq!(
        std::fs::read(d.join("basis.sig")).expect("sig"),
        support::accelerator_signature(&basis)
    );
    let stream = std::fs::read(d.join("stream")).expect("stream");
    assert!(
        stream.len() < new.len() / 5,
        "stream of {} bytes",
        stream.len()
    );
    let out = rproxy(
        d,
        &[
            "hsync",
            "decode",
            "--basis",
            "basis",
            "stream",
            "-o",
            "rebuilt",
            "--signature-out",
            "rebuilt.sig",
        ],
    );
    assert_success(&out, "decode");
    assert!(std::fs::read(d.join("rebuilt")).expect("rebuilt") == new);
    let block_size = split_stream(&stream).0.block_size;
    assert_eq!(
        std::fs::read(d.join("rebuilt.sig")).expect("sig out"),
        reference_signature(&new, block_size)
    );
    // No temp file left beside the output.
    assert_eq!(
        names(d),
        [
            "basis",
            "basis.sig",
            "new",
            "rebuilt",
            "rebuilt.sig",
            "stream"
        ]
        .into_iter()
        .map(String::from)
        .collect()
    );
}

/// `-` reads stdin and writes stdout at every step.
#[test]
fn encode_and_decode_work_through_pipes() {
    let (dir, _, new) = prepared();
    let d = dir.path();
    let encoded = rproxy_with_stdin(
        d,
        &["hsync", "encode", "--signature", "basis.sig", "-"],
        &new,
    );
    assert_success(&encoded, "encode from stdin");
    let decoded = rproxy_with_stdin(
        d,
        &["hsync", "decode", "--basis", "basis", "-"],
        &encoded.stdout,
    );
    assert_success(&decoded, "decode from stdin");
    assert!(decoded.stdout == new);
}

/// D-A3: a truncated stream exits 1 and leaves no output file and no temp
/// file; an existing file at the output path is left as it was.
#[test]
fn decode_of_truncated_stream_fails_and_leaves_no_file() {
    let (dir, _, _) = prepared();
    let d = dir.path();
    let stream = std::fs::read(d.join("stream")).expect("stream");
    for cut in [0, 5, 12, stream.len() / 2, stream.len() - 1] {
        std::fs::write(d.join("cut"), &stream[..cut]).expect("write cut");
        let before = names(d);
        let out = rproxy(
            d,
            &[
                "hsync", "decode", "--basis", "basis", "cut", "-o", "rebuilt",
            ],
        );
        assert_eq!(out.status.code(), Some(1), "cut {cut}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("truncated"), "cut {cut}: {stderr}");
        assert_eq!(names(d), before, "cut {cut}: files appeared");
    }
    std::fs::write(d.join("rebuilt"), b"old contents").expect("write old");
    let out = rproxy(
        d,
        &[
            "hsync", "decode", "--basis", "basis", "cut", "-o", "rebuilt",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        std::fs::read(d.join("rebuilt")).expect("old"),
        b"old contents"
    );

    // To stdout the bytes stream out, so only the exit status tells.
    let out = rproxy(d, &["hsync", "decode", "--basis", "basis", "cut"]);
    assert_eq!(out.status.code(), Some(1));
}

/// D-A4: a corrupt stream, or one over `--max-output`, fails the same way.
#[test]
fn decode_of_corrupt_or_oversized_stream_fails_and_leaves_no_file() {
    let (dir, _, new) = prepared();
    let d = dir.path();
    let mut stream = std::fs::read(d.join("stream")).expect("stream");
    let last = stream.len() - 1;
    stream[last] ^= 1; // the END digest
    std::fs::write(d.join("corrupt"), &stream).expect("write");
    let before = names(d);
    let out = rproxy(
        d,
        &[
            "hsync", "decode", "--basis", "basis", "corrupt", "-o", "rebuilt",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(names(d), before);

    let max = (new.len() - 1).to_string();
    let out = rproxy(
        d,
        &[
            "hsync",
            "decode",
            "--basis",
            "basis",
            "stream",
            "-o",
            "rebuilt",
            "--max-output",
            &max,
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(names(d), before);
}

/// Bad usage exits 64 with a message on stderr; `--help` succeeds.
#[test]
fn bad_usage_exits_64() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    for args in [
        &["no-such-command"][..],
        &["hsync"],
        &["hsync", "decode", "stream"],
        &["hsync", "sign"],
        &["hsync", "sign", "file", "--no-such-flag"],
        &[
            "hsync",
            "decode",
            "--basis",
            "b",
            "s",
            "--max-output",
            "lots",
        ],
    ] {
        let out = rproxy(d, args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
    let out = rproxy(d, &["hsync", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("decode"));
}

/// A runtime failure (a missing input) exits 1, not 64.
#[test]
fn missing_input_exits_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = rproxy(dir.path(), &["hsync", "sign", "missing-file"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing-file"));
}

/// `stats` prints one line with the wire cost and the ratio to gzip -9.
#[test]
fn stats_prints_wire_and_ratio() {
    let (dir, _, _) = prepared();
    let out = rproxy(dir.path(), &["hsync", "stats", "--basis", "basis", "new"]);
    assert_success(&out, "stats");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("wire=") && l.contains("ratio="))
        .unwrap_or_else(|| panic!("no wire=/ratio= line in {stdout:?}"));
    let field = |name: &str| -> f64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line}"))
            .parse()
            .unwrap_or_else(|e| panic!("{name} in {line}: {e}"))
    };
    // A small edit of a 200 KB text costs far less than gzip -9 of it.
    assert!(field("wire=") > 0.0);
    assert!(field("ratio=") < 0.5, "{line}");
}

/// Decoding over the basis itself (`-o` = `--basis`) updates it in place:
/// the basis is read through its open file while the output goes to a temp
/// file that replaces it only at the end.
#[test]
fn decode_can_replace_its_own_basis() {
    let (dir, _, new) = prepared();
    let d = dir.path();
    let out = rproxy(
        d,
        &[
            "hsync", "decode", "--basis", "basis", "stream", "-o", "basis",
        ],
    );
    assert_success(&out, "decode in place");
    assert!(std::fs::read(d.join("basis")).expect("basis") == new);
    assert_eq!(
        names(d),
        ["basis", "basis.sig", "new", "stream"]
            .into_iter()
            .map(String::from)
            .collect()
    );
}

/// A tuning flag out of range is a usage error (STYLE: one-line reason,
/// exit 64), not a panic: `--min-block` above the 1 MiB block maximum.
#[test]
fn stats_with_min_block_over_the_maximum_exits_64() {
    let (dir, _, _) = prepared();
    let out = rproxy(
        dir.path(),
        &[
            "hsync",
            "stats",
            "--basis",
            "basis",
            "new",
            "--min-block",
            "2000000",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(64), "{stderr}");
}

/// When the last step fails (here the output path is an existing
/// directory, so the rename fails), `decode` exits 1 and still removes its
/// temp file.
#[test]
fn decode_whose_rename_fails_leaves_no_temp_file() {
    let (dir, _, _) = prepared();
    let d = dir.path();
    std::fs::create_dir(d.join("outdir")).expect("mkdir");
    let before = names(d);
    let out = rproxy(
        d,
        &[
            "hsync", "decode", "--basis", "basis", "stream", "-o", "outdir",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(names(d), before, "a temp file was left behind");
}

//! Hostile input for both ends of the codec (RELIABILITY B2: D-S1..D-S4
//! for the accelerator's encoder, D-A1..D-A7 for the client's decoder).
//! Every case must end in a named error or a correct result: never a panic,
//! a hang, output past the limit, or a wrong body that verifies.

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rproxy::hsync::{
    BasisUse, DecodeError, DecodeLimits, Decoder, DeltaCommand, EncoderOptions, FileBasis,
    FrameError, HEADER_LEN, Header, LiteralCodec, MAX_WINDOW_OUTPUT, SIGNATURE_HEADER_LEN,
    SignatureError, SignatureLimits,
};
use support::{
    OwnedFrame, Rng, accelerator_signature, blake3_of, build_stream, commands, decode, encode,
    encode_against, header, options, pseudo_text, random_bytes, reference_signature, split_stream,
};

const ALL_CODECS: [LiteralCodec; 3] = [
    LiteralCodec::None,
    LiteralCodec::Zstd,
    LiteralCodec::ZstdWindow,
];

/// A DELTA frame with uncompressed literals.
fn delta(list: &[DeltaCommand], literals: &[u8]) -> OwnedFrame {
    OwnedFrame::Delta {
        commands: commands(list),
        literals: literals.to_vec(),
    }
}

/// Runs `f` on another thread and fails the test if it takes longer than
/// `limit` (so a hang fails instead of stalling the suite).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(value) => value,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("did not finish within {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the worker panicked"),
    }
}

/// A valid signature of `blocks` blocks with one header field replaced.
fn signature_with_field(blocks: usize, at: usize, value: u32) -> Vec<u8> {
    let mut signature = accelerator_signature(&pseudo_text(5, blocks * 1024));
    signature[at..at + 4].copy_from_slice(&value.to_be_bytes());
    signature
}

/// D-S1, D-S2, D-S3: a signature that fails validation gives a valid
/// from-scratch stream (no copies) and names why; nothing reaches
/// fast_rsync's `index()`/`diff()`, so block size 0 cannot hang it. (F-4
/// runs the same check under the fuzzer: `fuzz/fuzz_targets/signature.rs`.)
#[test]
fn d_s1_d_s3_unusable_signatures_give_a_from_scratch_stream() {
    let cap = SignatureLimits::default().max_bytes;
    // D-S2: block size 1 with a signature at exactly the byte cap.
    let mut at_cap = signature_with_field(0, 4, 1);
    at_cap.resize(cap, 0xab);
    let mut over_cap = accelerator_signature(&pseudo_text(5, 4096));
    over_cap.resize(cap + 1, 0);
    // 4097 blocks of 1 MiB: more than the 4 GiB a signature may describe.
    let mut huge_basis = signature_with_field(0, 4, 1 << 20);
    huge_basis.resize(SIGNATURE_HEADER_LEN + 4097 * 12, 7);
    let cases: Vec<(&str, Vec<u8>, SignatureError)> = vec![
        (
            "D-S1 block 0",
            signature_with_field(64, 4, 0),
            SignatureError::BlockSizeOutOfRange { block_size: 0 },
        ),
        (
            "D-S2 block 1, 8 MiB",
            at_cap,
            SignatureError::BlockSizeOutOfRange { block_size: 1 },
        ),
        (
            "D-S2 block 2^32-1",
            signature_with_field(64, 4, u32::MAX),
            SignatureError::BlockSizeOutOfRange {
                block_size: u32::MAX,
            },
        ),
        (
            "D-S3 strong 0",
            signature_with_field(64, 8, 0),
            SignatureError::StrongLenOutOfRange { strong_len: 0 },
        ),
        (
            "D-S3 strong 17",
            signature_with_field(64, 8, 17),
            SignatureError::StrongLenOutOfRange { strong_len: 17 },
        ),
        (
            "D-S3 strong 0xFFFFFFFF",
            signature_with_field(64, 8, u32::MAX),
            SignatureError::StrongLenOutOfRange {
                strong_len: u32::MAX,
            },
        ),
        (
            "D-S3 BLAKE2 magic",
            signature_with_field(64, 0, 0x7273_0137),
            SignatureError::WrongMagic { magic: 0x7273_0137 },
        ),
        (
            "D-S3 empty",
            Vec::new(),
            SignatureError::TooShort { len: 0 },
        ),
        (
            "D-S3 11 bytes",
            signature_with_field(0, 0, 0x7273_0136)[..11].to_vec(),
            SignatureError::TooShort { len: 11 },
        ),
        (
            "D-S3 over the cap",
            over_cap,
            SignatureError::TooLarge {
                len: cap + 1,
                max: cap,
            },
        ),
        (
            "implied basis over 4 GiB",
            huge_basis,
            SignatureError::BasisTooLarge {
                implied_len: 4097 << 20,
                max: 4 << 30,
            },
        ),
    ];
    let new = pseudo_text(6, 50_000);
    for (name, signature, error) in cases {
        let body = new.clone();
        let started = Instant::now();
        let (stream, summary) = within(Duration::from_secs(10), move || {
            encode(
                Some(&signature),
                Some(body.len() as u64),
                &body,
                options(8192, LiteralCodec::None),
                &[],
            )
        });
        let elapsed = started.elapsed();
        if name.starts_with("D-S1") {
            assert!(elapsed < Duration::from_secs(1), "{name}: took {elapsed:?}");
        }
        assert_eq!(summary.basis, BasisUse::Unusable(error), "{name}");
        assert_eq!(summary.copied_bytes, 0, "{name}");
        // No copies: it decodes against any basis, even an empty one.
        let run = decode(&b""[..], &stream, &[], DecodeLimits::default());
        assert!(run.result.is_ok(), "{name}: {:?}", run.result);
        assert!(run.out == new, "{name}");
    }
}

/// D-S3: a signature whose length is not a whole number of entries is
/// used for its whole entries (documented choice: a header budget may cut
/// it), not rejected.
#[test]
fn d_s3_signature_cut_inside_an_entry_uses_its_whole_entries() {
    let basis = pseudo_text(8, 20 * 1024);
    let signature = accelerator_signature(&basis);
    // 10 whole entries and 5 bytes of the 11th.
    let cut = &signature[..SIGNATURE_HEADER_LEN + 10 * 12 + 5];
    let (stream, summary) = encode(
        Some(cut),
        Some(basis.len() as u64),
        &basis,
        options(4096, LiteralCodec::Zstd),
        &[],
    );
    assert_eq!(summary.basis, BasisUse::Truncated);
    assert_eq!(summary.copied_bytes, 10 * 1024, "{summary:?}");
    let run = decode(&basis[..], &stream, &[], DecodeLimits::default());
    assert!(run.result.is_ok());
    assert!(run.out == basis);
}

/// D-S4: a hash-flood signature, 200k entries sharing one rollsum (the
/// rollsum of every window of the body below) with distinct strong sums.
/// The diff must finish (fast_rsync blacklists a rollsum after 1024
/// collisions) and the stream must decode. Timing is left to the benches.
#[test]
fn d_s4_hash_flood_signature_finishes_and_decodes() {
    let zero_block = reference_signature(&[0; 1024], 1024);
    let rollsum = &zero_block[SIGNATURE_HEADER_LEN..SIGNATURE_HEADER_LEN + 4];
    let mut signature = zero_block[..SIGNATURE_HEADER_LEN].to_vec();
    let mut rng = Rng::new(99);
    for _ in 0..200_000 {
        signature.extend_from_slice(rollsum);
        signature.extend_from_slice(&rng.next_u64().to_be_bytes());
    }
    // Mostly zeros, so every position's rollsum collides, with some text.
    let mut new = vec![0u8; 4 << 20];
    new[1 << 20..(1 << 20) + 50_000].copy_from_slice(&pseudo_text(9, 50_000));
    let body = new.clone();
    let (stream, summary) = within(Duration::from_secs(120), move || {
        encode(
            Some(&signature),
            Some(body.len() as u64),
            &body,
            options(1 << 20, LiteralCodec::None),
            &[],
        )
    });
    assert_eq!(summary.basis, BasisUse::Whole);
    // No strong sum matches, so no copies: an empty basis is enough.
    assert_eq!(summary.copied_bytes, 0);
    let run = decode(&b""[..], &stream, &[], DecodeLimits::default());
    assert!(run.result.is_ok(), "{:?}", run.result);
    assert!(run.out == new);
}

/// D-A1: a copy past the end of the basis (or whose end overflows) is
/// `CopyOutOfBounds`, and no byte of its window is handed out.
#[test]
fn d_a1_copy_out_of_bounds_is_rejected_before_output() {
    let basis = pseudo_text(10, 5000);
    let cases = [
        (4990, 20),
        (5000, 1),
        (0, 5001),
        (u64::MAX - 5, 10),
        (u64::MAX, u64::MAX),
    ];
    for (offset, len) in cases {
        let frames = [
            delta(
                &[DeltaCommand::Copy {
                    offset: 0,
                    len: 100,
                }],
                b"",
            ),
            delta(
                &[
                    DeltaCommand::Literal { len: 3 },
                    DeltaCommand::Copy { offset, len },
                ],
                b"abc",
            ),
        ];
        let stream = build_stream(header(LiteralCodec::None), &frames);
        let run = decode(&basis[..], &stream, &[7], DecodeLimits::default());
        assert_eq!(
            run.result,
            Err(DecodeError::CopyOutOfBounds {
                offset,
                len,
                basis_len: 5000
            })
        );
        // Only the first, good window came out.
        assert_eq!(run.out, basis[..100]);
    }
}

/// D-A1 with a file basis, and D-A7's failure mode: a basis file that
/// shrinks under the decoder gives a `Basis` error, not a panic or short
/// output.
#[test]
fn d_a1_file_basis_checks_bounds_and_survives_a_shrinking_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("basis");
    let basis = pseudo_text(11, 30_000);
    std::fs::write(&path, &basis).expect("write basis");
    let new = {
        let mut new = basis.clone();
        new.splice(15_000..15_000, b"inserted".iter().copied());
        new
    };
    let stream = encode_against(&basis, &new, options(4096, LiteralCodec::Zstd));

    let file_basis = FileBasis::new(std::fs::File::open(&path).expect("open")).expect("basis");
    let run = decode(file_basis, &stream, &[333], DecodeLimits::default());
    assert!(run.result.is_ok(), "{:?}", run.result);
    assert!(run.out == new);

    let oob = build_stream(
        header(LiteralCodec::None),
        &[delta(
            &[DeltaCommand::Copy {
                offset: 29_999,
                len: 2,
            }],
            b"",
        )],
    );
    let file_basis = FileBasis::new(std::fs::File::open(&path).expect("open")).expect("basis");
    let run = decode(file_basis, &oob, &[], DecodeLimits::default());
    assert!(matches!(
        run.result,
        Err(DecodeError::CopyOutOfBounds { .. })
    ));

    let file_basis = FileBasis::new(std::fs::File::open(&path).expect("open")).expect("basis");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for write")
        .set_len(1000)
        .expect("shrink");
    let run = decode(file_basis, &stream, &[], DecodeLimits::default());
    assert!(
        matches!(run.result, Err(DecodeError::Basis { .. })),
        "{:?}",
        run.result
    );
    assert!(new.starts_with(&run.out));
}

/// D-A2: a delta bomb (1 MiB of `COPY(0, basis_len)` in one frame) and
/// literals declaring 2^63 bytes stop at the window limit before any byte
/// is produced or allocated.
#[test]
fn d_a2_delta_bomb_stops_at_the_window_limit() {
    let basis = random_bytes(12, 64 << 10);
    let copy = DeltaCommand::Copy {
        offset: 0,
        len: basis.len() as u64,
    };
    let one = commands(&[copy]);
    let bomb: Vec<u8> = one
        .iter()
        .copied()
        .cycle()
        .take((1 << 20) / one.len() * one.len())
        .collect();
    let started = Instant::now();
    for codec in ALL_CODECS {
        let frames = [OwnedFrame::Delta {
            commands: bomb.clone(),
            literals: Vec::new(),
        }];
        let run = decode(
            &basis[..],
            &build_stream(header(codec), &frames),
            &[],
            DecodeLimits::default(),
        );
        assert_eq!(
            run.result,
            Err(DecodeError::WindowTooLarge {
                max: MAX_WINDOW_OUTPUT
            })
        );
        assert!(run.out.is_empty());

        for len in [1u64 << 63, (MAX_WINDOW_OUTPUT + 1) as u64, u64::MAX] {
            let frames = [delta(&[DeltaCommand::Literal { len }], b"tiny")];
            let run = decode(
                &basis[..],
                &build_stream(header(codec), &frames),
                &[],
                DecodeLimits::default(),
            );
            assert_eq!(
                run.result,
                Err(DecodeError::WindowTooLarge {
                    max: MAX_WINDOW_OUTPUT
                }),
                "literal of {len}"
            );
            assert!(run.out.is_empty());
        }
    }
    // Generous: the bomb is rejected on its declared lengths, not by
    // rebuilding 16 MiB.
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// D-A2: literals whose declared lengths add up past u64 must be refused
/// like any other oversized window. (Found by this suite: the decoder adds
/// literal lengths unchecked, which panics on overflow in debug builds.)
#[test]
fn d_a2_literal_lengths_that_overflow_are_window_too_large() {
    for codec in ALL_CODECS {
        let frames = [delta(
            &[
                DeltaCommand::Literal { len: 1 },
                DeltaCommand::Literal { len: u64::MAX },
            ],
            b"a",
        )];
        let run = decode(
            &b"basis"[..],
            &build_stream(header(codec), &frames),
            &[],
            DecodeLimits::default(),
        );
        assert_eq!(
            run.result,
            Err(DecodeError::WindowTooLarge {
                max: MAX_WINDOW_OUTPUT
            })
        );
        assert!(run.out.is_empty());
    }
}

/// D-A2: `DecodeLimits::max_output` holds across frames: the frame that
/// would cross it fails whole, so the output never passes the limit.
#[test]
fn d_a2_output_limit_holds_across_frames() {
    let basis = random_bytes(13, 64 << 10);
    let copy = DeltaCommand::Copy {
        offset: 0,
        len: 64 << 10,
    };
    let frames: Vec<OwnedFrame> = (0..10).map(|_| delta(&[copy], b"")).collect();
    let stream = build_stream(header(LiteralCodec::None), &frames);
    let limits = DecodeLimits {
        max_output: 200_000,
        ..DecodeLimits::default()
    };
    let run = decode(&basis[..], &stream, &[1000], limits);
    assert_eq!(run.result, Err(DecodeError::OutputLimit { max: 200_000 }));
    assert_eq!(run.out.len(), 3 * (64 << 10));

    // A real stream: one byte short of its body fails, the exact length
    // succeeds.
    let basis = pseudo_text(14, 30_000);
    let mut new = basis.clone();
    new.extend_from_slice(&pseudo_text(15, 20_000));
    for codec in ALL_CODECS {
        let stream = encode_against(&basis, &new, options(4096, codec));
        for (max_output, ok) in [
            (new.len() as u64 - 1, false),
            (new.len() as u64, true),
            (0, false),
        ] {
            let limits = DecodeLimits {
                max_output,
                ..DecodeLimits::default()
            };
            let run = decode(&basis[..], &stream, &[5000], limits);
            assert!(run.out.len() as u64 <= max_output, "{codec:?} {max_output}");
            if ok {
                assert!(run.result.is_ok(), "{codec:?}: {:?}", run.result);
            } else {
                assert_eq!(
                    run.result,
                    Err(DecodeError::OutputLimit { max: max_output }),
                    "{codec:?}"
                );
            }
        }
    }
}

/// A zstd frame of one raw block whose header declares a window of
/// 2^`window_log` bytes.
fn zstd_frame(window_log: u8, data: &[u8]) -> Vec<u8> {
    let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd];
    // Frame header descriptor: no content size, no checksum, no dictionary,
    // not single-segment; then the window descriptor (exponent only).
    frame.push(0x00);
    frame.push((window_log - 10) << 3);
    let block_header = ((data.len() as u32) << 3) | 1; // last block, raw
    frame.extend_from_slice(&block_header.to_le_bytes()[..3]);
    frame.extend_from_slice(data);
    frame
}

/// D-A2: compressed literals are bounded too. A zstd frame that decodes
/// to more than the commands need is refused. A frame asking for a 1 GiB
/// window is refused by the streaming `Zstd` codec (whose window buffer it
/// would size); `ZstdWindow` decodes each frame in one shot into the
/// window's own output buffer, so there the declared window costs nothing
/// and the frame decodes.
#[test]
fn d_a2_compressed_literals_cannot_ask_for_more_memory_or_bytes() {
    let data = pseudo_text(16, 3000);
    for codec in [LiteralCodec::Zstd, LiteralCodec::ZstdWindow] {
        let run_with = |window_log: u8, declared: u64| {
            let frames = [OwnedFrame::Delta {
                commands: commands(&[DeltaCommand::Literal { len: declared }]),
                literals: zstd_frame(window_log, &data),
            }];
            decode(
                &b""[..],
                &build_stream(header(codec), &frames),
                &[],
                DecodeLimits::default(),
            )
        };
        // Control: a modest window decodes (so the frame itself is right).
        let run = run_with(20, 3000);
        assert_eq!(
            run.result,
            Err(DecodeError::Truncated { rebuilt: 3000 }),
            "{codec:?}"
        );
        assert_eq!(run.out, data);

        let run = run_with(30, 3000);
        if codec == LiteralCodec::Zstd {
            assert!(
                matches!(run.result, Err(DecodeError::Literals { .. })),
                "{codec:?}: {:?}",
                run.result
            );
            assert!(run.out.is_empty());
        } else {
            assert_eq!(run.result, Err(DecodeError::Truncated { rebuilt: 3000 }));
            assert_eq!(run.out, data);
        }

        for declared in [2000, 2999, 3001] {
            let run = run_with(20, declared);
            assert!(
                matches!(run.result, Err(DecodeError::Literals { .. })),
                "{codec:?} {declared}: {:?}",
                run.result
            );
            assert!(run.out.is_empty());
        }

        // After a good window, a bad one (decoded straight into the output,
        // as literals-only windows are) leaves exactly the good window.
        for declared in [2999, 3001] {
            let frames = [
                OwnedFrame::Delta {
                    commands: commands(&[DeltaCommand::Literal { len: 3000 }]),
                    literals: zstd_frame(20, &data),
                },
                OwnedFrame::Delta {
                    commands: commands(&[DeltaCommand::Literal { len: declared }]),
                    literals: zstd_frame(20, &data),
                },
            ];
            let run = decode(
                &b""[..],
                &build_stream(header(codec), &frames),
                &[],
                DecodeLimits::default(),
            );
            assert!(
                matches!(run.result, Err(DecodeError::Literals { .. })),
                "{codec:?} {declared}: {:?}",
                run.result
            );
            assert_eq!(run.out, data, "{codec:?} {declared}");
        }
    }
}

/// A small valid stream and what it encodes.
fn small_stream(codec: LiteralCodec) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let basis = pseudo_text(17, 6000);
    let mut new = basis.clone();
    new.splice(2000..2100, pseudo_text(18, 700));
    new.extend_from_slice(b"tail that is new");
    let stream = encode_against(&basis, &new, options(2048, codec));
    (basis, new, stream)
}

/// D-A3: a stream cut at any byte never finishes `Ok`; what was handed out
/// is a prefix of the body, and `into_partial` reports it with its exact
/// signature (fit to be a basis later).
#[test]
fn d_a3_truncation_at_every_byte_is_never_ok() {
    for codec in ALL_CODECS {
        let (basis, new, stream) = small_stream(codec);
        let block = split_stream(&stream).0.block_size;
        for cut in 0..stream.len() {
            let mut decoder = Decoder::new(&basis[..], DecodeLimits::default());
            let mut out = Vec::new();
            decoder
                .push(&stream[..cut], &mut out)
                .unwrap_or_else(|e| panic!("{codec:?} cut {cut}: a valid prefix fails: {e}"));
            assert_eq!(
                decoder.finish(),
                Err(DecodeError::Truncated {
                    rebuilt: out.len() as u64
                }),
                "{codec:?} cut {cut}"
            );
            assert!(new.starts_with(&out), "{codec:?} cut {cut}");
            let partial = decoder.into_partial();
            assert_eq!(partial.len, out.len() as u64);
            if cut < HEADER_LEN {
                assert_eq!(partial.signature, None);
            } else {
                assert_eq!(partial.signature, Some(reference_signature(&out, block)));
            }
        }
        let run = decode(&basis[..], &stream, &[], DecodeLimits::default());
        assert!(run.result.is_ok());
    }
}

/// D-A3: 1000 random cut points of a larger stream fed in random pieces.
#[test]
fn d_a3_random_cut_points_are_never_ok() {
    let basis = pseudo_text(19, 60_000);
    let mut new = basis.clone();
    new.splice(20_000..20_000, pseudo_text(20, 5_000));
    new.drain(40_000..45_000);
    let stream = encode_against(&basis, &new, options(8192, LiteralCodec::Zstd));
    let mut rng = Rng::new(21);
    for _ in 0..1000 {
        let cut = rng.below(stream.len() as u64) as usize;
        let piece = 1 + rng.below(4000) as usize;
        let run = decode(
            &basis[..],
            &stream[..cut],
            &[piece],
            DecodeLimits::default(),
        );
        assert_eq!(
            run.result,
            Err(DecodeError::Truncated {
                rebuilt: run.out.len() as u64
            }),
            "cut {cut}"
        );
        assert!(new.starts_with(&run.out));
    }
}

/// D-A3: bytes after END, unknown frame kinds, wrong magic, unknown
/// version, codec or flags each have their own error.
#[test]
fn d_a3_framing_faults_have_named_errors() {
    let (basis, _, stream) = small_stream(LiteralCodec::Zstd);
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut bad = stream.clone();
        f(&mut bad);
        decode(&basis[..], &bad, &[], DecodeLimits::default()).result
    };
    assert_eq!(
        with(&|s| s.extend_from_slice(b"xyz")),
        Err(DecodeError::TrailingData { len: 3 })
    );
    // Trailing data arriving in a later push.
    let mut decoder = Decoder::new(&basis[..], DecodeLimits::default());
    let mut out = Vec::new();
    decoder.push(&stream, &mut out).expect("valid stream");
    assert!(decoder.is_complete());
    assert_eq!(
        decoder.push(&[3], &mut out),
        Err(DecodeError::TrailingData { len: 1 })
    );
    assert_eq!(decoder.finish(), Err(DecodeError::Failed));

    // An unknown frame kind where the first frame should be.
    assert_eq!(
        with(&|s| s[HEADER_LEN] = 9),
        Err(DecodeError::Frame(FrameError::UnknownKind { kind: 9 }))
    );
    assert_eq!(
        with(&|s| s[..4].copy_from_slice(b"rs\x026")),
        Err(DecodeError::Frame(FrameError::BadMagic {
            found: *b"rs\x026"
        }))
    );
    assert_eq!(
        with(&|s| s[4] = 2),
        Err(DecodeError::Frame(FrameError::UnsupportedVersion {
            version: 2
        }))
    );
    assert_eq!(
        with(&|s| s[5] = 200),
        Err(DecodeError::Frame(FrameError::UnknownCodec { codec: 200 }))
    );
    assert_eq!(
        with(&|s| s[7] = 2),
        Err(DecodeError::Frame(FrameError::UnknownFlags { flags: 2 }))
    );
    // NO_SIG, on a stream that has SIG frames.
    assert_eq!(with(&|s| s[7] = 1), Err(DecodeError::UnexpectedSig));
    // A frame length over the limit is refused before its payload arrives.
    let mut decoder = Decoder::new(&basis[..], DecodeLimits::default());
    let mut head = stream[..HEADER_LEN].to_vec();
    head.push(1);
    head.extend_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        decoder.push(&head, &mut out),
        Err(DecodeError::Frame(FrameError::FrameTooLarge { .. }))
    ));
}

/// One random corruption of `stream`: a bit flip, a byte set to a random
/// value, or a byte set to 0 / 0xff.
fn corrupt(stream: &mut [u8], rng: &mut Rng) -> usize {
    let at = rng.below(stream.len() as u64) as usize;
    match rng.below(4) {
        0 | 1 => stream[at] ^= 1 << rng.below(8),
        2 => stream[at] = rng.next_u64() as u8,
        _ => stream[at] = if rng.below(2) == 0 { 0 } else { 0xff },
    }
    at
}

/// D-A4: 1000 random corruptions per codec: the decoder either fails or
/// rebuilds exactly the right body (when the change hit nothing that
/// matters). A wrong body never verifies.
#[test]
fn d_a4_random_corruption_never_verifies_a_wrong_body() {
    for codec in ALL_CODECS {
        let (basis, new, stream) = small_stream(codec);
        let mut rng = Rng::new(22 + codec as u64);
        let mut harmless = 0;
        for _ in 0..1000 {
            let mut bad = stream.clone();
            let at = corrupt(&mut bad, &mut rng);
            let pieces = [1 + rng.below(3000) as usize];
            let limits = DecodeLimits {
                max_output: new.len() as u64 * 2,
                ..DecodeLimits::default()
            };
            let run = decode(&basis[..], &bad, &pieces, limits);
            assert!(run.out.len() as u64 <= limits.max_output);
            if let Ok(decoded) = run.result {
                assert!(
                    run.out == new,
                    "{codec:?}: corruption at {at} verified a wrong body"
                );
                assert_eq!(decoded.digest, blake3_of(&new));
                harmless += 1;
            }
        }
        // Most corruptions must be caught; a handful may be no-ops.
        assert!(harmless < 100, "{codec:?}: {harmless} corruptions decoded");
    }
}

/// D-A4: the MD4-collision case: a stream that sends a COPY of the wrong
/// block (here every COPY shifted by one byte) with the SIG and END of the
/// intended body is caught by the signature or digest check.
#[test]
fn d_a4_copy_of_the_wrong_block_is_caught() {
    let basis = pseudo_text(23, 20_000);
    let mut new = basis.clone();
    new.splice(7000..7000, b"edit".iter().copied());
    let stream = encode_against(&basis, &new, options(4096, LiteralCodec::None));
    let (header, frames) = split_stream(&stream);
    let copies = frames
        .iter()
        .filter_map(|f| match f {
            OwnedFrame::Delta { commands, .. } => Some(commands),
            _ => None,
        })
        .flat_map(|c| {
            rproxy::hsync::parse_commands(c)
                .map(Result::unwrap)
                .collect::<Vec<_>>()
        })
        .filter(|c| matches!(c, DeltaCommand::Copy { .. }))
        .count();
    assert!(copies >= 2, "the stream needs copies to shift");
    for target in 0..copies {
        let mut seen = 0;
        let shifted: Vec<OwnedFrame> = frames
            .iter()
            .map(|frame| match frame {
                OwnedFrame::Delta {
                    commands: bytes,
                    literals,
                } => {
                    let list: Vec<DeltaCommand> = rproxy::hsync::parse_commands(bytes)
                        .map(Result::unwrap)
                        .map(|c| match c {
                            DeltaCommand::Copy { offset, len } => {
                                seen += 1;
                                if seen - 1 == target {
                                    let offset = if offset > 0 { offset - 1 } else { offset + 1 };
                                    DeltaCommand::Copy { offset, len }
                                } else {
                                    c
                                }
                            }
                            c => c,
                        })
                        .collect();
                    OwnedFrame::Delta {
                        commands: commands(&list),
                        literals: literals.clone(),
                    }
                }
                other => other.clone(),
            })
            .collect();
        let run = decode(
            &basis[..],
            &build_stream(header, &shifted),
            &[],
            DecodeLimits::default(),
        );
        assert!(
            matches!(
                run.result,
                Err(DecodeError::SignatureMismatch { .. } | DecodeError::DigestMismatch)
            ),
            "copy {target}: {:?}",
            run.result
        );
    }
}

/// D-A6: SIG entries are never trusted: one altered entry (with all else
/// right) is `SignatureMismatch` at that block; missing, extra and
/// misaligned entries are refused too.
#[test]
fn d_a6_altered_signature_entries_are_refused() {
    // Twenty blocks, so that SIG entries come in more than one frame (the
    // encoder hashes eight blocks at a time).
    let basis = pseudo_text(17, 20_000);
    let mut new = basis.clone();
    new.splice(2000..2100, pseudo_text(18, 700));
    new.extend_from_slice(b"tail that is new");
    let stream = encode_against(&basis, &new, options(2048, LiteralCodec::Zstd));
    let (header, frames) = split_stream(&stream);
    let sig_frames: Vec<usize> = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f, OwnedFrame::Sig { .. }))
        .map(|(i, _)| i)
        .collect();
    let blocks = new.len().div_ceil(1024);
    assert!(sig_frames.len() >= 2);
    let mut block = 0;
    for &i in &sig_frames {
        let OwnedFrame::Sig { entries } = &frames[i] else {
            unreachable!()
        };
        for entry in 0..entries.len() / 12 {
            for byte in [0, 5, 11] {
                let mut altered = frames.clone();
                let OwnedFrame::Sig { entries } = &mut altered[i] else {
                    unreachable!()
                };
                entries[entry * 12 + byte] ^= 0x80;
                let run = decode(
                    &basis[..],
                    &build_stream(header, &altered),
                    &[],
                    DecodeLimits::default(),
                );
                assert_eq!(
                    run.result,
                    Err(DecodeError::SignatureMismatch {
                        block: block + entry
                    }),
                    "entry {} byte {byte}",
                    block + entry
                );
            }
        }
        block += entries.len() / 12;
    }
    assert_eq!(block, blocks);

    let run_with = |frames: &[OwnedFrame]| {
        decode(
            &basis[..],
            &build_stream(header, frames),
            &[],
            DecodeLimits::default(),
        )
        .result
    };
    // A SIG frame left out: found at the next SIG or at END.
    let mut missing = frames.clone();
    missing.remove(sig_frames[0]);
    assert!(matches!(
        run_with(&missing),
        Err(DecodeError::SignatureMismatch { .. })
    ));
    // A SIG frame sent twice: entries ahead of the rebuilt body.
    let mut extra = frames.clone();
    extra.insert(sig_frames[0], frames[sig_frames[0]].clone());
    assert!(matches!(
        run_with(&extra),
        Err(DecodeError::SignatureMismatch { .. } | DecodeError::SignatureAhead { .. })
    ));
    // A SIG frame that is not a whole number of entries.
    let mut misaligned = frames.clone();
    if let OwnedFrame::Sig { entries } = &mut misaligned[sig_frames[0]] {
        entries.pop();
    }
    assert_eq!(
        run_with(&misaligned),
        Err(DecodeError::SignatureMisaligned {
            len: match &misaligned[sig_frames[0]] {
                OwnedFrame::Sig { entries } => entries.len(),
                _ => unreachable!(),
            },
            entry_len: 12
        })
    );
    // Entries sent ahead of their blocks are refused, not buffered.
    let mut flood = frames.clone();
    flood.insert(
        0,
        OwnedFrame::Sig {
            entries: vec![0; 12 * 1000],
        },
    );
    let limits = DecodeLimits {
        max_signature_bytes: 6000,
        ..DecodeLimits::default()
    };
    let run = decode(&basis[..], &build_stream(header, &flood), &[], limits);
    assert!(
        matches!(run.result, Err(DecodeError::SignatureAhead { .. })),
        "{:?}",
        run.result
    );
}

/// A frame for the random-stream property: mostly well-formed kinds with
/// random payloads, some with random commands.
fn random_frame() -> impl Strategy<Value = Vec<u8>> {
    let command_bytes = prop::collection::vec(
        prop_oneof![
            (1u8..=0x54).prop_map(|op| vec![op]),
            prop::collection::vec(any::<u8>(), 1..9),
        ],
        0..12,
    )
    .prop_map(|parts| parts.concat());
    prop_oneof![
        (command_bytes, prop::collection::vec(any::<u8>(), 0..300)).prop_map(|(c, l)| {
            let mut frame = Vec::new();
            OwnedFrame::Delta {
                commands: c,
                literals: l,
            }
            .write(&mut frame);
            frame
        }),
        prop::collection::vec(any::<u8>(), 0..100).prop_map(|entries| {
            let mut frame = Vec::new();
            OwnedFrame::Sig { entries }.write(&mut frame);
            frame
        }),
        (any::<u64>(), any::<[u8; 32]>()).prop_map(|(len, digest)| {
            let mut frame = Vec::new();
            OwnedFrame::End {
                len: len % 5000,
                digest,
            }
            .write(&mut frame);
            frame
        }),
        prop::collection::vec(any::<u8>(), 0..64),
    ]
}

fn codec() -> impl Strategy<Value = LiteralCodec> {
    prop_oneof![
        Just(LiteralCodec::None),
        Just(LiteralCodec::Zstd),
        Just(LiteralCodec::ZstdWindow)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Random bytes after a valid header never panic, never hand out more
    /// than the output limit and never verify.
    #[test]
    fn random_bytes_after_a_valid_header_fail_cleanly(
        codec in codec(),
        block_size in 512u32..=4096,
        tail in prop::collection::vec(any::<u8>(), 0..4096),
        pieces in prop::collection::vec(1usize..600, 1..4),
    ) {
        let basis = pseudo_text(24, 3000);
        let mut stream = Vec::new();
        Header { block_size, strong_len: 8, codec, sig_frames: true }.write(&mut stream);
        stream.extend_from_slice(&tail);
        let limits = DecodeLimits { max_output: 10_000, max_signature_bytes: 1000 };
        let run = decode(&basis[..], &stream, &pieces, limits);
        prop_assert!(run.out.len() <= 10_000);
        prop_assert!(run.result.is_err());
    }

    /// Random frames (valid kinds and lengths, random payloads and command
    /// bytes) after a valid header: same promises, deeper into the decoder.
    #[test]
    fn random_frames_after_a_valid_header_fail_cleanly(
        codec in codec(),
        frames in prop::collection::vec(random_frame(), 0..8),
        pieces in prop::collection::vec(1usize..600, 1..4),
    ) {
        let basis = pseudo_text(25, 3000);
        let mut stream = Vec::new();
        Header { block_size: 1024, strong_len: 8, codec, sig_frames: true }.write(&mut stream);
        stream.extend(frames.concat());
        let limits = DecodeLimits { max_output: 10_000, max_signature_bytes: 1000 };
        let run = decode(&basis[..], &stream, &pieces, limits);
        prop_assert!(run.out.len() <= 10_000);
        // Only an empty body with the right digest could verify.
        if let Ok(decoded) = &run.result {
            prop_assert_eq!(decoded.len, 0);
            prop_assert_eq!(decoded.digest, blake3_of(b""));
        }
    }
}

/// The default options (what the proxies use) on a from-scratch stream
/// decode with the tightest correct limits.
#[test]
fn from_scratch_stream_decodes_at_exact_limits() {
    let new = pseudo_text(26, 100_000);
    let (stream, summary) = encode(None, None, &new, EncoderOptions::default(), &[4096]);
    assert_eq!(summary.basis, BasisUse::Absent);
    let limits = DecodeLimits {
        max_output: new.len() as u64,
        max_signature_bytes: reference_signature(&new, summary.params.block_size).len()
            - SIGNATURE_HEADER_LEN,
    };
    let run = decode(&b""[..], &stream, &[1], limits);
    assert!(run.result.is_ok(), "{:?}", run.result);
    assert!(run.out == new);
}

/// `choose_block_size` stays in the block range whatever `min_block_size`
/// it is given, and an encoder with such options does not panic.
#[test]
fn choose_block_size_stays_in_range_for_any_minimum() {
    for min_block in [0, 1, 512, 1 << 20, (1 << 20) + 1, 2 << 20, u32::MAX] {
        for len in [0, 1, 1 << 30, u64::MAX] {
            let block = rproxy::hsync::choose_block_size(len, 4608, min_block);
            assert!(
                (rproxy::hsync::MIN_BLOCK_SIZE..=rproxy::hsync::MAX_BLOCK_SIZE).contains(&block),
                "len {len} min {min_block}: {block}"
            );
        }
    }
    let options = EncoderOptions {
        min_block_size: 2 << 20,
        ..options(4096, LiteralCodec::None)
    };
    let (stream, _) = encode(None, Some(10), b"ten bytes!", options, &[]);
    let run = decode(&b""[..], &stream, &[], DecodeLimits::default());
    assert!(run.result.is_ok());
}

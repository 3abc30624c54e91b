//! Differential tests of the decoder against `fast_rsync::apply_limited`
//! (RELIABILITY D-A9): the same (basis, delta) must give the same output,
//! or an error of the same class on both sides.
//!
//! Two sources of deltas: real streams from our encoder (each DELTA frame
//! joined back into a librsync delta), and random command bytes, valid-ish
//! with random offsets and lengths, wrapped by hand into an hsync stream.

mod support;

use proptest::prelude::*;
use rproxy::hsync::{
    DELTA_MAGIC, DecodeError, DecodeLimits, DeltaCommand, DeltaError, Header, LiteralCodec,
    MAX_WINDOW_OUTPUT, SIGNATURE_HEADER_LEN, join_delta, parse_commands,
};
use support::{
    OwnedFrame, apply_edits, blake3_of, build_stream, content, content_kind, decode, edit, encode,
    options, plain_windows, random_bytes, reference_signature,
};

fn apply_limited(basis: &[u8], delta: &[u8], limit: usize) -> (Result<(), String>, Vec<u8>) {
    let mut out = Vec::new();
    let result =
        fast_rsync::apply_limited(basis, delta, &mut out, limit).map_err(|e| e.to_string());
    (result, out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// D-A9 on real streams: every DELTA frame, joined into a librsync
    /// delta and applied by fast_rsync, rebuilds the same window as our
    /// decoder; all windows' commands and literals joined into one delta
    /// (the shape `rdiff patch` reads) rebuild the whole body.
    #[test]
    fn d_a9_encoded_windows_apply_like_fast_rsync(
        basis in (content_kind(), any::<u64>(), 0usize..=48 << 10),
        edits in prop::collection::vec(edit(), 0..5),
        window in 2048usize..=8192,
        zstd in any::<bool>(),
    ) {
        let basis: Vec<u8> = content(basis.0, basis.1, basis.2);
        let new = apply_edits(&basis, &edits);
        let codec = if zstd { LiteralCodec::Zstd } else { LiteralCodec::None };
        let signature = support::accelerator_signature(&basis);
        let (stream, _) = encode(Some(&signature), Some(new.len() as u64), &new, options(window, codec), &[]);
        let run = decode(&basis[..], &stream, &[], DecodeLimits::default());
        prop_assert!(run.result.is_ok(), "{:?}", run.result);
        prop_assert!(run.out == new);

        let (mut by_window, mut all_commands, mut all_literals) = (Vec::new(), Vec::new(), Vec::new());
        for (commands, literals) in plain_windows(&stream) {
            let delta = join_delta(&commands, &literals).expect("our frames join");
            let (result, out) = apply_limited(&basis, &delta, MAX_WINDOW_OUTPUT);
            prop_assert_eq!(result, Ok(()));
            by_window.extend_from_slice(&out);
            all_commands.extend_from_slice(&commands);
            all_literals.extend_from_slice(&literals);
        }
        prop_assert!(by_window == run.out, "fast_rsync's windows differ from our decoder's");
        let delta = join_delta(&all_commands, &all_literals).expect("joined frames join");
        let (result, out) = apply_limited(&basis, &delta, new.len());
        prop_assert_eq!(result, Ok(()));
        prop_assert!(out == new);
    }
}

/// How a copy's operands relate to the basis.
#[derive(Debug, Clone, Copy)]
enum CopyKind {
    InBounds,
    /// Ends 1.. bytes past the basis.
    PastEnd,
    /// offset + len overflows u64.
    Overflow,
    /// len 0 (librsync never writes one).
    Zero,
}

/// One command of a hand-made delta.
#[derive(Debug, Clone)]
enum Op {
    /// A literal of `len` bytes; `class` forces an operand width (0..4 for
    /// 1, 2, 4, 8 bytes) instead of the shortest form.
    Literal {
        len: u64,
        class: Option<u8>,
        seed: u64,
    },
    Copy {
        kind: CopyKind,
        a: u64,
        b: u64,
        offset_class: u8,
        len_class: u8,
    },
    /// A command byte that is not defined inside a window (0x00 is END).
    Unknown(u8),
}

fn size_class(value: u64) -> u8 {
    match value {
        0..=0xff => 0,
        0x100..=0xffff => 1,
        0x1_0000..=0xffff_ffff => 2,
        _ => 3,
    }
}

fn write_operand(value: u64, class: u8, out: &mut Vec<u8>) {
    out.extend_from_slice(&value.to_be_bytes()[8 - (1 << class)..]);
}

/// The command bytes of `op` and its literal data, against a basis of
/// `basis_len` bytes; also the command as our parser should read it.
fn encode_op(op: &Op, basis_len: u64) -> (Vec<u8>, Vec<u8>, Option<DeltaCommand>) {
    let mut cmd = Vec::new();
    match *op {
        Op::Literal { len, class, seed } => {
            match class {
                None if len <= 64 => cmd.push(len as u8),
                class => {
                    let class = class.unwrap_or(0).max(size_class(len));
                    cmd.push(0x41 + class);
                    write_operand(len, class, &mut cmd);
                }
            }
            (
                cmd,
                random_bytes(seed, len as usize),
                Some(DeltaCommand::Literal { len }),
            )
        }
        Op::Copy {
            kind,
            a,
            b,
            offset_class,
            len_class,
        } => {
            let (offset, len) = match kind {
                CopyKind::InBounds if basis_len > 0 => {
                    let offset = a % basis_len;
                    (offset, 1 + b % (basis_len - offset))
                }
                CopyKind::InBounds | CopyKind::PastEnd => {
                    let offset = basis_len - a % (basis_len + 1);
                    (offset, basis_len - offset + 1 + b % 100)
                }
                CopyKind::Overflow => (u64::MAX - a % 1000, 1001 + b % 5000),
                CopyKind::Zero => (a % (basis_len + 1), 0),
            };
            let offset_class = offset_class.max(size_class(offset));
            let len_class = len_class.max(size_class(len));
            cmd.push(0x45 + offset_class * 4 + len_class);
            write_operand(offset, offset_class, &mut cmd);
            write_operand(len, len_class, &mut cmd);
            (cmd, Vec::new(), Some(DeltaCommand::Copy { offset, len }))
        }
        Op::Unknown(byte) => (vec![byte], Vec::new(), None),
    }
}

fn valid_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..300, prop::option::weighted(0.3, 0u8..4), any::<u64>())
            .prop_map(|(len, class, seed)| Op::Literal { len, class, seed }),
        (
            any::<u64>(),
            any::<u64>(),
            prop_oneof![4 => Just(0u8), 1 => 0u8..4],
            prop_oneof![4 => Just(0u8), 1 => 0u8..4]
        )
            .prop_map(|(a, b, offset_class, len_class)| Op::Copy {
                kind: CopyKind::InBounds,
                a,
                b,
                offset_class,
                len_class
            }),
    ]
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => valid_op(),
        1 => (any::<u64>(), any::<u64>(), 0u8..4).prop_map(|(a, b, c)| Op::Copy {
            kind: CopyKind::PastEnd, a, b, offset_class: 0, len_class: c
        }),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(a, b)| Op::Copy {
            kind: CopyKind::Overflow, a, b, offset_class: 3, len_class: 0
        }),
        1 => (any::<u64>(), 0u8..4).prop_map(|(a, c)| Op::Copy {
            kind: CopyKind::Zero, a, b: 0, offset_class: 0, len_class: c
        }),
        1 => prop_oneof![Just(0u8), 0x55u8..=0xff].prop_map(Op::Unknown),
    ]
}

/// The class of an error, the same on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorClass {
    CopyOutOfBounds,
    UnknownCommand,
    ZeroCopy,
    /// The delta ends inside a command or its literal data.
    Eof,
    OutputLimit,
}

fn fast_rsync_class(error: &fast_rsync::ApplyError) -> ErrorClass {
    use fast_rsync::ApplyError as E;
    match error {
        E::CopyOutOfBounds { .. } => ErrorClass::CopyOutOfBounds,
        // An END (0x00) inside the window ends fast_rsync's delta early.
        E::UnknownCommand { .. } | E::TrailingData { .. } => ErrorClass::UnknownCommand,
        E::CopyZero => ErrorClass::ZeroCopy,
        E::UnexpectedEof { .. } => ErrorClass::Eof,
        E::OutputLimit { .. } => ErrorClass::OutputLimit,
        other => panic!("fast_rsync error the generator cannot cause: {other}"),
    }
}

fn our_class(error: &DecodeError) -> Option<ErrorClass> {
    Some(match error {
        DecodeError::CopyOutOfBounds { .. } => ErrorClass::CopyOutOfBounds,
        DecodeError::Delta(DeltaError::UnknownCommand { .. }) => ErrorClass::UnknownCommand,
        DecodeError::Delta(DeltaError::ZeroLength { .. }) => ErrorClass::ZeroCopy,
        DecodeError::Delta(DeltaError::Truncated { .. }) | DecodeError::Literals { .. } => {
            ErrorClass::Eof
        }
        DecodeError::OutputLimit { .. } | DecodeError::WindowTooLarge { .. } => {
            ErrorClass::OutputLimit
        }
        _ => return None,
    })
}

fn plain_header() -> Header {
    Header {
        block_size: 1024,
        strong_len: 8,
        codec: LiteralCodec::None,
        sig_frames: true,
    }
}

#[derive(Debug, Clone)]
struct CommandCase {
    basis_len: usize,
    basis_seed: u64,
    ops: Vec<Op>,
    /// Where the DELTA frames split the ops (raw, modulo the op count).
    frame_cuts: Vec<u64>,
    /// Cut the delta inside one op: (op index raw, byte raw).
    truncate: Option<(u64, u64)>,
    /// Output limit, raw (modulo twice the declared output), or none.
    limit: Option<u64>,
    pieces: Vec<usize>,
}

fn command_case() -> impl Strategy<Value = CommandCase> {
    (
        0usize..8192,
        any::<u64>(),
        prop_oneof![
            prop::collection::vec(valid_op(), 0..40),
            prop::collection::vec(any_op(), 0..40),
        ],
        prop::collection::vec(any::<u64>(), 0..3),
        prop::option::weighted(0.25, (any::<u64>(), any::<u64>())),
        prop::option::weighted(0.3, any::<u64>()),
        prop_oneof![Just(vec![1]), prop::collection::vec(1usize..500, 1..4)],
    )
        .prop_map(
            |(basis_len, basis_seed, ops, frame_cuts, truncate, limit, pieces)| CommandCase {
                basis_len,
                basis_seed,
                ops,
                frame_cuts,
                truncate,
                limit,
                pieces,
            },
        )
}

/// Builds both sides' inputs from a case and runs them.
fn check_commands(case: &CommandCase) -> Result<(), TestCaseError> {
    let basis = random_bytes(case.basis_seed, case.basis_len);
    let basis_len = basis.len() as u64;
    let encoded: Vec<_> = case.ops.iter().map(|op| encode_op(op, basis_len)).collect();

    // Ours: (commands, literals) per op; cut ops are the last.
    let mut ops: Vec<(Vec<u8>, Vec<u8>)> = encoded
        .iter()
        .map(|(c, d, _)| (c.clone(), d.clone()))
        .collect();
    // fast_rsync's: one librsync delta with literal data inline.
    let mut theirs = DELTA_MAGIC.to_be_bytes().to_vec();
    let mut ends_cleanly = true;
    if let Some((op_raw, byte_raw)) = case.truncate
        && !ops.is_empty()
    {
        let i = (op_raw % ops.len() as u64) as usize;
        let (cmd, data) = &ops[i];
        let inline_len = cmd.len() + data.len();
        if inline_len > 1 {
            // Keep 1..inline_len bytes of op i: never a clean op boundary.
            let keep = 1 + (byte_raw % (inline_len as u64 - 1)) as usize;
            let (cmd, data) = if keep < cmd.len() {
                (cmd[..keep].to_vec(), Vec::new())
            } else {
                (cmd.clone(), data[..keep - cmd.len()].to_vec())
            };
            ops.truncate(i);
            ops.push((cmd, data));
            ends_cleanly = false;
        }
    }
    for (cmd, data) in &ops {
        theirs.extend_from_slice(cmd);
        theirs.extend_from_slice(data);
    }
    if ends_cleanly {
        theirs.push(0x00);
    }

    // The output the commands declare, up to the first one ours rejects.
    let all_commands: Vec<u8> = ops.iter().flat_map(|(c, _)| c.iter().copied()).collect();
    let declared: u64 = parse_commands(&all_commands)
        .map_while(Result::ok)
        .map(|c| c.output_len())
        .fold(0u64, u64::saturating_add);
    let limit = match case.limit {
        None => DecodeLimits::default().max_output,
        Some(raw) => raw % declared.saturating_mul(2).saturating_add(1),
    };

    let (their_result, their_out) = {
        let mut out = Vec::new();
        let result = fast_rsync::apply_limited(&basis, &theirs, &mut out, limit as usize);
        (result, out)
    };

    // Ours: header + DELTA frames (+ SIG + END when the delta is good).
    let mut cuts: Vec<usize> = case
        .frame_cuts
        .iter()
        .map(|&raw| (raw % (ops.len() as u64 + 1)) as usize)
        .collect();
    cuts.push(0);
    cuts.push(ops.len());
    cuts.sort_unstable();
    let mut frames = Vec::new();
    for pair in cuts.windows(2) {
        let group = &ops[pair[0]..pair[1]];
        frames.push(OwnedFrame::Delta {
            commands: group.iter().flat_map(|(c, _)| c.iter().copied()).collect(),
            literals: group.iter().flat_map(|(_, d)| d.iter().copied()).collect(),
        });
    }
    if their_result.is_ok() {
        let signature = reference_signature(&their_out, 1024);
        frames.push(OwnedFrame::Sig {
            entries: signature[SIGNATURE_HEADER_LEN..].to_vec(),
        });
        frames.push(OwnedFrame::End {
            len: their_out.len() as u64,
            digest: blake3_of(&their_out),
        });
    }
    let stream = build_stream(plain_header(), &frames);
    let limits = DecodeLimits {
        max_output: limit,
        ..DecodeLimits::default()
    };
    let run = decode(&basis[..], &stream, &case.pieces, limits);

    match (&their_result, &run.result) {
        (Ok(()), Ok(decoded)) => {
            prop_assert!(run.out == their_out, "outputs differ");
            prop_assert_eq!(decoded.len, their_out.len() as u64);
        }
        (Ok(()), Err(ours)) => {
            return Err(TestCaseError::fail(format!(
                "fast_rsync applied it, we failed: {ours}"
            )));
        }
        (Err(theirs), Ok(_)) => {
            return Err(TestCaseError::fail(format!(
                "we decoded it, fast_rsync failed: {theirs}"
            )));
        }
        (Err(theirs), Err(ours)) => {
            let ours_class = our_class(ours);
            let theirs_class = fast_rsync_class(theirs);
            let same = ours_class == Some(theirs_class)
                // fast_rsync stops at the limit; we check a whole frame's
                // commands first, so a later bad command may be found first.
                || (theirs_class == ErrorClass::OutputLimit && ours_class.is_some())
                // We add up a whole frame's lengths before reading its
                // literals; fast_rsync reads a literal's data first.
                || (theirs_class == ErrorClass::Eof
                    && ours_class == Some(ErrorClass::OutputLimit)
                    && declared > limit);
            prop_assert!(
                same,
                "ours {:?} ({}) vs fast_rsync {:?} ({})",
                ours_class,
                ours,
                theirs_class,
                theirs
            );
            // We never hand out any byte of a window that fails, so what we
            // handed out is a prefix of what fast_rsync wrote before failing.
            prop_assert!(
                their_out.starts_with(&run.out),
                "ours is not a prefix of fast_rsync's output"
            );
        }
    }
    prop_assert!(run.out.len() as u64 <= limit);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// D-A9 on random command bytes (F-2's oracle as a property).
    #[test]
    fn d_a9_random_commands_decode_like_fast_rsync(case in command_case()) {
        check_commands(&case)?;
    }
}

/// The one deliberate difference: a zero-length literal (`LITERAL_N1 0`),
/// which librsync never writes, is accepted by fast_rsync as a no-op and
/// rejected by us.
#[test]
fn d_a9_zero_length_literal_is_rejected_where_fast_rsync_skips_it() {
    let basis = b"basis bytes".to_vec();
    let mut delta = DELTA_MAGIC.to_be_bytes().to_vec();
    delta.extend_from_slice(&[0x41, 0, 0x00]);
    let (result, out) = apply_limited(&basis, &delta, 100);
    assert_eq!(result, Ok(()));
    assert!(out.is_empty());

    let frames = [OwnedFrame::Delta {
        commands: vec![0x41, 0],
        literals: Vec::new(),
    }];
    let run = decode(
        &basis[..],
        &build_stream(plain_header(), &frames),
        &[],
        DecodeLimits::default(),
    );
    assert_eq!(
        run.result,
        Err(DecodeError::Delta(DeltaError::ZeroLength { offset: 0 }))
    );
}

/// The classes the property relies on, one by one, so that a change of
/// error variant shows up by name.
#[test]
fn d_a9_each_fault_has_the_same_class_on_both_sides() {
    let basis = random_bytes(1, 300);
    let cases: [(&[u8], &[u8], ErrorClass); 6] = [
        (&[0x45, 0xf0, 0xff], b"", ErrorClass::CopyOutOfBounds),
        (&[0x55], b"", ErrorClass::UnknownCommand),
        (&[0x02, 0x00, 0x01], b"abc", ErrorClass::UnknownCommand),
        (&[0x45, 0x10, 0x00], b"", ErrorClass::ZeroCopy),
        (&[0x46, 0x10, 0x01], b"", ErrorClass::Eof),
        (&[0x05], b"abc", ErrorClass::Eof),
    ];
    for (commands, literals, class) in cases {
        let frames = [OwnedFrame::Delta {
            commands: commands.to_vec(),
            literals: literals.to_vec(),
        }];
        let run = decode(
            &basis[..],
            &build_stream(plain_header(), &frames),
            &[],
            DecodeLimits::default(),
        );
        let ours = run.result.expect_err("a bad window");
        assert_eq!(our_class(&ours), Some(class), "{commands:02x?}: {ours}");
        assert!(run.out.is_empty());

        // The inline form fast_rsync reads: literal data after its command.
        let mut delta = DELTA_MAGIC.to_be_bytes().to_vec();
        let mut at = 0;
        let mut data = literals;
        while at < commands.len() {
            let op = commands[at];
            delta.push(op);
            at += 1;
            let operands = match op {
                0x46 => 3,
                0x45 => 2,
                _ => 0,
            };
            let operands = operands.min(commands.len() - at);
            delta.extend_from_slice(&commands[at..at + operands]);
            at += operands;
            if (1..=0x40).contains(&op) {
                let n = (op as usize).min(data.len());
                delta.extend_from_slice(&data[..n]);
                data = &data[n..];
            }
        }
        if class != ErrorClass::Eof {
            delta.push(0x00);
        }
        let mut out = Vec::new();
        let theirs = fast_rsync::apply_limited(&basis, &delta, &mut out, 1 << 20)
            .expect_err("fast_rsync rejects it too");
        assert_eq!(
            fast_rsync_class(&theirs),
            class,
            "{commands:02x?}: {theirs}"
        );
    }
}

//! Codec 3 (`ZstdBasis`): the encoder holds the client's basis body itself
//! and compresses each window against a slice of it. Round trips (D-A11,
//! D-A10), bases that differ from the encoder's (D-A4, D-A7: never a wrong
//! body), truncation (D-A3), and the slicing of large bases.

mod support;

use proptest::prelude::*;
use rproxy::hsync::{
    BASIS_SPAN, BasisUse, DecodeError, DecodeLimits, Decoder, Encoder, EncoderOptions, FileBasis,
    Header, LiteralCodec,
};
use support::*;

/// Fast settings: what is under test is the prefix, not the level.
fn fast(window_bytes: usize) -> EncoderOptions {
    EncoderOptions {
        window_bytes,
        basis_window_bytes: window_bytes,
        zstd_level: 3,
        basis_zstd_level: 3,
        ..EncoderOptions::default()
    }
}

/// The fast stage from the first window (as for a body larger than
/// `basis_high_level_budget`): windows go as the held-body matcher's
/// copies and literals.
fn fast_stage(window_bytes: usize) -> EncoderOptions {
    EncoderOptions {
        basis_high_level_budget: 0,
        ..fast(window_bytes)
    }
}

#[test]
fn small_edit_round_trips_and_costs_less_than_the_rsync_stream() {
    let basis = pseudo_text(1, 300_000);
    let mut new = basis.clone();
    // Edits every ~3 KB: each kills a block for rsync, not for codec 3.
    for at in (1000..290_000).step_by(3000) {
        new[at] ^= 0x20;
    }
    let stream = encode_with_body(&basis, &new, fast(1 << 20), &[]);
    let (out, decoded) = decode_ok(&basis, &stream);
    assert!(out == new);
    assert_eq!(decoded.digest, blake3_of(&new));
    let rsync = encode_against(&basis, &new, fast(1 << 20));
    assert!(
        stream.len() * 2 < rsync.len(),
        "codec 3: {} bytes, rsync: {} bytes",
        stream.len(),
        rsync.len()
    );
}

/// Issue 20: by the client's agreement a stream leaves out its SIG frames;
/// the decoder computes the same signature itself, vouches for no byte
/// before END, and refuses a SIG frame the header said it would not get.
#[test]
fn a_stream_without_sig_frames_rebuilds_the_same_body_and_signature() {
    let basis = pseudo_text(7, 200_000);
    let mut new = basis.clone();
    new.splice(100_000..100_000, b"inserted".iter().copied());
    let with = encode_with_body(&basis, &new, fast(1 << 20), &[]);
    let mut encoder = Encoder::with_basis_body(
        Box::new(basis.clone()),
        Some(new.len() as u64),
        fast(1 << 20),
    );
    encoder.leave_out_sig_frames();
    let mut without = Vec::new();
    encoder.push(&new, &mut without).unwrap();
    let summary = encoder.finish(&mut without).unwrap();
    assert_eq!(summary.signature_wire_bytes, 0);
    assert_eq!(without[7], Header::NO_SIG);
    assert!(
        without.len() < with.len(),
        "{} {}",
        without.len(),
        with.len()
    );

    let (out, decoded) = decode_ok(&basis, &without);
    assert!(out == new);
    let (_, decoded_with) = decode_ok(&basis, &with);
    assert_eq!(decoded.signature, decoded_with.signature);

    let mut decoder = Decoder::new(&basis[..], DecodeLimits::default());
    let mut rebuilt = Vec::new();
    let before_end = without.len() - 5 - 40;
    decoder.push(&without[..before_end], &mut rebuilt).unwrap();
    assert_eq!(decoder.rebuilt_len(), new.len() as u64);
    assert_eq!(decoder.verified_len(), 0);
    decoder.push(&without[before_end..], &mut rebuilt).unwrap();
    assert_eq!(decoder.verified_len(), new.len() as u64);

    let mut sig_frames_unannounced = with.clone();
    sig_frames_unannounced[7] = Header::NO_SIG;
    let run = decode(
        &basis[..],
        &sig_frames_unannounced,
        &[],
        DecodeLimits::default(),
    );
    assert_eq!(run.result, Err(DecodeError::UnexpectedSig));
}

#[test]
fn d_a4_a_different_basis_at_the_decoder_never_verifies() {
    let basis = pseudo_text(2, 100_000);
    let mut new = basis.clone();
    new.splice(50_000..50_000, b"inserted".iter().copied());
    let stream = encode_with_body(&basis, &new, fast(16 << 10), &[]);
    for other in [
        {
            let mut b = basis.clone();
            b[10] ^= 1;
            b
        },
        basis[..99_999].to_vec(),
        pseudo_text(3, 100_000),
        Vec::new(),
    ] {
        // A basis that differs only where the stream never looks rebuilds
        // the right body; anything else must fail. Never a wrong body.
        let run = decode(&other[..], &stream, &[4096], DecodeLimits::default());
        if run.result.is_ok() {
            assert!(run.out == new, "a wrong body verified");
        }
    }
    // A basis unrelated to the encoder's cannot rebuild it.
    let unrelated = pseudo_text(3, 100_000);
    assert!(
        decode(&unrelated[..], &stream, &[], DecodeLimits::default())
            .result
            .is_err()
    );
}

#[test]
fn body_larger_than_the_basis_span_uses_sliding_slices() {
    // Two copies of the basis with edits, so windows past BASIS_SPAN need a
    // slice that starts later in the basis.
    let span = BASIS_SPAN as usize;
    let basis = pseudo_text(4, span + (span / 2));
    let mut new = basis.clone();
    for at in (0..new.len()).step_by(200_000) {
        new[at] = b'#';
    }
    let stream = encode_with_body(&basis, &new, fast(1 << 20), &[1 << 20]);
    let (out, _) = decode_ok(&basis, &stream);
    assert!(out == new);
    // The tail of the body is far beyond the first slice: it still finds
    // its old text (nearly all of the body is cheap).
    let rsync = encode_against(&basis, &new, fast(1 << 20));
    assert!(
        stream.len() * 4 < rsync.len(),
        "codec 3: {} bytes, rsync: {} bytes, body {}",
        stream.len(),
        rsync.len(),
        new.len()
    );
}

/// A large body gets large signature blocks (its signature must fit the
/// budget), and windows used to hold eight of them: 8 MiB windows against
/// a 6 MiB basis slice starting 2 MiB before each window, so the back half
/// of every window found no old text (a 1 GiB body with 1 % edits sent
/// 419 MB, against 11.4 MB for rsync). Codec 3's windows stay within the
/// slice whatever the block size. A small signature budget gives 1 MiB
/// blocks on a 20 MiB body.
#[test]
fn large_blocks_keep_windows_within_the_basis_slice() {
    let len = 20 << 20;
    let basis = pseudo_text(12, len);
    let mut new = basis.clone();
    for at in (1000..len).step_by(256 << 10) {
        new[at] ^= 0x20;
    }
    let options = EncoderOptions {
        max_signature_bytes: 12 + 20 * 12,
        ..fast(1 << 20)
    };
    let stream = encode_with_body(&basis, &new, options, &[]);
    let (out, _) = decode_ok(&basis, &stream);
    assert!(out == new);
    let (header, frames) = split_stream(&stream);
    assert_eq!(header.block_size, 1 << 20);
    // 80 one-byte edits: a few dozen bytes each, and the frames around them.
    let rsync = encode_against(&basis, &new, options);
    assert!(
        stream.len() < 40_000 && stream.len() * 4 < rsync.len(),
        "codec 3: {} bytes in {} frames, rsync: {} bytes",
        stream.len(),
        frames.len(),
        rsync.len()
    );
}

/// Issue 20, codec 3 at speed: in the fast stage only the edited bytes are
/// literals (the rest goes as copies found by the held basis's index, moved
/// text included), the stream is smaller than the whole-window zstd one,
/// and an encoder reading the basis from a file writes the same stream.
#[test]
fn the_fast_stage_sends_copies_and_only_the_edited_bytes() {
    let basis = pseudo_text(21, 3 << 20);
    let mut new = basis.clone();
    for (n, at) in (10_000..3_000_000).step_by(150_001).enumerate() {
        new[at..at + 8].copy_from_slice(format!("EDIT{n:04}").as_bytes());
    }
    new.splice(1_000_000..1_000_000, pseudo_text(22, 5000));
    new.drain(2_000_000..2_004_000);
    let moved = basis[2_500_000..2_600_000].to_vec();
    new.splice(400_000..400_000, moved);
    let window = 1 << 20;
    let encode = |basis_body: Box<dyn rproxy::hsync::Basis + Send + Sync>| {
        let mut encoder =
            Encoder::with_basis_body(basis_body, Some(new.len() as u64), fast_stage(window));
        assert!(encoder.is_in_fast_stage());
        let mut stream = Vec::new();
        for piece in new.chunks(100_000) {
            encoder.push(piece, &mut stream).unwrap();
        }
        let summary = encoder.finish(&mut stream).unwrap();
        (stream, summary)
    };
    let (stream, summary) = encode(Box::new(basis.clone()));
    let (out, decoded) = decode_ok(&basis, &stream);
    assert!(out == new);
    assert_eq!(decoded.digest, blake3_of(&new));
    // 20 edits of 8 bytes and 5,000 inserted: a few bytes more at most
    // where an edit's text happens to equal the basis's.
    assert!(
        summary.literal_bytes <= 5000 + 20 * 8,
        "{} literal bytes",
        summary.literal_bytes
    );
    assert_eq!(
        summary.copied_bytes + summary.literal_bytes,
        new.len() as u64
    );
    let whole = encode_with_body(&basis, &new, fast(window), &[]);
    assert!(
        stream.len() < whole.len(),
        "matched: {} bytes, whole windows: {} bytes",
        stream.len(),
        whole.len()
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("basis");
    std::fs::write(&path, &basis).unwrap();
    let file = FileBasis::sole(std::fs::File::open(&path).unwrap()).unwrap();
    assert!(encode(Box::new(file)).0 == stream);

    // The decoder reads the copies from the basis and little else: the
    // literals' zstd frames reach only into the context (but in the first
    // window, which has none), so it builds no basis slice for them.
    struct Counting(Vec<u8>, std::rc::Rc<std::cell::Cell<u64>>);
    impl rproxy::hsync::Basis for Counting {
        fn size(&self) -> u64 {
            self.0.len() as u64
        }
        fn append_range(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
            self.1.set(self.1.get() + len as u64);
            self.0.append_range(offset, len, out)
        }
    }
    let read = std::rc::Rc::new(std::cell::Cell::new(0));
    let mut decoder = Decoder::new(
        Counting(basis.clone(), read.clone()),
        DecodeLimits::default(),
    );
    let mut out = Vec::new();
    decoder.push(&stream, &mut out).unwrap();
    decoder.finish().unwrap();
    assert!(out == new);
    let extra = read.get() - summary.copied_bytes;
    assert!(
        extra <= 64 << 10,
        "{extra} basis bytes read beyond the copies"
    );
}

/// A window the basis has little of (unrelated text) goes whole through
/// zstd against the basis slice, as in the high stage; the windows around
/// it still go as copies, and the body decodes.
#[test]
fn the_fast_stage_sends_unrelated_windows_whole() {
    let basis = pseudo_text(23, 1 << 20);
    let mut new = basis.clone();
    new.splice(300_000..300_000, random_bytes(24, 200_000));
    let mut encoder = Encoder::with_basis_body(Box::new(basis.clone()), None, fast_stage(64 << 10));
    let mut stream = Vec::new();
    encoder.push(&new, &mut stream).unwrap();
    let summary = encoder.finish(&mut stream).unwrap();
    let (out, _) = decode_ok(&basis, &stream);
    assert!(out == new);
    assert!(summary.copied_bytes > 900_000, "{summary:?}");
    assert!(summary.literal_bytes >= 200_000, "{summary:?}");
}

#[test]
fn decodes_against_a_file_basis() {
    let basis = pseudo_text(5, 200_000);
    let mut new = basis.clone();
    new.truncate(150_000);
    new.extend_from_slice(&pseudo_text(6, 10_000));
    let stream = encode_with_body(&basis, &new, fast(32 << 10), &[]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("basis");
    std::fs::write(&path, &basis).unwrap();
    let file = FileBasis::new(std::fs::File::open(&path).unwrap()).unwrap();
    let run = decode(file, &stream, &[777], DecodeLimits::default());
    run.result.expect("decodes against the file");
    assert!(run.out == new);
}

#[test]
fn d_a3_a_truncated_stream_never_finishes() {
    let basis = pseudo_text(7, 50_000);
    let mut new = basis.clone();
    new[25_000] = b'!';
    let stream = encode_with_body(&basis, &new, fast(8 << 10), &[]);
    for cut in (0..stream.len()).step_by(97) {
        let run = decode(&basis[..], &stream[..cut], &[], DecodeLimits::default());
        assert!(
            run.result.is_err(),
            "cut at {cut} of {} finished",
            stream.len()
        );
    }
}

#[test]
fn uncompressed_literals_ignore_the_body_and_send_from_scratch() {
    let basis = pseudo_text(8, 10_000);
    let options = EncoderOptions {
        codec: LiteralCodec::None,
        ..fast(4096)
    };
    let mut encoder = Encoder::with_basis_body(Box::new(basis.clone()), None, options);
    let mut stream = Vec::new();
    encoder.push(&basis, &mut stream).unwrap();
    let summary = encoder.finish(&mut stream).unwrap();
    assert_eq!(summary.basis, BasisUse::Absent);
    // Decodes against any basis, even none.
    let (out, _) = decode_ok(&[], &stream);
    assert!(out == basis);
}

#[test]
fn empty_basis_and_empty_body() {
    for (basis, new) in [
        (vec![], pseudo_text(9, 5000)),
        (pseudo_text(9, 5000), vec![]),
        (vec![], vec![]),
    ] {
        let stream = encode_with_body(&basis, &new, fast(4096), &[]);
        let (out, _) = decode_ok(&basis, &stream);
        assert!(out == new);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// D-A11 / D-A10 for codec 3: any edit script, any chunking on both
    /// sides, several windows.
    #[test]
    fn codec3_round_trips(
        kind in content_kind(),
        seed in any::<u64>(),
        len in 0usize..40_000,
        edits in prop::collection::vec(edit(), 0..6),
        window in 2048usize..16_384,
        encode_sizes in prop::collection::vec(1usize..9000, 1..4),
        decode_sizes in prop::collection::vec(1usize..5000, 1..4),
    ) {
        let basis = content(kind, seed, len);
        let new = apply_edits(&basis, &edits);
        let stream = encode_with_body(&basis, &new, fast(window), &encode_sizes);
        let run = decode(&basis[..], &stream, &decode_sizes, DecodeLimits::default());
        let decoded = run.result.expect("our stream decodes");
        prop_assert!(run.out == new);
        prop_assert_eq!(decoded.digest, blake3_of(&new));
        let block = split_stream(&stream).0.block_size;
        prop_assert_eq!(decoded.signature, reference_signature(&new, block));
    }

    /// The same for the fast stage's matched windows (copies found by the
    /// held basis's index, literals against the context's tail).
    #[test]
    fn codec3_fast_stage_round_trips(
        kind in content_kind(),
        seed in any::<u64>(),
        len in 0usize..40_000,
        edits in prop::collection::vec(edit(), 0..6),
        window in 2048usize..16_384,
        encode_sizes in prop::collection::vec(1usize..9000, 1..4),
        decode_sizes in prop::collection::vec(1usize..5000, 1..4),
    ) {
        let basis = content(kind, seed, len);
        let new = apply_edits(&basis, &edits);
        let stream = encode_with_body(&basis, &new, fast_stage(window), &encode_sizes);
        let run = decode(&basis[..], &stream, &decode_sizes, DecodeLimits::default());
        let decoded = run.result.expect("our stream decodes");
        prop_assert!(run.out == new);
        prop_assert_eq!(decoded.digest, blake3_of(&new));
        let block = split_stream(&stream).0.block_size;
        prop_assert_eq!(decoded.signature, reference_signature(&new, block));
    }
}

#[test]
fn decode_error_for_a_wrong_basis_is_a_digest_or_literal_error() {
    // The stream itself is fine; only the basis differs, so the failure
    // must be one that reports corruption, not a framing error.
    let basis = pseudo_text(10, 20_000);
    let mut new = basis.clone();
    new[100] = b'x';
    let stream = encode_with_body(&basis, &new, fast(4096), &[]);
    let wrong = pseudo_text(11, 20_000);
    let run = decode(&wrong[..], &stream, &[], DecodeLimits::default());
    assert!(
        matches!(
            run.result,
            Err(DecodeError::Literals { .. }
                | DecodeError::SignatureMismatch { .. }
                | DecodeError::DigestMismatch)
        ),
        "{:?}",
        run.result
    );
}

/// A decoder told to trust SIG entries computes the signature itself from
/// a stream that has none.
#[test]
fn trusting_sig_entries_of_a_stream_without_them_computes_the_signature() {
    let basis = pseudo_text(8, 100_000);
    let mut new = basis.clone();
    new[50_000] ^= 1;
    let mut encoder = Encoder::with_basis_body(
        Box::new(basis.clone()),
        Some(new.len() as u64),
        fast(1 << 20),
    );
    encoder.leave_out_sig_frames();
    let mut stream = Vec::new();
    encoder.push(&new, &mut stream).unwrap();
    encoder.finish(&mut stream).unwrap();
    let (_, computed) = decode_ok(&basis, &stream);
    let mut decoder = Decoder::new(&basis[..], DecodeLimits::default());
    decoder.trust_signature_entries();
    let mut out = Vec::new();
    decoder.push(&stream, &mut out).unwrap();
    let decoded = decoder.finish().unwrap();
    assert!(out == new);
    assert_eq!(decoded.signature, computed.signature);
}

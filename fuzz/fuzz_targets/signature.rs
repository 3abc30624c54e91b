//! F-4: basis-signature validation, then indexing and diffing through the
//! encoder, against a fixed 32 KiB body.
//!
//! Input: the signature bytes, as a client would send them.
//! Oracle: no panic, no hang (libFuzzer's -timeout); the caps hold
//! (`max_bytes`, `max_basis_len`); the encoder uses the signature exactly
//! when it parses; its stream parses frame by frame, ends with END carrying
//! the body's length and blake3, rebuilds exactly the body's length, and
//! copies only within the blocks the signature describes; decoding it
//! against an empty basis fails with `CopyOutOfBounds` when it copies and
//! rebuilds the body exactly when it does not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rproxy::hsync::{
    BasisSignature, BasisUse, DecodeError, DecodeLimits, Decoder, DeltaCommand, Encoder,
    EncoderOptions, Frame, Header, LiteralCodec, SIGNATURE_HEADER_LEN, SignatureLimits,
    parse_commands,
};

const LIMITS: SignatureLimits = SignatureLimits {
    max_bytes: 1 << 20,
    max_basis_len: 1 << 30,
};

fuzz_target!(|data: &[u8]| {
    let parsed = BasisSignature::parse(data, LIMITS);
    let Ok(signature) = parsed else {
        return;
    };
    let params = signature.params();
    assert!(data.len() <= LIMITS.max_bytes);
    let entries = data.len() - SIGNATURE_HEADER_LEN;
    assert_eq!(signature.blocks(), entries / params.entry_len());
    assert_eq!(
        signature.is_truncated(),
        !entries.is_multiple_of(params.entry_len())
    );
    let basis_len = signature.blocks() as u64 * u64::from(params.block_size);
    assert!(basis_len <= LIMITS.max_basis_len);

    let body = rproxy_fuzz::body();
    // Plain literals: with the default zstd level 19 one run costs ~0.1 s
    // under ASan (9 exec/s), and the codec is not what this target is for.
    let options = EncoderOptions {
        signature_limits: LIMITS,
        codec: LiteralCodec::None,
        ..EncoderOptions::default()
    };
    let mut encoder = Encoder::new(Some(data), Some(body.len() as u64), options);
    let expected_use = if signature.is_truncated() {
        BasisUse::Truncated
    } else {
        BasisUse::Whole
    };
    assert_eq!(*encoder.basis_use(), expected_use);
    let mut stream = Vec::new();
    encoder.push(body, &mut stream).expect("encoder push");
    let summary = encoder.finish(&mut stream).expect("encoder finish");
    assert_eq!(summary.body_len, body.len() as u64);
    assert_eq!(
        summary.copied_bytes + summary.literal_bytes,
        body.len() as u64
    );
    assert_eq!(summary.stream_bytes, stream.len() as u64);

    // Frame by frame.
    let (_, mut at) = Header::parse(&stream)
        .expect("header")
        .expect("whole header");
    let (mut rebuilt, mut copied, mut ended) = (0u64, 0u64, false);
    while at < stream.len() {
        assert!(!ended, "bytes after END");
        let (frame, used) = Frame::parse(&stream[at..])
            .expect("frame")
            .expect("whole frame");
        at += used;
        match frame {
            Frame::Delta { commands, .. } => {
                for command in parse_commands(commands) {
                    let command = command.expect("encoder wrote a bad command");
                    if let DeltaCommand::Copy { offset, len } = command {
                        assert!(
                            offset + len <= basis_len,
                            "copy {offset}+{len} > {basis_len}"
                        );
                        copied += len;
                    }
                    rebuilt += command.output_len();
                }
            }
            Frame::Sig { .. } => {}
            Frame::End { len, digest } => {
                assert_eq!(len, body.len() as u64);
                assert_eq!(digest, *blake3::hash(body).as_bytes());
                ended = true;
            }
        }
    }
    assert!(ended, "no END");
    assert_eq!(rebuilt, body.len() as u64);
    assert_eq!(copied, summary.copied_bytes);

    // Against an empty basis: copies fail, a copy-free stream rebuilds the body.
    let mut decoder = Decoder::new(&[][..], DecodeLimits::default());
    let mut out = Vec::new();
    let result = decoder.push(&stream, &mut out);
    if copied == 0 {
        result.expect("copy-free stream refused");
        assert_eq!(
            decoder.finish().expect("copy-free stream unverified").len,
            rebuilt
        );
        assert!(out == body, "copy-free stream rebuilt the wrong body");
    } else {
        assert!(
            matches!(result, Err(DecodeError::CopyOutOfBounds { .. })),
            "{result:?}"
        );
    }
});

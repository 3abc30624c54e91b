//! F-2: the streaming decoder over a fixed pseudo-random 64 KiB basis.
//!
//! Input: byte 0 chooses the push size (1..=256) and, when odd, `push_to`
//! (a sink collecting each window) rather than `push`; the rest is the
//! stream, whose header's codec byte picks any of codecs 0-3.
//! Oracle: no panic; output never exceeds `max_output` and always equals
//! `rebuilt_len()`; a verified stream's digest is the blake3 of the output
//! and its signature is `fast_rsync::Signature::calculate` of the output; an
//! unverified one leaves a `Partial` whose length and signature describe
//! exactly the bytes handed out.
#![no_main]

use fast_rsync::{Signature, SignatureOptions};
use libfuzzer_sys::fuzz_target;
use rproxy::hsync::{DecodeError, DecodeLimits, Decoder};

const MAX_OUTPUT: u64 = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&split, stream)) = data.split_first() else {
        return;
    };
    let use_sink = split % 2 == 1;
    let split = usize::from(split) + 1;
    let basis = rproxy_fuzz::basis();
    let mut decoder = Decoder::new(
        basis,
        DecodeLimits {
            max_output: MAX_OUTPUT,
            ..Default::default()
        },
    );
    let mut out = Vec::new();
    let mut failed = false;
    for piece in stream.chunks(split) {
        let result = if use_sink {
            decoder.push_to(piece, |window| {
                out.extend_from_slice(window);
                Ok(())
            })
        } else {
            decoder.push(piece, &mut out)
        };
        assert!(out.len() as u64 <= MAX_OUTPUT, "output {} bytes", out.len());
        if use_sink && result.is_err() {
            // R-8 (tests/hsync_review.rs): `push_to` counts a window whose
            // SIG check failed without handing it out. Make this `==` once
            // it is fixed.
            assert!(out.len() as u64 <= decoder.rebuilt_len());
        } else {
            assert_eq!(out.len() as u64, decoder.rebuilt_len());
        }
        if failed {
            assert_eq!(result, Err(DecodeError::Failed));
        }
        if result.is_err() {
            failed = true;
            // One more push must be refused (and append nothing).
            let before = out.len();
            assert_eq!(decoder.push(b"x", &mut out), Err(DecodeError::Failed));
            assert_eq!(out.len(), before);
            break;
        }
    }
    let header = decoder.header();
    match decoder.finish() {
        Ok(decoded) => {
            assert!(!failed);
            let header = header.expect("a verified stream has a header");
            assert_eq!(decoded.len, out.len() as u64);
            assert_eq!(decoded.digest, *blake3::hash(&out).as_bytes());
            let expected = Signature::calculate(
                &out,
                SignatureOptions {
                    block_size: header.block_size,
                    crypto_hash_size: header.strong_len,
                },
            );
            assert_eq!(
                decoded.signature,
                expected.serialized(),
                "signature differs"
            );
        }
        Err(_) => {
            let partial = decoder.into_partial();
            if use_sink && failed && partial.len != out.len() as u64 {
                // R-8, as above: the partial describes more than was handed out.
                assert!(partial.len > out.len() as u64);
                return;
            }
            assert_eq!(partial.len, out.len() as u64);
            match (header, partial.signature) {
                (Some(header), Some(signature)) => {
                    let expected = Signature::calculate(
                        &out,
                        SignatureOptions {
                            block_size: header.block_size,
                            crypto_hash_size: header.strong_len,
                        },
                    );
                    assert_eq!(
                        signature,
                        expected.serialized(),
                        "partial signature differs"
                    );
                }
                (None, None) => assert!(out.is_empty()),
                (h, s) => panic!(
                    "header {h:?} but partial signature {:?}",
                    s.map(|s| s.len())
                ),
            }
        }
    }
});

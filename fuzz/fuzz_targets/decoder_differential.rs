//! D-A9: our decoder against `fast_rsync::apply_limited`, same basis, same
//! output limit.
//!
//! Input: a big-endian u16 `n`, then librsync command bytes (the first `n`
//! bytes of the rest, or all of it) and literal bytes (what follows). They
//! become one stream: a header (codec None, block 1024, strong 8) and one
//! DELTA frame. The same commands and literals, joined by `join_delta`, go
//! to `fast_rsync::apply_limited`.
//!
//! Oracle: no panic; when ours rebuilds the window, fast_rsync rebuilds the
//! same bytes; when fast_rsync accepts the joined delta, ours accepts the
//! stream (the two are meant to agree exactly once `join_delta` accepts);
//! when `join_delta` refuses, ours refuses. A rebuilt window followed by its
//! true SIG and END frames must verify.
#![no_main]

use fast_rsync::{Signature, SignatureOptions};
use libfuzzer_sys::fuzz_target;
use rproxy::hsync::{
    DecodeLimits, Decoder, Frame, Header, LiteralCodec, SIGNATURE_HEADER_LEN, join_delta,
};

const LIMIT: usize = 1 << 20;
const BLOCK_SIZE: u32 = 1024;
const STRONG_LEN: u32 = 8;

fuzz_target!(|data: &[u8]| {
    let Some((len, rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let n = usize::from(u16::from_be_bytes(*len)).min(rest.len());
    let (commands, literals) = rest.split_at(n);
    let basis = rproxy_fuzz::basis();

    let header = Header {
        block_size: BLOCK_SIZE,
        strong_len: STRONG_LEN,
        codec: LiteralCodec::None,
        sig_frames: true,
    };
    let mut stream = Vec::new();
    header.write(&mut stream);
    Frame::Delta { commands, literals }.write(&mut stream);
    let mut decoder = Decoder::new(
        basis,
        DecodeLimits {
            max_output: LIMIT as u64,
            ..Default::default()
        },
    );
    let mut ours = Vec::new();
    let ours_result = decoder.push(&stream, &mut ours);
    assert!(ours.len() <= LIMIT);

    let joined = join_delta(commands, literals);
    let Ok(delta) = joined else {
        assert!(
            ours_result.is_err(),
            "join_delta refused ({joined:?}) but our decoder rebuilt {} bytes",
            ours.len()
        );
        return;
    };
    let mut theirs = Vec::new();
    let theirs_result = fast_rsync::apply_limited(basis, &delta, &mut theirs, LIMIT);
    match (&ours_result, &theirs_result) {
        (Ok(()), Ok(())) => assert!(ours == theirs, "outputs differ"),
        (Ok(()), Err(e)) => panic!(
            "ours rebuilt {} bytes, fast_rsync failed: {e:?}",
            ours.len()
        ),
        (Err(e), Ok(())) => panic!(
            "fast_rsync rebuilt {} bytes, ours failed: {e:?}",
            theirs.len()
        ),
        (Err(_), Err(_)) => return,
    }

    // The rebuilt window with its true SIG and END must verify.
    let signature = Signature::calculate(
        &ours,
        SignatureOptions {
            block_size: BLOCK_SIZE,
            crypto_hash_size: STRONG_LEN,
        },
    );
    let mut tail = Vec::new();
    Frame::Sig {
        entries: &signature.serialized()[SIGNATURE_HEADER_LEN..],
    }
    .write(&mut tail);
    Frame::End {
        len: ours.len() as u64,
        digest: *blake3::hash(&ours).as_bytes(),
    }
    .write(&mut tail);
    let before = ours.len();
    decoder
        .push(&tail, &mut ours)
        .expect("true SIG and END refused");
    assert_eq!(ours.len(), before);
    let decoded = decoder.finish().expect("verified stream did not finish");
    assert_eq!(decoded.len, before as u64);
    assert_eq!(decoded.signature, signature.serialized());
});

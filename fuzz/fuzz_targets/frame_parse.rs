//! Framing parser: `Header::parse`, then `Frame::parse` repeatedly on what
//! follows (on the whole input when there is no valid header, so that frames
//! are fuzzed either way).
//!
//! Oracle: no panic; every consumed length is within its input; a parsed
//! item writes back to exactly the bytes it was parsed from; every proper
//! prefix of a parsed frame asks for more bytes (`Ok(None)`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rproxy::hsync::{FRAME_PREFIX_LEN, Frame, HEADER_LEN, Header};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    match Header::parse(data) {
        Ok(Some((header, used))) => {
            assert_eq!(used, HEADER_LEN);
            assert!(used <= data.len());
            let mut written = Vec::new();
            header.write(&mut written);
            assert_eq!(written, &data[..used], "header does not round-trip");
            rest = &data[used..];
        }
        Ok(None) => assert!(data.len() < HEADER_LEN),
        Err(_) => {}
    }
    while let Ok(Some((frame, used))) = Frame::parse(rest) {
        assert!(used >= FRAME_PREFIX_LEN, "frame consumed {used} bytes");
        assert!(
            used <= rest.len(),
            "frame consumed {used} of {}",
            rest.len()
        );
        let mut written = Vec::new();
        frame.write(&mut written);
        assert_eq!(written, &rest[..used], "frame does not round-trip");
        // Cheap enough for short frames; long ones are covered by cutting
        // at the prefix and one byte short.
        let cuts: Vec<usize> = if used <= 64 {
            (0..used).collect()
        } else {
            vec![0, FRAME_PREFIX_LEN - 1, FRAME_PREFIX_LEN, used - 1]
        };
        for cut in cuts {
            assert_eq!(
                Frame::parse(&rest[..cut]),
                Ok(None),
                "a {used}-byte frame cut to {cut} bytes"
            );
        }
        rest = &rest[used..];
    }
});

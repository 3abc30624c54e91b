//! The request framing guard in front of hyper (`rproxy::http::head_guard`):
//! any bytes, read in pieces of any size.
//!
//! Input: byte 0 = piece size − 1, then the connection's bytes. Oracle: no
//! panic; each call lets through at most its chunk; after a violation
//! nothing more goes on and the same violation repeats; the violation
//! (rule, offset, head or body) is the one found when the bytes come in
//! one piece; what went on stops at the bad body byte, or before the
//! refused head (within the part of it read in earlier pieces).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rproxy::http::head_guard::{Framing, Part, Violation};

/// Bytes let through, and the violation.
fn feed(bytes: &[u8], piece: usize) -> (u64, Option<Violation>) {
    let mut framing = Framing::new();
    let mut passed = 0u64;
    let mut found = None;
    for chunk in bytes.chunks(piece) {
        let checked = framing.check(chunk);
        assert!(checked.safe <= chunk.len());
        if found.is_some() {
            assert_eq!(checked.safe, 0);
            assert_eq!(checked.violation, found);
        }
        passed += checked.safe as u64;
        found = found.or(checked.violation);
    }
    (passed, found)
}

fuzz_target!(|data: &[u8]| {
    let Some((&piece, bytes)) = data.split_first() else {
        return;
    };
    let (whole_passed, whole) = feed(bytes, bytes.len().max(1));
    let (passed, pieced) = feed(bytes, usize::from(piece) + 1);
    assert_eq!(whole, pieced);
    match pieced {
        None => {
            assert_eq!(passed, bytes.len() as u64);
            assert_eq!(whole_passed, passed);
        }
        Some(Violation {
            at,
            part: Part::Body,
            ..
        }) => assert!(passed == at && whole_passed == at),
        Some(Violation {
            at,
            part: Part::Head { start },
            ..
        }) => assert!(
            whole_passed == start && start <= passed && passed <= at && at < bytes.len() as u64
        ),
    }
});

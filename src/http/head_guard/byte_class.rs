//! Byte classes of an HTTP/1.1 head (RFC 9110 §5.5, §5.6.2) and the scan
//! over them: which bytes may stand in a field name (a token), a field
//! value or chunk extension, and a request line; how far a run of such
//! bytes goes, eight bytes at a time; and which [`Reason`] a stray byte
//! breaks.
//!
//! It knows no state and no message structure: where a line or a field
//! begins and what its value means is [`super::Framing`]'s job. Nothing
//! here allocates.
//!
//! Main items: [`is_tchar`] (also used by the cache key's `Vary` names),
//! the tables `FIELD_BYTE`, `REQUEST_LINE_BYTE`, and the scans `span` and
//! `text_span`.

use super::Reason;

/// Bytes of a field value or chunk extension: VCHAR, obs-text, SP and HTAB
/// (RFC 9110 §5.5).
pub(super) static FIELD_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = b == 0x09 || (b >= 0x20 && b != 0x7f);
        b += 1;
    }
    table
};

/// Bytes of a request line: as in a value, but no HTAB.
pub(super) static REQUEST_LINE_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = b >= 0x20 && b != 0x7f;
        b += 1;
    }
    table
};

/// Token characters (RFC 9110 §5.6.2), the bytes of a field name.
pub(super) static TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

/// Whether `b` is a token character (RFC 9110 §5.6.2): may stand in a
/// field name.
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

/// The reason for a byte that does not belong: a bare LF or a control
/// byte say so; anything else (a CR ending a line too early, a blank where
/// none may be) is `otherwise`.
pub(super) fn stray(b: u8, otherwise: Reason) -> Reason {
    match b {
        b'\n' => Reason::BareLineFeed,
        b'\r' | b'\t' => otherwise,
        0..=0x1f | 0x7f => Reason::ControlByte(b),
        _ => otherwise,
    }
}

/// How many leading bytes of `bytes` are in `table`.
pub(super) fn span(bytes: &[u8], table: &[bool; 256]) -> usize {
    bytes
        .iter()
        .position(|&b| !table[usize::from(b)])
        .unwrap_or(bytes.len())
}

/// [`span`] for a table that holds every byte but the control bytes (and
/// perhaps HTAB): eight bytes at a time while none is a control byte,
/// since this runs over every byte of every head.
pub(super) fn text_span(bytes: &[u8], table: &[bool; 256]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
    let mut i = 0;
    while let Some(word) = bytes.get(i..i + 8) {
        let word = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        // Whether a byte is below 0x20, or is 0x7f (the usual SWAR test
        // for a byte below n, and for a zero byte after xor).
        let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGH_BITS;
        let del = word ^ (ONES * 0x7f);
        let is_del = del.wrapping_sub(ONES) & !del & HIGH_BITS;
        if below_space | is_del != 0 {
            break;
        }
        i += 8;
    }
    i + span(&bytes[i..], table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_bytes_at_a_time_stop_where_one_at_a_time_would() {
        for table in [&FIELD_BYTE, &REQUEST_LINE_BYTE] {
            for byte in 0..=255u8 {
                for at in 0..20 {
                    let mut bytes = vec![b'a'; 20];
                    bytes[at] = byte;
                    bytes.push(0xff);
                    assert_eq!(
                        text_span(&bytes, table),
                        span(&bytes, table),
                        "{byte} at {at}"
                    );
                }
            }
        }
    }
}

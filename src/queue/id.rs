//! Queue IDs (PARQ §4: "The unique queue ID (pure random number)") and the
//! generator that makes them.
//!
//! The generator reads no entropy itself, so the queue stays sans-IO and
//! tests are deterministic: the caller seeds it once with 32 random bytes
//! (the accelerator from the OS), and each ID is the first 128 bits of the
//! blake3 keyed hash of a counter. Without the seed the IDs cannot be
//! guessed, which matters because an ID is the token that holds a place:
//! whoever presents it (with the last position) gets the place.
//!
//! Main types: [`QueueId`], [`IdGenerator`]; error: [`QueueIdError`].

use std::fmt;

use thiserror::Error;

/// A 128-bit queue ID, written as 32 lowercase hexadecimal digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId([u8; 16]);

/// Text that is not a queue ID (32 hexadecimal digits). The header parsers
/// report it as [`HeaderError::BadId`](super::HeaderError::BadId).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("not a queue ID (32 hexadecimal digits)")]
pub struct QueueIdError;

impl QueueId {
    /// The ID with these 16 bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        QueueId(bytes)
    }

    /// The 16 bytes of the ID.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Parses 32 hexadecimal digits (either case), nothing else.
    ///
    /// # Errors
    /// [`QueueIdError`] for any other input.
    pub fn parse_hex(text: &[u8]) -> Result<Self, QueueIdError> {
        if text.len() != 32 {
            return Err(QueueIdError);
        }
        let mut bytes = [0u8; 16];
        for (byte, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
            let hi = hex_value(pair[0]).ok_or(QueueIdError)?;
            let lo = hex_value(pair[1]).ok_or(QueueIdError)?;
            *byte = hi << 4 | lo;
        }
        Ok(QueueId(bytes))
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QueueId({self})")
    }
}

/// Makes unguessable queue IDs from a secret seed.
pub struct IdGenerator {
    key: [u8; 32],
    counter: u64,
}

impl IdGenerator {
    /// A generator keyed with `seed`, which must be secret and random (32
    /// bytes from the OS) in production; tests pass a constant.
    pub fn from_seed(seed: [u8; 32]) -> Self {
        IdGenerator {
            key: seed,
            counter: 0,
        }
    }

    /// The next ID.
    pub fn next_id(&mut self) -> QueueId {
        let hash = blake3::keyed_hash(&self.key, &self.counter.to_le_bytes());
        self.counter = self.counter.wrapping_add(1);
        let mut id = [0u8; 16];
        id.copy_from_slice(&hash.as_bytes()[..16]);
        QueueId(id)
    }
}

impl fmt::Debug for IdGenerator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is what makes IDs unguessable: never print it.
        f.debug_struct("IdGenerator")
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_hex_round_trip_and_case_insensitive_parse() {
        let mut ids = IdGenerator::from_seed([7; 32]);
        let id = ids.next_id();
        let text = id.to_string();
        assert_eq!(text.len(), 32);
        assert!(
            text.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(QueueId::parse_hex(text.as_bytes()), Ok(id));
        assert_eq!(QueueId::parse_hex(text.to_uppercase().as_bytes()), Ok(id));
    }

    #[test]
    fn id_parse_rejects_wrong_length_and_non_hex() {
        for bad in [
            &b""[..],
            b"6a074979f3201edbf323b6425fef4a5",
            b"6a074979f3201edbf323b6425fef4a533",
            b"6a074979f3201edbf323b6425fef4a5g",
            b"+a074979f3201edbf323b6425fef4a53",
            "é074979f3201edbf323b6425fef4a5".as_bytes(),
        ] {
            assert_eq!(QueueId::parse_hex(bad), Err(QueueIdError), "{bad:?}");
        }
    }

    #[test]
    fn generator_is_deterministic_per_seed_and_ids_differ() {
        let mut a = IdGenerator::from_seed([1; 32]);
        let mut b = IdGenerator::from_seed([1; 32]);
        let mut c = IdGenerator::from_seed([2; 32]);
        let first = a.next_id();
        assert_eq!(first, b.next_id());
        assert_ne!(first, c.next_id());
        assert_ne!(first, a.next_id());
        assert!(!format!("{a:?}").contains("1, 1"));
    }
}

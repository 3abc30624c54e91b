//! The hsync/1 stream header and frames: parsing (borrowing from the
//! caller's buffer) and writing. Knows the byte layout of `mod.rs` and its
//! limits; knows nothing of deltas or signatures beyond their lengths.
//!
//! Parsing follows one contract: `Ok(Some((item, consumed)))` means exactly
//! one item was read from the front of the buffer; `Ok(None)` means more
//! bytes are needed; `Err` means the stream is unusable.

use super::{
    END_LEN, FRAME_PREFIX_LEN, HEADER_LEN, MAGIC, MAX_BLOCK_SIZE, MAX_FRAME_LEN, MAX_STRONG_LEN,
    MIN_BLOCK_SIZE, MIN_STRONG_LEN, VERSION,
};

/// What is wrong with the framing of a stream.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The stream does not start with the hsync magic.
    #[error("not an hsync stream (magic {found:02x?})")]
    BadMagic {
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// The stream is of a version we do not speak.
    #[error("unsupported hsync version {version} (this build speaks {VERSION})")]
    UnsupportedVersion {
        /// The version byte found.
        version: u8,
    },
    /// The header names a literal codec we do not know.
    #[error("unknown literal codec {codec}")]
    UnknownCodec {
        /// The codec byte found.
        codec: u8,
    },
    /// The header sets flag bits this version does not define.
    #[error("unknown header flags {flags:#04x}")]
    UnknownFlags {
        /// The flags byte found.
        flags: u8,
    },
    /// The header's block size is outside the accepted range.
    #[error("block size {block_size} outside {MIN_BLOCK_SIZE}..={MAX_BLOCK_SIZE}")]
    BlockSizeOutOfRange {
        /// The block size found.
        block_size: u32,
    },
    /// The header's strong-sum length is outside the accepted range.
    #[error("strong sum length {strong_len} outside {MIN_STRONG_LEN}..={MAX_STRONG_LEN}")]
    StrongLenOutOfRange {
        /// The strong-sum length found.
        strong_len: u32,
    },
    /// A frame of a kind version 1 does not define.
    #[error("unknown frame kind {kind}")]
    UnknownKind {
        /// The kind byte found.
        kind: u8,
    },
    /// A frame longer than the decoder accepts.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge {
        /// The declared payload length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A frame whose payload does not have the shape its kind requires.
    #[error("malformed {kind:?} frame: {reason}")]
    Malformed {
        /// The frame's kind.
        kind: FrameKind,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The codec of the literal section of DELTA frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiteralCodec {
    /// Literal bytes as they are.
    None,
    /// One zstd stream across the whole hsync stream, flushed per frame.
    Zstd,
    /// One zstd frame per window, compressed against a reference prefix
    /// that both ends hold: the body's last bytes before the window, then
    /// the window's copied bytes (see `window_prefix`).
    ZstdWindow,
    /// As `ZstdWindow`, but the prefix is a slice of the basis body itself
    /// (the encoder holds it), then the body before the window.
    ZstdBasis,
}

impl LiteralCodec {
    fn to_byte(self) -> u8 {
        match self {
            LiteralCodec::None => 0,
            LiteralCodec::Zstd => 1,
            LiteralCodec::ZstdWindow => 2,
            LiteralCodec::ZstdBasis => 3,
        }
    }

    fn from_byte(codec: u8) -> Result<Self, FrameError> {
        match codec {
            0 => Ok(LiteralCodec::None),
            1 => Ok(LiteralCodec::Zstd),
            2 => Ok(LiteralCodec::ZstdWindow),
            3 => Ok(LiteralCodec::ZstdBasis),
            _ => Err(FrameError::UnknownCodec { codec }),
        }
    }
}

/// The stream header: the parameters of the new body's signature and the
/// literal codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Block size of the new body's signature (bytes).
    pub block_size: u32,
    /// Strong-sum length of the new body's signature entries (bytes).
    pub strong_len: u32,
    /// How literal bytes are compressed.
    pub codec: LiteralCodec,
    /// The stream carries SIG frames (the default). Without them (flag
    /// [`Header::NO_SIG`], by the client's agreement) the decoder computes
    /// the new body's signature itself and vouches for no byte before END.
    pub sig_frames: bool,
}

impl Header {
    /// Flag bit: the stream has no SIG frames.
    pub const NO_SIG: u8 = 0x01;

    /// Appends the 12-byte header to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(self.codec.to_byte());
        out.push(self.strong_len as u8);
        out.push(if self.sig_frames { 0 } else { Header::NO_SIG });
        out.extend_from_slice(&self.block_size.to_be_bytes());
    }

    /// Reads a header from the front of `buf`.
    ///
    /// # Errors
    /// Any field out of its range (see the format diagram).
    pub fn parse(buf: &[u8]) -> Result<Option<(Header, usize)>, FrameError> {
        // Check the magic on a short prefix too, so that a stream that is not
        // hsync fails at once rather than waiting for 12 bytes.
        let magic_len = buf.len().min(MAGIC.len());
        if buf[..magic_len] != MAGIC[..magic_len] {
            let mut found = [0; 4];
            found[..magic_len].copy_from_slice(&buf[..magic_len]);
            return Err(FrameError::BadMagic { found });
        }
        let Some(header) = buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        if header[4] != VERSION {
            return Err(FrameError::UnsupportedVersion { version: header[4] });
        }
        let codec = LiteralCodec::from_byte(header[5])?;
        let strong_len = u32::from(header[6]);
        if !(MIN_STRONG_LEN..=MAX_STRONG_LEN).contains(&strong_len) {
            return Err(FrameError::StrongLenOutOfRange { strong_len });
        }
        if header[7] & !Header::NO_SIG != 0 {
            return Err(FrameError::UnknownFlags { flags: header[7] });
        }
        let block_size = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) {
            return Err(FrameError::BlockSizeOutOfRange { block_size });
        }
        Ok(Some((
            Header {
                block_size,
                strong_len,
                codec,
                sig_frames: header[7] & Header::NO_SIG == 0,
            },
            HEADER_LEN,
        )))
    }
}

/// The kind byte of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A window of the new body as delta commands + literals.
    Delta = 1,
    /// Signature entries of the new body.
    Sig = 2,
    /// Total length and digest of the new body.
    End = 3,
}

impl FrameKind {
    fn from_byte(kind: u8) -> Result<Self, FrameError> {
        match kind {
            1 => Ok(FrameKind::Delta),
            2 => Ok(FrameKind::Sig),
            3 => Ok(FrameKind::End),
            _ => Err(FrameError::UnknownKind { kind }),
        }
    }
}

/// One frame, borrowing its payload from the parse buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A window: librsync commands (literal data removed) and the
    /// compressed literal section.
    Delta {
        /// The librsync command bytes.
        commands: &'a [u8],
        /// The literal section, still compressed.
        literals: &'a [u8],
    },
    /// Signature entries (rollsum + strong sum each).
    Sig {
        /// The entries, back to back.
        entries: &'a [u8],
    },
    /// The end of the body.
    End {
        /// Total length of the body.
        len: u64,
        /// blake3 of the body.
        digest: [u8; 32],
    },
}

impl<'a> Frame<'a> {
    /// Reads one frame from the front of `buf`.
    ///
    /// # Errors
    /// Unknown kind, a length over [`MAX_FRAME_LEN`](super::MAX_FRAME_LEN)
    /// (checked before waiting for the payload), or a payload that does not
    /// fit its kind.
    pub fn parse(buf: &'a [u8]) -> Result<Option<(Frame<'a>, usize)>, FrameError> {
        let Some(&kind) = buf.first() else {
            return Ok(None);
        };
        let kind = FrameKind::from_byte(kind)?;
        let Some(len) = buf.get(1..FRAME_PREFIX_LEN) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        if len as usize > MAX_FRAME_LEN {
            return Err(FrameError::FrameTooLarge {
                len: u64::from(len),
                max: MAX_FRAME_LEN,
            });
        }
        let end = FRAME_PREFIX_LEN + len as usize;
        let Some(payload) = buf.get(FRAME_PREFIX_LEN..end) else {
            return Ok(None);
        };
        let frame = match kind {
            FrameKind::Delta => {
                let malformed = |reason| FrameError::Malformed { kind, reason };
                let commands_len = payload
                    .get(..4)
                    .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .ok_or(malformed("shorter than its commands length"))?;
                let commands = payload
                    .get(4..4 + commands_len)
                    .ok_or(malformed("commands length beyond the frame"))?;
                Frame::Delta {
                    commands,
                    literals: &payload[4 + commands_len..],
                }
            }
            FrameKind::Sig => Frame::Sig { entries: payload },
            FrameKind::End => {
                if payload.len() != END_LEN {
                    return Err(FrameError::Malformed {
                        kind,
                        reason: "END payload is not 40 bytes",
                    });
                }
                let mut len = [0; 8];
                len.copy_from_slice(&payload[..8]);
                let mut digest = [0; 32];
                digest.copy_from_slice(&payload[8..]);
                Frame::End {
                    len: u64::from_be_bytes(len),
                    digest,
                }
            }
        };
        Ok(Some((frame, end)))
    }

    /// Appends this frame to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Frame::Delta { commands, literals } => {
                write_prefix(FrameKind::Delta, 4 + commands.len() + literals.len(), out);
                out.extend_from_slice(&(commands.len() as u32).to_be_bytes());
                out.extend_from_slice(commands);
                out.extend_from_slice(literals);
            }
            Frame::Sig { entries } => {
                write_prefix(FrameKind::Sig, entries.len(), out);
                out.extend_from_slice(entries);
            }
            Frame::End { len, digest } => {
                write_prefix(FrameKind::End, END_LEN, out);
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(digest);
            }
        }
    }
}

/// Appends a DELTA frame whose literal section `write_literals` appends to
/// `out` itself (the encoder compresses straight into the stream rather
/// than into a buffer that is then copied). On an error `out` is left as it
/// was.
///
/// # Errors
/// What `write_literals` returns.
pub(crate) fn write_delta_with<E>(
    commands: &[u8],
    out: &mut Vec<u8>,
    write_literals: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), E> {
    let start = out.len();
    write_prefix(FrameKind::Delta, 0, out);
    out.extend_from_slice(&(commands.len() as u32).to_be_bytes());
    out.extend_from_slice(commands);
    if let Err(error) = write_literals(out) {
        out.truncate(start);
        return Err(error);
    }
    let payload_len = out.len() - start - FRAME_PREFIX_LEN;
    debug_assert!(
        payload_len <= MAX_FRAME_LEN,
        "encoder wrote an oversized frame"
    );
    out[start + 1..start + FRAME_PREFIX_LEN].copy_from_slice(&(payload_len as u32).to_be_bytes());
    Ok(())
}

/// Appends a frame's kind and payload length to `out`.
pub(crate) fn write_prefix(kind: FrameKind, len: usize, out: &mut Vec<u8>) {
    debug_assert!(len <= MAX_FRAME_LEN, "encoder wrote an oversized frame");
    out.push(kind as u8);
    out.extend_from_slice(&(len as u32).to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            block_size: 1024,
            strong_len: 8,
            codec: LiteralCodec::Zstd,
            sig_frames: true,
        }
    }

    /// A DELTA frame whose literals are written in place parses as the
    /// one `write` makes; a failing writer leaves the stream as it was.
    #[test]
    fn delta_written_in_place_is_the_same_frame() {
        let (commands, literals) = (b"\x41\x05".as_slice(), b"hello".as_slice());
        let mut expected = b"before".to_vec();
        Frame::Delta { commands, literals }.write(&mut expected);
        let mut out = b"before".to_vec();
        write_delta_with(commands, &mut out, |out| {
            out.extend_from_slice(literals);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(out, expected);
        let (frame, len) = Frame::parse(&out[6..]).unwrap().unwrap();
        assert_eq!(len, out.len() - 6);
        assert_eq!(frame, Frame::Delta { commands, literals });

        let result = write_delta_with(commands, &mut out, |out| {
            out.extend_from_slice(b"half");
            Err(())
        });
        assert_eq!(result, Err(()));
        assert_eq!(out, expected);
    }

    #[test]
    fn header_round_trips_and_needs_all_twelve_bytes() {
        let mut buf = Vec::new();
        header().write(&mut buf);
        assert_eq!(buf.len(), HEADER_LEN);
        for cut in 0..HEADER_LEN {
            assert_eq!(Header::parse(&buf[..cut]), Ok(None), "cut at {cut}");
        }
        assert_eq!(Header::parse(&buf), Ok(Some((header(), HEADER_LEN))));
    }

    #[test]
    fn header_rejects_wrong_magic_from_the_first_byte() {
        assert!(matches!(
            Header::parse(b"x"),
            Err(FrameError::BadMagic { .. })
        ));
    }

    #[test]
    fn header_rejects_out_of_range_fields() {
        let mut buf = Vec::new();
        header().write(&mut buf);
        let with = |i: usize, v: u8| {
            let mut b = buf.clone();
            b[i] = v;
            Header::parse(&b)
        };
        assert!(matches!(
            with(4, 2),
            Err(FrameError::UnsupportedVersion { .. })
        ));
        assert!(matches!(with(5, 9), Err(FrameError::UnknownCodec { .. })));
        assert!(matches!(
            with(6, 7),
            Err(FrameError::StrongLenOutOfRange { .. })
        ));
        assert!(matches!(
            with(6, 17),
            Err(FrameError::StrongLenOutOfRange { .. })
        ));
        assert!(matches!(with(7, 2), Err(FrameError::UnknownFlags { .. })));
        assert!(matches!(
            with(7, 0x81),
            Err(FrameError::UnknownFlags { .. })
        ));
        let (no_sig, _) = with(7, Header::NO_SIG).unwrap().unwrap();
        assert!(!no_sig.sig_frames);
        let mut zero_block = buf.clone();
        zero_block[8..12].copy_from_slice(&0u32.to_be_bytes());
        assert!(matches!(
            Header::parse(&zero_block),
            Err(FrameError::BlockSizeOutOfRange { block_size: 0 })
        ));
    }

    #[test]
    fn frames_round_trip_and_wait_for_their_payload() {
        let frames = [
            Frame::Delta {
                commands: b"\x45\x00\x10",
                literals: b"zz",
            },
            Frame::Sig { entries: &[7; 24] },
            Frame::End {
                len: 42,
                digest: [9; 32],
            },
        ];
        for frame in frames {
            let mut buf = Vec::new();
            frame.write(&mut buf);
            for cut in 0..buf.len() {
                assert_eq!(Frame::parse(&buf[..cut]), Ok(None));
            }
            assert_eq!(Frame::parse(&buf), Ok(Some((frame, buf.len()))));
        }
    }

    #[test]
    fn frame_longer_than_limit_is_rejected_before_its_payload_arrives() {
        let mut buf = vec![FrameKind::Sig as u8];
        buf.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            Frame::parse(&buf),
            Err(FrameError::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn frame_with_unknown_kind_or_bad_shape_is_rejected() {
        assert_eq!(
            Frame::parse(&[9, 0, 0, 0, 0]),
            Err(FrameError::UnknownKind { kind: 9 })
        );
        let mut end = Vec::new();
        write_prefix(FrameKind::End, 3, &mut end);
        end.extend_from_slice(&[0; 3]);
        assert!(matches!(
            Frame::parse(&end),
            Err(FrameError::Malformed { .. })
        ));
        let mut delta = Vec::new();
        write_prefix(FrameKind::Delta, 5, &mut delta);
        delta.extend_from_slice(&[0, 0, 0, 9, 0]);
        assert!(matches!(
            Frame::parse(&delta),
            Err(FrameError::Malformed { .. })
        ));
    }
}

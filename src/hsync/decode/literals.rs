//! The decoder's side of the literal codecs (the `codec` byte of the
//! header, see `hsync/mod.rs`): turns a DELTA frame's literal section back
//! into exactly the literal bytes its commands need, and nothing more.
//!
//! It leaves out where the reference prefix comes from (the decoder builds
//! it from the basis and the body's context) and the delta commands; it
//! keeps only codec 1's zstd context, which lives as long as the stream.
//! [`zstd_window_size`] tells the decoder how much of a prefix a frame can
//! reach, so that it builds no more.
//!
//! Main types: [`LiteralDecompressor`].

use zstd::stream::raw::{DParameter, Operation};
use zstd_safe::{InBuffer, OutBuffer};

use super::DecodeError;
use crate::hsync::frame::LiteralCodec;
use crate::hsync::{MAX_FRAME_LEN, ZSTD_WINDOW_LOG_MAX};

/// The window size a zstd frame declares (RFC 8878, 3.1.1.1.2), or `None`
/// when it does not say (single segment, or not a frame): how far back
/// its matches may reach.
pub(super) fn zstd_window_size(frame: &[u8]) -> Option<usize> {
    const MAGIC: [u8; 4] = 0xFD2F_B528u32.to_le_bytes();
    let (magic, rest) = frame.split_first_chunk::<4>()?;
    let (&descriptor, rest) = rest.split_first()?;
    if *magic != MAGIC || descriptor & 0x20 != 0 {
        return None;
    }
    let &window = rest.first()?;
    let base = 1u64 << (10 + u32::from(window >> 3));
    usize::try_from(base + base / 8 * u64::from(window & 7)).ok()
}

/// The literal codec's decoding side.
pub(super) enum LiteralDecompressor {
    Plain,
    /// One context for the whole stream.
    Zstd(Box<zstd::stream::raw::Decoder<'static>>),
    /// A frame per window, against the window's prefix.
    ZstdWindow,
}

impl LiteralDecompressor {
    pub(super) fn new(codec: LiteralCodec) -> Self {
        match codec {
            LiteralCodec::None => LiteralDecompressor::Plain,
            LiteralCodec::Zstd => {
                let mut decoder = zstd::stream::raw::Decoder::new()
                    .expect("creating a zstd context only fails on allocation");
                // Bounds the streaming decoder's window buffer.
                decoder
                    .set_parameter(DParameter::WindowLogMax(ZSTD_WINDOW_LOG_MAX))
                    .expect("a valid window log");
                LiteralDecompressor::Zstd(Box::new(decoder))
            }
            LiteralCodec::ZstdWindow | LiteralCodec::ZstdBasis => LiteralDecompressor::ZstdWindow,
        }
    }

    /// Decodes `input` into exactly `expected` bytes appended to `buf`; on
    /// an error `buf` is left as it was.
    pub(super) fn decompress(
        &mut self,
        input: &[u8],
        expected: usize,
        prefix: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<(), DecodeError> {
        let start = buf.len();
        let result = self.decompress_inner(input, expected, prefix, buf);
        if result.is_err() {
            buf.truncate(start);
        }
        result
    }

    fn decompress_inner(
        &mut self,
        input: &[u8],
        expected: usize,
        prefix: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<(), DecodeError> {
        debug_assert!(expected <= MAX_FRAME_LEN);
        let corrupt = |reason: String| DecodeError::Literals { reason };
        let start = buf.len();
        if expected == 0 {
            return if input.is_empty() {
                Ok(())
            } else {
                Err(corrupt(format!(
                    "{} literal bytes where none are needed",
                    input.len()
                )))
            };
        }
        match self {
            LiteralDecompressor::Plain => {
                if input.len() != expected {
                    return Err(corrupt(format!(
                        "{} literal bytes for {expected} needed",
                        input.len()
                    )));
                }
                buf.extend_from_slice(input);
            }
            LiteralDecompressor::Zstd(decoder) => {
                // One spare byte detects a section that decodes to more.
                buf.resize(start + expected + 1, 0);
                let mut output = OutBuffer::around(&mut buf[start..]);
                let mut input = InBuffer::around(input);
                loop {
                    let before = (input.pos(), output.pos());
                    decoder
                        .run(&mut input, &mut output)
                        .map_err(|e| corrupt(e.to_string()))?;
                    if output.pos() > expected {
                        return Err(corrupt(format!(
                            "decodes to more than the {expected} bytes needed"
                        )));
                    }
                    if (input.pos(), output.pos()) == before {
                        break;
                    }
                }
                let produced = output.pos();
                if input.pos() != input.src.len() || produced != expected {
                    return Err(corrupt(format!(
                        "decodes to {produced} bytes, {expected} needed"
                    )));
                }
                buf.truncate(start + expected);
            }
            LiteralDecompressor::ZstdWindow => {
                let zstd_error = |code| corrupt(zstd_safe::get_error_name(code).to_string());
                let mut dctx = zstd_safe::DCtx::create();
                dctx.set_parameter(zstd_safe::DParameter::WindowLogMax(ZSTD_WINDOW_LOG_MAX))
                    .map_err(zstd_error)?;
                if !prefix.is_empty() {
                    dctx.ref_prefix(prefix).map_err(zstd_error)?;
                }
                // Into the spare capacity after `start`, unzeroed. One spare
                // byte detects a frame that decodes to more; the capacity
                // (at most a window's) bounds what zstd may write.
                buf.reserve(expected + 1);
                let mut output = std::io::Cursor::new(&mut *buf);
                output.set_position(start as u64);
                let produced = dctx.decompress(&mut output, input).map_err(zstd_error)?;
                if produced != expected {
                    return Err(corrupt(format!(
                        "decodes to {produced} bytes, {expected} needed"
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::zstd_window_size;

    /// The window a frame declares bounds what the decoder builds of a
    /// prefix, so it must be read as zstd's own encoder wrote it.
    #[test]
    fn the_window_size_is_what_the_frame_declares() {
        for log in [10u32, 17, 20, 23] {
            let mut cctx = zstd_safe::CCtx::create();
            cctx.set_parameter(zstd_safe::CParameter::WindowLog(log))
                .unwrap();
            cctx.set_parameter(zstd_safe::CParameter::ContentSizeFlag(false))
                .unwrap();
            // Longer than the window, or zstd declares a smaller one.
            let data = vec![7u8; (1 << log) + 1000];
            let mut frame = Vec::with_capacity(zstd_safe::compress_bound(data.len()));
            cctx.compress2(&mut frame, &data).unwrap();
            let declared = zstd_window_size(&frame).expect("a window descriptor");
            assert!(declared >= 1 << log, "log {log}: {declared}");
            assert!(declared < 2 << log, "log {log}: {declared}");
        }
        assert_eq!(zstd_window_size(b"not a frame"), None);
        assert_eq!(zstd_window_size(&[0x28, 0xB5, 0x2F, 0xFD]), None);
        // Single segment: no window descriptor, so no bound from it.
        assert_eq!(zstd_window_size(&[0x28, 0xB5, 0x2F, 0xFD, 0x20, 9]), None);
    }
}

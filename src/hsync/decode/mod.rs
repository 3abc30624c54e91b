//! The client side: rebuilds a body from an hsync/1 stream and its basis,
//! as the stream arrives in chunks of any size.
//!
//! The stream is untrusted (MD4 collides; the link may be broken or
//! hostile). Every length is checked against a named limit before anything
//! is allocated, every copy against the basis length, the output against
//! a cap; the SIG entries are compared with the signature recomputed from
//! the rebuilt bytes, and END with the rebuilt length and blake3. A stream
//! that stops early leaves a [`Partial`]: the prefix length and its
//! signature, a basis for the next transfer (never a body to serve).
//!
//! Main types: [`Decoder`], [`DecodeLimits`], [`Decoded`], [`Partial`];
//! the basis is read through [`Basis`] (`basis.rs`).

use super::SignatureParams;
use super::basis::Basis;
use super::delta::{DeltaCommand, DeltaError, parse_commands};
use super::frame::{Frame, FrameError, Header, LiteralCodec};
use super::signature::SignatureBuilder;
use super::{MAX_PREFIX_LEN, MAX_WINDOW_OUTPUT};

use literals::{LiteralDecompressor, zstd_window_size};

mod literals;

/// Why a stream cannot be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Bad framing.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// Bad delta commands.
    #[error(transparent)]
    Delta(#[from] DeltaError),
    /// A copy reaches past the end of the basis.
    #[error("copy of {len} bytes at {offset} is outside the {basis_len}-byte basis")]
    CopyOutOfBounds {
        /// Copy offset.
        offset: u64,
        /// Copy length.
        len: u64,
        /// Basis length.
        basis_len: u64,
    },
    /// One window rebuilds more than [`MAX_WINDOW_OUTPUT`].
    #[error("a window rebuilds more than {max} bytes")]
    WindowTooLarge {
        /// The limit.
        max: usize,
    },
    /// The body grows past the output cap.
    #[error("the body grows past the output limit of {max} bytes")]
    OutputLimit {
        /// The limit.
        max: u64,
    },
    /// The literal section does not decode to what the commands need.
    #[error("literal section is corrupt: {reason}")]
    Literals {
        /// What went wrong.
        reason: String,
    },
    /// A SIG frame is not a whole number of entries.
    #[error("SIG frame of {len} bytes is not a multiple of the {entry_len}-byte entry")]
    SignatureMisaligned {
        /// The frame's payload length.
        len: usize,
        /// One entry's length.
        entry_len: usize,
    },
    /// A SIG frame in a stream whose header said it has none.
    #[error("SIG frame in a stream announced without SIG frames")]
    UnexpectedSig,
    /// The new body's signature grows past its cap.
    #[error("the new signature grows past the limit of {max} bytes")]
    SignatureTooLarge {
        /// The limit.
        max: usize,
    },
    /// SIG entries for blocks that have not been rebuilt yet.
    #[error("{entries} signature entries received for {blocks} blocks rebuilt")]
    SignatureAhead {
        /// Entries received so far.
        entries: usize,
        /// Blocks (whole or started) rebuilt so far.
        blocks: u64,
    },
    /// SIG entries disagree with the rebuilt bytes.
    #[error("signature entries disagree with the rebuilt body at block {block}")]
    SignatureMismatch {
        /// The first block that disagrees.
        block: usize,
    },
    /// END's length differs from the rebuilt length.
    #[error("END says {declared} bytes but {rebuilt} were rebuilt")]
    LengthMismatch {
        /// Length in END.
        declared: u64,
        /// Length rebuilt.
        rebuilt: u64,
    },
    /// END's blake3 differs from the rebuilt body's.
    #[error("the rebuilt body's blake3 does not match END")]
    DigestMismatch,
    /// Bytes after END.
    #[error("{len} bytes after END")]
    TrailingData {
        /// How many (at least).
        len: usize,
    },
    /// The stream stopped before END.
    #[error("the stream stopped after {rebuilt} rebuilt bytes, before END")]
    Truncated {
        /// Bytes rebuilt.
        rebuilt: u64,
    },
    /// Reading the basis failed.
    #[error("reading the basis failed: {reason}")]
    Basis {
        /// The I/O error.
        reason: String,
    },
    /// The caller's sink refused a window (`push_to`).
    #[error("writing the rebuilt body failed: {reason}")]
    Output {
        /// The sink's error.
        reason: String,
    },
    /// `push` after an error.
    #[error("decoder used after an error")]
    Failed,
}

/// Where `push_to` hands each rebuilt window.
type WindowSink<'a> = Option<&'a mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<()>>;

/// Caps for one decode.
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    /// Largest body rebuilt (bytes): the expected length when known, else
    /// the proxy's maximum object size.
    pub max_output: u64,
    /// Largest new signature kept (bytes).
    pub max_signature_bytes: usize,
}

impl Default for DecodeLimits {
    /// 4 GiB of body, and room for its signature at 1 KiB blocks (48 MiB):
    /// a body of unknown length gets the smallest default block, so every
    /// stream our encoder writes under the output limit is accepted.
    fn default() -> Self {
        const MAX_OUTPUT: u64 = 4 << 30;
        const SMALLEST_DEFAULT_BLOCK: u64 = 1024;
        DecodeLimits {
            max_output: MAX_OUTPUT,
            max_signature_bytes: (MAX_OUTPUT / SMALLEST_DEFAULT_BLOCK) as usize * 12
                + super::SIGNATURE_HEADER_LEN,
        }
    }
}

/// A verified body: its length, digest and signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// Body length.
    pub len: u64,
    /// blake3 of the body (checked against END).
    pub digest: [u8; 32],
    /// The body's whole signature, recomputed here (header + entries).
    pub signature: Vec<u8>,
}

/// What an interrupted stream leaves: an unverified prefix of the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial {
    /// Bytes of body rebuilt (all handed out through `push`).
    pub len: u64,
    /// The prefix's signature (header + entries), or `None` if the stream
    /// stopped before its header.
    pub signature: Option<Vec<u8>>,
    /// blake3 of the prefix.
    pub digest: [u8; 32],
}

/// Rebuilds a body from an hsync/1 stream.
pub struct Decoder<B> {
    basis: B,
    limits: DecodeLimits,
    /// Unparsed input: the start of a frame that has not fully arrived.
    pending: Vec<u8>,
    header: Option<Header>,
    literals: Option<LiteralDecompressor>,
    signature: Option<SignatureBuilder>,
    /// SIG entries received and not yet compared with the rebuilt body.
    unchecked_entries: Vec<u8>,
    /// Bytes of computed entries already compared.
    checked_len: usize,
    hasher: blake3::Hasher,
    rebuilt: u64,
    verified: Option<Decoded>,
    failed: bool,
    /// The SIG entries are the signature, not recomputed
    /// ([`Decoder::trust_signature_entries`]).
    trust_entries: bool,
    literal_buf: Vec<u8>,
    /// The window handed to `push_to`'s sink.
    window_out: Vec<u8>,
    /// The body's last bytes (codecs 2 and 3).
    context: Vec<u8>,
    /// A window's reference prefix, the tail its zstd frame reaches
    /// (`ZstdWindow`: of the context and then the window's copied bytes;
    /// `ZstdBasis`: of the basis slice and then the context).
    prefix: Vec<u8>,
}

impl<B: Basis> Decoder<B> {
    /// A decoder rebuilding against `basis`.
    pub fn new(basis: B, limits: DecodeLimits) -> Self {
        Decoder {
            basis,
            limits,
            pending: Vec::new(),
            header: None,
            literals: None,
            signature: None,
            unchecked_entries: Vec::new(),
            checked_len: 0,
            hasher: blake3::Hasher::new(),
            rebuilt: 0,
            verified: None,
            failed: false,
            trust_entries: false,
            literal_buf: Vec::new(),
            window_out: Vec::new(),
            context: Vec::new(),
            prefix: Vec::new(),
        }
    }

    /// Takes the stream's SIG entries as the new body's signature instead
    /// of recomputing it from the rebuilt bytes (MD4 and rollsum over every
    /// byte: a quarter of the decoder's CPU), for a caller that hands out
    /// nothing as final before [`finish`](Self::finish) succeeds and does
    /// not need [`verified_len`](Self::verified_len) (it stays 0 until END
    /// verified). Call it before the first [`push`](Self::push).
    ///
    /// Why the body stays as safe: END's length and blake3 are checked as
    /// ever, over every rebuilt byte, so no wrong byte is ever accepted.
    /// The entries are still checked for form (whole entries, never ahead
    /// of the rebuilt blocks, within the signature limit, and exactly one
    /// per block at END); they are only not compared with the bytes. What
    /// they then affect is the next transfer, in which they are the basis
    /// signature: a wrong entry (a broken or hostile accelerator, the only
    /// party that could write it) makes that delta worse (a block not
    /// found) or makes its body fail blake3 (a COPY matched on a wrong
    /// entry), and a body that fails is refused like any corrupt stream.
    /// Whoever can write the entries can write the delta too, so trusting
    /// them hands nobody a new power over the bytes. The proxy keeps the
    /// default: it releases bytes as their SIG entries vouch for them.
    pub fn trust_signature_entries(&mut self) {
        self.trust_entries = true;
    }

    /// Bytes of body rebuilt so far.
    pub fn rebuilt_len(&self) -> u64 {
        self.rebuilt
    }

    /// Bytes of the rebuilt body, from its start, that the stream has
    /// vouched for so far: the blocks whose SIG entries arrived and matched
    /// what was rebuilt, or all of it once END verified. A caller that
    /// hands bytes on before END hands on no more than these, so a basis
    /// that rotted on disk (or a stream that does not fit it) shows as a
    /// failed check before its wrong bytes leave (C-V3). The SIG frame
    /// after each DELTA frame covers the window's completed blocks, and the
    /// signature is recomputed eight blocks at a time (SIMD lanes), so what
    /// is held back stays within a window and eight blocks. A stream
    /// without SIG frames ([`Header::sig_frames`]) vouches for nothing
    /// before END.
    pub fn verified_len(&self) -> u64 {
        if self.verified.is_some() {
            return self.rebuilt;
        }
        let Some(signature) = &self.signature else {
            return 0;
        };
        let params = signature.params();
        let blocks = (self.checked_len / params.entry_len()) as u64;
        (blocks * u64::from(params.block_size)).min(self.rebuilt)
    }

    /// Frees the buffers that only the work on a window needs (its
    /// reference prefix, basis slice, literals and output), keeping what
    /// the next window needs (the context). For a caller whose reader
    /// stalls: an idle decoder then holds little more than its context;
    /// the buffers grow again with the next window.
    pub fn release_scratch(&mut self) {
        for buffer in [
            &mut self.prefix,
            &mut self.literal_buf,
            &mut self.window_out,
        ] {
            *buffer = Vec::new();
        }
        self.pending.shrink_to_fit();
        // The context keeps up to twice what a prefix uses, to shift
        // seldom; its last CONTEXT_LEN bytes are all the next window needs.
        let keep = self.context.len().min(super::CONTEXT_LEN);
        if self.context.capacity() > keep {
            self.context = self.context[self.context.len() - keep..].to_vec();
        }
    }

    /// The stream header, once it has arrived.
    pub fn header(&self) -> Option<Header> {
        self.header
    }

    /// Whether END arrived and verified, and nothing failed since.
    pub fn is_complete(&self) -> bool {
        self.verified.is_some() && !self.failed
    }

    /// Feeds the next bytes of the stream, appending rebuilt body bytes to
    /// `out`. Bytes are appended window by window, before END is checked:
    /// the caller must not treat them as final until [`finish`](Self::finish)
    /// succeeds.
    ///
    /// # Errors
    /// Any [`DecodeError`]; after one, the decoder refuses further input.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
        self.push_inner(input, out, None)
    }

    /// Feeds the next bytes of the stream, handing each rebuilt window to
    /// `sink` as soon as it is rebuilt: memory stays bounded by one window
    /// however much body a few stream bytes rebuild (a 24 KB stream can
    /// rebuild an unchanged 1 GiB body). The same caveat as for
    /// [`push`](Self::push): nothing is final before `finish` succeeds.
    /// `sink` gets the buffer the window was rebuilt in: it may take it (to
    /// hand the bytes on without a copy), leaving another in its place,
    /// which the decoder clears and reuses.
    ///
    /// # Errors
    /// Any [`DecodeError`]; [`DecodeError::Output`] when `sink` fails.
    pub fn push_to(
        &mut self,
        input: &[u8],
        mut sink: impl FnMut(&mut Vec<u8>) -> std::io::Result<()>,
    ) -> Result<(), DecodeError> {
        let mut window = std::mem::take(&mut self.window_out);
        window.clear();
        let result = self.push_inner(input, &mut window, Some(&mut sink));
        self.window_out = window;
        result
    }

    fn push_inner(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        mut sink: WindowSink<'_>,
    ) -> Result<(), DecodeError> {
        if self.failed {
            return Err(DecodeError::Failed);
        }
        let result = if self.pending.is_empty() {
            // Fast path: parse straight from the caller's bytes.
            self.consume(input, out, &mut sink).map(|used| {
                self.pending.extend_from_slice(&input[used..]);
            })
        } else {
            let mut pending = std::mem::take(&mut self.pending);
            pending.extend_from_slice(input);
            let result = self.consume(&pending, out, &mut sink);
            if let Ok(used) = result {
                pending.drain(..used);
                self.pending = pending;
            }
            result.map(drop)
        };
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    /// Parses as many whole items as `buf` holds; returns bytes consumed.
    fn consume(
        &mut self,
        buf: &[u8],
        out: &mut Vec<u8>,
        sink: &mut WindowSink<'_>,
    ) -> Result<usize, DecodeError> {
        let mut used = 0;
        loop {
            let rest = &buf[used..];
            if rest.is_empty() {
                return Ok(used);
            }
            if self.verified.is_some() {
                return Err(DecodeError::TrailingData { len: rest.len() });
            }
            let Some(header) = self.header else {
                let Some((header, len)) = Header::parse(rest)? else {
                    return Ok(used);
                };
                self.start(header);
                used += len;
                continue;
            };
            let Some((frame, len)) = Frame::parse(rest)? else {
                return Ok(used);
            };
            match frame {
                Frame::Delta { commands, literals } => {
                    let applied = self.apply_window(header, commands, literals, out);
                    // A window that failed a check after it was rebuilt is
                    // counted in `rebuilt`: hand it out too, as `push` leaves
                    // it in `out`, so the prefix and its partial signature
                    // describe exactly the bytes the caller holds.
                    if let Some(sink) = sink.as_mut()
                        && !out.is_empty()
                    {
                        sink(out).map_err(|e| DecodeError::Output {
                            reason: e.to_string(),
                        })?;
                        out.clear();
                    }
                    applied?;
                }
                Frame::Sig { entries } => self.receive_entries(entries)?,
                Frame::End { len, digest } => self.end(len, digest)?,
            }
            used += len;
        }
    }

    fn start(&mut self, header: Header) {
        self.header = Some(header);
        // Without SIG frames there are no entries to trust: the signature
        // is computed from the bytes.
        self.trust_entries &= header.sig_frames;
        self.literals = Some(LiteralDecompressor::new(header.codec));
        self.signature = Some(SignatureBuilder::new(SignatureParams {
            block_size: header.block_size,
            strong_len: header.strong_len,
        }));
    }

    /// Checks a DELTA frame completely, then rebuilds its window.
    fn apply_window(
        &mut self,
        header: Header,
        commands: &[u8],
        literals: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), DecodeError> {
        let basis_len = self.basis.size();
        // Pass 1: validate every command and size the window, allocating
        // nothing from the declared lengths.
        let (mut window_len, mut literal_len, mut copied_len) = (0u64, 0u64, 0u64);
        for command in parse_commands(commands) {
            let command = command?;
            if let DeltaCommand::Copy { offset, len } = command
                && offset.checked_add(len).is_none_or(|end| end > basis_len)
            {
                return Err(DecodeError::CopyOutOfBounds {
                    offset,
                    len,
                    basis_len,
                });
            }
            // Saturating: a hostile length must fail the window check
            // below, not overflow.
            match command {
                DeltaCommand::Literal { len } => literal_len = literal_len.saturating_add(len),
                DeltaCommand::Copy { len, .. } => copied_len = copied_len.saturating_add(len),
            }
            window_len = window_len.saturating_add(command.output_len());
            if window_len > MAX_WINDOW_OUTPUT as u64 {
                return Err(DecodeError::WindowTooLarge {
                    max: MAX_WINDOW_OUTPUT,
                });
            }
        }
        if self.rebuilt + window_len > self.limits.max_output {
            return Err(DecodeError::OutputLimit {
                max: self.limits.max_output,
            });
        }
        // Codecs 2 and 3 decode literals against a prefix of what we hold
        // (see `window_prefix`). Codec 2's is the body's context and then
        // the window's copied bytes. zstd reaches back no further than
        // its frame's window, so only that tail of the prefix is built
        // (the encoder compresses large bodies against a tail of it);
        // copies before the tail are rebuilt straight from the basis
        // below, and those in it are read once, into the prefix, and
        // rebuilt from there.
        let read_error = |e: std::io::Error| DecodeError::Basis {
            reason: e.to_string(),
        };
        let prefixed = header.codec == LiteralCodec::ZstdWindow && literal_len > 0;
        self.prefix.clear();
        // Bytes of [context tail | copies] left out of the prefix.
        let mut skip = 0;
        let mut context_len = 0;
        if prefixed {
            let context = super::context_tail(&self.context, window_len);
            context_len = context.len();
            let total = context_len + copied_len as usize;
            let reach = zstd_window_size(literals)
                .unwrap_or(usize::MAX)
                .min(total)
                .min(MAX_PREFIX_LEN);
            skip = total - reach;
            self.prefix
                .extend_from_slice(&context[skip.min(context_len)..]);
            let mut at = context_len;
            for command in parse_commands(commands) {
                if let DeltaCommand::Copy { offset, len } = command.expect("validated in pass 1") {
                    let end = at + len as usize;
                    if end > skip {
                        let from = skip.saturating_sub(at);
                        self.basis
                            .append_range(
                                offset + from as u64,
                                len as usize - from,
                                &mut self.prefix,
                            )
                            .map_err(read_error)?;
                    }
                    at = end;
                }
            }
        }
        // Codec 3's prefix is [basis slice | context tail] (see
        // `window_prefix`), of which only the tail that the zstd frame's
        // window reaches is built: the encoder's fast stage compresses the
        // edited bytes against the context's tail alone, and reading each
        // window's 6 MiB basis slice for them was most of the decoder's
        // basis reads.
        if header.codec == LiteralCodec::ZstdBasis && literal_len > 0 {
            let range = super::basis_slice(self.rebuilt, window_len, basis_len);
            let context = super::context_tail(&self.context, window_len);
            let whole = ((range.end - range.start) as usize + context.len()).min(MAX_PREFIX_LEN);
            let reach = zstd_window_size(literals).unwrap_or(usize::MAX).min(whole);
            let from_basis = reach.saturating_sub(context.len());
            self.basis
                .append_range(range.end - from_basis as u64, from_basis, &mut self.prefix)
                .map_err(read_error)?;
            self.prefix
                .extend_from_slice(&context[context.len() - (reach - from_basis)..]);
        }
        let reference = &self.prefix[self.prefix.len().saturating_sub(MAX_PREFIX_LEN)..];
        let decompressor = self.literals.as_mut().expect("header parsed before frames");
        let start = out.len();
        // A window of literals only (a body sent from scratch) is decoded
        // straight into `out`; otherwise the literals are gathered first and
        // copied out between the copies of pass 2.
        let literals_only = copied_len == 0;
        if literals_only {
            out.reserve(window_len as usize);
            decompressor.decompress(literals, literal_len as usize, reference, out)?;
        } else {
            self.literal_buf.clear();
            decompressor.decompress(
                literals,
                literal_len as usize,
                reference,
                &mut self.literal_buf,
            )?;
            out.reserve(window_len as usize);
        }

        // Pass 2: rebuild.
        let basis_failed = |e: std::io::Error, out: &mut Vec<u8>| {
            // Hand out only what `rebuilt` counts.
            out.truncate(start);
            DecodeError::Basis {
                reason: e.to_string(),
            }
        };
        // `at`: where the next copy starts in [context tail | copies].
        let (mut literal_at, mut at) = (0, context_len);
        for command in parse_commands(commands) {
            match command.expect("validated in pass 1") {
                DeltaCommand::Copy { offset, len } if prefixed => {
                    let end = at + len as usize;
                    if at < skip {
                        let direct = skip.min(end) - at;
                        self.basis
                            .append_range(offset, direct, out)
                            .map_err(|e| basis_failed(e, out))?;
                    }
                    if end > skip {
                        out.extend_from_slice(&self.prefix[at.max(skip) - skip..end - skip]);
                    }
                    at = end;
                }
                DeltaCommand::Copy { offset, len } => {
                    self.basis
                        .append_range(offset, len as usize, out)
                        .map_err(|e| basis_failed(e, out))?;
                }
                DeltaCommand::Literal { .. } if literals_only => {}
                DeltaCommand::Literal { len } => {
                    let end = literal_at + len as usize;
                    out.extend_from_slice(&self.literal_buf[literal_at..end]);
                    literal_at = end;
                }
            }
        }
        if matches!(
            header.codec,
            LiteralCodec::ZstdWindow | LiteralCodec::ZstdBasis
        ) {
            super::extend_context(&mut self.context, &out[start..]);
        }
        let window = &out[start..];
        self.hasher.update(window);
        let signature = self
            .signature
            .as_mut()
            .expect("header parsed before frames");
        if !self.trust_entries {
            signature.update(window);
        }
        self.rebuilt += window.len() as u64;
        if signature.entries().len() > self.limits.max_signature_bytes {
            return Err(DecodeError::SignatureTooLarge {
                max: self.limits.max_signature_bytes,
            });
        }
        self.check_entries()
    }

    fn receive_entries(&mut self, entries: &[u8]) -> Result<(), DecodeError> {
        if self.header.is_some_and(|header| !header.sig_frames) {
            return Err(DecodeError::UnexpectedSig);
        }
        let params = self
            .signature
            .as_ref()
            .expect("header parsed before frames")
            .params();
        if !entries.len().is_multiple_of(params.entry_len()) {
            return Err(DecodeError::SignatureMisaligned {
                len: entries.len(),
                entry_len: params.entry_len(),
            });
        }
        // Our encoder sends an entry only once its block is rebuilt (the
        // short last block's entry as soon as its bytes are): entries ahead
        // of the body are refused rather than buffered.
        let received = self.checked_len + self.unchecked_entries.len() + entries.len();
        let blocks_rebuilt = self.rebuilt.div_ceil(u64::from(params.block_size));
        if received as u64 > blocks_rebuilt * params.entry_len() as u64 {
            return Err(DecodeError::SignatureAhead {
                entries: received / params.entry_len(),
                blocks: blocks_rebuilt,
            });
        }
        if received > self.limits.max_signature_bytes {
            return Err(DecodeError::SignatureTooLarge {
                max: self.limits.max_signature_bytes,
            });
        }
        self.unchecked_entries.extend_from_slice(entries);
        self.check_entries()
    }

    /// Compares received SIG entries with the recomputed ones, as far as
    /// both go.
    fn check_entries(&mut self) -> Result<(), DecodeError> {
        if self.trust_entries {
            return Ok(());
        }
        let signature = self
            .signature
            .as_ref()
            .expect("header parsed before frames");
        let computed = &signature.entries()[self.checked_len..];
        let n = computed.len().min(self.unchecked_entries.len());
        if computed[..n] != self.unchecked_entries[..n] {
            let entry_len = signature.params().entry_len();
            let first_bad = (0..n)
                .step_by(entry_len)
                .find(|&i| computed[i..i + entry_len] != self.unchecked_entries[i..i + entry_len])
                .unwrap_or(0);
            return Err(DecodeError::SignatureMismatch {
                block: (self.checked_len + first_bad) / entry_len,
            });
        }
        self.unchecked_entries.drain(..n);
        self.checked_len += n;
        Ok(())
    }

    fn end(&mut self, declared: u64, digest: [u8; 32]) -> Result<(), DecodeError> {
        if declared != self.rebuilt {
            return Err(DecodeError::LengthMismatch {
                declared,
                rebuilt: self.rebuilt,
            });
        }
        if self.trust_entries {
            return self.end_trusted(digest);
        }
        let signature = self
            .signature
            .as_mut()
            .expect("header parsed before frames");
        signature.finish();
        self.check_entries()?;
        let signature = self
            .signature
            .as_ref()
            .expect("header parsed before frames");
        let sig_frames = self.header.is_some_and(|header| header.sig_frames);
        if sig_frames
            && (self.checked_len != signature.entries().len() || !self.unchecked_entries.is_empty())
        {
            // Every block must have been described by a SIG entry.
            return Err(DecodeError::SignatureMismatch {
                block: self.checked_len / signature.params().entry_len(),
            });
        }
        if *self.hasher.finalize().as_bytes() != digest {
            return Err(DecodeError::DigestMismatch);
        }
        self.verified = Some(Decoded {
            len: self.rebuilt,
            digest,
            signature: signature.to_signature_bytes(),
        });
        Ok(())
    }

    /// END with [`trust_signature_entries`](Self::trust_signature_entries):
    /// one entry per block, then the digest, then the entries are the
    /// signature.
    fn end_trusted(&mut self, digest: [u8; 32]) -> Result<(), DecodeError> {
        let params = self
            .signature
            .as_ref()
            .expect("header parsed before frames")
            .params();
        let blocks = self.rebuilt.div_ceil(u64::from(params.block_size));
        if self.unchecked_entries.len() as u64 != blocks * params.entry_len() as u64 {
            return Err(DecodeError::SignatureMismatch {
                block: self.unchecked_entries.len() / params.entry_len(),
            });
        }
        if *self.hasher.finalize().as_bytes() != digest {
            return Err(DecodeError::DigestMismatch);
        }
        let mut signature =
            Vec::with_capacity(super::SIGNATURE_HEADER_LEN + self.unchecked_entries.len());
        signature.extend_from_slice(&params.header_bytes());
        signature.extend_from_slice(&self.unchecked_entries);
        self.verified = Some(Decoded {
            len: self.rebuilt,
            digest,
            signature,
        });
        Ok(())
    }

    /// Ends the stream: the verified body's length, digest and signature.
    ///
    /// # Errors
    /// [`DecodeError::Truncated`] when END never arrived (use
    /// [`into_partial`](Self::into_partial) to keep the prefix), or
    /// [`DecodeError::Failed`] after an earlier error.
    pub fn finish(&mut self) -> Result<Decoded, DecodeError> {
        if self.failed {
            return Err(DecodeError::Failed);
        }
        match &self.verified {
            Some(decoded) if self.pending.is_empty() => Ok(decoded.clone()),
            _ => Err(DecodeError::Truncated {
                rebuilt: self.rebuilt,
            }),
        }
    }

    /// What an interrupted stream leaves: the length of the prefix handed
    /// out so far and its signature. The prefix is unverified: fit to be a
    /// basis (a wrong basis costs bandwidth, never correctness, because the
    /// next body is verified), never to be served. With
    /// [`trust_signature_entries`](Self::trust_signature_entries) the
    /// signature is the entries received, which may describe fewer blocks
    /// than the prefix holds.
    pub fn into_partial(self) -> Partial {
        let trusted = self.trust_entries.then_some(self.unchecked_entries);
        Partial {
            len: self.rebuilt,
            digest: *self.hasher.finalize().as_bytes(),
            signature: self.signature.map(|mut s| match trusted {
                Some(entries) => [&s.params().header_bytes()[..], &entries].concat(),
                None => {
                    s.finish();
                    s.to_signature_bytes()
                }
            }),
        }
    }
}

//! `rproxy hsync …`: the codec as command-line tools, for operators,
//! scripts and interop tests. `-` means stdin or stdout.
//!
//! `decode` never leaves a complete-looking output file behind a stream that
//! was truncated, corrupt or failed its digest: it writes a temporary file
//! beside the output and renames it only after END verified.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use base64::Engine;
use clap::{Args, Subcommand};

use crate::hsync::{
    DEFAULT_STRONG_LEN, DecodeError, DecodeLimits, Decoder, EncodeSummary, Encoder, EncoderOptions,
    FileBasis, LiteralCodec, SignatureBuilder, SignatureParams, choose_block_size,
};

/// Read size for files and pipes.
const CHUNK: usize = 256 << 10;

/// The `rproxy hsync` tools.
#[derive(Debug, Subcommand)]
pub enum HsyncCommand {
    /// Print FILE's signature as the accelerator makes it (binary, librsync
    /// MD4 format with 8-byte strong sums; equal to
    /// `rdiff -H md4 -R rollsum -S 8 -b BLOCK signature`).
    Sign(SignArgs),
    /// Encode NEW as an hsync/1 stream against a basis signature (or from
    /// scratch without one).
    Encode(EncodeArgs),
    /// Rebuild a body from an hsync/1 stream and its basis; verifies the
    /// digest before OUT appears.
    Decode(DecodeArgs),
    /// Show what a transfer of NEW against BASIS would cost, next to gzip -9.
    Stats(StatsArgs),
}

/// Arguments of `hsync sign`.
#[derive(Debug, Args)]
pub struct SignArgs {
    /// The file to sign (`-` for stdin).
    pub file: PathBuf,
    /// Where to write the signature.
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// Signature budget in bytes; sets the block size.
    #[arg(long, default_value_t = EncoderOptions::default().max_signature_bytes)]
    pub max_signature: usize,
}

/// Arguments of `hsync encode`.
#[derive(Debug, Args)]
pub struct EncodeArgs {
    /// The basis signature (as `sign` or a client sends it); none gives a
    /// from-scratch stream.
    #[arg(long, conflicts_with = "basis_body")]
    pub signature: Option<PathBuf>,
    /// The basis body itself, as an accelerator that kept it holds it:
    /// literals are compressed against it (codec 3), no signature needed.
    #[arg(long)]
    pub basis_body: Option<PathBuf>,
    /// Budget for the new body's signature in bytes; sets its block size.
    #[arg(long, default_value_t = EncoderOptions::default().max_signature_bytes)]
    pub max_signature: usize,
    /// The new body (`-` for stdin).
    pub new: PathBuf,
    /// Where to write the stream.
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// Encoder settings other than the defaults.
    #[command(flatten)]
    pub tuning: Tuning,
}

/// Arguments of `hsync decode`.
#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// The basis the stream was encoded against.
    #[arg(long)]
    pub basis: PathBuf,
    /// The stream (`-` for stdin).
    pub stream: PathBuf,
    /// Where to write the body. On stdout the bytes stream out as they are
    /// rebuilt, and a failure shows only in the exit status.
    #[arg(short, long, default_value = "-")]
    pub output: PathBuf,
    /// Also write the new body's signature here (recomputed, verified).
    #[arg(long)]
    pub signature_out: Option<PathBuf>,
    /// Refuse to rebuild more than this many bytes.
    #[arg(long, default_value_t = DecodeLimits::default().max_output)]
    pub max_output: u64,
}

/// Arguments of `hsync stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The client's cached body.
    #[arg(long)]
    pub basis: PathBuf,
    /// The fresh body.
    pub new: PathBuf,
    /// Encoder settings to compare against the defaults.
    #[command(flatten)]
    pub tuning: Tuning,
}

/// Encoder settings that `stats` can vary, to choose defaults by measurement.
#[derive(Debug, Args)]
pub struct Tuning {
    /// Literal codec: none, zstd (one stream), zstd-window (per window,
    /// against the body before it and the window's copies).
    #[arg(long, value_parser = parse_codec)]
    pub codec: Option<LiteralCodec>,
    /// zstd level for literals.
    #[arg(long)]
    pub zstd_level: Option<i32>,
    /// Smallest block size (bytes).
    #[arg(long, value_parser = clap::value_parser!(u32).range(512..=1 << 20))]
    pub min_block: Option<u32>,
    /// Window size (bytes); with --basis-body (codec 3) at most 3 MiB.
    #[arg(long)]
    pub window: Option<usize>,
    /// Bytes of zstd work (prefix + literals) per stream at --zstd-level
    /// before the fast level takes over.
    #[arg(long)]
    pub high_level_budget: Option<u64>,
}

impl Tuning {
    fn apply(&self, mut options: EncoderOptions) -> EncoderOptions {
        options.codec = self.codec.unwrap_or(options.codec);
        options.zstd_level = self.zstd_level.unwrap_or(options.zstd_level);
        options.min_block_size = self.min_block.unwrap_or(options.min_block_size);
        options.window_bytes = self.window.unwrap_or(options.window_bytes);
        options.basis_window_bytes = self.window.unwrap_or(options.basis_window_bytes);
        options.high_level_budget = self.high_level_budget.unwrap_or(options.high_level_budget);
        options
    }
}

fn parse_codec(name: &str) -> Result<LiteralCodec, String> {
    match name {
        "none" => Ok(LiteralCodec::None),
        "zstd" => Ok(LiteralCodec::Zstd),
        "zstd-window" => Ok(LiteralCodec::ZstdWindow),
        _ => Err(format!(
            "unknown codec {name:?}: use none, zstd or zstd-window"
        )),
    }
}

/// Runs one `hsync` tool.
///
/// # Errors
/// I/O failures and undecodable streams, with what was being done.
pub fn run(command: HsyncCommand) -> anyhow::Result<()> {
    match command {
        HsyncCommand::Sign(args) => sign(args),
        HsyncCommand::Encode(args) => encode(args),
        HsyncCommand::Decode(args) => decode(args),
        HsyncCommand::Stats(args) => stats(args),
    }
}

fn open_input(path: &Path) -> anyhow::Result<(Box<dyn Read>, Option<u64>)> {
    if path == Path::new("-") {
        return Ok((Box::new(io::stdin().lock()), None));
    }
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let meta = file.metadata()?;
    let len = meta.is_file().then_some(meta.len());
    Ok((Box::new(file), len))
}

fn create_output(path: &Path) -> anyhow::Result<Box<dyn Write>> {
    if path == Path::new("-") {
        return Ok(Box::new(io::stdout().lock()));
    }
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    Ok(Box::new(io::BufWriter::new(file)))
}

/// Reads `input` to the end in chunks, handing each to `each`.
fn for_each_chunk(
    mut input: impl Read,
    mut each: impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut buf = vec![0; CHUNK];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        each(&buf[..n])?;
    }
}

/// Signs a body read from `input`, with the block size the accelerator
/// would choose for `len` bytes.
fn signature_of(
    input: impl Read,
    len: Option<u64>,
    options: &EncoderOptions,
) -> anyhow::Result<Vec<u8>> {
    let mut builder = SignatureBuilder::new(SignatureParams {
        block_size: choose_block_size(
            len.unwrap_or(0),
            options.max_signature_bytes,
            options.min_block_size,
        ),
        strong_len: DEFAULT_STRONG_LEN,
    });
    for_each_chunk(input, |chunk| {
        builder.update(chunk);
        Ok(())
    })?;
    builder.finish();
    Ok(builder.to_signature_bytes())
}

fn sign(args: SignArgs) -> anyhow::Result<()> {
    let (input, len) = open_input(&args.file)?;
    let options = EncoderOptions {
        max_signature_bytes: args.max_signature,
        ..EncoderOptions::default()
    };
    let signature = signature_of(input, len, &options)?;
    let mut out = create_output(&args.output)?;
    out.write_all(&signature)?;
    out.flush()?;
    Ok(())
}

fn read_capped(path: &Path, max: usize) -> anyhow::Result<Vec<u8>> {
    let (input, _) = open_input(path)?;
    let mut bytes = Vec::new();
    // Read one byte past the cap, so an oversized file is caught without
    // reading it all.
    input.take(max as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > max {
        bail!(
            "{} is larger than {max} bytes: not a signature we accept",
            path.display()
        );
    }
    Ok(bytes)
}

fn encode_to(
    mut encoder: Encoder,
    mut input: impl Read,
    mut out: impl Write,
) -> anyhow::Result<EncodeSummary> {
    let mut frames = Vec::new();
    // Straight into the encoder's window: no copy through a buffer here.
    while encoder.read_from(&mut input, &mut frames)? > 0 {
        out.write_all(&frames)?;
        frames.clear();
    }
    out.write_all(&frames)?;
    frames.clear();
    let summary = encoder.finish(&mut frames)?;
    out.write_all(&frames)?;
    out.flush()?;
    Ok(summary)
}

fn encode(args: EncodeArgs) -> anyhow::Result<()> {
    let options = args.tuning.apply(EncoderOptions {
        max_signature_bytes: args.max_signature,
        ..EncoderOptions::default()
    });
    let signature = match &args.signature {
        Some(path) => Some(read_capped(path, options.signature_limits.max_bytes)?),
        None => None,
    };
    let (input, len) = open_input(&args.new)?;
    let encoder = match &args.basis_body {
        Some(path) => {
            let file = File::open(path)
                .with_context(|| format!("cannot open basis body {}", path.display()))?;
            // Opened here for the basis alone: nothing else moves its offset.
            Encoder::with_basis_body(Box::new(FileBasis::sole(file)?), len, options)
        }
        None => Encoder::new(signature.as_deref(), len, options),
    };
    let out = create_output(&args.output)?;
    let summary = encode_to(encoder, input, out)?;
    eprintln!(
        "encoded {} bytes: {} copied, {} literal ({} compressed), {} signature; stream {} bytes; basis {:?}, block {}{}",
        summary.body_len,
        summary.copied_bytes,
        summary.literal_bytes,
        summary.literal_wire_bytes,
        summary.signature_wire_bytes,
        summary.stream_bytes,
        summary.basis,
        summary.params.block_size,
        if summary.is_larger_than_plain {
            "; larger than a plain compressed body"
        } else {
            ""
        },
    );
    Ok(())
}

/// An output file that only appears under its name once complete.
struct PendingFile {
    temp: PathBuf,
    file: io::BufWriter<File>,
}

impl PendingFile {
    fn create(path: &Path) -> anyhow::Result<Self> {
        let name = path.file_name().context("output path has no file name")?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".{}.tmp", std::process::id()));
        let temp = path.with_file_name(temp_name);
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(&temp)
            .with_context(|| format!("cannot create {}", temp.display()))?;
        Ok(PendingFile {
            temp,
            file: io::BufWriter::new(file),
        })
    }

    /// Makes the file appear under `path`; on any failure the temporary
    /// file is removed, so nothing half-written stays behind.
    fn commit(self, path: &Path) -> anyhow::Result<()> {
        let temp = self.temp.clone();
        let result = (|| {
            let file = self.file.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            std::fs::rename(&temp, path)
                .with_context(|| format!("cannot rename into {}", path.display()))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        result
    }

    fn discard(self) {
        drop(self.file);
        let _ = std::fs::remove_file(&self.temp);
    }
}

fn decode(args: DecodeArgs) -> anyhow::Result<()> {
    let basis = File::open(&args.basis)
        .with_context(|| format!("cannot open basis {}", args.basis.display()))?;
    let mut decoder = Decoder::new(
        // Opened here for the basis alone: nothing else moves its offset.
        FileBasis::sole(basis)?,
        DecodeLimits {
            max_output: args.max_output,
            ..DecodeLimits::default()
        },
    );
    if args.signature_out.is_none() {
        // Nothing here needs the new body's signature: END's blake3
        // verifies the body, so its MD4 is not recomputed just to be
        // compared with the SIG entries (nothing is written as final before
        // END either way; stdout streams unverified bytes regardless).
        decoder.trust_signature_entries();
    }
    let (input, _) = open_input(&args.stream)?;
    let to_stdout = args.output == Path::new("-");
    let mut pending = if to_stdout {
        None
    } else {
        Some(PendingFile::create(&args.output)?)
    };
    let mut stdout = io::stdout().lock();
    // Window by window: a few stream bytes may rebuild gigabytes.
    let result = for_each_chunk(input, |chunk| {
        decoder.push_to(chunk, |window| match &mut pending {
            Some(file) => file.file.write_all(window),
            None => stdout.write_all(window),
        })?;
        Ok(())
    })
    .and_then(|()| decoder.finish().map_err(anyhow::Error::from));
    let decoded = match result {
        Ok(decoded) => decoded,
        Err(error) => {
            if let Some(file) = pending {
                file.discard();
            }
            let truncated = matches!(error.downcast_ref(), Some(DecodeError::Truncated { .. }));
            let rebuilt = decoder.rebuilt_len();
            return Err(error.context(if truncated {
                format!(
                    "{} is truncated ({rebuilt} bytes rebuilt); no output written",
                    args.stream.display()
                )
            } else {
                format!(
                    "{} cannot be decoded; no output written",
                    args.stream.display()
                )
            }));
        }
    };
    stdout.flush()?;
    if let Some(file) = pending {
        file.commit(&args.output)?;
    }
    if let Some(path) = &args.signature_out {
        let mut out = create_output(path)?;
        out.write_all(&decoded.signature)?;
        out.flush()?;
    }
    Ok(())
}

/// Encodes `new` with `encoder`, then decodes the stream against `basis`
/// and checks the bytes, so that no figure is printed for a stream that
/// would not decode.
fn encode_and_verify(
    mut encoder: Encoder,
    basis: &[u8],
    new: &[u8],
) -> anyhow::Result<(Vec<u8>, EncodeSummary)> {
    let mut stream = Vec::new();
    encoder.push(new, &mut stream)?;
    let summary = encoder.finish(&mut stream)?;
    let mut decoder = Decoder::new(basis, DecodeLimits::default());
    let mut rebuilt = Vec::new();
    decoder.push(&stream, &mut rebuilt)?;
    decoder.finish()?;
    if rebuilt != new {
        bail!("internal error: a stream does not rebuild the new body");
    }
    Ok((stream, summary))
}

fn gzip9_len(data: &[u8]) -> anyhow::Result<u64> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(data)?;
    Ok(encoder.finish()?.len() as u64)
}

fn stats(args: StatsArgs) -> anyhow::Result<()> {
    let basis = std::fs::read(&args.basis)
        .with_context(|| format!("cannot read {}", args.basis.display()))?;
    let new =
        std::fs::read(&args.new).with_context(|| format!("cannot read {}", args.new.display()))?;
    let options = args.tuning.apply(EncoderOptions::default());
    let signature = signature_of(&basis[..], Some(basis.len() as u64), &options)?;
    let (stream, summary) = encode_and_verify(
        Encoder::new(Some(&signature), Some(new.len() as u64), options),
        &basis,
        &new,
    )?;
    // The same transfer when the accelerator still holds the basis body
    // (named by its blake3 in the request): codec 3.
    let (known_basis_stream, _) = encode_and_verify(
        Encoder::with_basis_body(Box::new(basis.clone()), Some(new.len() as u64), options),
        &basis,
        &new,
    )?;
    // And as the proxies send it when the accelerator said it holds the
    // basis: the digest alone goes up, the stream leaves out SIG frames.
    let mut held =
        Encoder::with_basis_body(Box::new(basis.clone()), Some(new.len() as u64), options);
    held.leave_out_sig_frames();
    let (held_stream, _) = encode_and_verify(held, &basis, &new)?;
    let gzip9 = gzip9_len(&new)?;
    // The request carries the signature in base64 (`Hsync-Signature: :…:`).
    let signature_header = base64::engine::general_purpose::STANDARD
        .encode(&signature)
        .len()
        + 2;
    let wire = signature_header as u64 + stream.len() as u64;
    // A client that does not know whether the accelerator holds its basis
    // sends the signature either way.
    let wire_known_basis = signature_header as u64 + known_basis_stream.len() as u64;
    eprintln!(
        "{}: {} bytes; gzip -9 would send {gzip9}; hsync sends {wire} \
         ({signature_header} request signature + {} stream), {:.0}% of gzip -9. \
         {} bytes copied from the basis, {} literal. Rebuilt and verified.",
        args.new.display(),
        new.len(),
        stream.len(),
        100.0 * wire as f64 / gzip9.max(1) as f64,
        summary.copied_bytes,
        summary.literal_bytes,
    );
    println!(
        "new={} gzip9={} signature={} signature_header={} stream={} wire={} ratio={:.3} copied={} literal={} literal_wire={} new_signature={} larger_than_plain={} wire_known_basis={wire_known_basis} ratio_known_basis={:.3} wire_held={} ratio_held={:.3}",
        new.len(),
        gzip9,
        signature.len(),
        signature_header,
        stream.len(),
        wire,
        wire as f64 / gzip9.max(1) as f64,
        summary.copied_bytes,
        summary.literal_bytes,
        summary.literal_wire_bytes,
        summary.signature_wire_bytes,
        summary.is_larger_than_plain,
        wire_known_basis as f64 / gzip9.max(1) as f64,
        held_stream.len(),
        held_stream.len() as f64 / gzip9.max(1) as f64,
    );
    Ok(())
}

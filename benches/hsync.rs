//! Throughput of the hsync codec with the settings the proxies use
//! ([`EncoderOptions::default`], [`DecodeLimits::default`]), next to peers
//! measured in the same run.
//!
//! Groups:
//! - `encode`: [`Encoder`] from `Encoder::new` (parsing and indexing the
//!   basis signature, as per request) to `finish`, the body pushed in 64 KiB
//!   chunks and each chunk's frames dropped, as a proxy streams them.
//! - `decode`: [`Decoder`] over an in-memory basis, from `new` to a verified
//!   `finish` (SIG entries and blake3 checked), the stream pushed in 64 KiB
//!   chunks and the rebuilt bytes dropped after each push.
//! - `encode_kept`: codec 3 against the basis body itself (an accelerator
//!   that kept it), 16 and 64 MiB with 1% edits: `alone` indexes the basis
//!   in each encode, as a lone request does; `shared_anchors` takes anchors
//!   an earlier encode built ([`SharedAnchors`], as the accelerator keeps
//!   them for a large held body), so the difference is the indexing.
//! - `peers`: zstd -3 compress and decompress and blake3 of the 64 MiB
//!   edited body, one thread each, like the codec.
//!
//! Parameters: body size (64 KiB to 64 MiB) × similarity of the new body to
//! the basis (`identical`, `edited_1pct`: 1% of the bytes edited in 32
//! scattered runs, `unrelated`: other text of the same vocabulary). Bodies
//! are deterministic text (`support/textgen.rs`). The basis signature is made
//! once per case, outside the timing, as the client proxy would have it.
//!
//! After criterion's own report, a summary prints MB/s (10^6 bytes/s;
//! criterion's lines show MiB/s) and the targets (encode ≥ 400 MB/s,
//! decode+verify ≥ 1,000 MB/s for 64 MiB with 1% edits) as ratios to the
//! target and to the peers of the same run. Peak RSS is not measured here:
//! `scripts/bench-hsync.sh` does that, on 1 GiB bodies.
//!
//! Time budget: criterion needs at least 11 runs of a benchmark, and an
//! encode of 64 MiB takes seconds (minutes, when all its literals go
//! through zstd level 19). So each case is encoded once up front (to make
//! the decode stream and check the round trip), whatever the filter; an
//! encode slower than `SLOW_ENCODE_SECS` is reported from that one run
//! instead of criterion's samples, and a case whose encode, scaled from the
//! previous size, would take over `SKIP_ENCODE_SECS` is skipped in both
//! groups (the summary says so). `HSYNC_BENCH_SLOW=1` runs and samples
//! every case, however long it takes. `cargo bench --bench hsync -- 64MiB`
//! runs only the largest cases. Pin it to one core (`taskset -c 0 cargo
//! bench ...`) to compare with the script's figures.

#[path = "support/textgen.rs"]
mod textgen;

use std::cell::{Cell, OnceCell};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::rc::Rc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput};
use rproxy::hsync::{
    DecodeLimits, Decoded, Decoder, EncodeSummary, Encoder, EncoderOptions, SharedAnchors,
    SignatureBuilder, SignatureParams, choose_block_size,
};

/// Bytes per `push`, both ways (a typical socket read).
const CHUNK: usize = 64 << 10;

/// Samples per benchmark: few, because the large cases take seconds each.
const SAMPLES: usize = 10;

const SIZES: [(usize, &str); 4] = [
    (64 << 10, "64KiB"),
    (1 << 20, "1MiB"),
    (16 << 20, "16MiB"),
    (64 << 20, "64MiB"),
];

/// The size the targets are stated for.
const TARGET_SIZE: &str = "64MiB";
/// Encode target, MB/s.
const ENCODE_TARGET: f64 = 400.0;
/// Decode+verify target, MB/s.
const DECODE_TARGET: f64 = 1000.0;

const BASIS_SEED: u64 = 1;
const EDIT_SEED: u64 = 2;
const UNRELATED_SEED: u64 = 3;

/// One basis and one new body.
struct Case {
    size: &'static str,
    similarity: &'static str,
    basis: Rc<Vec<u8>>,
    new: Vec<u8>,
    signature: Rc<Vec<u8>>,
    /// The encoded stream and the seconds its encoding took, made on first
    /// use.
    stream: OnceCell<(Vec<u8>, f64)>,
    /// Left out for the time budget (see `SKIP_ENCODE_SECS`).
    skipped: Cell<bool>,
}

impl Case {
    fn id(&self) -> BenchmarkId {
        BenchmarkId::new(self.similarity, self.size)
    }

    fn name(&self) -> String {
        format!("{}/{}", self.similarity, self.size)
    }

    /// The stream, encoded (and timed) on first use and checked to
    /// round-trip; prints what it carries, so that a throughput can be read
    /// next to the work it did.
    fn stream(&self) -> &[u8] {
        &self.encoded().0
    }

    /// Seconds the first encode took (the one that made the stream).
    fn first_encode_secs(&self) -> f64 {
        self.encoded().1
    }

    fn encoded(&self) -> &(Vec<u8>, f64) {
        self.stream.get_or_init(|| {
            let mut stream = Vec::new();
            let start = Instant::now();
            let summary = encode(&self.signature, &self.new, &mut Vec::new(), |frames| {
                stream.extend_from_slice(frames)
            });
            let secs = start.elapsed().as_secs_f64();
            let mut body = Vec::new();
            let mut decoder = Decoder::new(&self.basis[..], DecodeLimits::default());
            decoder
                .push(&stream, &mut body)
                .expect("the stream decodes");
            decoder.finish().expect("the stream verifies");
            assert!(body == self.new, "{} does not round-trip", self.name());
            println!(
                "case {}: new {} B, basis block {} B, copied {} B, literal {} B -> {} B, \
                 stream {} B; first encode {secs:.2} s",
                self.name(),
                self.new.len(),
                u32::from_be_bytes(self.signature[4..8].try_into().expect("4 bytes")),
                summary.copied_bytes,
                summary.literal_bytes,
                summary.literal_wire_bytes,
                stream.len(),
            );
            (stream, secs)
        })
    }
}

/// The basis signature as the accelerator receives it from the client.
fn basis_signature(basis: &[u8]) -> Vec<u8> {
    let options = EncoderOptions::default();
    let mut builder = SignatureBuilder::new(SignatureParams {
        block_size: choose_block_size(
            basis.len() as u64,
            options.max_signature_bytes,
            options.min_block_size,
        ),
        strong_len: 8,
    });
    builder.update(basis);
    builder.finish();
    builder.to_signature_bytes()
}

/// Encodes `new` as the accelerator does, handing each push's frames to
/// `sink` and then dropping them.
fn encode(
    signature: &[u8],
    new: &[u8],
    frames: &mut Vec<u8>,
    mut sink: impl FnMut(&[u8]),
) -> EncodeSummary {
    let mut encoder = Encoder::new(
        Some(signature),
        Some(new.len() as u64),
        EncoderOptions::default(),
    );
    for chunk in new.chunks(CHUNK) {
        encoder.push(chunk, frames).expect("encoding to memory");
        sink(frames);
        frames.clear();
    }
    let summary = encoder.finish(frames).expect("encoding to memory");
    sink(frames);
    frames.clear();
    summary
}

/// Decodes and verifies `stream` as the client proxy does; rebuilt bytes
/// are dropped after each push.
fn decode(basis: &[u8], stream: &[u8], body: &mut Vec<u8>) -> Decoded {
    let mut decoder = Decoder::new(basis, DecodeLimits::default());
    for chunk in stream.chunks(CHUNK) {
        decoder.push(chunk, body).expect("the stream decodes");
        black_box(&body[..]);
        body.clear();
    }
    decoder.finish().expect("the stream verifies")
}

/// The data of every case (no encoding yet: see [`Case::stream`]).
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (len, size) in SIZES {
        let basis = Rc::new(textgen::text(len, BASIS_SEED));
        let signature = Rc::new(basis_signature(&basis));
        let news = [
            ("identical", basis.to_vec()),
            ("edited_1pct", textgen::edit(&basis, 1, EDIT_SEED)),
            ("unrelated", textgen::text(len, UNRELATED_SEED)),
        ];
        for (similarity, new) in news {
            cases.push(Case {
                size,
                similarity,
                basis: basis.clone(),
                new,
                signature: signature.clone(),
                stream: OnceCell::new(),
                skipped: Cell::new(false),
            });
        }
    }
    cases
}

/// Per-iteration times (seconds) of every benchmark run, by name, so the
/// summary can set our figures next to the peers of the same run.
static TIMES: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

fn record(name: &str, secs: f64) {
    TIMES
        .lock()
        .expect("no panic while holding the lock")
        .entry(name.to_owned())
        .or_default()
        .push(secs);
}

/// Times `iters` calls of `routine` for criterion, and keeps the
/// per-iteration time for the summary.
fn timed(name: &str, iters: u64, mut routine: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        routine();
    }
    let elapsed = start.elapsed();
    record(name, elapsed.as_secs_f64() / iters as f64);
    elapsed
}

/// Median seconds per iteration over the last [`SAMPLES`] runs (criterion
/// measures after warming up, so these are its samples), and how many
/// runs that is.
fn median_secs(name: &str) -> Option<(f64, usize)> {
    let times = TIMES.lock().expect("no panic while holding the lock");
    let all = times.get(name)?;
    let mut last = all[all.len().saturating_sub(SAMPLES)..].to_vec();
    last.sort_by(f64::total_cmp);
    Some((last[last.len() / 2], last.len()))
}

/// An encode slower than this (seconds) is timed once, by the run that
/// makes its stream, instead of sampled by criterion, which needs at least
/// `SAMPLES + 1` runs: the 64 MiB encodes take 1-2 s each, and took minutes
/// when every literal went through zstd level 19. `HSYNC_BENCH_SLOW=1`
/// samples them all.
const SLOW_ENCODE_SECS: f64 = 1.5;

/// A case whose encode is predicted (from the same similarity at the
/// previous size, scaled by length) to take longer than this (seconds) is
/// skipped unless `HSYNC_BENCH_SLOW=1`.
const SKIP_ENCODE_SECS: f64 = 30.0;

/// Few samples and short measurements: the large cases take whole seconds
/// per iteration, and the file must stay a few minutes long.
fn configure(group: &mut BenchmarkGroup<'_, WallTime>, size: &str) {
    let (warm_up, measure) = match size {
        "64KiB" | "1MiB" => (Duration::from_millis(300), Duration::from_secs(1)),
        "16MiB" => (Duration::from_millis(500), Duration::from_secs(2)),
        _ => (Duration::from_millis(500), Duration::from_secs(3)),
    };
    group.sample_size(SAMPLES);
    group.warm_up_time(warm_up);
    group.measurement_time(measure);
    // Flat: the same iteration count in every sample, so a case of seconds
    // per iteration takes 10 iterations, not the 55 of linear sampling.
    group.sampling_mode(SamplingMode::Flat);
}

fn bench_encode(c: &mut Criterion, cases: &[Case]) {
    let sample_slow = std::env::var_os("HSYNC_BENCH_SLOW").is_some_and(|v| v == "1");
    let mut group = c.benchmark_group("encode");
    let mut frames = Vec::new();
    // Similarity -> (length, seconds) of the last first encode.
    let mut previous: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    for case in cases {
        let name = format!("encode/{}", case.name());
        if let Some(&(len, secs)) = previous.get(case.similarity) {
            let predicted = secs * case.new.len() as f64 / len as f64;
            if predicted > SKIP_ENCODE_SECS && !sample_slow {
                println!(
                    "{}: skipped in encode and decode, one encode would take about \
                     {predicted:.0} s (HSYNC_BENCH_SLOW=1 runs it)",
                    case.name()
                );
                case.skipped.set(true);
                continue;
            }
        }
        // Every case is encoded once here, whatever the filter: criterion
        // does not tell which benchmarks it will run.
        let first = case.first_encode_secs();
        previous.insert(case.similarity, (case.new.len(), first));
        if first > SLOW_ENCODE_SECS && !sample_slow {
            println!(
                "{name}: one run took {first:.1} s, timed once instead of sampled \
                 (HSYNC_BENCH_SLOW=1 samples it)"
            );
            record(&name, first);
            continue;
        }
        configure(&mut group, case.size);
        group.throughput(Throughput::Bytes(case.new.len() as u64));
        group.bench_function(case.id(), |b| {
            b.iter_custom(|iters| {
                timed(&name, iters, || {
                    black_box(encode(&case.signature, &case.new, &mut frames, |f| {
                        black_box(f);
                    }));
                })
            })
        });
    }
    group.finish();
}

/// Codec 3 (the basis body held), pushed as [`encode`] pushes.
fn encode_kept(
    basis: &std::sync::Arc<[u8]>,
    new: &[u8],
    anchors: Option<&SharedAnchors>,
    frames: &mut Vec<u8>,
) -> EncodeSummary {
    let mut encoder = Encoder::with_basis_body(
        Box::new(basis.clone()),
        Some(new.len() as u64),
        EncoderOptions::default(),
    );
    if let Some(anchors) = anchors {
        encoder.share_held_anchors(anchors.clone());
    }
    for chunk in new.chunks(CHUNK) {
        encoder.push(chunk, frames).expect("encoding to memory");
        frames.clear();
    }
    let summary = encoder.finish(frames).expect("encoding to memory");
    frames.clear();
    summary
}

fn bench_encode_kept(c: &mut Criterion, cases: &[Case]) {
    let mut group = c.benchmark_group("encode_kept");
    let mut frames = Vec::new();
    let edited = cases
        .iter()
        .filter(|case| case.similarity == "edited_1pct" && matches!(case.size, "16MiB" | "64MiB"));
    for case in edited {
        configure(&mut group, case.size);
        group.throughput(Throughput::Bytes(case.new.len() as u64));
        let anchors = SharedAnchors::default();
        // Held as the accelerator's memory tier holds it: no copy per use.
        let held: std::sync::Arc<[u8]> = case.basis.as_slice().into();
        // Built once here, outside the timing: as a first request did.
        encode_kept(&held, &case.new, Some(&anchors), &mut frames);
        for (how, shared) in [("alone", None), ("shared_anchors", Some(&anchors))] {
            group.bench_function(BenchmarkId::new(how, case.size), |b| {
                b.iter(|| black_box(encode_kept(&held, &case.new, shared, &mut frames)))
            });
        }
    }
    group.finish();
}

fn bench_decode(c: &mut Criterion, cases: &[Case]) {
    let mut group = c.benchmark_group("decode");
    let mut body = Vec::new();
    for case in cases.iter().filter(|case| !case.skipped.get()) {
        configure(&mut group, case.size);
        group.throughput(Throughput::Bytes(case.new.len() as u64));
        let name = format!("decode/{}", case.name());
        group.bench_function(case.id(), |b| {
            let stream = case.stream();
            b.iter_custom(|iters| {
                timed(&name, iters, || {
                    black_box(decode(&case.basis, stream, &mut body));
                })
            })
        });
    }
    group.finish();
}

/// The peers, on the body the targets are stated for.
fn bench_peers(c: &mut Criterion, cases: &[Case]) {
    let case = cases
        .iter()
        .find(|case| case.size == TARGET_SIZE && case.similarity == "edited_1pct")
        .expect("the target case is among the cases");
    let new = &case.new;
    let mut group = c.benchmark_group("peers");
    configure(&mut group, case.size);
    group.throughput(Throughput::Bytes(new.len() as u64));

    let mut compressor = zstd::bulk::Compressor::new(3).expect("a zstd context");
    let mut compressed = Vec::with_capacity(zstd::zstd_safe::compress_bound(new.len()));
    let name = format!("peers/zstd3_compress/{}", case.name());
    group.bench_function(BenchmarkId::new("zstd3_compress", case.name()), |b| {
        b.iter_custom(|iters| {
            timed(&name, iters, || {
                compressed.clear();
                compressor
                    .compress_to_buffer(&new[..], &mut compressed)
                    .expect("the buffer has the bound's capacity");
                black_box(&compressed);
            })
        })
    });

    let mut decompressor = zstd::bulk::Decompressor::new().expect("a zstd context");
    let mut decompressed = Vec::with_capacity(new.len());
    let name = format!("peers/zstd3_decompress/{}", case.name());
    group.bench_function(BenchmarkId::new("zstd3_decompress", case.name()), |b| {
        b.iter_custom(|iters| {
            timed(&name, iters, || {
                decompressed.clear();
                decompressor
                    .decompress_to_buffer(&compressed[..], &mut decompressed)
                    .expect("our own frame decompresses");
                black_box(&decompressed);
            })
        })
    });

    let name = format!("peers/blake3/{}", case.name());
    group.bench_function(BenchmarkId::new("blake3", case.name()), |b| {
        b.iter_custom(|iters| {
            timed(&name, iters, || {
                black_box(blake3::hash(new));
            })
        })
    });
    group.finish();
    println!(
        "peer zstd -3: {} B -> {} B ({:.2}x)",
        new.len(),
        compressed.len(),
        new.len() as f64 / compressed.len().max(1) as f64
    );
}

/// Prints MB/s of every case run, then the targets as ratios to the target
/// and to the peers.
fn print_summary(cases: &[Case]) {
    let mb_per_s = |name: &str, len: usize| {
        median_secs(name).map(|(secs, runs)| (len as f64 / secs / 1e6, runs))
    };
    // A figure from one run (a slow encode, or criterion's --test mode)
    // says so.
    let number = |v: f64| match v {
        v if v < 10.0 => format!("{v:.2}"),
        v if v < 100.0 => format!("{v:.1}"),
        v => format!("{v:.0}"),
    };
    let show = |v: Option<(f64, usize)>| match v {
        Some((v, 1)) => format!("{} (1 run)", number(v)),
        Some((v, _)) => number(v),
        None => "n/a".to_owned(),
    };
    let ratio = |a: Option<(f64, usize)>, b: Option<(f64, usize)>| match (a, b) {
        (Some((a, _)), Some((b, _))) => format!("{:.2}x", a / b),
        _ => "n/a".to_owned(),
    };

    println!();
    println!(
        "hsync throughput, MB/s (10^6 B/s), one thread, median of the last {SAMPLES} samples:"
    );
    println!("{:<22} {:>14} {:>14}", "case", "encode", "decode+verify");
    for case in cases {
        let len = case.new.len();
        let encode = mb_per_s(&format!("encode/{}", case.name()), len);
        let decode = mb_per_s(&format!("decode/{}", case.name()), len);
        if case.skipped.get() {
            println!("{:<22} {:>14} {:>14}", case.name(), "skipped", "skipped");
        } else if encode.is_some() || decode.is_some() {
            println!(
                "{:<22} {:>14} {:>14}",
                case.name(),
                show(encode),
                show(decode)
            );
        }
    }

    let Some(case) = cases
        .iter()
        .find(|case| case.size == TARGET_SIZE && case.similarity == "edited_1pct")
    else {
        return;
    };
    let len = case.new.len();
    let name = case.name();
    let encode = mb_per_s(&format!("encode/{name}"), len);
    let decode = mb_per_s(&format!("decode/{name}"), len);
    let zstd3 = mb_per_s(&format!("peers/zstd3_compress/{name}"), len);
    let unzstd3 = mb_per_s(&format!("peers/zstd3_decompress/{name}"), len);
    let blake3 = mb_per_s(&format!("peers/blake3/{name}"), len);
    println!();
    println!("targets for {name}, next to peers of the same run:");
    println!(
        "{:<14} {:>14} {:>7} {:>10} {:>12} {:>12} {:>10}",
        "", "MB/s", "target", "vs target", "vs zstd-3 c", "vs zstd-3 d", "vs blake3"
    );
    for (label, value, target) in [
        ("encode", encode, ENCODE_TARGET),
        ("decode+verify", decode, DECODE_TARGET),
    ] {
        println!(
            "{:<14} {:>14} {:>7.0} {:>10} {:>12} {:>12} {:>10}",
            label,
            show(value),
            target,
            ratio(value, Some((target, 0))),
            ratio(value, zstd3),
            ratio(value, unzstd3),
            ratio(value, blake3),
        );
    }
    println!(
        "peers (MB/s): zstd -3 compress {}, zstd -3 decompress {}, blake3 {}",
        show(zstd3),
        show(unzstd3),
        show(blake3)
    );
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let cases = cases();
    bench_encode(&mut criterion, &cases);
    bench_encode_kept(&mut criterion, &cases);
    bench_decode(&mut criterion, &cases);
    bench_peers(&mut criterion, &cases);
    criterion.final_summary();
    print_summary(&cases);
}

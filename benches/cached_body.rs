//! C-V3's throughput target: a hit whose body is checked group by group
//! against its blake3 outboard ([`serve_cached`]) against the same file
//! streamed the same way unchecked, measured in the same run.
//!
//! Both read a 64 MiB file (in the page cache after the first sample) on
//! the blocking pool group by group and hand each group through a channel
//! to a consumer that drops it, as hyper would write it out. The checked
//! one also hashes each group and compares it with the outboard. The
//! summary prints both in MB/s and their ratio; the target is "within
//! 10 %" (ratio ≥ 0.90). The user agent's socket is not in either, so the
//! ratio is the worst case: over a real socket the copy to the kernel
//! costs both the same.

use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http_body_util::BodyExt;
use rproxy::cache::Outboard;
use rproxy::client_proxy::cached_body::{CachedBody, serve_cached};
use tokio::sync::mpsc;

const LEN: usize = 64 << 20;
const GROUP: usize = 64 << 10;

static RESULTS: Mutex<Vec<(&str, f64)>> = Mutex::new(Vec::new());

fn body() -> Vec<u8> {
    (0..LEN as u64)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}

/// The checked path, as a hit takes it.
async fn checked(file: std::fs::File, digest: blake3::Hash, outboard: Outboard) -> usize {
    let served = tokio::task::spawn_blocking(move || {
        serve_cached(file, LEN as u64, digest, Some(outboard), || {
            panic!("a good body failed its check")
        })
    })
    .await
    .unwrap();
    let Some(CachedBody::Stream(mut body)) = served else {
        panic!("a large body streams");
    };
    let mut total = 0;
    while let Some(frame) = body.frame().await {
        total += frame.unwrap().into_data().unwrap().len();
    }
    total
}

/// The same reads and hand-over, unchecked.
async fn unchecked(mut file: std::fs::File) -> usize {
    let (tx, mut rx) = mpsc::channel::<Bytes>(1);
    tokio::spawn(async move {
        for _ in 0..LEN / GROUP {
            let (returned, group) = tokio::task::spawn_blocking(move || {
                let mut group = vec![0; GROUP];
                file.read_exact(&mut group).unwrap();
                (file, group)
            })
            .await
            .unwrap();
            file = returned;
            if tx.send(Bytes::from(group)).await.is_err() {
                return;
            }
        }
    });
    let mut total = 0;
    while let Some(group) = rx.recv().await {
        total += group.len();
    }
    total
}

fn bench(c: &mut Criterion) {
    let data = body();
    let digest = blake3::hash(&data);
    let outboard = Outboard::of(&data);
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(&data).unwrap();
    drop(data);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("cached_hit_64MiB");
    group.throughput(Throughput::Bytes(LEN as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(8));
    let reopen = |file: &mut std::fs::File| {
        file.seek(SeekFrom::Start(0)).unwrap();
        file.try_clone().unwrap()
    };
    for name in ["unchecked", "checked"] {
        let mut elapsed = Duration::ZERO;
        let mut runs = 0u32;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let started = std::time::Instant::now();
                for _ in 0..iters {
                    let one = reopen(&mut file);
                    let total = match name {
                        "checked" => runtime.block_on(checked(one, digest, outboard.clone())),
                        _ => runtime.block_on(unchecked(one)),
                    };
                    assert_eq!(total, LEN);
                }
                let took = started.elapsed();
                elapsed += took;
                runs += iters as u32;
                took
            })
        });
        let mb_s = LEN as f64 * f64::from(runs) / elapsed.as_secs_f64() / 1e6;
        RESULTS.lock().unwrap().push((name, mb_s));
    }
    group.finish();
    let results = RESULTS.lock().unwrap();
    let get = |n: &str| results.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
    if let (Some(plain), Some(checked)) = (get("unchecked"), get("checked")) {
        println!(
            "\nC-V3 hit throughput, 64 MiB from the page cache: checked {checked:.0} MB/s, \
             unchecked {plain:.0} MB/s, ratio {:.2} (target >= 0.90)",
            checked / plain
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);

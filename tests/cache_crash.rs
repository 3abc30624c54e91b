//! The cache store under a file system that fails or crashes where the test
//! says (`fault_fs`): a power-loss model over random operation sequences
//! (RELIABILITY C-K3), process crashes at each step of a commit (C-K2), EIO
//! on fsync (C-E2) and on reading a hit (C-E3), the last two also through
//! the real client proxy.
//!
//! `RPROXY_CK3_SEQUENCES` sets the number of C-K3 sequences (default
//! 10 000 in release builds, 2 000 in debug ones, which run the store's
//! code unoptimised); `RPROXY_CK3_SEED` replays one seed.

mod fault_fs;
mod support;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fault_fs::{FaultFs, Kind, Verdict};
use rproxy::cache::{CacheError, CacheKey, CacheStore, Completeness, NewEntry};
use support::{Rng, random_bytes};

const BUDGET: u64 = 64 << 20;

fn new_entry() -> NewEntry {
    NewEntry {
        status: 200,
        headers: vec![("content-type".into(), "text/plain".into())],
        stored_at: 1_700_000_000,
        completeness: Completeness::Complete,
        shareable_as_basis: true,
    }
}

/// A directory for one test, in memory when the machine has /dev/shm.
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().unwrap()
}

/// One version of an entry: what was written.
#[derive(Clone, Debug, PartialEq)]
struct Version {
    body: Vec<u8>,
    sig: Vec<u8>,
}

impl Version {
    fn random(rng: &mut Rng) -> Version {
        let len = match rng.below(4) {
            0 => 0,
            1 => 4096 * rng.below(3) as usize,
            _ => rng.below(20_000) as usize,
        };
        let sig_len = rng.below(3) as usize * 40;
        Version {
            body: random_bytes(rng.next_u64(), len),
            sig: random_bytes(rng.next_u64(), sig_len),
        }
    }
}

/// Writes `version` in random chunks and commits it; `before_commit` runs
/// once the body is written, just before the commit.
fn put(
    store: &CacheStore,
    key: &CacheKey,
    version: &Version,
    rng: &mut Rng,
    before_commit: impl FnOnce(),
) -> Result<(), CacheError> {
    let mut writer = store.begin(key)?;
    let mut rest = &version.body[..];
    while !rest.is_empty() {
        let n = (rng.below(rest.len() as u64) + 1) as usize;
        writer.write_body(&rest[..n])?;
        rest = &rest[n..];
    }
    before_commit();
    writer.commit(new_entry(), &version.sig)
}

/// Reads `key`'s entry whole: body and signature, if it is served and its
/// body matches its digest.
fn read_entry(store: &CacheStore, key: &CacheKey) -> Option<Result<Version, String>> {
    let mut entry = store.get(key)?;
    Some(match entry.verify_body() {
        Ok(true) => {
            let mut body = Vec::new();
            entry.body.read_to_end(&mut body).unwrap();
            Ok(Version {
                body,
                sig: entry.signature.clone(),
            })
        }
        Ok(false) => Err(format!("{key}: served body fails its digest")),
        Err(e) => Err(format!("{key}: body unreadable: {e}")),
    })
}

/// Cache files under final names, grouped by entry (`<dir>/<hash>`), with
/// their extensions; and the number of temp files.
fn files_on_disk(root: &Path) -> (HashMap<PathBuf, Vec<String>>, usize) {
    let temps = std::fs::read_dir(root.join("tmp")).map_or(0, |d| d.count());
    let mut entries: HashMap<PathBuf, Vec<String>> = HashMap::new();
    for dir in std::fs::read_dir(root).unwrap().flatten() {
        let name = dir.file_name();
        if !dir.file_type().unwrap().is_dir() || name == "tmp" || name == "quarantine" {
            continue;
        }
        for file in std::fs::read_dir(dir.path()).unwrap().flatten() {
            let file = file.file_name().into_string().unwrap();
            let (stem, ext) = file.split_once('.').unwrap();
            let at = Path::new(&name).join(stem);
            entries.entry(at).or_default().push(ext.to_owned());
        }
    }
    (entries, temps)
}

// ---------------------------------------------------------------------------
// C-K3: the power-loss model

/// What the test knows of one key.
#[derive(Default)]
struct Expected {
    /// Versions that may be found: the last one whose commit returned, and
    /// any tried since.
    allowed: Vec<Version>,
    /// The version whose commit returned, if nothing touched the key since:
    /// it must survive any crash.
    durable: Option<Version>,
}

#[derive(Default, Debug)]
struct Tally {
    sequences: u64,
    crashed_mid_sequence: u64,
    torn: u64,
    process_only: u64,
    commits: u64,
    durable_checked: u64,
    entries_checked: u64,
    violations: Vec<String>,
}

/// How a sequence ends.
#[derive(Clone, Copy)]
enum Ending {
    /// Power cut keeping only what was fsynced.
    PowerCut,
    /// Power cut keeping a random part of what was not.
    TornPowerCut,
    /// `kill -9`: everything done stays, nothing more happens.
    ProcessCrash,
}

/// One sequence: boot on what the last crash left, open (with its
/// start-up cleanup), random operations until the crash (which may come in
/// the middle of any file operation, the open's included), then the check.
fn sequence(
    root: &Path,
    keys: &[CacheKey],
    expected: &mut [Expected],
    rng: &mut Rng,
    tally: &mut Tally,
) {
    let crash_after = rng.below(150);
    let ops = Arc::new(AtomicU64::new(0));
    let counter = ops.clone();
    let fs = Arc::new(FaultFs::boot(
        root,
        Box::new(move |_| {
            if counter.fetch_add(1, Ordering::Relaxed) == crash_after {
                Verdict::Crash
            } else {
                Verdict::Go
            }
        }),
    ));
    if let Ok(store) = CacheStore::open_with_fs(root, BUDGET, fs.clone()) {
        for _ in 0..rng.below(12) + 1 {
            if fs.is_dead() {
                break;
            }
            let k = rng.below(keys.len() as u64) as usize;
            let (key, exp) = (&keys[k], &mut expected[k]);
            match rng.below(10) {
                0..=3 => {
                    let version = Version::random(rng);
                    let tried = version.clone();
                    let mut committing = false;
                    let result = put(&store, key, &version, rng, || committing = true);
                    if committing {
                        exp.durable = None;
                        exp.allowed.push(tried);
                    }
                    if result.is_ok() {
                        tally.commits += 1;
                        exp.allowed = vec![version.clone()];
                        exp.durable = Some(version);
                    }
                }
                4 => {
                    // A put abandoned half-way (the upstream cut, say).
                    if let Ok(mut writer) = store.begin(key) {
                        let _ = writer.write_body(&random_bytes(rng.next_u64(), 5000));
                    }
                }
                5 | 6 => {
                    store.remove(key);
                    exp.durable = None;
                }
                7 => {
                    // A 304's refresh of the stored headers.
                    if let Some(entry) = store.get(key) {
                        let mut meta = entry.meta.clone();
                        meta.stored_at += 1;
                        let _ = store.update_meta(&meta);
                    }
                }
                _ => match read_entry(&store, key) {
                    Some(Ok(found)) if !exp.allowed.contains(&found) => tally
                        .violations
                        .push(format!("{key}: a version never written is served")),
                    Some(Err(e)) if !fs.is_dead() => tally.violations.push(e),
                    None if exp.durable.is_some() && !fs.is_dead() => tally
                        .violations
                        .push(format!("{key}: committed entry missing before any crash")),
                    _ => {}
                },
            }
        }
    }
    if fs.is_dead() {
        tally.crashed_mid_sequence += 1;
    }
    let ending = match rng.below(3) {
        0 => Ending::PowerCut,
        1 => Ending::TornPowerCut,
        _ => Ending::ProcessCrash,
    };
    match ending {
        Ending::PowerCut => fs.power_cut(rng, false),
        Ending::TornPowerCut => {
            tally.torn += 1;
            fs.power_cut(rng, true)
        }
        Ending::ProcessCrash => tally.process_only += 1,
    }
    drop(fs);
    check_after_restart(root, keys, expected, tally);
    tally.sequences += 1;
}

/// Restarts on `root` and checks C-K1's invariants; what is found becomes
/// what the next sequence starts from.
fn check_after_restart(
    root: &Path,
    keys: &[CacheKey],
    expected: &mut [Expected],
    tally: &mut Tally,
) {
    let store = CacheStore::open(root, BUDGET).expect("the store opens after any crash");
    let (on_disk, temps) = files_on_disk(root);
    if temps != 0 {
        tally
            .violations
            .push(format!("{temps} temp files after start-up cleanup"));
    }
    let mut present = 0;
    for (key, exp) in keys.iter().zip(expected.iter_mut()) {
        tally.entries_checked += 1;
        let found = match read_entry(&store, key) {
            Some(Ok(found)) => Some(found),
            Some(Err(e)) => {
                tally.violations.push(e);
                None
            }
            None => None,
        };
        if let Some(version) = &exp.durable {
            tally.durable_checked += 1;
            if found.as_ref() != Some(version) {
                tally
                    .violations
                    .push(format!("{key}: an entry whose commit returned is lost"));
            }
        }
        match found {
            Some(found) => {
                if !exp.allowed.contains(&found) {
                    tally
                        .violations
                        .push(format!("{key}: after restart, a version never written"));
                }
                present += 1;
                let files = on_disk.get(&key.entry_path()).map(|e| e.len());
                if files != Some(3) {
                    tally
                        .violations
                        .push(format!("{key}: {files:?} files under final names"));
                }
                exp.allowed = vec![found.clone()];
                exp.durable = Some(found);
            }
            None => *exp = Expected::default(),
        }
    }
    // Anything else under a final name is an orphan or a partial file.
    if on_disk.len() != present || store.len() != present {
        tally.violations.push(format!(
            "{} entries on disk, {} indexed, {present} valid: {on_disk:?}",
            on_disk.len(),
            store.len()
        ));
    }
}

#[test]
fn c_k3_power_loss_model_random_sequences_keep_every_committed_entry_and_serve_nothing_torn() {
    let default = if cfg!(debug_assertions) {
        2_000
    } else {
        10_000
    };
    let sequences: u64 = std::env::var("RPROXY_CK3_SEQUENCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    let seed: u64 = std::env::var("RPROXY_CK3_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_c0de);
    let keys: Vec<CacheKey> = [
        "http://a.example/app.js",
        "http://a.example/style.css",
        "http://a.example/",
        "http://b.example:8080/data.json",
        "http://c.example/big.bin",
    ]
    .iter()
    .map(|u| CacheKey::parse(u).unwrap())
    .collect();
    let started = std::time::Instant::now();
    let mut tally = Tally::default();
    // Chains of sequences on one directory, so later ones start from what
    // earlier crashes left.
    let mut run = 0;
    while tally.sequences < sequences {
        let dir = scratch();
        let root = dir.path().join("cache");
        let mut expected: Vec<Expected> = keys.iter().map(|_| Expected::default()).collect();
        let mut rng = Rng::new(seed ^ run);
        for _ in 0..50.min(sequences - tally.sequences) {
            sequence(&root, &keys, &mut expected, &mut rng, &mut tally);
            if !tally.violations.is_empty() {
                panic!(
                    "C-K3 violation in chain {run} (RPROXY_CK3_SEED={seed}): {:#?}",
                    tally.violations
                );
            }
        }
        run += 1;
    }
    println!(
        "C-K3: {} sequences in {:.1?} ({} crashed mid-operation, {} torn power cuts, {} process crashes), \
         {} commits, {} committed entries checked after a crash, {} entry checks, {} violations",
        tally.sequences,
        started.elapsed(),
        tally.crashed_mid_sequence,
        tally.torn,
        tally.process_only,
        tally.commits,
        tally.durable_checked,
        tally.entries_checked,
        tally.violations.len()
    );
    assert!(tally.crashed_mid_sequence > tally.sequences / 4);
    assert!(tally.durable_checked > tally.sequences / 4);
}

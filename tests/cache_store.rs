//! Black-box tests of the client cache store on real temp directories:
//! crash leftovers (C-K2 style), the hard budget (C-V1), LRU (C-V2), rebuild
//! time (C-R1), hostile directory content (C-R2), hit checks (C-E3, C-P2),
//! concurrent writers (C-W1) and eviction under a reader (C-W4).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::{ProptestConfig, TestCaseError, prop_assert, prop_assert_eq, proptest};
use rproxy::cache::store::LOCK_FILE;
use rproxy::cache::{
    CacheError, CacheKey, CacheScope, CacheStore, Completeness, EntryMeta, NewEntry, select_basis,
};

const MIB: u64 = 1024 * 1024;

fn key(url: &str) -> CacheKey {
    CacheKey::parse(url).expect("test URL parses")
}

fn info(completeness: Completeness) -> NewEntry {
    NewEntry {
        status: 200,
        headers: vec![("content-type".into(), "text/plain".into())],
        stored_at: 1_700_000_000,
        completeness,
        shareable_as_basis: true,
        complete_len: None,
    }
}

/// A signature stand-in derived from the body, so a reader can tell whether
/// body and signature belong together.
fn sig_of(body: &[u8]) -> Vec<u8> {
    blake3::hash(body).as_bytes().repeat(2)
}

fn put(store: &CacheStore, k: &CacheKey, body: &[u8]) -> Result<(), CacheError> {
    let mut w = store.begin(k)?;
    for chunk in body.chunks(7000) {
        w.write_body(chunk)?;
    }
    w.commit(info(Completeness::Complete), &sig_of(body))
}

fn read_hit(store: &CacheStore, k: &CacheKey) -> Option<Vec<u8>> {
    let mut e = store.get(k)?;
    let mut body = Vec::new();
    e.body.read_to_end(&mut body).expect("body reads");
    assert_eq!(e.signature, sig_of(&body), "signature of another version");
    assert_eq!(blake3::hash(&body).to_hex().as_str(), e.meta.body_blake3);
    Some(body)
}

/// Every regular file under `dir`, not following symlinks.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("readable").flatten() {
            let t = e.file_type().expect("file type");
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() && e.path() != dir.join(LOCK_FILE) {
                // The lock file is the open store's, not an entry's.
                out.push(e.path());
            }
        }
    }
    out
}

/// Disk usage as the store counts it: each file in 4 KiB blocks.
fn usage(dir: &Path) -> u64 {
    files_under(dir)
        .iter()
        .map(|p| fs::metadata(p).map_or(0, |m| m.len().div_ceil(4096) * 4096))
        .sum()
}

fn body_path(root: &Path, k: &CacheKey) -> PathBuf {
    root.join(k.entry_path()).with_extension("body")
}

fn meta_path(root: &Path, k: &CacheKey) -> PathBuf {
    root.join(k.entry_path()).with_extension("meta")
}

/// Small deterministic generator (xorshift), enough for sizes and choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn commit_then_get_returns_the_bytes_and_reopen_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 8 * MIB).unwrap();
    let k = key("http://e.com/a.txt");
    put(&store, &k, b"hello world").unwrap();
    assert_eq!(read_hit(&store, &k).as_deref(), Some(&b"hello world"[..]));
    let mut e = store.get(&k).unwrap();
    assert!(e.verify_body().unwrap());
    assert_eq!(e.meta.status, 200);
    assert_eq!(e.meta.completeness, Completeness::Complete);
    drop(store);

    let store = CacheStore::open(dir.path(), 8 * MIB).unwrap();
    assert_eq!(store.len(), 1);
    assert_eq!(read_hit(&store, &k).as_deref(), Some(&b"hello world"[..]));
    assert!(store.remove(&k));
    assert!(store.get(&k).is_none());
    assert_eq!(files_under(dir.path()), Vec::<PathBuf>::new());
}

#[test]
fn a_digest_given_at_commit_must_be_the_written_bodys() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 8 * MIB).unwrap();
    let k = key("http://e.com/a.txt");
    let body = b"rebuilt by the decoder";

    // The right digest: the entry reads back and verifies.
    let mut w = store.begin(&k).unwrap();
    w.write_body(body).unwrap();
    w.commit_with_digest(
        info(Completeness::Complete),
        &sig_of(body),
        blake3::hash(body),
    )
    .unwrap();
    assert_eq!(read_hit(&store, &k).as_deref(), Some(&body[..]));

    // Another one: refused, and the old entry stays.
    let mut w = store.begin(&k).unwrap();
    w.write_body(b"other bytes").unwrap();
    let wrong = w.commit_with_digest(
        info(Completeness::Complete),
        &sig_of(b"other bytes"),
        blake3::hash(body),
    );
    assert!(
        matches!(wrong, Err(CacheError::DigestMismatch { .. })),
        "{wrong:?}"
    );
    assert_eq!(
        read_hit(&store, &k).as_deref(),
        Some(&body[..]),
        "the old entry stays"
    );
}

#[test]
fn c_v3_a_committed_entry_keeps_an_outboard_that_checks_each_group() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 64 * MIB).unwrap();
    let k = key("http://e.com/large.bin");
    let body: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 9) as u8)
        .collect();
    let mut w = store.begin(&k).unwrap();
    for piece in body.chunks(100_000) {
        w.write_body(piece).unwrap();
    }
    w.commit(info(Completeness::Complete), &sig_of(&body))
        .unwrap();
    let entry = store.get(&k).unwrap();
    let outboard = entry
        .meta
        .outboard()
        .expect("an outboard that merges into the digest");
    assert!(outboard.groups() > 1);
    for i in 0..outboard.groups() {
        let r = outboard.group_range(i);
        let mut group = body[r.start as usize..r.end as usize].to_vec();
        assert!(outboard.check_group(i, &group));
        group[0] ^= 1;
        assert!(!outboard.check_group(i, &group));
    }
    // Altered metadata is no outboard at all.
    let mut meta = entry.meta.clone();
    meta.outboard.replace_range(
        8..9,
        if &meta.outboard[8..9] == "A" {
            "B"
        } else {
            "A"
        },
    );
    assert!(meta.outboard().is_none());
}

/// C-K2, simulated: the files each crash point leaves behind, then a restart.
#[test]
fn c_k2_crash_leftovers_are_cleaned_and_valid_entries_survive() {
    for run in 0..20u64 {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let store = CacheStore::open(root, 8 * MIB).unwrap();
        let kept = key("http://e.com/kept");
        let replaced = key("http://e.com/replaced");
        let truncated = key("http://e.com/truncated");
        let last = key("http://e.com/last");
        for k in [&kept, &replaced, &truncated, &last] {
            put(&store, k, &vec![run as u8; 5000 + run as usize]).unwrap();
        }
        // A writer that never finishes: its temp file stays while we "crash".
        let mut w = store.begin(&key("http://e.com/in-flight")).unwrap();
        w.write_body(b"half").unwrap();
        std::mem::forget(w);
        drop(store);

        // Crash 1, after the temp writes: more temp files.
        fs::write(root.join("tmp/0123.body.tmp"), b"x").unwrap();
        fs::write(root.join("tmp/0124.meta.tmp"), b"{").unwrap();
        // Crash 2, after body and signature renames, before the metadata
        // rename: of a new key (no meta) ...
        let new = key("http://e.com/new");
        fs::write(body_path(root, &new), b"new body").unwrap();
        fs::write(body_path(root, &new).with_extension("sig"), b"sig").unwrap();
        // ... and of a replacement (old metadata already unlinked).
        fs::remove_file(meta_path(root, &replaced)).unwrap();
        fs::write(body_path(root, &replaced), b"newer body").unwrap();
        // An outside truncation: metadata with the wrong length.
        fs::OpenOptions::new()
            .write(true)
            .open(body_path(root, &truncated))
            .unwrap()
            .set_len(10)
            .unwrap();
        // Crash 3, after the metadata rename and before the dir fsync: the
        // entry is complete, and `last` stands for it.

        let store = CacheStore::open(root, 8 * MIB).unwrap();
        assert_eq!(
            fs::read_dir(root.join("tmp")).unwrap().count(),
            0,
            "temp files left"
        );
        for p in files_under(root) {
            if p.starts_with(root.join("quarantine")) {
                continue;
            }
            let ext = p.extension().unwrap().to_str().unwrap();
            assert!(
                p.with_extension("meta").exists(),
                "{ext} without metadata under a final name: {p:?}"
            );
        }
        assert!(store.get(&new).is_none());
        assert!(store.get(&replaced).is_none());
        assert!(store.get(&truncated).is_none());
        assert!(
            !body_path(root, &truncated).exists(),
            "invalid entry left in place"
        );
        for k in [&kept, &last] {
            let body = read_hit(&store, k).expect("committed entry survives");
            assert_eq!(body, vec![run as u8; 5000 + run as usize]);
        }
        assert_eq!(store.len(), 2);
    }
}

/// C-V1: the store's count and the files on disk stay within the budget
/// after every put, including puts that do not fit.
#[test]
fn c_v1_budget_never_exceeded_across_200_random_puts() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 256 * 1024;
    let store = CacheStore::open(dir.path(), budget).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut stored, mut refused) = (0, 0);
    for i in 0..200 {
        let len = match rng.below(10) {
            0 => budget as usize + 1 + rng.below(1000) as usize, // never fits
            1..=3 => rng.below(100_000) as usize,
            _ => rng.below(8000) as usize,
        };
        let k = key(&format!("http://e.com/{}", rng.below(150)));
        match put(&store, &k, &vec![i as u8; len]) {
            Ok(()) => stored += 1,
            Err(CacheError::OverBudget { .. }) => refused += 1,
            Err(e) => panic!("unexpected error {e}"),
        }
        assert!(store.used_bytes() <= budget, "count {}", store.used_bytes());
        let on_disk = usage(dir.path());
        assert!(
            on_disk <= budget,
            "on disk {on_disk} > {budget} after put {i}"
        );
    }
    assert!(
        stored > 100 && refused > 0,
        "stored {stored}, refused {refused}"
    );
    // Mid-write too: a writer's reservation counts before its commit.
    let mut w = store.begin(&key("http://e.com/big")).unwrap();
    for _ in 0..50 {
        w.write_body(&[1; 4096]).unwrap();
        assert!(usage(dir.path()) <= budget);
        assert!(store.used_bytes() <= budget);
    }
    assert!(matches!(
        w.write_body(&vec![0; budget as usize]),
        Err(CacheError::OverBudget { .. })
    ));
    drop(w);
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
}

/// C-V2: a hot set that keeps being used survives a scan of 10× the budget.
#[test]
fn c_v2_lru_keeps_recently_used_entries() {
    let dir = tempfile::tempdir().unwrap();
    // An entry of a 4000-byte body is 3 blocks (body, sig, meta): 40 fit.
    let budget = 40 * 3 * 4096;
    let store = CacheStore::open(dir.path(), budget).unwrap();
    let hot: Vec<CacheKey> = (0..4)
        .map(|i| key(&format!("http://e.com/hot/{i}")))
        .collect();
    for k in &hot {
        put(&store, k, &[7; 4000]).unwrap();
    }
    for i in 0..400 {
        put(&store, &key(&format!("http://e.com/cold/{i}")), &[1; 4000]).unwrap();
        // 90 % of hits go to the hot set.
        let h = &hot[i % hot.len()];
        if i % 10 != 0 {
            assert!(
                read_hit(&store, h).is_some(),
                "hot entry {h} evicted at {i}"
            );
        }
    }
    let present = hot.iter().filter(|k| store.lookup(k).is_some()).count();
    assert_eq!(present, hot.len());
    assert!(store.len() <= 40);
    assert!(store.lookup(&key("http://e.com/cold/0")).is_none());
}

/// C-R1: rebuilding an index of 2,000 entries takes well under 2 s in debug.
#[test]
fn c_r1_rebuild_of_2000_entries_is_fast() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Written directly (no fsync) to keep the set-up quick; the files are
    // exactly what commits would leave.
    for i in 0..2000 {
        let k = key(&format!("http://host{}.example/path/{i}.html", i % 7));
        let body = vec![(i % 251) as u8; 1024];
        let sig = sig_of(&body);
        let meta = EntryMeta::new(
            &k,
            info(Completeness::Complete),
            1024,
            blake3::hash(&body),
            &sig,
        );
        let stem = root.join(k.entry_path());
        fs::create_dir_all(stem.parent().unwrap()).unwrap();
        fs::write(stem.with_extension("body"), &body).unwrap();
        fs::write(stem.with_extension("sig"), &sig).unwrap();
        fs::write(stem.with_extension("meta"), meta.to_json()).unwrap();
    }
    let started = Instant::now();
    let store = CacheStore::open(root, 64 * MIB).unwrap();
    let elapsed = started.elapsed();
    println!("C-R1: rebuilt 2000 entries in {elapsed:?}");
    assert_eq!(store.len(), 2000);
    assert!(elapsed < Duration::from_secs(2), "rebuild took {elapsed:?}");
    let k = key("http://host3.example/path/10.html");
    assert_eq!(read_hit(&store, &k), Some(vec![10; 1024]));
}

/// C-R2: symlinks out of the root, a FIFO, a mode-000 file, garbage and a
/// lying empty body: no panic, no hang, nothing outside the root read or
/// touched.
#[test]
fn c_r2_hostile_cache_dir_content() {
    let outside = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let secret = outside.path().join("secret");
    fs::write(&secret, b"do not read").unwrap();

    // A valid-looking entry whose files are symlinks to the outside file.
    let linked = key("http://e.com/linked");
    let meta = EntryMeta::new(
        &linked,
        info(Completeness::Complete),
        11,
        blake3::hash(b"do not read"),
        b"",
    );
    let stem = root.join(linked.entry_path());
    fs::create_dir_all(stem.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&secret, stem.with_extension("body")).unwrap();
    fs::write(outside.path().join("meta"), meta.to_json()).unwrap();
    std::os::unix::fs::symlink(outside.path().join("meta"), stem.with_extension("meta")).unwrap();
    // A whole authority directory that is a symlink to the outside, holding a
    // valid entry.
    let via_dir = key("http://evil.com/x");
    let outside_entry = outside.path().join(via_dir.entry_path());
    fs::create_dir_all(outside_entry.parent().unwrap()).unwrap();
    let vmeta = EntryMeta::new(
        &via_dir,
        info(Completeness::Complete),
        3,
        blake3::hash(b"abc"),
        b"",
    );
    fs::write(outside_entry.with_extension("body"), b"abc").unwrap();
    fs::write(outside_entry.with_extension("sig"), b"").unwrap();
    fs::write(outside_entry.with_extension("meta"), vmeta.to_json()).unwrap();
    std::os::unix::fs::symlink(
        outside_entry.parent().unwrap(),
        root.join(via_dir.authority_dir()),
    )
    .unwrap();
    // A FIFO as metadata and as body.
    let fifo = key("http://e.com/fifo");
    let fifo_stem = root.join(fifo.entry_path());
    for ext in ["meta", "body"] {
        let status = std::process::Command::new("mkfifo")
            .arg(fifo_stem.with_extension(ext))
            .status()
            .expect("mkfifo runs");
        assert!(status.success());
    }
    // A mode-000 metadata file (root ignores the mode; then it is garbage).
    let locked = key("http://e.com/locked");
    let locked_meta = meta_path(&root, &locked);
    fs::write(&locked_meta, b"not json").unwrap();
    fs::write(body_path(&root, &locked), b"x").unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&locked_meta, fs::Permissions::from_mode(0o000)).unwrap();
    // Garbage metadata, and an empty body whose metadata promises content.
    let garbage = key("http://e.com/garbage");
    fs::write(meta_path(&root, &garbage), b"\0\0garbage").unwrap();
    let empty = key("http://e.com/empty");
    let emeta = EntryMeta::new(
        &empty,
        info(Completeness::Complete),
        0,
        blake3::hash(b"content"),
        b"",
    );
    fs::write(meta_path(&root, &empty), emeta.to_json()).unwrap();
    fs::write(body_path(&root, &empty), b"").unwrap();
    fs::write(body_path(&root, &empty).with_extension("sig"), b"").unwrap();
    // Foreign files the store must leave alone.
    fs::write(root.join("README"), b"runtime data").unwrap();

    // Open in a thread so a blocking FIFO open fails the test instead of
    // hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let open_root = root.clone();
    std::thread::spawn(move || {
        let _ = tx.send(CacheStore::open(open_root, 8 * MIB));
    });
    let store = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("open did not hang")
        .expect("open succeeds");

    assert_eq!(store.len(), 0, "nothing hostile is indexed");
    for k in [&linked, &via_dir, &fifo, &locked, &garbage, &empty] {
        assert!(store.get(k).is_none(), "{k} served");
    }
    assert_eq!(fs::read(&secret).unwrap(), b"do not read");
    assert!(
        outside_entry.with_extension("meta").exists(),
        "outside file touched"
    );
    assert!(root.join("README").exists());
    // Writing to the symlinked authority must not write through it.
    assert!(matches!(
        put(&store, &via_dir, b"new"),
        Err(CacheError::NotADirectory { .. })
    ));
    assert_eq!(
        fs::read(outside_entry.with_extension("body")).unwrap(),
        b"abc"
    );
    assert_eq!(files_under(outside.path()).len(), 5);
    // The store still works.
    let ok = key("http://e.com/ok");
    put(&store, &ok, b"fine").unwrap();
    assert_eq!(read_hit(&store, &ok).as_deref(), Some(&b"fine"[..]));
}

/// C-E3: a body truncated behind the store's back is a miss, and the entry
/// is quarantined, then gone after the next open.
#[test]
fn c_e3_truncated_body_on_a_hit_is_a_miss_and_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 8 * MIB).unwrap();
    let k = key("http://e.com/t");
    put(&store, &k, &[5; 10_000]).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(body_path(dir.path(), &k))
        .unwrap()
        .set_len(9_999)
        .unwrap();
    assert!(store.get(&k).is_none());
    assert!(store.lookup(&k).is_none());
    assert!(!body_path(dir.path(), &k).exists());
    assert_eq!(
        fs::read_dir(dir.path().join("quarantine")).unwrap().count(),
        3
    );
    drop(store);
    let store = CacheStore::open(dir.path(), 8 * MIB).unwrap();
    assert_eq!(
        fs::read_dir(dir.path().join("quarantine")).unwrap().count(),
        0
    );
    assert_eq!(store.used_bytes(), 0);
}

/// C-P2: metadata naming another key, under this key's file name, is a
/// miss (forced collision).
#[test]
fn c_p2_metadata_of_another_key_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 8 * MIB).unwrap();
    let a = key("http://e.com/a");
    let b = key("http://e.com/b");
    put(&store, &a, b"same").unwrap();
    put(&store, &b, b"same").unwrap();
    fs::copy(meta_path(dir.path(), &b), meta_path(dir.path(), &a)).unwrap();
    assert!(store.get(&a).is_none());
    assert_eq!(read_hit(&store, &b).as_deref(), Some(&b"same"[..]));
    // At start-up the same mismatch is caught by the name check.
    put(&store, &a, b"same").unwrap();
    drop(store);
    fs::copy(meta_path(dir.path(), &b), meta_path(dir.path(), &a)).unwrap();
    let store = CacheStore::open(dir.path(), 8 * MIB).unwrap();
    assert!(store.get(&a).is_none());
    assert!(store.get(&b).is_some());
}

#[test]
fn partial_entry_only_when_no_complete_entry_exists() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 8 * MIB).unwrap();
    let k = key("http://e.com/big.iso");
    let partial = |store: &CacheStore| {
        let mut w = store.begin(&k)?;
        w.write_body(b"prefix")?;
        w.commit(info(Completeness::Partial), &sig_of(b"prefix"))
    };
    partial(&store).unwrap();
    assert_eq!(
        store.lookup(&k).unwrap().completeness,
        Completeness::Partial
    );
    partial(&store).unwrap(); // a longer prefix may replace a prefix
    put(&store, &k, b"prefix and the rest").unwrap();
    assert!(matches!(
        partial(&store),
        Err(CacheError::CompleteEntryExists { .. })
    ));
    assert_eq!(
        read_hit(&store, &k).as_deref(),
        Some(&b"prefix and the rest"[..])
    );
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
}

#[test]
fn entry_larger_than_the_budget_is_not_stored_and_evicts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 64 * 1024).unwrap();
    let small = key("http://e.com/small");
    put(&store, &small, b"s").unwrap();
    // With the length known up front, nothing is evicted for a hopeless entry.
    let mut w = store.begin(&key("http://e.com/huge")).unwrap();
    let err = w.expect_body_len(70 * 1024).unwrap_err();
    assert!(matches!(err, CacheError::OverBudget { .. }), "{err}");
    assert!(matches!(
        w.write_body(b"x"),
        Err(CacheError::WriterFailed { .. })
    ));
    drop(w);
    assert!(store.lookup(&small).is_some());
    // Without it the writer finds out as the bytes come, and still refuses.
    let err = put(&store, &key("http://e.com/huge"), &vec![0; 70 * 1024]).unwrap_err();
    assert!(matches!(err, CacheError::OverBudget { .. }), "{err}");
    assert!(store.lookup(&key("http://e.com/huge")).is_none());
    assert!(store.used_bytes() <= 64 * 1024);
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
}

#[test]
fn dropped_or_aborted_writers_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 8 * MIB).unwrap();
    let mut w = store.begin(&key("http://e.com/a")).unwrap();
    w.write_body(&[1; 100_000]).unwrap();
    drop(w);
    let mut w = store.begin(&key("http://e.com/b")).unwrap();
    w.write_body(b"x").unwrap();
    w.abort();
    assert_eq!(files_under(dir.path()), Vec::<PathBuf>::new());
    assert_eq!(store.used_bytes(), 0);
    assert!(store.is_empty());
}

#[test]
fn candidates_feed_basis_selection() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 8 * MIB).unwrap();
    for url in [
        "http://e.com/docs/a.html",
        "http://e.com/img/b.png",
        "http://other.com/docs/a.html",
    ] {
        put(&store, &key(url), url.as_bytes()).unwrap();
    }
    let want = key("http://e.com/docs/c.html");
    let candidates = store.candidates(&want);
    assert_eq!(candidates.len(), 2);
    let basis = select_basis(&candidates, &want, CacheScope::Shared).unwrap();
    assert_eq!(basis.key.url(), "http://e.com/docs/a.html");
    assert_eq!(basis.body_blake3, blake3::hash(b"http://e.com/docs/a.html"));
    assert!(store.touch(&basis.key));
}

/// C-W1: writers of one key race readers; every read is one whole version
/// (body, signature and metadata agree), never a mix. 8 writers x 25
/// versions against 4 readers by default; `RPROXY_CACHE_STRESS=1` runs the
/// full 32 x 1000 against 32 readers (minutes; use --release too).
#[test]
fn c_w1_concurrent_writers_of_one_key_never_mix_versions() {
    let full = std::env::var_os("RPROXY_CACHE_STRESS").is_some();
    let (writers, versions, readers) = if full {
        (32u32, 1000u32, 32)
    } else {
        (8, 25, 4)
    };
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 64 * MIB).unwrap();
    let k = key("http://e.com/contended");
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..readers)
        .map(|_| {
            let (store, k, stop, reads) = (
                store.clone(),
                k.clone(),
                Arc::clone(&stop),
                Arc::clone(&reads),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(body) = read_hit(&store, &k) {
                        // Each version is one byte value repeated.
                        assert!(body.iter().all(|&b| b == body[0]), "mixed body");
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let writers: Vec<_> = (0..writers)
        .map(|w| {
            let (store, k) = (store.clone(), k.clone());
            std::thread::spawn(move || {
                for i in 0..versions {
                    let v = (w * 31 + i) as u8;
                    let len = 1000 + (w as usize % 8) * 3000 + (i as usize % 100);
                    put(&store, &k, &vec![v; len]).unwrap();
                }
            })
        })
        .collect();
    for t in writers {
        t.join().expect("writer panicked");
    }
    stop.store(true, Ordering::Relaxed);
    for t in readers {
        t.join().expect("reader saw a mixed version");
    }
    assert!(reads.load(Ordering::Relaxed) > 0);
    // No reader ever found an inconsistent entry to quarantine.
    assert_eq!(
        fs::read_dir(dir.path().join("quarantine")).unwrap().count(),
        0
    );
    assert_eq!(store.len(), 1);
    assert!(store.get(&k).unwrap().verify_body().unwrap());
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    // Exactly one version's three files remain.
    assert_eq!(files_under(dir.path()).len(), 3);
}

/// C-W4: a reader holding an entry keeps reading the old bytes after the
/// entry is replaced or evicted.
#[test]
fn c_w4_eviction_and_replacement_while_reading() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 4 * MIB).unwrap();
    let k = key("http://e.com/streamed");
    let old: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    put(&store, &k, &old).unwrap();
    let mut reading = store.get(&k).unwrap();
    let mut first = vec![0; 1000];
    reading.body.read_exact(&mut first).unwrap();

    put(&store, &k, b"replacement").unwrap();
    let mut basis = store.get(&k).unwrap();
    assert!(store.remove(&k)); // evicted while in use as a basis
    // Fill the cache so the old blocks would be reused if they were freed.
    for i in 0..3 {
        put(
            &store,
            &key(&format!("http://e.com/fill/{i}")),
            &vec![0xee; 1_000_000],
        )
        .unwrap();
    }

    let mut rest = Vec::new();
    reading.body.read_to_end(&mut rest).unwrap();
    first.extend(rest);
    assert_eq!(first, old);
    assert!(reading.verify_body().unwrap());
    assert!(basis.verify_body().unwrap());
    let mut b = Vec::new();
    basis.body.read_to_end(&mut b).unwrap();
    assert_eq!(b, b"replacement");
}

#[derive(Debug, Clone)]
enum Op {
    Put {
        k: usize,
        len: usize,
        partial: bool,
    },
    Get(usize),
    Remove(usize),
    /// A writer dies mid-body and a stray orphan body appears, then restart.
    CrashAndReopen {
        k: usize,
    },
}

fn op_strategy() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..6usize, 0..20_000usize, proptest::bool::weighted(0.2))
            .prop_map(|(k, len, partial)| Op::Put { k, len, partial }),
        4 => (0..6usize).prop_map(Op::Get),
        1 => (0..6usize).prop_map(Op::Remove),
        1 => (0..6usize).prop_map(|k| Op::CrashAndReopen { k }),
    ]
}

/// Runs one op sequence against the store and an in-memory model. With
/// `exact` the budget never evicts and the model must match exactly;
/// otherwise entries may be lost but never served wrong (the cache
/// invariant of RELIABILITY B).
fn run_model(ops: Vec<Op>, budget: u64, exact: bool) -> Result<(), TestCaseError> {
    use std::collections::HashMap;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut store = CacheStore::open(root, budget).unwrap();
    let keys: Vec<CacheKey> = (0..6).map(|i| key(&format!("http://m.com/{i}"))).collect();
    let mut model: HashMap<usize, (Vec<u8>, Completeness)> = HashMap::new();
    for (n, op) in ops.into_iter().enumerate() {
        match op {
            Op::Put { k, len, partial } => {
                let body = vec![(n % 251) as u8; len];
                let completeness = if partial {
                    Completeness::Partial
                } else {
                    Completeness::Complete
                };
                let stored = store.lookup(&keys[k]).map(|e| e.completeness);
                if exact {
                    prop_assert_eq!(stored, model.get(&k).map(|(_, c)| *c));
                }
                let mut w = store.begin(&keys[k]).unwrap();
                w.write_body(&body).unwrap();
                let result = w.commit(info(completeness), &sig_of(&body));
                if partial && stored == Some(Completeness::Complete) {
                    let is_refusal = matches!(result, Err(CacheError::CompleteEntryExists { .. }));
                    prop_assert!(is_refusal);
                } else {
                    result.unwrap();
                    model.insert(k, (body, completeness));
                }
            }
            Op::Get(k) => {
                let got = read_hit(&store, &keys[k]);
                let want = model.get(&k).map(|(b, _)| b);
                if exact || got.is_some() {
                    prop_assert_eq!(got.as_ref(), want);
                } else {
                    model.remove(&k); // lost to eviction: allowed
                }
            }
            Op::Remove(k) => {
                let removed = store.remove(&keys[k]);
                let modelled = model.remove(&k).is_some();
                prop_assert!(removed == modelled || (!exact && !removed));
            }
            Op::CrashAndReopen { k } => {
                let mut w = store.begin(&keys[k]).unwrap();
                w.write_body(b"never committed").unwrap();
                std::mem::forget(w);
                let stray = key(&format!("http://m.com/stray/{n}"));
                let stray_body = body_path(root, &stray);
                fs::create_dir_all(stray_body.parent().unwrap()).unwrap();
                fs::write(&stray_body, b"orphan").unwrap();
                drop(store);
                store = CacheStore::open(root, budget).unwrap();
                prop_assert!(!stray_body.exists());
                prop_assert_eq!(fs::read_dir(root.join("tmp")).unwrap().count(), 0);
            }
        }
        if exact {
            prop_assert_eq!(store.len(), model.len());
        }
        prop_assert!(store.used_bytes() <= budget);
        prop_assert!(usage(root) <= budget);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Model-based store test (RELIABILITY B6): random put / get / remove /
    /// crash / reopen sequences; the budget never evicts.
    #[test]
    fn store_matches_a_model(ops in proptest::collection::vec(op_strategy(), 1..40)) {
        run_model(ops, 64 * MIB, true)?;
    }

    /// The same under a budget of about four entries: entries are lost to
    /// eviction, never served wrong, and the budget holds.
    #[test]
    fn store_under_pressure_loses_entries_but_never_lies(
        ops in proptest::collection::vec(op_strategy(), 1..40)
    ) {
        run_model(ops, 96 * 1024, false)?;
    }
}

/// Quarantine keeps at most a tenth of the budget; past that, invalid
/// entries are deleted so corruption cannot fill the cache.
#[test]
fn quarantine_beyond_its_share_deletes_instead() {
    let dir = tempfile::tempdir().unwrap();
    let store = CacheStore::open(dir.path(), 256 * 1024).unwrap();
    let k = key("http://e.com/big");
    put(&store, &k, &[1; 30_000]).unwrap();
    fs::write(body_path(dir.path(), &k), b"short").unwrap();
    assert!(store.get(&k).is_none());
    assert_eq!(
        fs::read_dir(dir.path().join("quarantine")).unwrap().count(),
        0
    );
    assert_eq!(files_under(dir.path()), Vec::<PathBuf>::new());
    assert_eq!(store.used_bytes(), 0);
}

/// Environment variable that turns `crash_loop_child` into a writer that
/// commits entries under the given cache root until it is killed.
const CHILD_ROOT_ENV: &str = "RPROXY_CACHE_CRASH_CHILD_ROOT";

/// Not a test on its own: the body of the child process that
/// `c_k1_kill_9_loop_leaves_only_valid_entries` SIGKILLs. It prints a line
/// after each commit returns.
#[test]
fn crash_loop_child() {
    let Ok(root) = std::env::var(CHILD_ROOT_ENV) else {
        return;
    };
    let store = CacheStore::open(&root, 1 << 40).unwrap();
    let mut rng = Rng(u64::from(std::process::id()) | 1);
    for n in 0.. {
        let k = key(&format!("http://e.com/{}/{n}", std::process::id()));
        let body = vec![(n % 251) as u8; rng.below(300_000) as usize];
        put(&store, &k, &body).unwrap();
        println!("COMMITTED {}", k.url());
    }
}

/// C-K1 in small: SIGKILL a writer at random moments, reopen, and check that
/// no temp file or orphan is left, every entry verifies, and every entry
/// whose commit returned before the kill is there.
#[test]
fn c_k1_kill_9_loop_leaves_only_valid_entries() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut committed = Vec::new();
    for _ in 0..10 {
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "crash_loop_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ROOT_ENV, root)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(50 + rng.below(250)));
        let mut child = child;
        child.kill().unwrap(); // SIGKILL
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        committed.extend(
            stdout
                .lines()
                .filter_map(|l| l.strip_prefix("COMMITTED "))
                .map(key),
        );

        let store = CacheStore::open(root, 1 << 40).unwrap();
        assert_eq!(fs::read_dir(root.join("tmp")).unwrap().count(), 0);
        for p in files_under(root) {
            assert!(p.with_extension("meta").exists(), "orphan {p:?}");
        }
        for k in &committed {
            let mut e = store.get(k).unwrap_or_else(|| panic!("lost committed {k}"));
            assert!(e.verify_body().unwrap(), "{k} fails its digest");
        }
        // Entries committed but not yet logged verify too.
        let mut on_disk = 0;
        for p in files_under(root) {
            if p.extension().is_some_and(|e| e == "meta") {
                let meta = EntryMeta::from_json(&fs::read(&p).unwrap()).unwrap();
                let mut e = store.get(&meta.key().unwrap()).expect("indexed");
                assert!(e.verify_body().unwrap(), "{p:?} fails its digest");
                on_disk += 1;
            }
        }
        assert_eq!(on_disk, store.len());
        assert!(store.len() >= committed.len());
    }
    println!("C-K1: {} logged commits survived 10 kills", committed.len());
    assert!(!committed.is_empty());
}

//! `rproxy demo` as a test: the bundled sample through origin, accelerator
//! and client proxy on loopback; the newer release must come as a small
//! delta and every body must equal its file.

use rproxy::demo::{DemoOptions, print_report, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_fetches_the_newer_release_as_a_small_delta() {
    let cache = tempfile::tempdir().unwrap();
    let options = DemoOptions {
        root: "tests/data".into(),
        paths: vec![
            "/index.html".into(),
            "/jquery/3.7.0/jquery.js".into(),
            "/jquery/3.7.1/jquery.js".into(),
            "/jquery/3.7.1/jquery.js".into(),
        ],
        cache: cache.path().join("demo"),
    };
    let fetches = run(&options).await.unwrap();
    assert_eq!(fetches.len(), 4);
    assert!(fetches.iter().all(|f| f.matches_file && f.status == 200));
    let (old, new, again) = (&fetches[1], &fetches[2], &fetches[3]);
    assert!(old.link_bytes > 50_000, "from scratch: {}", old.link_bytes);
    // The older release is the basis (by its digest alone: the
    // accelerator said it kept it), or the link would carry about gzip's.
    assert!(
        new.link_bytes + new.signature_bytes < new.gzip_bytes / 5,
        "delta {} + signature {} against gzip {}",
        new.link_bytes,
        new.signature_bytes,
        new.gzip_bytes
    );
    // Fresh by the Last-Modified heuristic (a hit), or, in a checkout just
    // made, revalidated with a 304: no body crosses the link either way.
    assert_eq!(again.link_bytes, 0, "{}", again.cache_status);
    assert!(
        again.cache_status.contains("hit") || again.cache_status.contains("fwd-status=304"),
        "{}",
        again.cache_status
    );
    let mut report = Vec::new();
    print_report(&fetches, &mut report).unwrap();
    let report = String::from_utf8(report).unwrap();
    assert!(report.contains("same bytes as the file"));
    assert!(!report.contains("DIFFERS"));
}

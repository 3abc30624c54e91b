//! Cost of the request framing guard (`rproxy::http::head_guard::Framing`), which
//! every byte of every HTTP/1.1 request passes before hyper.
//!
//! Cases: `wrk_get` (the 1 KiB cache hit of `scripts/bench-proxy.sh`, a
//! 60-byte head), `browser_get` (a 700-byte head of a browser's
//! absolute-form request to the client proxy), `post_chunked_64k` (a head
//! and a 64 KiB chunked body in 8 KiB chunks, read in 16 KiB pieces), and
//! `pipelined_16` (16 browser heads in one read). Each case checks its
//! bytes on a fresh `Framing`, as a connection's first read would.
//! Throughput is per input byte.
//!
//! The response guard (`ResponseFraming`, on every byte of every upstream
//! HTTP/1.1 response): `response_cl_1g` (a 1 GiB Content-Length body read
//! in 64 KiB pieces, as hyper reads a big body: counted, not scanned) and
//! `response_chunked_1m` (1 MiB in 16 KiB chunks, read in 64 KiB pieces:
//! only chunk lines are parsed).

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rproxy::http::head_guard::{Framing, ResponseFraming};

const BROWSER: &str = "GET http://static.example.com/assets/js/jquery-3.7.1.min.js?v=20240101 HTTP/1.1\r\n\
Host: static.example.com\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n\
Accept: */*\r\n\
Accept-Language: en-GB,en;q=0.7,fr;q=0.3\r\n\
Accept-Encoding: gzip, deflate, br, zstd\r\n\
Referer: http://static.example.com/index.html\r\n\
Proxy-Connection: keep-alive\r\n\
Cookie: session=0123456789abcdef0123456789abcdef; theme=dark; consent=1; ab=variant-b\r\n\
If-Modified-Since: Tue, 14 May 2024 09:12:44 GMT\r\n\
If-None-Match: \"6642b37c-15d9d\"\r\n\
Sec-Fetch-Dest: script\r\n\
Sec-Fetch-Mode: no-cors\r\n\
Sec-Fetch-Site: same-origin\r\n\
Priority: u=2\r\n\
Cache-Control: max-age=0\r\n\r\n";

fn check_all(reads: &[&[u8]]) -> usize {
    let mut framing = Framing::new();
    let mut safe = 0;
    for read in reads {
        let checked = framing.check(read);
        assert!(checked.violation.is_none());
        safe += checked.safe;
    }
    safe
}

fn bench(c: &mut Criterion) {
    let wrk = b"GET /1k.bin HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n".to_vec();
    let mut post =
        b"POST /upload HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..8 {
        post.extend(b"2000\r\n");
        post.extend(std::iter::repeat_n(b'x', 8192));
        post.extend(b"\r\n");
    }
    post.extend(b"0\r\n\r\n");
    let pipelined = BROWSER.repeat(16).into_bytes();
    let cases: [(&str, Vec<&[u8]>); 4] = [
        ("wrk_get", vec![&wrk]),
        ("browser_get", vec![BROWSER.as_bytes()]),
        ("post_chunked_64k", post.chunks(16 << 10).collect()),
        ("pipelined_16", vec![&pipelined]),
    ];
    let mut group = c.benchmark_group("head_guard");
    for (name, reads) in &cases {
        let len: usize = reads.iter().map(|r| r.len()).sum();
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(*name, |b| b.iter(|| check_all(black_box(reads))));
    }
    group.finish();
}

/// Checks `reads` as the responses to one GET on a fresh connection.
fn check_response(reads: &[&[u8]]) -> usize {
    let mut framing = ResponseFraming::new();
    framing.sent(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n");
    for read in reads {
        assert!(framing.received(read).violation.is_none());
    }
    reads.len()
}

fn bench_responses(c: &mut Criterion) {
    const GIB: usize = 1 << 30;
    const READ: usize = 64 << 10;
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {GIB}\r\n\r\n"
    );
    // One 64 KiB buffer stands for every read of the body: the guard only
    // looks at its length.
    let piece = vec![b'x'; READ];
    let mut cl: Vec<&[u8]> = vec![head.as_bytes()];
    cl.extend(std::iter::repeat_n(&piece[..], GIB / READ));
    let mut chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..64 {
        chunked.extend(b"4000\r\n");
        chunked.extend(std::iter::repeat_n(b'x', 16 << 10));
        chunked.extend(b"\r\n");
    }
    chunked.extend(b"0\r\n\r\n");
    let cases: [(&str, Vec<&[u8]>); 2] = [
        ("response_cl_1g", cl),
        ("response_chunked_1m", chunked.chunks(READ).collect()),
    ];
    let mut group = c.benchmark_group("response_guard");
    for (name, reads) in &cases {
        let len: usize = reads.iter().map(|r| r.len()).sum();
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(*name, |b| b.iter(|| check_response(black_box(reads))));
    }
    group.finish();
}

criterion_group!(benches, bench, bench_responses);
criterion_main!(benches);

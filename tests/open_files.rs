//! L-6: running out of file descriptors. The real binary, started with
//! a small open-file limit, is given more connections than it has
//! descriptors for: its accept loop must back off rather than spin, say
//! so without a line per retry, and serve again as soon as descriptors are
//! free. (The other half of L-6, the connection cap, is in
//! `tests/limits.rs`: past `--max-connections` new connections wait in
//! the backlog, as GUIDE.md says.)

mod support;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::process::{Running, exchange};

/// Descriptors the accelerator may open: a few dozen go to the runtime,
/// the logs and the listener, the rest to connections.
const OPEN_FILES: u64 = 64;

#[test]
fn l_6_out_of_descriptors_the_accept_loop_backs_off_and_recovers_at_once() {
    // An origin that refuses connections: every request gets a 502, which
    // is all this test needs of an answer.
    let mut accelerator = Running::start_with_open_files(
        &[
            "accelerator",
            "--listen",
            "127.0.0.1:0",
            "--origin",
            "http://127.0.0.1:9",
        ],
        OPEN_FILES,
    );
    let address = accelerator.address;
    let (status, _) = exchange(address, "GET / HTTP/1.1\r\nHost: site.test");
    assert_eq!(status, 502);

    // More idle connections than it has descriptors: the kernel completes
    // every handshake (the backlog), the accelerator accepts until it
    // runs out.
    let held: Vec<TcpStream> = (0..2 * OPEN_FILES)
        .map(|_| TcpStream::connect(address).unwrap())
        .collect();
    accelerator.wait_for_line("accept failed");

    // While it lasts: little CPU (the target is 10 %), and few lines.
    let cpu_before = accelerator.cpu_time();
    let measured = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let cpu = accelerator.cpu_time() - cpu_before;
    let share = cpu.as_secs_f64() / measured.elapsed().as_secs_f64();
    assert!(share <= 0.10, "{cpu:?} of CPU in 2 s out of descriptors");
    assert_eq!(
        accelerator.count_lines("accept failed"),
        0,
        "one line when it started, none per retry"
    );

    // Descriptors free again: served within a second.
    drop(held);
    let freed = Instant::now();
    let (status, _) = exchange(address, "GET / HTTP/1.1\r\nHost: site.test");
    assert_eq!(status, 502);
    assert!(
        freed.elapsed() < Duration::from_secs(1),
        "answered {:?} after the descriptors were freed",
        freed.elapsed()
    );
    accelerator.wait_for_line("accept works again");
}

//! The `rproxy` binary: parse the command line, set up logging, run.
//! Exit codes: 0 success, 64 bad usage, 1 runtime failure.

use std::process::ExitCode;

use rproxy::cli::{run, try_parse};

/// How often freed heap memory is handed back to the system.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// glibc's malloc keeps what its per-thread arenas freed: after a burst of
/// large transfers a gigabyte and more stayed resident with nothing in use
/// (L-14). `malloc_trim(0)` gives the free pages of every arena back; a
/// thread of its own calls it every few seconds (milliseconds each when
/// there is little to give). Here rather than in the library, which
/// forbids `unsafe`. (mimalloc as the allocator kept more, not less, in
/// `scripts/soak.sh`.)
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    let _ = std::thread::Builder::new()
        .name("rproxy-trim".into())
        .spawn(|| {
            loop {
                std::thread::sleep(TRIM_EVERY);
                // SAFETY: malloc_trim only walks and releases the
                // allocator's own free lists; it has no preconditions.
                unsafe { libc::malloc_trim(0) };
            }
        });
}

/// glibc gives each thread that contends for the heap an arena of its
/// own, up to eight per core, and every arena keeps its own free pages and
/// fragments: with the runtime's workers and the blocking pool touching
/// the heap, 300 concurrent 2 MB fetches through the pair peaked the
/// accelerator at 476-584 MiB (L-14, target 512). One arena per core (as
/// `MALLOC_ARENA_MAX` would set it) gave 444 and 456 MiB. An operator's
/// own `MALLOC_ARENA_MAX` is left as it is.
fn one_arena_per_core() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let arenas = libc::c_int::try_from(cores.max(2)).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only sets a tunable of the allocator; called
        // before any other thread exists.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) };
    }
}

/// glibc serves a request above `M_MMAP_THRESHOLD` (128 KiB at start) with
/// a mapping of its own, unmapped on free; but the first such free raises
/// the threshold to that chunk's size (up to 32 MiB), so from then on the
/// accelerator's kept bodies (50-500 KB in L-11's mix, churned as its
/// basis store evicts) went to the arenas' heaps, and its RSS crept past
/// its full store: minute 10 -> 60 of `scripts/soak-mixed.sh` 284.7 ->
/// 307.2 MiB (+7.9 %, target 5 %). Setting the threshold keeps it at
/// 128 KiB (and stops the raising): 276.7 -> 284.8 MiB (+2.9 %), and
/// L-14's burst peaked lower (374 against 444 MiB). 64 KiB did no better.
/// An operator's own `MALLOC_MMAP_THRESHOLD_` or
/// `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=…` is left as it is.
fn large_chunks_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none()
        && !std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("malloc.mmap_threshold"))
    {
        // SAFETY: mallopt only sets a tunable of the allocator; called
        // before any other thread exists.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
    }
}

/// The size from which glibc maps a chunk of its own (bytes).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Socket activation (a systemd `.socket` unit with `Accept=no`): the
/// listening socket systemd passed as descriptor 3 is handed to the
/// library, which serves it instead of binding `listen`. A connected
/// socket (`Accept=yes`, for `--inetd`) is left alone.
fn take_activated_listener() {
    use std::os::fd::{FromRawFd, OwnedFd};
    // Checks LISTEN_PID is ours, so a descriptor meant for another
    // process is never taken.
    let Ok(mut passed) = sd_notify::listen_fds() else {
        return;
    };
    if passed.len() != 1 {
        return;
    }
    let fd = passed.next().expect("one descriptor");
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `listening`, an
    // int that lives across the call; a descriptor that is not a socket
    // only makes it fail.
    let asked = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&raw mut listening).cast(),
            &raw mut len,
        )
    };
    if asked != 0 || listening == 0 {
        return;
    }
    // SAFETY: systemd passed this descriptor to this process (LISTEN_PID)
    // for it to own, and nothing else here has taken it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    rproxy::cli::systemd::hand_over_listener(std::net::TcpListener::from(owned));
}

fn main() -> ExitCode {
    one_arena_per_core();
    large_chunks_mapped();
    let cli = match try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let usage_error = error.use_stderr();
            // --help and --version print to stdout and succeed.
            let _ = error.print();
            return if usage_error {
                ExitCode::from(64)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    give_back_freed_memory();
    take_activated_listener();
    // Under inetd, stderr may be the connection itself: nothing is written
    // there then (logs go to a journald or file stderr, as systemd or a
    // wrapper sets up).
    let quiet = rproxy::http::inetd::stderr_is_the_connection();
    rproxy::logging::init(quiet);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            if !quiet {
                eprintln!("rproxy: {error:#}");
            }
            if error.downcast_ref::<rproxy::cli::UsageError>().is_some() {
                ExitCode::from(64)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

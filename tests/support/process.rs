//! The real `rproxy` binary as a child process: started, its log lines
//! collected, signalled, killed when dropped; and raw HTTP/1.1 exchanges
//! with it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running `rproxy` and the lines it has logged so far.
pub struct Running {
    /// The process.
    pub child: Child,
    /// The address its ready line named.
    pub address: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    /// Its `TMPDIR`: what it makes in the temp directory by default (an
    /// accelerator's spool and basis store) goes here, and with it.
    _tmp: tempfile::TempDir,
}

impl Running {
    /// Starts `rproxy ARGS`, waiting for the line that names its address.
    /// Its admin listener is off, so that tests running at once do not
    /// contend for the default port.
    pub fn start(args: &[&str]) -> Running {
        Running::start_with(args, |_| {})
    }

    /// [`Running::start`] with at most `open_files` file descriptors (the
    /// soft and hard limits: the binary cannot raise them).
    pub fn start_with_open_files(args: &[&str], open_files: u64) -> Running {
        use std::os::unix::process::CommandExt;
        Running::start_with(args, |command| {
            // SAFETY: between fork and exec the closure only makes one
            // system call (setrlimit), which allocates nothing.
            unsafe {
                command.pre_exec(move || {
                    rlimit::setrlimit(rlimit::Resource::NOFILE, open_files, open_files)
                });
            }
        })
    }

    /// [`Running::start`], with `configure` applied to the command first.
    fn start_with(args: &[&str], configure: impl FnOnce(&mut Command)) -> Running {
        let tmp = tempfile::tempdir().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_rproxy"));
        command
            .args(args)
            .args(["--admin-listen", "off"])
            .env("TMPDIR", tmp.path())
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped());
        configure(&mut command);
        let mut child = command.spawn().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        let mut running = Running {
            child,
            address: "0.0.0.0:0".parse().unwrap(),
            log,
            _tmp: tmp,
        };
        let ready = running.wait_for_line("ready");
        let at = ready
            .find("listen=")
            .expect("the ready line names the address")
            + 7;
        let rest = &ready[at..];
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        running.address = rest[..end].parse().unwrap();
        running
    }

    /// The first line logged containing `text` (after the ones already
    /// taken by an earlier wait), within 10 s.
    pub fn wait_for_line(&mut self, text: &str) -> String {
        let started = Instant::now();
        loop {
            {
                let mut log = self.log.lock().unwrap();
                if let Some(at) = log.iter().position(|line| line.contains(text)) {
                    let line = log[at].clone();
                    log.drain(..=at);
                    return line;
                }
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("rproxy ended ({status}) before logging {text:?}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no line with {text:?} in 10 s: {:?}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How many lines logged so far (and not taken by a wait) contain
    /// `text`.
    pub fn count_lines(&self, text: &str) -> usize {
        let log = self.log.lock().unwrap();
        log.iter().filter(|line| line.contains(text)).count()
    }

    /// The CPU time (user and system) the process has used so far.
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // The fields after the command name, which is in parentheses.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
            .split_whitespace()
            .collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        Duration::from_millis(ticks * 1000 / per_second)
    }

    /// Sends SIGHUP.
    pub fn hangup(&self) {
        self.signal(libc::SIGHUP);
    }

    /// Sends `signal`.
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `head` (request line and headers, without the blank line that
/// ends them) and `Connection: close` to `address` on a connection of its
/// own, with no body: the answer's status code and body.
pub fn exchange(address: SocketAddr, head: &str) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "{head}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    split_answer(&answer)
}

/// A whole HTTP/1.1 answer's status code and body.
pub fn split_answer(answer: &[u8]) -> (u16, Vec<u8>) {
    let head_end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a whole head")
        + 4;
    let status = String::from_utf8_lossy(&answer[..head_end])
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status code");
    (status, answer[head_end..].to_vec())
}

//! The systemd units in `scripts/systemd/` (issue 19): each one's
//! `ExecStart` runs flags `rproxy check` accepts on top of the example
//! config, and `systemd-analyze verify` finds nothing wrong in them where
//! it is installed (Debian has it; a machine without systemd skips that
//! half, saying so). The binary speaks the sd_notify protocol and serves a
//! socket systemd passes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn units() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/systemd");
    let mut units: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .is_some_and(|e| e == "service" || e == "socket")
        })
        .collect();
    units.sort();
    assert!(units.len() >= 4, "units in {}", dir.display());
    units
}

/// The words after `ExecStart=/usr/local/bin/rproxy`.
fn exec_start(unit: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(unit).unwrap();
    let line = text.lines().find(|l| l.starts_with("ExecStart="))?;
    let words: Vec<String> = line["ExecStart=".len()..]
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(words[0], "/usr/local/bin/rproxy", "{}", unit.display());
    Some(words[1..].to_vec())
}

#[test]
fn each_units_command_line_checks_against_the_example_config() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut checked = 0;
    for unit in units() {
        let Some(words) = exec_start(&unit) else {
            continue;
        };
        let role = words[0].clone();
        // `rproxy check --role R --config FILE FLAGS...`: the file first.
        let mut args = vec!["check".to_owned(), "--role".to_owned(), role.clone()];
        let mut flags = Vec::new();
        let mut rest = words[1..].iter();
        while let Some(word) = rest.next() {
            if word == "--config" {
                let file = rest.next().unwrap();
                assert_eq!(
                    file,
                    &format!("/etc/rproxy/{role}.toml"),
                    "{}",
                    unit.display()
                );
                args.push("--config".into());
                args.push(examples.join(format!("{role}.toml")).display().to_string());
            } else {
                flags.push(word.clone());
            }
        }
        args.extend(flags);
        let output = Command::new(env!("CARGO_BIN_EXE_rproxy"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}: rproxy {args:?}: {}",
            unit.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 3);
}

#[test]
fn systemd_analyze_verifies_the_units() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze is not installed: the units were not verified");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_rproxy");
    let mut copies = Vec::new();
    for unit in units() {
        // Verified against the binary just built: verify wants the
        // command to exist.
        let text = std::fs::read_to_string(&unit)
            .unwrap()
            .replace("/usr/local/bin/rproxy", binary);
        let copy = dir.path().join(unit.file_name().unwrap());
        std::fs::write(&copy, text).unwrap();
        copies.push(copy);
    }
    let output = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&copies)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    // What it says about a unit names the unit's file; unknown keys are
    // only warnings to systemd, so none of those either.
    let about_ours: Vec<&str> = said
        .lines()
        .filter(|line| line.contains("rproxy-"))
        .collect();
    assert!(about_ours.is_empty(), "{said}");
    if !output.status.success() {
        // Nothing about our units: the machine cannot run the verifier
        // (no systemd manager in a container, say).
        eprintln!("systemd-analyze could not verify here: {said}");
    }
}

/// Under `Type=notify`, the service manager hears READY=1 once the role
/// serves, RELOADING=1 then READY=1 around a reload, and STOPPING=1 on
/// SIGTERM: a datagram socket stands in for systemd's.
#[test]
fn readiness_reloads_and_stopping_are_told_to_the_service_manager() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify");
    let manager = UnixDatagram::bind(&notify_path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut child = Killed(
        Command::new(env!("CARGO_BIN_EXE_rproxy"))
            .args([
                "accelerator",
                "--listen",
                "127.0.0.1:0",
                "--access-log",
                "off",
                // Not the shared temp directory's basis store.
                "--basis-dir",
                "off",
            ])
            .env("NOTIFY_SOCKET", &notify_path)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let next = || {
        let mut buffer = [0; 4096];
        let n = manager.recv(&mut buffer).expect("a notification");
        String::from_utf8_lossy(&buffer[..n]).into_owned()
    };
    let ready = next();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready}");
    assert!(ready.contains("STATUS=serving on 127.0.0.1:"), "{ready}");
    signal(&child.0, libc::SIGHUP);
    let reloading = next();
    assert!(reloading.lines().any(|l| l == "RELOADING=1"), "{reloading}");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    assert!(next().lines().any(|l| l == "READY=1"), "ready again");
    signal(&child.0, libc::SIGTERM);
    assert!(next().lines().any(|l| l == "STOPPING=1"));
    assert!(child.0.wait().unwrap().success());
}

/// Socket activation (`Accept=no`): the listening socket systemd passes as
/// descriptor 3, with LISTEN_FDS and LISTEN_PID, is the one served. The
/// test holds the address itself, so binding `--listen` instead would
/// fail.
#[test]
fn a_listening_socket_passed_by_systemd_is_served() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let passed = listener.as_raw_fd();
    let mut command = Command::new("sh");
    command
        .args([
            "-c",
            r#"export LISTEN_PID=$$ LISTEN_FDS=1; exec "$0" "$@""#,
            env!("CARGO_BIN_EXE_rproxy"),
            "accelerator",
            "--listen",
            &address.to_string(),
            "--access-log",
            "off",
            "--admin-listen",
            "off",
            // Not the shared temp directory's basis store.
            "--basis-dir",
            "off",
        ])
        .stderr(Stdio::piped());
    // SAFETY: between fork and exec only dup2, which is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(passed, 3) == 3 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let mut child = Killed(command.spawn().unwrap());
    drop(listener);
    let mut log = BufReader::new(child.0.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("accelerator ready") {
        line.clear();
        assert!(
            log.read_line(&mut line).unwrap() > 0,
            "it ended before it was ready"
        );
    }
    assert!(line.contains(&format!("listen={address}")), "{line}");
    std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .write_all(b"GET /.rproxy/stats HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    signal(&child.0, libc::SIGTERM);
    assert!(child.0.wait().unwrap().success());
}

fn signal(child: &std::process::Child, signal: i32) {
    let pid = i32::try_from(child.id()).unwrap();
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
}

/// A child killed if the test ends early, so that it never outlives it.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

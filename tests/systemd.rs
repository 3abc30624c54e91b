//! The systemd units in `scripts/systemd/` (issue 19): each one's
//! `ExecStart` runs flags `rproxy check` accepts on top of the example
//! config, and `systemd-analyze verify` finds nothing wrong in them where
//! it is installed (Debian has it; a machine without systemd skips that
//! half, saying so).

use std::path::{Path, PathBuf};
use std::process::Command;

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

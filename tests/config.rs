//! `rproxy check` as an operator runs it: the example files pass and print
//! themselves back, a bad file exits with 64 and names its line.

use std::process::{Command, Output};

fn check(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .arg("check")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn each_example_file_checks_and_prints_its_settings() {
    for (role, file, admin) in [
        ("accelerator", "examples/accelerator.toml", "127.0.0.1:9081"),
        ("client", "examples/client.toml", "127.0.0.1:9082"),
    ] {
        let output = check(&["--config", file]);
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(
            output.status.success(),
            "{file}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            stdout.starts_with(&format!("role = \"{role}\"\n")),
            "{stdout}"
        );
        assert!(stdout.contains("max-signature = \"24K\"\n"), "{stdout}");
        assert!(stdout.contains("idle-timeout = \"1m\"\n"), "{stdout}");
        let admin = format!("admin-listen = \"{admin}\"\n");
        assert!(stdout.contains(&admin), "{stdout}");
    }
}

#[test]
fn a_flag_given_after_the_file_overrides_it() {
    let output = check(&[
        "--config",
        "examples/accelerator.toml",
        "--basis-store",
        "64M",
        "--idle-timeout",
        "2m",
    ]);
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("basis-store = \"64M\"\n"), "{stdout}");
    assert!(stdout.contains("idle-timeout = \"2m\"\n"), "{stdout}");
    assert!(stdout.contains("max-spool = \"1G\"\n"), "{stdout}");
}

#[test]
fn a_bad_file_exits_with_64_and_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("client.toml");
    std::fs::write(
        &file,
        "role = \"client\"\n\n[limits]\nidle-timeout = \"soon\"\n",
    )
    .unwrap();
    let output = check(&["--config", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("client.toml:4: "), "{stderr}");
    assert!(stderr.contains("not a duration"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn version_names_the_release_and_the_commit_when_built_from_git() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_rproxy"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    let expected = format!("rproxy {}", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&expected), "{text}");
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    if let Ok(commit) = commit
        && commit.status.success()
    {
        let commit = String::from_utf8(commit.stdout).unwrap();
        assert!(text.contains(commit.trim()), "{text} lacks {commit}");
    }
}

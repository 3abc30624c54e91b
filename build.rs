//! Records the git commit the binary is built from, for `rproxy --version`
//! (`0.1.0 (abc1234)`; without git, or outside a checkout, the version
//! alone).

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map(|commit| commit.trim().to_owned())
        .filter(|commit| !commit.is_empty());
    let version = match commit {
        Some(commit) => format!("{} ({commit})", env!("CARGO_PKG_VERSION")),
        None => env!("CARGO_PKG_VERSION").to_owned(),
    };
    println!("cargo:rustc-env=RPROXY_VERSION={version}");
    // A new commit changes the version: look again when HEAD moves. In a
    // worktree `.git` is a file naming the real directory (a path that is
    // missing would make cargo run this on every build).
    let git_dir = git_path("--git-dir").unwrap_or_else(|| ".git".into());
    let common_dir = git_path("--git-common-dir").unwrap_or_else(|| git_dir.clone());
    println!("cargo:rerun-if-changed={git_dir}/HEAD");
    println!("cargo:rerun-if-changed={common_dir}/refs/heads");
}

/// What `git rev-parse FLAG` prints (a directory), if git answers.
fn git_path(flag: &str) -> Option<String> {
    Command::new("git")
        .args(["rev-parse", flag])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map(|path| path.trim().to_owned())
        .filter(|path| !path.is_empty())
}

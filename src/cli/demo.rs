//! `rproxy demo`: the whole pipeline on loopback ports, with a report.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::demo::{DemoOptions, print_report, run as run_demo};

/// Flags of `rproxy demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Folder the demo's origin serves (the bundled sample: a page and two
    /// jQuery releases).
    #[arg(long, default_value = "tests/data")]
    pub root: PathBuf,
    /// Paths fetched through the proxies, in order (repeat the flag): by
    /// default the page, the older release, then the newer one, which
    /// comes as a delta against the older.
    #[arg(long = "fetch", default_values_t = [
        "/index.html".to_string(),
        "/jquery/3.7.0/jquery.js".to_string(),
        "/jquery/3.7.1/jquery.js".to_string(),
    ])]
    pub paths: Vec<String>,
    /// The client proxy's cache directory; emptied at start so every run
    /// shows the same exchange.
    #[arg(long, default_value = "cache/demo")]
    pub cache: PathBuf,
}

/// Runs the demo and prints its report.
///
/// # Errors
/// Whatever stopped the demo, or a body that came back wrong.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let options = DemoOptions {
        root: args.root,
        paths: args.paths,
        cache: args.cache,
    };
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let fetches = runtime.block_on(run_demo(&options))?;
    print_report(&fetches, &mut std::io::stdout().lock())
}

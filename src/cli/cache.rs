//! `rproxy cache`: looks into a client proxy's cache directory and purges
//! entries by URL prefix.
//!
//! `ls` and `show` read the entries' metadata files ([`Listing`]): they
//! take no lock and change nothing, so they are safe while the proxy
//! runs. `purge` opens the store, which locks the directory and cleans it
//! up as a proxy's start would, then removes the entries through the
//! store's own path ([`CacheStore::purge_prefix`]). When a proxy holds the
//! directory it touches nothing and says to purge through that proxy's
//! admin listener, which shares the index the files belong to.
//!
//! Left out: the admin listener itself, and the accelerator's basis store
//! (memory, or files of its own).
//!
//! Main type: [`CacheCommand`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use clap::{Args, Subcommand};

use super::UsageError;
use crate::cache::freshness::http_date;
use crate::cache::store::{ListedEntry, Listing};
use crate::cache::{CacheError, CacheKey, CacheStore, Completeness};
use crate::config::{self, ClientSettings};

/// `rproxy cache`: look into and purge a client proxy's cache.
#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Lists the entries (safe while the proxy runs).
    ///
    /// One line each, sorted by URL: status, body bytes, age, complete or
    /// partial, URL and Vary'd values; then a total. Reads the files
    /// only.
    Ls(LsArgs),
    /// Prints all the metadata says about URL (safe while the proxy runs).
    ///
    /// Each Vary'd variant: status, when stored, body size and blake3,
    /// validators, freshness, headers. Exit 1 when there is none.
    Show(ShowArgs),
    /// Removes the entries under a URL prefix (not while a proxy runs).
    ///
    /// Every entry whose URL starts with URL-PREFIX, or all of them with
    /// --all; prints what it removed. While a proxy has the cache open it
    /// touches nothing: purge through that proxy's admin listener then.
    Purge(PurgeArgs),
}

/// Which cache directory: `--cache`, else the `--config` file's `cache`,
/// else the client proxy's default.
#[derive(Debug, Args)]
pub struct CacheDirArgs {
    /// The client proxy's cache directory [default: the --config file's
    /// `cache`, else cache/client]
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// A client proxy's configuration file, for its `cache` and `private`
    /// (a private cache counts freshness without s-maxage).
    #[arg(long = "config", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
}

/// Flags of `rproxy cache ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub dir: CacheDirArgs,
    /// Only entries whose URL starts with this, as stored: lower-case
    /// scheme and host, no default port (`http://example.com/img/`).
    #[arg(value_name = "URL-PREFIX")]
    pub url_prefix: Option<String>,
    /// One JSON object per line and entry, with every field `show` prints
    /// but the headers; no total.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `rproxy cache show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub dir: CacheDirArgs,
    /// The URL, as a user agent asked for it (it is normalised as the
    /// proxy normalises keys).
    #[arg(value_name = "URL")]
    pub url: String,
}

/// Flags of `rproxy cache purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub dir: CacheDirArgs,
    /// Remove the entries whose URL starts with this, as stored: lower-case
    /// scheme and host, no default port (`http://example.com/img/`).
    #[arg(value_name = "URL-PREFIX")]
    pub url_prefix: Option<String>,
    /// Remove every entry (an empty prefix alone is refused, so that a
    /// mistyped one cannot empty the cache).
    #[arg(long, conflicts_with = "url_prefix")]
    pub all: bool,
}

/// Runs `rproxy cache …`.
///
/// # Errors
/// A [`UsageError`] for a bad URL, config file or an empty prefix without
/// `--all`; otherwise (exit 1) a missing cache directory, no entry for
/// `show`'s URL, or a running proxy holding the cache for `purge`.
pub fn run(command: CacheCommand) -> anyhow::Result<()> {
    match command {
        CacheCommand::Ls(args) => ls(&args),
        CacheCommand::Show(args) => show(&args),
        CacheCommand::Purge(args) => purge(&args),
    }
}

impl CacheDirArgs {
    /// The cache directory, and whether its proxy is a shared cache.
    fn resolve(&self) -> Result<(PathBuf, bool), UsageError> {
        let settings = match &self.config_file {
            Some(file) => config::load::<ClientSettings>(file)?,
            None => ClientSettings::default(),
        };
        let dir = self.cache.clone().unwrap_or(settings.cache);
        Ok((dir, !settings.private))
    }

    /// The directory's entries, read without locking or changing it.
    fn read(&self) -> anyhow::Result<(PathBuf, bool, Listing)> {
        let (dir, shared) = self.resolve()?;
        let listing = Listing::read(&dir).map_err(|e| no_cache_at(&dir, &e.to_string()))?;
        for invalid in &listing.invalid {
            eprintln!(
                "rproxy: {}: invalid entry, {} (the proxy quarantines it when it next opens the cache)",
                invalid.path.display(),
                invalid.reason
            );
        }
        Ok((dir, shared, listing))
    }
}

fn ls(args: &LsArgs) -> anyhow::Result<()> {
    let (_, shared, listing) = args.dir.read()?;
    let prefix = args.url_prefix.as_deref().unwrap_or("");
    let now = unix_now();
    let mut out = std::io::stdout().lock();
    let (mut entries, mut partial, mut bytes) = (0u64, 0u64, 0u64);
    for entry in listing
        .entries
        .iter()
        .filter(|e| e.url().starts_with(prefix))
    {
        entries += 1;
        partial += u64::from(entry.meta.completeness == Completeness::Partial);
        bytes += entry.meta.body_len;
        if args.json {
            writeln!(out, "{}", to_json(entry, now, shared))?;
        } else {
            writeln!(
                out,
                "{:>3} {:>12} {:>7} {:<8} {}{}",
                entry.meta.status,
                entry.meta.body_len,
                span(now.saturating_sub(entry.meta.stored_at)),
                completeness(entry.meta.completeness),
                entry.url(),
                vary_suffix(entry)
            )?;
        }
    }
    if !args.json {
        writeln!(
            out,
            "{} ({partial} partial), {bytes} body bytes",
            count(entries, "entry", "entries")
        )?;
    }
    out.flush()?;
    Ok(())
}

fn show(args: &ShowArgs) -> anyhow::Result<()> {
    let key = CacheKey::parse(&args.url).map_err(|e| UsageError(format!("{}: {e}", args.url)))?;
    let (dir, shared, listing) = args.dir.read()?;
    let variants: Vec<&ListedEntry> = listing
        .entries
        .iter()
        .filter(|e| e.url() == key.url())
        .collect();
    if variants.is_empty() {
        return Err(anyhow!(
            "no entry for {} in {} (`rproxy cache ls --cache {} PREFIX` lists what is there)",
            key.url(),
            dir.display(),
            dir.display()
        ));
    }
    let now = unix_now();
    let mut out = std::io::stdout().lock();
    for (n, entry) in variants.into_iter().enumerate() {
        if n > 0 {
            writeln!(out)?;
        }
        out.write_all(describe(entry, now, shared).as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

fn purge(args: &PurgeArgs) -> anyhow::Result<()> {
    let prefix = match (args.all, args.url_prefix.as_deref()) {
        (true, _) => "",
        (false, Some(prefix)) if !prefix.is_empty() => prefix,
        _ => {
            return Err(UsageError(
                "give the URL prefix to purge (http://example.com/img/), or --all to purge \
                 every entry"
                    .into(),
            )
            .into());
        }
    };
    let (dir, _) = args.dir.resolve()?;
    // Opening creates a missing directory; a mistyped one is an error.
    if !dir.is_dir() {
        return Err(no_cache_at(&dir, "not a directory"));
    }
    // No budget: opening must evict nothing; the proxy applies its own
    // when it next starts.
    let store = match CacheStore::open(&dir, u64::MAX) {
        Ok(store) => store,
        Err(CacheError::Locked { path }) => {
            return Err(anyhow!(
                "a running rproxy uses {} ({} is locked); nothing was purged. Purge through \
                 that proxy's admin listener (admin-listen): curl -X PURGE 'http://ADMIN-ADDRESS/{}'",
                dir.display(),
                path.display(),
                if args.all { "<url-prefix>" } else { prefix }
            ));
        }
        Err(e) => return Err(e).context(format!("cannot open the cache in {}", dir.display())),
    };
    let report = store.purge_prefix(prefix);
    if report.entries == 0 && !args.all {
        eprintln!(
            "rproxy: no entry's URL starts with {prefix}; URLs are stored with a lower-case \
             scheme and host and no default port (rproxy cache ls lists them)"
        );
    }
    println!(
        "purged {}, {} bytes",
        count(report.entries, "entry", "entries"),
        report.bytes
    );
    Ok(())
}

/// Everything the metadata says about one entry, a `name  value` line each.
fn describe(entry: &ListedEntry, now: u64, shared: bool) -> String {
    let meta = &entry.meta;
    let mut lines: Vec<(&str, String)> = vec![("url", meta.url.clone())];
    if !meta.vary.is_empty() {
        let vary: Vec<String> = meta.vary.iter().map(|(n, v)| format!("{n}: {v}")).collect();
        lines.push(("vary", vary.join(", ")));
    }
    lines.push(("status", meta.status.to_string()));
    lines.push((
        "stored",
        format!(
            "{} ({} ago)",
            date(meta.stored_at),
            span(now.saturating_sub(meta.stored_at))
        ),
    ));
    lines.push((
        "body",
        format!(
            "{} bytes, {}, blake3 {}",
            meta.body_len,
            completeness(meta.completeness),
            meta.body_blake3
        ),
    ));
    for name in ["content-type", "etag", "last-modified"] {
        lines.push((name, entry.header(name).unwrap_or("-").to_owned()));
    }
    lines.push(("freshness", freshness(entry, now, shared)));
    lines.push((
        "signature",
        format!("{} bytes, blake3 {}", meta.sig_len, meta.sig_blake3),
    ));
    lines.push((
        "basis",
        if meta.shareable_as_basis {
            "for any user".into()
        } else {
            "only in a private cache (credentials, private or Set-Cookie)".into()
        },
    ));
    lines.push(("metadata", entry.meta_path.display().to_string()));
    let mut text = String::new();
    for (name, value) in lines {
        text.push_str(&format!("{name:<13} {value}\n"));
    }
    text.push_str("headers\n");
    for (name, value) in &meta.headers {
        text.push_str(&format!("  {name}: {value}\n"));
    }
    text
}

/// How long the entry stays fresh, or how long it has been stale.
fn freshness(entry: &ListedEntry, now: u64, shared: bool) -> String {
    let age = entry.age(now, shared);
    if age.lifetime == 0 {
        return "no freshness lifetime: revalidated before each use".into();
    }
    let ttl = age.ttl();
    let until = date(now.saturating_add_signed(ttl));
    if ttl > 0 {
        format!(
            "fresh for {} more, until {until} (lifetime {})",
            span(ttl.unsigned_abs()),
            span(age.lifetime)
        )
    } else {
        format!(
            "stale for {}, since {until} (lifetime {})",
            span(ttl.unsigned_abs()),
            span(age.lifetime)
        )
    }
}

/// One entry as a line of JSON.
fn to_json(entry: &ListedEntry, now: u64, shared: bool) -> serde_json::Value {
    let meta = &entry.meta;
    let age = entry.age(now, shared);
    let vary: serde_json::Map<String, serde_json::Value> = meta
        .vary
        .iter()
        .map(|(n, v)| (n.clone(), v.clone().into()))
        .collect();
    serde_json::json!({
        "url": meta.url,
        "vary": vary,
        "status": meta.status,
        "stored_at": meta.stored_at,
        "age": age.current,
        "body_len": meta.body_len,
        "completeness": completeness(meta.completeness),
        "content_type": entry.header("content-type"),
        "etag": entry.header("etag"),
        "last_modified": entry.header("last-modified"),
        "body_blake3": meta.body_blake3,
        "lifetime": age.lifetime,
        "expires_at": now.saturating_add_signed(age.ttl()),
        "shareable_as_basis": meta.shareable_as_basis,
        "metadata": entry.meta_path,
    })
}

fn no_cache_at(dir: &Path, why: &str) -> anyhow::Error {
    anyhow!(
        "no cache directory at {} ({why}): give the client proxy's --cache, or its --config",
        dir.display()
    )
}

fn vary_suffix(entry: &ListedEntry) -> String {
    if entry.meta.vary.is_empty() {
        return String::new();
    }
    let vary: Vec<String> = entry
        .meta
        .vary
        .iter()
        .map(|(n, v)| format!("{n}: {v}"))
        .collect();
    format!(" [{}]", vary.join(", "))
}

/// `1 entry`, `3 entries`.
fn count(n: u64, one: &str, more: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { more })
}

fn completeness(completeness: Completeness) -> &'static str {
    match completeness {
        Completeness::Complete => "complete",
        Completeness::Partial => "partial",
    }
}

fn date(unix_secs: u64) -> String {
    http_date(unix_secs)
        .to_str()
        .expect("an HTTP-date is ASCII")
        .to_owned()
}

/// Seconds as at most two units: `40s`, `5m10s`, `3h`, `2d4h`.
fn span(secs: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")];
    let Some(first) = UNITS.iter().position(|&(unit, _)| secs >= unit) else {
        return "0s".into();
    };
    let (unit, name) = UNITS[first];
    let mut text = format!("{}{name}", secs / unit);
    if let Some(&(next, next_name)) = UNITS.get(first + 1) {
        let rest = secs % unit / next;
        if rest > 0 {
            text.push_str(&format!("{rest}{next_name}"));
        }
    }
    text
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn resolves_to(args: &CacheDirArgs, dir: &Path) -> bool {
        args.resolve().is_ok_and(|(resolved, _)| resolved == dir)
    }

    fn parse(line: &[&str]) -> Result<CacheCommand, clap::Error> {
        let line = ["rproxy", "cache"].iter().chain(line);
        match Cli::try_parse_from(line)?.command {
            Command::Cache(command) => Ok(command),
            _ => unreachable!(),
        }
    }

    #[test]
    fn spans_keep_two_units() {
        for (secs, shown) in [
            (0, "0s"),
            (40, "40s"),
            (60, "1m"),
            (310, "5m10s"),
            (3_600, "1h"),
            (5_400, "1h30m"),
            (86_400 * 2 + 3_600 * 4 + 59, "2d4h"),
        ] {
            assert_eq!(span(secs), shown, "{secs}");
        }
    }

    #[test]
    fn the_directory_comes_from_the_flag_then_the_file_then_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.toml");
        std::fs::write(&file, "cache = \"/var/cache/from-file\"\nprivate = true\n").unwrap();
        let args = |cache: Option<&str>, config: bool| CacheDirArgs {
            cache: cache.map(PathBuf::from),
            config_file: config.then(|| file.clone()),
        };
        assert!(resolves_to(&args(None, false), Path::new("cache/client")));
        assert!(resolves_to(
            &args(None, true),
            Path::new("/var/cache/from-file")
        ));
        assert!(resolves_to(&args(Some("/x"), true), Path::new("/x")));
        assert!(
            !args(None, true).resolve().unwrap().1,
            "private: not shared"
        );
    }

    #[test]
    fn purge_wants_a_prefix_or_all_but_not_both() {
        assert!(parse(&["purge", "--all", "http://e.com/"]).is_err());
        assert!(parse(&["purge", "--all"]).is_ok());
        for line in [&["purge", ""][..], &["purge"]] {
            let CacheCommand::Purge(args) = parse(line).unwrap() else {
                unreachable!()
            };
            let refused = purge(&args).unwrap_err();
            assert!(refused.downcast_ref::<UsageError>().is_some(), "{refused}");
            assert!(refused.to_string().contains("--all"), "{refused}");
        }
    }
}

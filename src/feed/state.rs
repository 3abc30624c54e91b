//! Where a log is kept between runs: one JSON file per log, written whole
//! through a temp file, an fsync and a rename (then the directory's
//! fsync), so a crash leaves the old file or the new one.
//!
//! A file says whether the process that wrote it stopped cleanly. One that
//! did not may have given out CSNs it never wrote down; the primary's
//! caller then skips ahead ([`FeedLog::skip_after_crash`]). A file that
//! cannot be read is set aside (`.bad`) and the log starts over as a new
//! incarnation: its peers reset, which costs a listing, never a wrong byte.
//!
//! Main functions: [`load`], [`save`].

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::log::FeedLog;

/// What a log file holds.
#[derive(Serialize, Deserialize)]
struct File {
    /// Written on the way out: nothing after it was lost.
    clean: bool,
    log: FeedLog,
}

/// A log read back.
#[derive(Debug)]
pub struct Loaded {
    /// The log as last written.
    pub log: FeedLog,
    /// Whether its writer stopped cleanly.
    pub clean: bool,
}

/// Reads the log at `path`: `None` when there is none (or it was unreadable
/// and was set aside, logged).
pub fn load(path: &Path) -> Option<Loaded> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot read the change feed's log; it starts over");
            return None;
        }
    };
    match serde_json::from_slice::<File>(&bytes) {
        Ok(file) => Some(Loaded {
            log: file.log,
            clean: file.clean,
        }),
        Err(error) => {
            let aside = with_suffix(path, ".bad");
            tracing::warn!(
                path = %path.display(), %error, aside = %aside.display(),
                "the change feed's log is damaged; set aside, it starts over"
            );
            let _ = std::fs::rename(path, aside);
            None
        }
    }
}

/// Writes `log` to `path` crash-safely; `clean` on the way out.
///
/// # Errors
/// The file system's: the caller logs it and tries again with its next
/// write.
pub fn save(path: &Path, log: &FeedLog, clean: bool) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct FileRef<'a> {
        clean: bool,
        log: &'a FeedLog,
    }
    let bytes = serde_json::to_vec(&FileRef { clean, log }).map_err(std::io::Error::other)?;
    let tmp = with_suffix(path, ".tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_comes_back_as_written_and_says_how_it_stopped() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let path = dir.join("site.json");
        assert!(load(&path).is_none());
        let mut log = FeedLog::new("i".into());
        log.commit("/a", "d", 1, 1);
        save(&path, &log, false).unwrap();
        let loaded = load(&path).unwrap();
        assert_eq!(loaded.log, log);
        assert!(!loaded.clean);
        save(&path, &log, true).unwrap();
        assert!(load(&path).unwrap().clean);
        assert!(!dir.join("site.json.tmp").exists());
    }

    #[test]
    fn a_damaged_log_is_set_aside() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let path = dir.join("site.json");
        std::fs::write(&path, b"{\"clean\": tru").unwrap();
        assert!(load(&path).is_none());
        assert!(dir.join("site.json.bad").exists());
        assert!(!path.exists());
    }
}

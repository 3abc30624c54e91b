//! Watching a static document root (`--feed-watch DIR=URL`): every
//! interval the tree is walked, and each file whose size or modification
//! time changed since the last walk is named by its URL (`DIR/a/b.css` is
//! `URL` + `a/b.css`; an `index.html` names its directory too), for the
//! accelerator to fetch from the origin and commit if its body changed.
//!
//! The first walk only takes note: changes made while the accelerator was
//! not running are learned when their paths are served or submitted. A
//! walk looks at [`MAX_WATCHED_FILES`] files at most (the rest are not
//! watched, logged once) and never follows symbolic links.
//!
//! Main type: [`DocRoot`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use walkdir::WalkDir;

/// Files one walk looks at, at most.
pub const MAX_WATCHED_FILES: usize = 100_000;

/// A document root and what its last walk saw.
#[derive(Debug)]
pub struct DocRoot {
    dir: PathBuf,
    /// The URL the root's files are served under, ending in `/`.
    url: String,
    seen: Option<HashMap<PathBuf, (u64, Option<SystemTime>)>>,
    warned_full: bool,
}

impl DocRoot {
    /// Watches `dir`, served at `url` (`http://host/prefix/`).
    pub fn new(dir: PathBuf, url: String) -> DocRoot {
        DocRoot {
            dir,
            url,
            seen: None,
            warned_full: false,
        }
    }

    /// The directory watched.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Walks the tree: the URLs of the files that changed since the last
    /// walk (none the first time). Blocking.
    pub fn changes(&mut self) -> Vec<String> {
        let mut now = HashMap::new();
        for entry in WalkDir::new(&self.dir)
            .follow_links(false)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|entry| entry.file_type().is_file())
        {
            if now.len() >= MAX_WATCHED_FILES {
                if !self.warned_full {
                    tracing::warn!(dir = %self.dir.display(), max = MAX_WATCHED_FILES, "the change feed watches no more files in this root");
                    self.warned_full = true;
                }
                break;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let Ok(relative) = entry.path().strip_prefix(&self.dir) else {
                continue;
            };
            now.insert(relative.to_owned(), (meta.len(), meta.modified().ok()));
        }
        let changed = match &self.seen {
            None => Vec::new(),
            Some(seen) => now
                .iter()
                .filter(|(path, stamp)| seen.get(*path) != Some(*stamp))
                .flat_map(|(path, _)| self.urls_of(path))
                .collect(),
        };
        self.seen = Some(now);
        changed
    }

    /// The URLs a file is served at: its own, and its directory's for an
    /// `index.html`. None for a name that is not UTF-8.
    fn urls_of(&self, relative: &Path) -> Vec<String> {
        let Some(text) = relative.to_str() else {
            return Vec::new();
        };
        let escaped = escape_path(text);
        let mut urls = vec![format!("{}{escaped}", self.url)];
        if let Some(dir) = escaped.strip_suffix("index.html") {
            urls.push(format!("{}{dir}", self.url));
        }
        urls
    }
}

/// A relative file path as a URL path: bytes outside the unreserved set
/// and `/` are %-escaped.
fn escape_path(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_names_what_changed_since_the_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("css")).unwrap();
        std::fs::write(root.join("css/app.css"), "a").unwrap();
        std::fs::write(root.join("index.html"), "x").unwrap();
        let mut watched = DocRoot::new(root.to_owned(), "http://site/".into());
        assert!(watched.changes().is_empty(), "the first walk takes note");
        assert!(watched.changes().is_empty());
        std::fs::write(root.join("css/app.css"), "ab").unwrap();
        std::fs::write(root.join("new file.js"), "n").unwrap();
        let mut changed = watched.changes();
        changed.sort();
        assert_eq!(
            changed,
            ["http://site/css/app.css", "http://site/new%20file.js"]
        );
        std::fs::write(root.join("index.html"), "xy").unwrap();
        let mut changed = watched.changes();
        changed.sort();
        assert_eq!(changed, ["http://site/", "http://site/index.html"]);
    }
}

//! The file-system steps the store is built from: an entry's three paths,
//! fresh temp files, real (not symlinked) directories, reading a regular
//! file within a bound, renames, unlinks and directory fsyncs, each through
//! [`Fs`] and each mapping its error to the path it happened on.
//!
//! Main type: `EntryPaths`.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::warn;

use crate::cache::CacheError;
use crate::cache::fs::Fs;
use crate::cache::key::CacheKey;

/// The three files of an entry and their directory.
pub(super) struct EntryPaths {
    pub(super) dir: PathBuf,
    pub(super) body: PathBuf,
    pub(super) sig: PathBuf,
    pub(super) meta: PathBuf,
}

impl EntryPaths {
    pub(super) fn new(root: &Path, key: &CacheKey) -> EntryPaths {
        let stem = root.join(key.entry_path());
        EntryPaths {
            dir: stem
                .parent()
                .expect("an entry path has a directory")
                .to_path_buf(),
            body: stem.with_extension("body"),
            sig: stem.with_extension("sig"),
            meta: stem.with_extension("meta"),
        }
    }
}

/// Opens a regular file for reading without following a final symlink and
/// without blocking on a FIFO (C-R2).
pub(super) fn open_regular(fs: &dyn Fs, path: &Path) -> io::Result<File> {
    let file = fs.open_read(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Reads a whole file of at most `max` bytes.
pub(super) fn read_bounded(file: File, max: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    file.take(max + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("longer than {max} bytes"),
        ));
    }
    Ok(buf)
}

/// Creates a fresh temp file (`create_new`, random name, mode 0600).
pub(crate) fn create_temp(
    fs: &dyn Fs,
    dir: &Path,
    kind: &str,
) -> Result<(PathBuf, File), CacheError> {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    for _ in 0..16 {
        // RandomState is seeded from the OS once per thread and then varied,
        // which is random enough for names that create_new double-checks.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        let path = dir.join(format!("{:016x}.{kind}.tmp", h.finish()));
        match fs.create_new(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(CacheError::io(path)(e)),
        }
    }
    Err(CacheError::io(dir)(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temp file name",
    )))
}

/// Makes sure `dir` is a real directory (not a symlink), creating it if
/// needed. Returns whether it was created.
pub(super) fn ensure_dir(fs: &dyn Fs, dir: &Path) -> Result<bool, CacheError> {
    match fs::symlink_metadata(dir) {
        Ok(md) if md.is_dir() => Ok(false),
        Ok(_) => Err(CacheError::NotADirectory { path: dir.into() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => match fs.create_dir(dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => ensure_dir(fs, dir),
            Err(e) => Err(CacheError::io(dir)(e)),
        },
        Err(e) => Err(CacheError::io(dir)(e)),
    }
}

/// Deletes everything inside `dir` (not following symlinks), logging
/// failures.
pub(super) fn empty_dir(fs: &dyn Fs, dir: &Path) {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            warn!(dir = %dir.display(), error = %e, "cannot list cache directory");
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let result = match entry.file_type() {
            Ok(t) if t.is_dir() => fs.remove_dir_all(&path),
            _ => fs.remove_file(&path),
        };
        if let Err(e) = result {
            warn!(path = %path.display(), error = %e, "cannot delete stale cache file");
        }
    }
}

pub(super) fn rename_all(fs: &dyn Fs, pairs: &[(&PathBuf, &PathBuf)]) -> Result<(), CacheError> {
    for (from, to) in pairs {
        fs.rename(from, to).map_err(CacheError::io(*to))?;
    }
    Ok(())
}

pub(crate) fn remove_if_exists(fs: &dyn Fs, path: &Path) -> io::Result<()> {
    match fs.remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

pub(crate) fn fsync_dir(fs: &dyn Fs, dir: &Path) -> Result<(), CacheError> {
    fs.sync_dir(dir).map_err(CacheError::io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    use crate::cache::fs::StdFs;

    #[test]
    fn open_regular_refuses_symlinks_and_fifos_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        assert!(open_regular(&StdFs, &file).is_ok());
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(open_regular(&StdFs, &link).is_err());
        let fifo = dir.path().join("p");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        assert!(open_regular(&StdFs, &fifo).is_err());
        assert!(open_regular(&StdFs, dir.path()).is_err());
    }

    #[test]
    fn read_bounded_stops_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, [0u8; 10]).unwrap();
        assert_eq!(
            read_bounded(File::open(&file).unwrap(), 10).unwrap().len(),
            10
        );
        assert!(read_bounded(File::open(&file).unwrap(), 9).is_err());
    }

    #[test]
    fn temp_names_are_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let names: HashSet<PathBuf> = (0..200)
            .map(|_| create_temp(&StdFs, dir.path(), "body").unwrap().0)
            .collect();
        assert_eq!(names.len(), 200);
    }
}

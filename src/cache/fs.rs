//! The file-system operations the cache store makes, behind a small trait
//! so that tests can fail any of them or model a power cut (RELIABILITY
//! C-K2, C-K3, C-E2, C-E3) without root. [`StdFs`], plain `std::fs`, is what
//! the proxy uses.
//!
//! The trait covers every operation that changes the disk or whose failure
//! the store must survive: creating, writing and fsyncing a file, renames,
//! removals, directory creation and fsync, and opening a file to read.
//! Listing a directory and `lstat` stay on `std::fs`, since a test file
//! system keeps its current state in a real directory (only what would
//! survive a crash is modelled), so the real listing is the right one.
//! Files are real `File`s: the proxy streams and `pread`s entry bodies.
//!
//! Main types: [`Fs`], [`StdFs`].

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What the cache store does to the disk. Paths are absolute or relative to
/// the process's directory, as given to [`crate::cache::CacheStore::open`].
pub trait Fs: Send + Sync + 'static {
    /// Creates `path` for writing, failing if it exists; mode 0600.
    fn create_new(&self, path: &Path) -> io::Result<File>;

    /// Writes all of `data` at the end of `file`, which was created at
    /// `path` (it may have been renamed since).
    fn write_all(&self, file: &mut File, path: &Path, data: &[u8]) -> io::Result<()>;

    /// Makes `file`'s data and length durable (`fsync`).
    fn sync_file(&self, file: &File, path: &Path) -> io::Result<()>;

    /// Renames `from` to `to`, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Unlinks a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// Removes a directory and everything in it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Creates one directory (its parent exists).
    fn create_dir(&self, path: &Path) -> io::Result<()>;

    /// Makes the creations, renames and removals inside `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;

    /// Opens a file for reading without following a final symlink and
    /// without blocking on a FIFO (the caller checks it is a regular file).
    fn open_read(&self, path: &Path) -> io::Result<File>;
}

/// The real file system, through `std::fs`.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdFs;

impl Fs for StdFs {
    fn create_new(&self, path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
    }

    fn write_all(&self, file: &mut File, _path: &Path, data: &[u8]) -> io::Result<()> {
        file.write_all(data)
    }

    fn sync_file(&self, file: &File, _path: &Path) -> io::Result<()> {
        file.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }

    fn create_dir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn open_read(&self, path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
    }
}

/// A file being written through an [`Fs`], as `std::io::Write` so that a
/// `BufWriter` can sit on it.
pub(crate) struct FsWriter {
    fs: Arc<dyn Fs>,
    file: File,
    path: PathBuf,
}

impl FsWriter {
    pub(crate) fn new(fs: Arc<dyn Fs>, file: File, path: PathBuf) -> FsWriter {
        FsWriter { fs, file, path }
    }

    /// Fsyncs the file through the [`Fs`] and closes it.
    pub(crate) fn sync(self) -> io::Result<()> {
        self.fs.sync_file(&self.file, &self.path)
    }
}

impl Write for FsWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.fs.write_all(&mut self.file, &self.path, data)?;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

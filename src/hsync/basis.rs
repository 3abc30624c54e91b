//! Random access to a basis body, for both ends: the decoder copies from
//! it, and an encoder that holds the client's basis (codec 3) cuts its
//! reference prefixes from it. Knows nothing of the stream; reads only the
//! ranges it is asked for, which the caller has checked against
//! [`Basis::size`].
//!
//! Main types: [`Basis`], [`FileBasis`].

/// Random access to the basis body. Slices and `Vec`s qualify as they are;
/// [`FileBasis`] reads a file by offset, so a large basis is never loaded
/// (nor mapped) whole.
pub trait Basis {
    /// Length of the basis in bytes (not `len`: `Vec`s are bases too, and
    /// their own `len` must stay unambiguous).
    fn size(&self) -> u64;

    /// Appends `len` bytes at `offset` to `out`; the caller checked the
    /// range against [`size`](Self::size).
    ///
    /// # Errors
    /// An I/O error reading the basis.
    fn append_range(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()>;
}

impl<T: AsRef<[u8]> + ?Sized> Basis for T {
    fn size(&self) -> u64 {
        self.as_ref().len() as u64
    }

    fn append_range(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
        let start = offset as usize;
        out.extend_from_slice(&self.as_ref()[start..start + len]);
        Ok(())
    }
}

/// A basis read from a file by offset.
///
/// Each range is read with a seek and a read straight into the spare
/// capacity of `out` (std's `read_to_end` does not zero it first), under a
/// lock since the two calls share the file's offset. A positional read
/// needs an initialised buffer in safe Rust: zeroing each range before the
/// kernel overwrote it was 4 % of a decoder's CPU (the rebuilt body is
/// mostly copies).
#[derive(Debug)]
pub struct FileBasis {
    file: std::sync::Mutex<std::fs::File>,
    len: u64,
}

impl FileBasis {
    /// Uses `file` as the basis; its length is taken now, so a file that
    /// changes under us fails with an I/O error, not a wrong length.
    ///
    /// # Errors
    /// Reading the file's metadata failed.
    pub fn new(file: std::fs::File) -> std::io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(FileBasis {
            file: std::sync::Mutex::new(file),
            len,
        })
    }
}

impl Basis for FileBasis {
    fn size(&self) -> u64 {
        self.len
    }

    fn append_range(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let start = out.len();
        out.reserve(len);
        // A poisoned lock held only a file offset, which is set again here.
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let result = file
            .seek(SeekFrom::Start(offset))
            .and_then(|_| (&mut *file).take(len as u64).read_to_end(out));
        match result {
            Ok(read) if read == len => Ok(()),
            Ok(_) => {
                out.truncate(start);
                Err(std::io::ErrorKind::UnexpectedEof.into())
            }
            Err(error) => {
                out.truncate(start);
                Err(error)
            }
        }
    }
}

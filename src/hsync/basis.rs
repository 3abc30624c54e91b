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

/// A basis read from a file with positional reads.
#[derive(Debug)]
pub struct FileBasis {
    file: std::fs::File,
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
        Ok(FileBasis { file, len })
    }
}

impl Basis for FileBasis {
    fn size(&self) -> u64 {
        self.len
    }

    fn append_range(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let start = out.len();
        out.resize(start + len, 0);
        let result = self.file.read_exact_at(&mut out[start..], offset);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }
}

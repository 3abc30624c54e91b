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
/// [`FileBasis::new`] reads each range with a positional read, which leaves
/// the file's offset alone: the file may share it with other handles (the
/// client proxy's basis is a `try_clone` of its cache entry's body). A
/// positional read needs an initialised buffer in safe Rust, so the range
/// is zeroed first, and the kernel then overwrites it: a memset of every
/// byte copied from the basis, 4 % of a decoder's CPU on the bench body.
/// [`FileBasis::sole`] is for a file whose offset nobody else uses: it
/// seeks and reads straight into the spare capacity (std's `read_to_end`
/// on a `Take` does not zero it), under a lock since the two calls share
/// the offset.
#[derive(Debug)]
pub struct FileBasis {
    file: std::fs::File,
    len: u64,
    /// Held across a seek and its read, when the offset is ours alone.
    sole: Option<std::sync::Mutex<()>>,
}

impl FileBasis {
    /// Uses `file` as the basis, reading by position; its length is taken
    /// now, so a file that changes under us fails with an I/O error, not a
    /// wrong length.
    ///
    /// # Errors
    /// Reading the file's metadata failed.
    pub fn new(file: std::fs::File) -> std::io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(FileBasis {
            file,
            len,
            sole: None,
        })
    }

    /// As [`new`](Self::new), for a file opened for this basis alone (not
    /// a `try_clone` of a handle that is read elsewhere, which shares the
    /// file offset): ranges are read with a seek and a read that need no
    /// zeroed buffer.
    ///
    /// # Errors
    /// Reading the file's metadata failed.
    pub fn sole(file: std::fs::File) -> std::io::Result<Self> {
        let mut basis = FileBasis::new(file)?;
        basis.sole = Some(std::sync::Mutex::new(()));
        Ok(basis)
    }
}

impl Basis for FileBasis {
    fn size(&self) -> u64 {
        self.len
    }

    fn append_range(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        use std::os::unix::fs::FileExt;
        let start = out.len();
        let result = match &self.sole {
            None => {
                out.resize(start + len, 0);
                self.file.read_exact_at(&mut out[start..], offset)
            }
            Some(lock) => {
                out.reserve(len);
                // A poisoned lock guarded only the offset, which is set
                // again here.
                let _guard = lock.lock().unwrap_or_else(|e| e.into_inner());
                let mut file = &self.file;
                file.seek(SeekFrom::Start(offset))
                    .and_then(|_| file.take(len as u64).read_to_end(out))
                    .and_then(|read| {
                        (read == len)
                            .then_some(())
                            .ok_or_else(|| std::io::ErrorKind::UnexpectedEof.into())
                    })
            }
        };
        if result.is_err() {
            out.truncate(start);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::{Basis, FileBasis};

    /// Both ways of reading a file give the same ranges, in any order, and
    /// a range past the end fails leaving `out` as it was.
    #[test]
    fn positional_and_sole_reads_agree() {
        let body: Vec<u8> = (0..100_000u32).map(|i| (i * 31 + i / 7) as u8).collect();
        let mut file = tempfile::tempfile().expect("temp file");
        std::io::Write::write_all(&mut file, &body).expect("write");
        let positional = FileBasis::new(file.try_clone().expect("clone")).expect("basis");
        let sole = FileBasis::sole(file).expect("basis");
        for basis in [&positional, &sole] {
            assert_eq!(basis.size(), body.len() as u64);
            let mut out = b"before".to_vec();
            for (offset, len) in [(90_000, 10_000), (0, 1), (5, 70_000), (100_000, 0)] {
                basis.append_range(offset, len, &mut out).expect("read");
            }
            let mut expected = b"before".to_vec();
            for (offset, len) in [(90_000, 10_000), (0, 1), (5, 70_000), (100_000, 0)] {
                expected.extend_from_slice(&body[offset..offset + len]);
            }
            assert!(out == expected);
            let error = basis.append_range(99_999, 2, &mut out).unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
            assert!(out == expected);
        }
    }
}

//! The model's own data files (trunk and shards), appended to and flushed as the journal says.

use std::fs::{File, OpenOptions as FsOpen};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use xxhash_rust::xxh3::Xxh3;

use crate::error::{FormatError, Result};

/// An append-only data file.
#[derive(Debug)]
pub(super) struct DataFile {
    pub(super) path: PathBuf,
    file: File,
    pub(super) len: u64,
    dirty: bool,
}

impl DataFile {
    pub(super) fn open(path: PathBuf, create_new: bool) -> Result<Self> {
        let file = FsOpen::new()
            .read(true)
            .write(true)
            .create(true)
            .create_new(create_new)
            .truncate(false)
            .open(&path)
            .map_err(|e| FormatError::io(&path, e))?;
        let len = file.metadata().map_err(|e| FormatError::io(&path, e))?.len();
        Ok(DataFile { path, file, len, dirty: false })
    }

    pub(super) fn write_at_end(&mut self, bytes: &[u8]) -> Result<()> {
        self.file.write_all_at(bytes, self.len).map_err(|e| FormatError::io(&self.path, e))?;
        self.len += bytes.len() as u64;
        self.dirty = true;
        Ok(())
    }

    pub(super) fn hash_range(&self, offset: u64, len: u64) -> Result<u64> {
        let mut h = Xxh3::new();
        let mut buf = vec![0u8; (1 << 22).min(len as usize)];
        let mut at = offset;
        while at < offset + len {
            let n = buf.len().min((offset + len - at) as usize);
            self.file.read_exact_at(&mut buf[..n], at).map_err(|e| FormatError::io(&self.path, e))?;
            h.update(&buf[..n]);
            at += n as u64;
        }
        Ok(h.digest())
    }

    pub(super) fn cut_to(&mut self, len: u64) -> Result<()> {
        self.file.set_len(len).map_err(|e| FormatError::io(&self.path, e))?;
        self.len = len;
        self.dirty = true;
        Ok(())
    }

    pub(super) fn sync(&mut self) -> Result<()> {
        if self.dirty {
            self.file.sync_data().map_err(|e| FormatError::io(&self.path, e))?;
            self.dirty = false;
        }
        Ok(())
    }
}

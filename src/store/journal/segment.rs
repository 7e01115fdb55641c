//! Segment files: naming, creation, the append position, and reading a whole
//! segment back for recovery.
//!
//! A segment is `MAGIC` followed by records (`record.rs`), appended with
//! positioned writes so the writer always knows where each record landed.
//! This module does not decide *when* to roll over or delete a segment
//! (`mod.rs` does, from the index's accounting).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::index::SegmentNo;
use super::record::MAGIC;

pub fn path(dir: &Path, no: SegmentNo) -> PathBuf {
    dir.join(format!("{no:010}.seg"))
}

/// The segment numbers present in `dir`, ascending. Other files are ignored.
pub fn list(dir: &Path) -> io::Result<Vec<SegmentNo>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(no) = name.strip_suffix(".seg").and_then(|n| n.parse().ok()) {
            out.push(no);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Makes a directory entry (a created or deleted segment) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

pub fn open_read(dir: &Path, no: SegmentNo) -> io::Result<Arc<File>> {
    Ok(Arc::new(File::open(path(dir, no))?))
}

/// The segment being appended to.
pub struct Writer {
    pub no: SegmentNo,
    pub file: Arc<File>,
    /// Bytes written so far: where the next record goes.
    pub len: u64,
}

impl Writer {
    /// Creates segment `no`; fails if it already exists (two writers, or a
    /// numbering bug, must never share a file).
    pub fn create(dir: &Path, no: SegmentNo) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path(dir, no))?;
        file.write_all_at(MAGIC, 0)?;
        Ok(Self {
            no,
            file: Arc::new(file),
            len: MAGIC.len() as u64,
        })
    }

    /// Writes `bytes` at the end; returns the offset they start at. A failed
    /// write is cut off again so the segment never keeps half a record
    /// followed by good ones.
    pub fn append(&mut self, bytes: &[u8]) -> io::Result<u64> {
        let at = self.len;
        match self.file.write_all_at(bytes, at) {
            Ok(()) => {
                self.len += bytes.len() as u64;
                Ok(at)
            }
            Err(e) => {
                let _ = self.file.set_len(at);
                Err(e)
            }
        }
    }
}

/// Reads a whole segment for recovery; `Err(InvalidData)` if it does not start
/// with `MAGIC` (`Ok(None)` for a file too short to hold it: a segment whose
/// creation a crash interrupted).
pub fn read_all(dir: &Path, no: SegmentNo) -> io::Result<Option<Vec<u8>>> {
    let bytes = std::fs::read(path(dir, no))?;
    if bytes.len() < MAGIC.len() {
        return Ok(None);
    }
    if &bytes[..MAGIC.len()] != MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a journal segment", path(dir, no).display()),
        ));
    }
    Ok(Some(bytes))
}

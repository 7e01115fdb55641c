//! A little-endian reader over a record's bytes that fails (`None`)
//! instead of panicking on short input: what the summary and checkpoint
//! decoders share. It knows no layout; they do.

pub struct Cursor<'a> {
    p: &'a [u8],
    /// Where the next read starts.
    pub at: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor over `p`, at `at`.
    pub fn at(p: &'a [u8], at: usize) -> Self {
        Self { p, at }
    }

    /// Bytes not read yet.
    pub fn left(&self) -> usize {
        self.p.len().saturating_sub(self.at)
    }

    /// Whether every byte was read.
    pub fn is_done(&self) -> bool {
        self.at == self.p.len()
    }

    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let bytes = self.p.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(bytes)
    }

    pub fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    pub fn id(&mut self) -> Option<[u8; 16]> {
        self.take(16)?.try_into().ok()
    }

    pub fn text(&mut self) -> Option<String> {
        let len = self.u32()? as usize;
        Some(std::str::from_utf8(self.take(len)?).ok()?.to_owned())
    }
}

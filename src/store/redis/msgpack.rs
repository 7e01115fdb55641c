//! The MessagePack subset a stream's compact value is written in: one map
//! with string keys whose values are unsigned integers, strings (any bytes)
//! or arrays of strings. It is what both this module and `cmsgpack`, the
//! MessagePack library of Redis' Lua, read and write, so that a script can
//! unpack a value, change a field and pack it again.
//!
//! Strings are written as MessagePack `str` whatever their bytes: Redis'
//! `cmsgpack` does not read `bin`. Reading also takes what `cmsgpack` writes
//! for a Lua number it cannot hold as an integer (a float: Lua numbers are
//! doubles), and negative integers, so that no value a script rewrote is
//! unreadable here; nested maps are refused.

/// One value of the map.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Value<'a> {
    Nil,
    Bool(bool),
    Uint(u64),
    Int(i64),
    Float(f64),
    Str(&'a [u8]),
    Array(Vec<Value<'a>>),
}

impl<'a> Value<'a> {
    /// The value as an unsigned integer: a float a script made of a large
    /// one is taken back (saturating), a negative number is not.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Uint(n) => Some(n),
            Value::Int(n) => u64::try_from(n).ok(),
            Value::Float(f) if f >= 0.0 && f.is_finite() => Some(f as u64),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> Option<&'a [u8]> {
        match *self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Writes a map: [`Writer::map`] first, then each key and its value.
#[derive(Default)]
pub(super) struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn map(&mut self, len: usize) {
        match len {
            0..=15 => self.buf.push(0x80 | len as u8),
            16..=0xffff => {
                self.buf.push(0xde);
                self.buf.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                self.buf.push(0xdf);
                self.buf.extend_from_slice(&(len as u32).to_be_bytes());
            }
        }
    }

    pub fn array(&mut self, len: usize) {
        match len {
            0..=15 => self.buf.push(0x90 | len as u8),
            16..=0xffff => {
                self.buf.push(0xdc);
                self.buf.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                self.buf.push(0xdd);
                self.buf.extend_from_slice(&(len as u32).to_be_bytes());
            }
        }
    }

    pub fn str(&mut self, bytes: &[u8]) {
        let len = bytes.len();
        match len {
            0..=31 => self.buf.push(0xa0 | len as u8),
            32..=0xff => self.buf.extend_from_slice(&[0xd9, len as u8]),
            0x100..=0xffff => {
                self.buf.push(0xda);
                self.buf.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                self.buf.push(0xdb);
                self.buf.extend_from_slice(&(len as u32).to_be_bytes());
            }
        }
        self.buf.extend_from_slice(bytes);
    }

    pub fn uint(&mut self, n: u64) {
        match n {
            0..=0x7f => self.buf.push(n as u8),
            0x80..=0xff => self.buf.extend_from_slice(&[0xcc, n as u8]),
            0x100..=0xffff => {
                self.buf.push(0xcd);
                self.buf.extend_from_slice(&(n as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                self.buf.push(0xce);
                self.buf.extend_from_slice(&(n as u32).to_be_bytes());
            }
            _ => {
                self.buf.push(0xcf);
                self.buf.extend_from_slice(&n.to_be_bytes());
            }
        }
    }
}

/// Reads a value that is one map; its pairs in the order written. Errs
/// (saying where) on anything else, trailing bytes included.
pub(super) fn read_map(bytes: &[u8]) -> Result<Vec<(&[u8], Value<'_>)>, String> {
    let mut r = Reader { bytes, at: 0 };
    let len = match r.byte()? {
        b @ 0x80..=0x8f => usize::from(b & 0x0f),
        0xde => r.uint(2)? as usize,
        0xdf => r.uint(4)? as usize,
        b => return Err(format!("a map was expected, not type {b:#04x}")),
    };
    let mut pairs = Vec::with_capacity(len);
    for _ in 0..len {
        let key = match r.value(0)? {
            Value::Str(key) => key,
            other => return Err(format!("a map key is {other:?}, not a string")),
        };
        pairs.push((key, r.value(0)?));
    }
    if r.at != bytes.len() {
        return Err(format!("{} bytes after the map", bytes.len() - r.at));
    }
    Ok(pairs)
}

/// How deep arrays may nest (the values here have one level).
const MAX_DEPTH: usize = 8;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("cut short at byte {}", self.at))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    /// A big-endian unsigned integer of `n` bytes.
    fn uint(&mut self, n: usize) -> Result<u64, String> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn int(&mut self, n: usize) -> Result<i64, String> {
        let raw = self.uint(n)?;
        let shift = 64 - 8 * n as u32;
        Ok(((raw << shift) as i64) >> shift)
    }

    fn value(&mut self, depth: usize) -> Result<Value<'a>, String> {
        let b = self.byte()?;
        Ok(match b {
            0x00..=0x7f => Value::Uint(u64::from(b)),
            0xe0..=0xff => Value::Int(i64::from(b as i8)),
            0xa0..=0xbf => Value::Str(self.take(usize::from(b & 0x1f))?),
            0x90..=0x9f => self.array(usize::from(b & 0x0f), depth)?,
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4 | 0xd9 => {
                let len = self.uint(1)? as usize;
                Value::Str(self.take(len)?)
            }
            0xc5 | 0xda => {
                let len = self.uint(2)? as usize;
                Value::Str(self.take(len)?)
            }
            0xc6 | 0xdb => {
                let len = self.uint(4)? as usize;
                Value::Str(self.take(len)?)
            }
            0xca => Value::Float(f64::from(f32::from_bits(self.uint(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.uint(8)?)),
            0xcc => Value::Uint(self.uint(1)?),
            0xcd => Value::Uint(self.uint(2)?),
            0xce => Value::Uint(self.uint(4)?),
            0xcf => Value::Uint(self.uint(8)?),
            0xd0 => Value::Int(self.int(1)?),
            0xd1 => Value::Int(self.int(2)?),
            0xd2 => Value::Int(self.int(4)?),
            0xd3 => Value::Int(self.int(8)?),
            0xdc => {
                let len = self.uint(2)? as usize;
                self.array(len, depth)?
            }
            0xdd => {
                let len = self.uint(4)? as usize;
                self.array(len, depth)?
            }
            other => return Err(format!("type {other:#04x} at byte {}", self.at - 1)),
        })
    }

    fn array(&mut self, len: usize, depth: usize) -> Result<Value<'a>, String> {
        if depth >= MAX_DEPTH {
            return Err("arrays nested too deep".into());
        }
        // Each element takes a byte at least: a length past the end is a lie.
        if len > self.bytes.len() - self.at {
            return Err(format!("an array of {len} in {} bytes", self.bytes.len()));
        }
        (0..len)
            .map(|_| self.value(depth + 1))
            .collect::<Result<_, _>>()
            .map(Value::Array)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back_at_every_length_boundary() {
        let numbers = [0, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x1_0000, u64::MAX];
        let long = vec![b'x'; 0x1_0000];
        let strings: [&[u8]; 5] = [b"", &[0xff; 31], &[0; 32], &long[..0x100], &long];
        let mut w = Writer::default();
        w.map(numbers.len() + strings.len() + 1);
        for (i, n) in numbers.iter().enumerate() {
            w.str(format!("n{i}").as_bytes());
            w.uint(*n);
        }
        for (i, s) in strings.iter().enumerate() {
            w.str(format!("s{i}").as_bytes());
            w.str(s);
        }
        w.str(b"a");
        w.array(16);
        for _ in 0..16 {
            w.str(b"e");
        }
        let pairs = read_map(&w.buf).unwrap();
        assert_eq!(pairs.len(), 14);
        for (i, n) in numbers.iter().enumerate() {
            assert_eq!(pairs[i].1.as_u64(), Some(*n));
        }
        for (i, s) in strings.iter().enumerate() {
            assert_eq!(pairs[numbers.len() + i].1.as_bytes(), Some(*s));
        }
        assert_eq!(pairs[13].1, Value::Array(vec![Value::Str(b"e"); 16]));
    }

    #[test]
    fn what_a_lua_script_may_write_for_a_number_reads_as_one() {
        // cmsgpack: 2^64 as a float32, 1.5e12 as a float64, -1 as fixint.
        let mut bytes = vec![0x83, 0xa1, b'a', 0xca];
        bytes.extend_from_slice(&(2f32.powi(64)).to_bits().to_be_bytes());
        bytes.extend_from_slice(&[0xa1, b'b', 0xcb]);
        bytes.extend_from_slice(&1.5e12f64.to_bits().to_be_bytes());
        bytes.extend_from_slice(&[0xa1, b'c', 0xff]);
        let pairs = read_map(&bytes).unwrap();
        assert_eq!(pairs[0].1.as_u64(), Some(u64::MAX));
        assert_eq!(pairs[1].1.as_u64(), Some(1_500_000_000_000));
        assert_eq!(pairs[2].1, Value::Int(-1));
        assert_eq!(pairs[2].1.as_u64(), None);
    }

    #[test]
    fn damaged_values_are_refused_not_misread() {
        for bad in [
            &b""[..],
            &[0x91, 0x01],
            &[0x81, 0xa1, b'a'],
            &[0x81, 0xa1, b'a', 0xdb, 0xff, 0xff, 0xff, 0xff],
            &[0x81, 0xa1, b'a', 0xdd, 0xff, 0xff, 0xff, 0xff],
            &[0x81, 0x01, 0x01],
            &[0x80, 0x00],
            &[0x81, 0xa1, b'a', 0x81, 0xa1, b'b', 0x01],
        ] {
            assert!(read_map(bad).is_err(), "{bad:?}");
        }
    }
}

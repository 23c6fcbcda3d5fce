//! Bounds-checked big-endian reads and writes for samsa's own record
//! layouts (`__transaction_state`, `__consumer_offsets`).
//!
//! Every read checks the bytes present before it takes or allocates
//! anything, so decoding arbitrary bytes gives a value or [`Truncated`],
//! never a panic.

/// The bytes ended while reading the named field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated(pub &'static str);

/// Bounds-checked big-endian reads.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Truncated> {
        if n > self.bytes.len() {
            return Err(Truncated(what));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Truncated> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, Truncated> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, Truncated> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn i16(&mut self, what: &'static str) -> Result<i16, Truncated> {
        Ok(i16::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn i32(&mut self, what: &'static str) -> Result<i32, Truncated> {
        Ok(i32::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, Truncated> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, Truncated> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    /// A count of items of at least `item_size` bytes each, refused up front
    /// if the bytes left cannot hold that many.
    pub(crate) fn len_u32(
        &mut self,
        what: &'static str,
        item_size: usize,
    ) -> Result<usize, Truncated> {
        let n = self.u32(what)?;
        let n = usize::try_from(n).map_err(|_| Truncated(what))?;
        if n.saturating_mul(item_size) > self.remaining() {
            return Err(Truncated(what));
        }
        Ok(n)
    }

    /// `u32` length then that many bytes.
    pub(crate) fn bytes_u32(&mut self, what: &'static str) -> Result<&'a [u8], Truncated> {
        let n = self.len_u32(what, 1)?;
        self.take(n, what)
    }

    /// `i32` length (-1: null) then that many bytes.
    pub(crate) fn nullable_bytes(
        &mut self,
        what: &'static str,
    ) -> Result<Option<&'a [u8]>, Truncated> {
        let n = self.i32(what)?;
        if n < 0 {
            return Ok(None);
        }
        let n = usize::try_from(n).map_err(|_| Truncated(what))?;
        self.take(n, what).map(Some)
    }
}

/// Big-endian writes matching [`Reader`].
pub(crate) fn put_bytes_u32(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

pub(crate) fn put_nullable_bytes(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        Some(b) => {
            out.extend_from_slice(&(b.len() as i32).to_be_bytes());
            out.extend_from_slice(b);
        }
    }
}

//! Byte-level encoding: an encoder that builds one length-prefixed frame of big-endian
//! fields, and a checked decoder over a frame's body that errs, never panics, on short or
//! malformed input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A decoding error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed bootstrap message: {0}")]
pub struct DecodeError(pub String);

/// Builds one frame: a 4-byte length (filled in by [`Enc::finish`]), a type byte, fields.
pub(super) struct Enc(Vec<u8>);

impl Enc {
    pub(super) fn new(ty: u8) -> Enc {
        Enc(vec![0, 0, 0, 0, ty])
    }
    pub(super) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(super) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn raw(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.raw(b);
    }
    pub(super) fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    pub(super) fn ip(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(a) => {
                self.u8(4);
                self.raw(&a.octets());
            }
            IpAddr::V6(a) => {
                self.u8(6);
                self.raw(&a.octets());
            }
        }
    }
    pub(super) fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_be_bytes());
        self.0
    }
}

/// Reads the fields of a frame's body, checking every length.
pub(super) struct Dec<'a>(pub(super) &'a [u8]);

impl<'a> Dec<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError(format!(
                "needs {n} more bytes, {} left",
                self.0.len()
            )));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub(super) fn arr<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().expect("length checked"))
    }
    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.arr()?))
    }
    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.arr()?))
    }
    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.arr()?))
    }
    pub(super) fn bytes(&mut self, limit: usize) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32()? as usize;
        if n > limit {
            return Err(DecodeError(format!("field of {n} bytes (limit {limit})")));
        }
        Ok(self.take(n)?.to_vec())
    }
    pub(super) fn str(&mut self, limit: usize) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes(limit)?).map_err(|_| DecodeError("text is not UTF-8".into()))
    }
    pub(super) fn count(&mut self, limit: usize, what: &str) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > limit {
            return Err(DecodeError(format!("{n} {what} (limit {limit})")));
        }
        Ok(n)
    }
    pub(super) fn ip(&mut self) -> Result<IpAddr, DecodeError> {
        match self.u8()? {
            4 => Ok(IpAddr::V4(Ipv4Addr::from(self.arr::<4>()?))),
            6 => Ok(IpAddr::V6(Ipv6Addr::from(self.arr::<16>()?))),
            t => Err(DecodeError(format!("address family {t}"))),
        }
    }
    pub(super) fn end(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError(format!("{} trailing bytes", self.0.len())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_in_a_length_prefixed_frame() {
        let mut e = Enc::new(7);
        e.u8(1);
        e.u16(0x0203);
        e.u32(0x0405_0607);
        e.u64(0x0809_0a0b_0c0d_0e0f);
        e.bytes(b"ab");
        e.str("cd");
        e.ip("10.1.2.3".parse().unwrap());
        e.ip("::1".parse().unwrap());
        let f = e.finish();
        assert_eq!(
            u32::from_be_bytes(f[..4].try_into().unwrap()) as usize,
            f.len() - 4
        );
        assert_eq!(f[4], 7);
        let mut d = Dec(&f[5..]);
        assert_eq!(d.u8().unwrap(), 1);
        assert_eq!(d.u16().unwrap(), 0x0203);
        assert_eq!(d.u32().unwrap(), 0x0405_0607);
        assert_eq!(d.u64().unwrap(), 0x0809_0a0b_0c0d_0e0f);
        assert_eq!(d.bytes(2).unwrap(), b"ab");
        assert_eq!(d.str(2).unwrap(), "cd");
        assert_eq!(d.ip().unwrap(), "10.1.2.3".parse::<IpAddr>().unwrap());
        assert_eq!(d.ip().unwrap(), "::1".parse::<IpAddr>().unwrap());
        assert!(d.end().is_ok());
    }

    #[test]
    fn short_oversized_and_malformed_fields_are_errors() {
        assert!(Dec(&[1]).u16().is_err());
        assert!(Dec(&[]).u8().is_err());
        // A length over the field's limit, or over what is left.
        assert!(Dec(&[0, 0, 0, 3, 1, 2, 3]).bytes(2).is_err());
        assert!(Dec(&[0, 0, 0, 3, 1, 2]).bytes(8).is_err());
        assert!(Dec(&[0, 0, 0, 9]).count(8, "things").is_err());
        assert_eq!(Dec(&[0, 0, 0, 8]).count(8, "things").unwrap(), 8);
        assert!(Dec(&[0, 0, 0, 1, 0xff]).str(8).is_err());
        assert!(Dec(&[5, 1, 2, 3, 4]).ip().is_err());
        assert!(Dec(&[4, 1, 2]).ip().is_err());
        assert!(Dec(&[0]).end().is_err());
    }
}

//! Framing on a stream: a 4-byte big-endian length, then the frame (type and body), read
//! with a bound on its length.

use std::io::{Read, Write};

use super::MAX_CONTRIBUTION;

/// Reads one frame (type and body) of at most `limit` bytes.
pub fn read_frame(r: &mut impl Read, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bootstrap frame of {len} bytes (limit {limit})"),
        ));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// Writes one encoded frame.
pub fn write_frame(w: &mut impl Write, frame: &[u8]) -> std::io::Result<()> {
    w.write_all(frame)?;
    w.flush()
}

/// Largest frame a rendezvous accepts from a rank.
pub const CLIENT_FRAME_LIMIT: usize = MAX_CONTRIBUTION + 64 * 1024;

/// Largest frame a rank accepts from a rendezvous of `size` ranks.
pub fn server_frame_limit(size: usize) -> usize {
    size.saturating_mul(MAX_CONTRIBUTION + 64 * 1024)
        .saturating_add(64 * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_frame_reads_back_and_lengths_are_bounded() {
        let frame = [0, 0, 0, 3, 9, 1, 2];
        let mut out = Vec::new();
        write_frame(&mut out, &frame).unwrap();
        assert_eq!(out, frame);
        assert_eq!(read_frame(&mut &out[..], 3).unwrap(), [9, 1, 2]);
        // Over the limit, empty, or cut short: errors.
        assert!(read_frame(&mut &out[..], 2).is_err());
        assert!(read_frame(&mut &[0u8, 0, 0, 0][..], 10).is_err());
        assert!(read_frame(&mut &out[..6], 3).is_err());
        assert!(read_frame(&mut &out[..2], 3).is_err());
        let big = [0xff, 0xff, 0xff, 0xff, 1];
        assert!(read_frame(&mut &big[..], CLIENT_FRAME_LIMIT).is_err());
    }

    #[test]
    fn server_limit_grows_with_the_job_and_saturates() {
        assert!(server_frame_limit(2) > server_frame_limit(1));
        assert!(server_frame_limit(1) >= CLIENT_FRAME_LIMIT);
        assert_eq!(server_frame_limit(usize::MAX), usize::MAX);
    }
}

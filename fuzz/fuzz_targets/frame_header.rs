//! `FrameHeader::decode` on arbitrary bytes: never panics, and every header it accepts
//! encodes back to exactly the bytes it was decoded from (there is one wire form per header).
#![no_main]

use braid_proto::wire::FrameHeader;
use braid_proto::wire::frame::{FrameError, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match FrameHeader::decode(data) {
        Ok(h) => {
            assert!(data.len() >= HEADER_LEN);
            let enc = h.encode();
            assert_eq!(
                &enc[..],
                &data[..HEADER_LEN],
                "re-encoding differs from the input"
            );
            assert_eq!(FrameHeader::decode(&enc), Ok(h), "round trip differs");
            // Bytes after the header never change the result.
            assert_eq!(FrameHeader::decode(&data[..HEADER_LEN]), Ok(h));
        }
        Err(FrameError::Truncated(n)) => {
            assert!(data.len() < HEADER_LEN);
            assert_eq!(n, data.len());
        }
        Err(_) => assert!(data.len() >= HEADER_LEN),
    }
});

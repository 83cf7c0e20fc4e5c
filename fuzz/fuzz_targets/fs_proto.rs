//! braid-fs's RPC decoders on arbitrary bytes: never panic, and every message they accept
//! encodes again to a message that decodes to the same value.
#![no_main]

use braid_fs::proto::{decode_reply, decode_request, encode_reply, encode_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((id, caller, req)) = decode_request(data) {
        let enc = encode_request(id, &caller, &req).expect("a decoded request encodes");
        assert_eq!(decode_request(&enc), Ok((id, caller, req)), "request round trip differs");
    }
    if let Ok((id, op, rep)) = decode_reply(data) {
        let enc = encode_reply(id, op, &rep).expect("a decoded reply encodes");
        assert_eq!(decode_reply(&enc), Ok((id, op, rep)), "reply round trip differs");
    }
});

//! `Hello::decode`, `HelloReply::decode` and `AuthProof::decode` on arbitrary bytes: never
//! panic, and a decoded message encodes back to the bytes it came from (the flags word of a
//! `Hello`, offset 14, is ignored by the decoder and encoded as zero, so it is masked).
#![no_main]

use braid_proto::wire::handshake::{AuthProof, HANDSHAKE_LEN};
use braid_proto::wire::{HandshakeError, Hello, HelloReply};
use libfuzzer_sys::fuzz_target;

fn check_len<T>(data: &[u8], r: &Result<T, HandshakeError>) {
    match r {
        Ok(_) => assert!(data.len() >= HANDSHAKE_LEN),
        Err(HandshakeError::Truncated(n)) => {
            assert!(data.len() < HANDSHAKE_LEN);
            assert_eq!(*n, data.len());
        }
        Err(_) => assert!(data.len() >= HANDSHAKE_LEN),
    }
}

fuzz_target!(|data: &[u8]| {
    let hello = Hello::decode(data);
    check_len(data, &hello);
    if let Ok(h) = hello {
        let enc = h.encode();
        assert_eq!(Hello::decode(&enc), Ok(h), "hello round trip differs");
        let mut want = [0u8; HANDSHAKE_LEN];
        want.copy_from_slice(&data[..HANDSHAKE_LEN]);
        want[14..16].fill(0);
        assert_eq!(enc, want, "hello re-encoding differs from the input");
        assert!(matches!(
            HelloReply::decode(&enc),
            Err(HandshakeError::BadMagic(_))
        ));
        assert!(matches!(
            AuthProof::decode(&enc),
            Err(HandshakeError::BadMagic(_))
        ));
    }

    let reply = HelloReply::decode(data);
    check_len(data, &reply);
    if let Ok(r) = reply {
        let enc = r.encode();
        assert_eq!(
            &enc[..],
            &data[..HANDSHAKE_LEN],
            "reply re-encoding differs"
        );
        assert_eq!(HelloReply::decode(&enc), Ok(r), "reply round trip differs");
        assert!(matches!(
            Hello::decode(&enc),
            Err(HandshakeError::BadMagic(_))
        ));
    }

    let proof = AuthProof::decode(data);
    check_len(data, &proof);
    if let Ok(p) = proof {
        let enc = p.encode();
        assert_eq!(
            &enc[..],
            &data[..HANDSHAKE_LEN],
            "proof re-encoding differs"
        );
        assert_eq!(AuthProof::decode(&enc), Ok(p), "proof round trip differs");
    }
});

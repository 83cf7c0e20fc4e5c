//! The rendezvous's challenge-response with the cluster secret (as braid's rail handshake:
//! HMAC-SHA256 over both nonces and the identity, a different role label per direction).

use hmac::{KeyInit, Mac};

use crate::wire::{MAC_LEN, NONCE_LEN};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// Which side proves.
#[derive(Clone, Copy)]
pub(crate) enum Role {
    /// The joining rank.
    Rank,
    /// The rendezvous.
    Root,
}

/// A fresh random nonce.
pub(crate) fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).expect("the operating system's random generator failed");
    n
}

fn mac_of(
    secret: &[u8],
    role: Role,
    root_nonce: &[u8; NONCE_LEN],
    rank_nonce: &[u8; NONCE_LEN],
    job: &str,
    rank: u32,
    size: u32,
) -> HmacSha256 {
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(match role {
        Role::Rank => b"braid-boot v1 rank\0",
        Role::Root => b"braid-boot v1 root\0",
    });
    m.update(root_nonce);
    m.update(rank_nonce);
    m.update(&(job.len() as u32).to_be_bytes());
    m.update(job.as_bytes());
    m.update(&rank.to_be_bytes());
    m.update(&size.to_be_bytes());
    m
}

/// The proof `role` sends.
pub(crate) fn prove(
    secret: &[u8],
    role: Role,
    root_nonce: &[u8; NONCE_LEN],
    rank_nonce: &[u8; NONCE_LEN],
    job: &str,
    rank: u32,
    size: u32,
) -> [u8; MAC_LEN] {
    mac_of(secret, role, root_nonce, rank_nonce, job, rank, size)
        .finalize()
        .into_bytes()
        .into()
}

/// Checks `role`'s proof in constant time.
#[allow(clippy::too_many_arguments)]
pub(crate) fn verify(
    secret: &[u8],
    role: Role,
    root_nonce: &[u8; NONCE_LEN],
    rank_nonce: &[u8; NONCE_LEN],
    job: &str,
    rank: u32,
    size: u32,
    proof: &[u8; MAC_LEN],
) -> bool {
    mac_of(secret, role, root_nonce, rank_nonce, job, rank, size)
        .verify_slice(proof)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_role_secret_and_identity() {
        let (a, b) = (nonce(), nonce());
        assert_ne!(a, b);
        let p = prove(b"s", Role::Rank, &a, &b, "job", 1, 2);
        assert!(verify(b"s", Role::Rank, &a, &b, "job", 1, 2, &p));
        assert!(!verify(b"t", Role::Rank, &a, &b, "job", 1, 2, &p));
        assert!(!verify(b"s", Role::Root, &a, &b, "job", 1, 2, &p));
        assert!(!verify(b"s", Role::Rank, &b, &a, "job", 1, 2, &p));
        assert!(!verify(b"s", Role::Rank, &a, &b, "jo", 1, 2, &p));
        assert!(!verify(b"s", Role::Rank, &a, &b, "job", 0, 2, &p));
        assert!(!verify(b"s", Role::Rank, &a, &b, "job", 1, 3, &p));
    }
}

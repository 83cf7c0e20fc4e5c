//! The bootstrap protocol's messages, as Rust types (their encoding is in `encode`).

use std::net::IpAddr;

use crate::addrs::HostAddr;
use crate::error::Refusal;

use super::{MAC_LEN, NONCE_LEN};

/// An address a rank listens on for braid rails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Address and prefix.
    pub addr: HostAddr,
    /// The braid listener's port on it.
    pub port: u16,
}

/// What a rank tells the rendezvous about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// Host name, for messages.
    pub hostname: String,
    /// Process id, for messages.
    pub pid: u32,
    /// Machine and network namespace (see [`crate::addrs::host_key`]).
    pub host_key: String,
    /// Rail addresses with their listening ports.
    pub addrs: Vec<Published>,
    /// Port of the braid listener on 127.0.0.1 (0: none).
    pub loopback_port: u16,
    /// The addresses come from `BRAID_RAILS`.
    pub rails_override: bool,
}

/// One rank's row of the address table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableEntry {
    /// What the rank sent.
    pub info: RankInfo,
    /// The address the rendezvous saw it connect from.
    pub seen: IpAddr,
}

/// Why the job failed, as the rendezvous tells every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A rank's connection ended without a goodbye.
    RankDied {
        /// The rank.
        rank: u32,
        /// What was seen.
        detail: String,
    },
    /// A rank reported its own error.
    RankAborted {
        /// The rank.
        rank: u32,
        /// Its error.
        reason: String,
    },
    /// A collective needs a rank that said goodbye.
    RankLeft {
        /// The rank.
        rank: u32,
    },
    /// Ranks missing at the join timeout.
    JoinTimeout {
        /// The missing ranks.
        missing: Vec<u32>,
        /// The timeout in milliseconds.
        waited_ms: u64,
    },
    /// A rank joined twice.
    DuplicateRank {
        /// The rank.
        rank: u32,
        /// First claimant.
        first: String,
        /// Second claimant.
        second: String,
    },
    /// A rank's size differs from rank 0's.
    SizeMismatch {
        /// The rank.
        rank: u32,
        /// Its size.
        size: u32,
        /// Rank 0's size.
        root_size: u32,
    },
    /// Ranks disagree on the collective being run.
    CollectiveMismatch(String),
}

/// Messages from a rank to the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientMsg {
    /// The first message: who this rank is.
    Join {
        /// Protocol version.
        version: u16,
        /// The rank's nonce.
        nonce: [u8; NONCE_LEN],
        /// Proof of the secret over both nonces and the identity (when the rank has one).
        mac: Option<[u8; MAC_LEN]>,
        /// Job id.
        job: String,
        /// Rank.
        rank: u32,
        /// Size.
        size: u32,
        /// Addresses and identity.
        info: RankInfo,
    },
    /// A contribution to collective number `seq` (allgather; a barrier contributes nothing).
    Collective {
        /// Sequence number, from 0, one per collective.
        seq: u64,
        /// 0 barrier, 1 allgather.
        kind: u8,
        /// The contribution.
        data: Vec<u8>,
    },
    /// This rank failed; the job cannot go on.
    Abort {
        /// Its error.
        reason: String,
    },
    /// This rank leaves cleanly.
    Bye,
}

/// Messages from the rendezvous to a rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerMsg {
    /// The first message, before the rank says anything.
    Hello {
        /// Protocol version.
        version: u16,
        /// The rendezvous's nonce.
        nonce: [u8; NONCE_LEN],
        /// The rendezvous has a cluster secret and requires a proof.
        auth_required: bool,
    },
    /// The rank is in; the proof is the rendezvous's own (when it has a secret).
    Welcome {
        /// Proof of the secret.
        mac: Option<[u8; MAC_LEN]>,
    },
    /// The rank is refused; the connection closes.
    Refuse {
        /// Why.
        kind: Refusal,
        /// In words.
        detail: String,
    },
    /// Everyone joined: the address table, indexed by rank.
    Table(Vec<TableEntry>),
    /// Collective `seq` completed: every rank's contribution, by rank.
    Done {
        /// Sequence number.
        seq: u64,
        /// Contributions.
        parts: Vec<Vec<u8>>,
    },
    /// The job failed.
    Failed(Failure),
}

//! The errors of forming and running a group.

use std::time::Duration;

use thiserror::Error;

/// Why the rendezvous refused one connecting process (the other ranks are not affected,
/// except where [`BootError`] says so).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The rendezvous serves another job (another job id on the same host:port).
    WrongJob,
    /// Another process already joined with this rank. The job is aborted as well: two
    /// processes claiming one rank means two jobs share the rendezvous and its job id.
    DuplicateRank,
    /// This process's group size differs from rank 0's (the job is aborted as well).
    SizeMismatch,
    /// The cluster secret was missing, different, or present on one side only.
    Auth,
    /// The job at this rendezvous was already formed (all ranks had joined).
    JobFormed,
    /// The rank is not below the size.
    BadRank,
    /// The other side speaks another version of the bootstrap protocol.
    Version,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::WrongJob => "wrong job",
            Refusal::DuplicateRank => "duplicate rank",
            Refusal::SizeMismatch => "size disagreement",
            Refusal::Auth => "authentication failed",
            Refusal::JobFormed => "the job is already formed",
            Refusal::BadRank => "rank out of range",
            Refusal::Version => "bootstrap protocol version mismatch",
        })
    }
}

/// Errors of [`crate::LaunchEnv::from_env`], [`crate::World::join`] and the collectives.
/// Every wait that can produce one is bounded in time.
#[derive(Debug, Error)]
pub enum BootError {
    /// The launcher's environment is missing, malformed or inconsistent.
    #[error("bad launch environment: {0}")]
    BadEnv(String),
    /// No rendezvous answered at any of the addresses before the join timeout.
    #[error(
        "cannot reach the rendezvous {root} within {waited:?} (is rank 0 running and BRAID_ROOT an address of its host?): {last}"
    )]
    RootUnreachable {
        /// The `BRAID_ROOT` value.
        root: String,
        /// How long this process tried.
        waited: Duration,
        /// The last connection error.
        last: String,
    },
    /// Rank 0 could not listen on the rendezvous address.
    #[error(
        "rank 0 cannot listen on the rendezvous {addr}: {error} (another job on this port, or not an address of this host?)"
    )]
    RootListen {
        /// The address it tried.
        addr: String,
        /// The operating system's error (in the message, so not a `source()`).
        error: std::io::Error,
    },
    /// The rendezvous refused this process.
    #[error("the rendezvous at {root} refused rank {rank}: {kind}: {detail}")]
    Refused {
        /// The rendezvous address.
        root: String,
        /// This process's rank.
        rank: usize,
        /// Why, as a kind to match on.
        kind: Refusal,
        /// Why, in words (with the values that disagree).
        detail: String,
    },
    /// The rendezvous did not prove that it knows the cluster secret.
    #[error("authentication of the rendezvous at {root} failed: {reason}")]
    Auth {
        /// The rendezvous address.
        root: String,
        /// Why.
        reason: String,
    },
    /// Not every rank joined before the join timeout (reported by the rendezvous).
    #[error("ranks {missing:?} did not join the rendezvous within {waited:?}")]
    JoinTimeout {
        /// The ranks that never arrived.
        missing: Vec<usize>,
        /// The rendezvous's join timeout.
        waited: Duration,
    },
    /// Two processes joined with the same rank; the job was aborted.
    #[error(
        "rank {rank} joined twice ({first} and {second}): two jobs with one job id on one rendezvous?"
    )]
    DuplicateRank {
        /// The rank claimed twice.
        rank: usize,
        /// The first claimant.
        first: String,
        /// The second claimant.
        second: String,
    },
    /// A rank's group size differs from rank 0's; the job was aborted.
    #[error("size disagreement: rank {rank} was started with size {size}, rank 0 with {root_size}")]
    SizeMismatch {
        /// The disagreeing rank.
        rank: usize,
        /// Its size.
        size: usize,
        /// Rank 0's size.
        root_size: usize,
    },
    /// A rank's connection to the rendezvous ended without a goodbye (the process died, or
    /// its host became unreachable).
    #[error("rank {rank} died: {detail}")]
    RankDied {
        /// The rank.
        rank: usize,
        /// What the rendezvous saw.
        detail: String,
    },
    /// A rank gave up (its own error ended its part of the job) and said why.
    #[error("rank {rank} failed: {reason}")]
    RankFailed {
        /// The rank.
        rank: usize,
        /// Its error.
        reason: String,
    },
    /// A collective needs a rank that has already left the job.
    #[error("rank {rank} has left the job; collectives need every rank")]
    RankLeft {
        /// The rank.
        rank: usize,
    },
    /// Ranks called different collectives (or one with a different sequence number).
    #[error("collective mismatch: {0}")]
    CollectiveMismatch(String),
    /// The connection to the rendezvous (hosted by rank 0) ended.
    #[error("lost the rendezvous (rank 0): {0}")]
    RootLost(String),
    /// A bounded wait ran out.
    #[error("timed out after {waited:?} {what}")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// A malformed or unexpected message on the bootstrap channel.
    #[error("bootstrap protocol error: {0}")]
    Protocol(String),
    /// A contribution or message is larger than the bootstrap channel carries.
    #[error("{what} of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// What.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// Forming the braid endpoint to a peer failed.
    #[error("cannot connect to rank {peer} over rails {rails}: {error}")]
    Connect {
        /// The peer's rank.
        peer: usize,
        /// The rails tried.
        rails: String,
        /// braid's error (in the message, so not a `source()`).
        error: braid::Error,
    },
    /// Accepting or identifying the braid endpoints of peers failed.
    #[error("forming the mesh: {0}")]
    Mesh(String),
    /// Another braid error (listening, for instance).
    #[error(transparent)]
    Braid(#[from] braid::Error),
    /// An operating-system error.
    #[error("I/O error: {0}")]
    Io(std::io::Error),
}

// The cause is in the message, so it is not also the `source()`: a chain printed with
// `{:#}` would say it twice.
impl From<std::io::Error> for BootError {
    fn from(e: std::io::Error) -> Self {
        BootError::Io(e)
    }
}

//! Posting a list of operations at once (as `ibv_post_send` takes a chain of work
//! requests): one session lock and one flush for the whole list, and operations that
//! report only a failure (unsignaled), so the small-message rate is not bounded by a lock,
//! a system call and a completion per operation.

use std::fmt;

use braid_proto::Request;
use braid_proto::error::Error;
use braid_proto::mem::region::{RemoteKey, Sge, sgl_len};

use super::{Endpoint, post_error};

/// What one [`WorkRequest`] does; the same operations as [`Endpoint`]'s methods of the same
/// names.
#[derive(Debug, Clone, Copy)]
pub enum Op<'a> {
    /// [`Endpoint::write`], or with `imm` [`Endpoint::write_with_imm`].
    Write {
        /// The source.
        local: &'a [Sge],
        /// The peer's region.
        remote: &'a RemoteKey,
        /// Where in it.
        remote_offset: u64,
        /// Immediate data for the peer's receive completion.
        imm: Option<u32>,
    },
    /// [`Endpoint::read`].
    Read {
        /// The destination (needs `LOCAL_WRITE`).
        local: &'a [Sge],
        /// The peer's region.
        remote: &'a RemoteKey,
        /// Where in it.
        remote_offset: u64,
    },
    /// [`Endpoint::send`], or with `imm` [`Endpoint::send_with_imm`].
    Send {
        /// The message.
        local: &'a [Sge],
        /// Immediate data for the peer's receive completion.
        imm: Option<u32>,
    },
    /// [`Endpoint::fetch_add`].
    FetchAdd {
        /// The peer's region.
        remote: &'a RemoteKey,
        /// The 8-byte aligned word's offset in it.
        remote_offset: u64,
        /// What to add.
        add: u64,
    },
    /// [`Endpoint::compare_swap`].
    CompareSwap {
        /// The peer's region.
        remote: &'a RemoteKey,
        /// The 8-byte aligned word's offset in it.
        remote_offset: u64,
        /// The expected value.
        compare: u64,
        /// The value stored when the word equals `compare`.
        swap: u64,
    },
}

impl Op<'_> {
    /// The request, and the bytes it moves.
    fn request(&self) -> (Request, u64) {
        match *self {
            Op::Write {
                local,
                remote,
                remote_offset,
                imm,
            } => (
                Request::Write {
                    local: local.to_vec(),
                    rkey: remote.key,
                    addr: remote_offset,
                    imm,
                },
                sgl_len(local),
            ),
            Op::Read {
                local,
                remote,
                remote_offset,
            } => (
                Request::Read {
                    local: local.to_vec(),
                    rkey: remote.key,
                    addr: remote_offset,
                },
                sgl_len(local),
            ),
            Op::Send { local, imm } => (
                Request::Send {
                    local: local.to_vec(),
                    imm,
                },
                sgl_len(local),
            ),
            Op::FetchAdd {
                remote,
                remote_offset,
                add,
            } => (
                Request::FetchAdd {
                    rkey: remote.key,
                    addr: remote_offset,
                    add,
                },
                0,
            ),
            Op::CompareSwap {
                remote,
                remote_offset,
                compare,
                swap,
            } => (
                Request::CompareSwap {
                    rkey: remote.key,
                    addr: remote_offset,
                    compare,
                    swap,
                },
                0,
            ),
        }
    }
}

/// One operation of [`Endpoint::post_list`].
#[derive(Debug, Clone, Copy)]
pub struct WorkRequest<'a> {
    /// Carried in the operation's completion.
    pub wr_id: u64,
    /// The operation.
    pub op: Op<'a>,
    /// Report a successful completion (`IBV_SEND_SIGNALED`). Unsignaled, only a failure
    /// produces a completion; since operations complete in order, a later signaled
    /// success also says that every earlier unsignaled operation succeeded. Signal at least
    /// every so often: until an operation completes it holds a completion-queue slot and an
    /// outstanding-operation slot of the endpoint.
    pub signaled: bool,
}

/// A [`Endpoint::post_list`] that stopped at an operation it could not post.
#[derive(Debug)]
pub struct PostListError {
    /// The operations before this index were posted (and will complete as usual); this
    /// one and those after it were not.
    pub index: usize,
    /// Why the operation at `index` could not be posted.
    pub error: Error,
}

impl fmt::Display for PostListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work request {} not posted: {}", self.index, self.error)
    }
}

impl std::error::Error for PostListError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl Endpoint {
    /// Posts `list` in order under one lock of the endpoint and sends what fits with one
    /// flush: the frames of small operations leave together (up to 16 frames in one system
    /// call per rail). Each operation behaves as if posted by its own method, except that
    /// an unsignaled one completes silently when it succeeds (see
    /// [`WorkRequest::signaled`]). On an error the operations before it stay posted.
    pub fn post_list(&self, list: &[WorkRequest<'_>]) -> Result<(), PostListError> {
        let mut largest = 0u64;
        let mut failed = None;
        let mut posted = 0usize;
        {
            let mut s = self.shared.session.lock();
            for (index, wr) in list.iter().enumerate() {
                if let Err(error) = self.shared.send_cq.reserve() {
                    failed = Some(PostListError { index, error });
                    break;
                }
                let (req, len) = wr.op.request();
                if let Err(e) = s.post_with(wr.wr_id, req, wr.signaled) {
                    self.shared.send_cq.unreserve();
                    failed = Some(PostListError {
                        index,
                        error: post_error(&self.shared, e),
                    });
                    break;
                }
                posted += 1;
                largest = largest.max(len);
            }
        }
        if posted > 0 {
            self.push(largest);
        }
        failed.map_or(Ok(()), Err)
    }
}

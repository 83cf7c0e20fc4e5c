//! Round trips of every message kind, and decoding of hostile bytes.

use proptest::prelude::*;

use super::*;

fn caller() -> impl Strategy<Value = Caller> {
    (
        any::<u32>(),
        any::<u32>(),
        proptest::collection::vec(any::<u32>(), 0..=MAX_GROUPS),
    )
        .prop_map(|(uid, gid, groups)| Caller::new(uid, gid, groups))
}

fn node() -> impl Strategy<Value = NodeId> {
    (any::<u64>(), any::<u64>()).prop_map(|(id, generation)| NodeId { id, generation })
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        any::<u8>().prop_filter("no / or NUL", |b| *b != b'/' && *b != 0),
        1..40,
    )
    .prop_filter("not . or ..", |n| n != b"." && n != b"..")
}

fn path() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>().prop_filter("no NUL", |b| *b != 0), 1..100)
}

fn ts() -> impl Strategy<Value = Timestamp> {
    (any::<i64>(), 0u32..1_000_000_000).prop_map(|(secs, nanos)| Timestamp { secs, nanos })
}

fn attr() -> impl Strategy<Value = Attr> {
    (
        (any::<u64>(), any::<u64>(), any::<u64>()),
        (ts(), ts(), ts()),
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
        (any::<u32>(), any::<u32>()),
    )
        .prop_map(
            |(
                (ino, size, blocks),
                (atime, mtime, ctime),
                (mode, nlink, uid, gid),
                (rdev, blksize),
            )| {
                Attr {
                    ino,
                    size,
                    blocks,
                    atime,
                    mtime,
                    ctime,
                    mode,
                    nlink,
                    uid,
                    gid,
                    rdev,
                    blksize,
                }
            },
        )
}

fn creds() -> impl Strategy<Value = Creds> {
    (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(uid, gid, umask)| Creds {
        uid,
        gid,
        umask,
    })
}

fn timeset() -> impl Strategy<Value = TimeSet> {
    prop_oneof![
        Just(TimeSet::Omit),
        Just(TimeSet::Now),
        ts().prop_map(TimeSet::At)
    ]
}

fn setattr() -> impl Strategy<Value = SetAttr> {
    (
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<u64>()),
        timeset(),
        timeset(),
    )
        .prop_map(|(mode, uid, gid, size, atime, mtime)| SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        })
}

fn region() -> impl Strategy<Value = Option<RegionInfo>> {
    proptest::option::of(
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<bool>()).prop_map(
            |(key, len, generation, writable)| RegionInfo {
                key,
                len,
                generation,
                writable,
            },
        ),
    )
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (any::<u8>(), any::<bool>(), any::<u64>()).prop_map(|(version, d, session)| {
            Request::Hello {
                version,
                role: if d { Role::Data } else { Role::Meta },
                session,
            }
        }),
        (node(), name()).prop_map(|(parent, name)| Request::Lookup { parent, name }),
        (node(), path(), any::<bool>()).prop_map(|(parent, path, follow)| Request::Walk {
            parent,
            path,
            follow
        }),
        proptest::collection::vec((node(), any::<u64>()), 0..10)
            .prop_map(|items| Request::Forget { items }),
        node().prop_map(|node| Request::GetAttr { node }),
        (node(), any::<u64>(), setattr()).prop_map(|(node, fh, set)| Request::SetAttr {
            node,
            fh,
            set
        }),
        node().prop_map(|node| Request::ReadLink { node }),
        (node(), name(), any::<u32>(), any::<u32>(), creds()).prop_map(
            |(parent, name, mode, rdev, creds)| Request::Mknod {
                parent,
                name,
                mode,
                rdev,
                creds
            }
        ),
        (node(), name(), any::<u32>(), creds()).prop_map(|(parent, name, mode, creds)| {
            Request::Mkdir {
                parent,
                name,
                mode,
                creds,
            }
        }),
        (node(), name()).prop_map(|(parent, name)| Request::Unlink { parent, name }),
        (node(), name()).prop_map(|(parent, name)| Request::Rmdir { parent, name }),
        (node(), name(), path(), creds()).prop_map(|(parent, name, target, creds)| {
            Request::Symlink {
                parent,
                name,
                target,
                creds,
            }
        }),
        (node(), name(), node(), name(), any::<u32>()).prop_map(
            |(parent, name, new_parent, new_name, flags)| Request::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags
            }
        ),
        (node(), node(), name()).prop_map(|(node, new_parent, new_name)| Request::Link {
            node,
            new_parent,
            new_name
        }),
        (node(), any::<u32>()).prop_map(|(node, flags)| Request::Open { node, flags }),
        (node(), name(), any::<u32>(), any::<u32>(), creds()).prop_map(
            |(parent, name, mode, flags, creds)| Request::Create {
                parent,
                name,
                mode,
                flags,
                creds
            }
        ),
        any::<u64>().prop_map(|fh| Request::Release { fh }),
        (any::<u64>(), 0u32..8).prop_map(|(fh, flags)| Request::Commit { fh, flags }),
        (any::<u64>(), any::<u64>()).prop_map(|(fh, min_size)| Request::MapRegion { fh, min_size }),
        (any::<u64>(), any::<u64>()).prop_map(|(fh, upto)| Request::Landed { fh, upto }),
        (
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(fh, offset, data)| Request::Write { fh, offset, data }),
        node().prop_map(|node| Request::OpenDir { node }),
        (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(dh, offset, max_bytes)| {
            Request::ReadDir {
                dh,
                offset,
                max_bytes,
            }
        }),
        any::<u64>().prop_map(|dh| Request::ReleaseDir { dh }),
        Just(Request::StatFs),
        (any::<u64>(), proptest::collection::vec(any::<u8>(), 1..300)).prop_map(|(fh, data)| {
            Request::Append {
                fh,
                data,
                reserve: 0,
            }
        }),
        (any::<u64>(), 1u64..u64::MAX).prop_map(|(fh, reserve)| Request::Append {
            fh,
            data: Vec::new(),
            reserve
        }),
        (lock_request(), 0u8..3).prop_map(|(l, op)| match op {
            0 => Request::GetLock(l),
            1 => Request::SetLock(l),
            _ => Request::SetLockWait(l),
        }),
    ]
}

fn lock_range() -> impl Strategy<Value = LockRange> {
    (0u8..3, any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(k, a, b, pid)| LockRange {
        kind: [LockKind::Read, LockKind::Write, LockKind::Unlock][k as usize],
        start: a.min(b),
        end: a.max(b),
        pid,
    })
}

fn lock_request() -> impl Strategy<Value = LockRequest> {
    (any::<u64>(), any::<u64>(), lock_range()).prop_map(|(fh, owner, range)| LockRequest {
        fh,
        owner,
        range,
    })
}

fn entry() -> impl Strategy<Value = Entry> {
    (node(), attr()).prop_map(|(node, attr)| Entry { node, attr })
}

fn opened() -> impl Strategy<Value = Opened> {
    (any::<u64>(), attr(), region()).prop_map(|(fh, attr, region)| Opened { fh, attr, region })
}

fn reply() -> impl Strategy<Value = (Op, Reply)> {
    let dirent = (any::<u64>(), any::<u64>(), any::<u32>(), name()).prop_map(
        |(ino, next_offset, file_type, name)| DirEntry {
            ino,
            next_offset,
            file_type,
            name,
        },
    );
    prop_oneof![
        (
            any::<u8>(),
            entry(),
            any::<bool>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(
                |(version, root, read_only, session, max_outstanding, max_msg)| (
                    Op::Hello,
                    Reply::Hello(HelloReply {
                        version,
                        root,
                        read_only,
                        session,
                        max_outstanding,
                        max_msg
                    })
                )
            ),
        entry().prop_map(|e| (Op::Lookup, Reply::Entry(e))),
        entry().prop_map(|e| (Op::Symlink, Reply::Entry(e))),
        attr().prop_map(|a| (Op::GetAttr, Reply::Attr(a))),
        attr().prop_map(|a| (Op::Commit, Reply::Attr(a))),
        Just((Op::Rename, Reply::Empty)),
        path().prop_map(|p| (Op::ReadLink, Reply::Link(p))),
        opened().prop_map(|o| (Op::Open, Reply::Opened(o))),
        (entry(), opened(), attr()).prop_map(|(e, o, p)| (Op::Create, Reply::Created(e, o, p))),
        attr().prop_map(|a| (Op::Unlink, Reply::Attr(a))),
        (attr(), region())
            .prop_map(|(attr, region)| (Op::MapRegion, Reply::Mapped(Mapped { attr, region }))),
        (any::<u32>(), attr()).prop_map(|(n, a)| (Op::Write, Reply::Written(n, a))),
        any::<u64>().prop_map(|h| (Op::OpenDir, Reply::Handle(h))),
        (proptest::collection::vec(dirent, 0..20), any::<bool>())
            .prop_map(|(e, eof)| (Op::ReadDir, Reply::Dir(e, eof))),
        (any::<u64>(), attr()).prop_map(|(o, a)| (Op::Append, Reply::Appended(o, a))),
        lock_range().prop_map(|l| (Op::GetLock, Reply::Lock(l))),
        Just((Op::SetLockWait, Reply::Empty)),
        Just((
            Op::StatFs,
            Reply::StatFs(StatFs {
                blocks: 1,
                bfree: 2,
                bavail: 3,
                files: 4,
                ffree: 5,
                bsize: 4096,
                namelen: 255,
                frsize: 4096
            })
        )),
    ]
}

proptest! {
    #[test]
    fn requests_round_trip(id in any::<u64>(), who in caller(), req in request()) {
        let bytes = encode_request(id, &who, &req).unwrap();
        prop_assert_eq!(decode_request(&bytes).unwrap(), (id, who, req));
        // Every strict prefix is refused, never a panic.
        for cut in [0, 1, HEADER_LEN - 1, HEADER_LEN, bytes.len() - 1] {
            if cut < bytes.len() {
                prop_assert!(decode_request(&bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn replies_round_trip(id in any::<u64>(), (op, rep) in reply()) {
        let ok = Ok(rep);
        let bytes = encode_reply(id, op, &ok).unwrap();
        prop_assert_eq!(decode_reply(&bytes).unwrap(), (id, op, ok));
    }

    #[test]
    fn errors_round_trip(id in any::<u64>(), i in 0usize..Errno::KNOWN.len()) {
        let e = Err(Errno::KNOWN[i]);
        let bytes = encode_reply(id, Op::Lookup, &e).unwrap();
        prop_assert_eq!(bytes.len(), HEADER_LEN);
        prop_assert_eq!(decode_reply(&bytes).unwrap(), (id, Op::Lookup, e));
    }

    /// Arbitrary bytes behind a valid header: both decoders return, whatever the body.
    #[test]
    fn hostile_bodies_never_panic(op in 1u16..=30, reply in any::<bool>(), status in prop_oneof![Just(0u32), any::<u32>()], body in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut m = Vec::new();
        m.extend_from_slice(&MAGIC.to_le_bytes());
        m.push(VERSION);
        m.push(reply as u8);
        m.extend_from_slice(&op.to_le_bytes());
        m.extend_from_slice(&0u16.to_le_bytes());
        m.extend_from_slice(&7u64.to_le_bytes());
        m.extend_from_slice(&status.to_le_bytes());
        m.extend_from_slice(&(body.len() as u32).to_le_bytes());
        m.extend_from_slice(&body);
        let _ = decode_request(&m);
        let _ = decode_reply(&m);
    }

    /// Valid messages with one byte changed: decoding returns (error or a value), never panics.
    #[test]
    fn mutated_messages_never_panic(req in request(), pos in any::<usize>(), byte in any::<u8>()) {
        let mut bytes = encode_request(1, &Caller::default(), &req).unwrap();
        let i = pos % bytes.len();
        bytes[i] = byte;
        let _ = decode_request(&bytes);
        let _ = decode_reply(&bytes);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_request(&bytes);
        let _ = decode_reply(&bytes);
    }
}

#[test]
fn bad_names_are_refused() {
    let p = NodeId {
        id: 1,
        generation: 2,
    };
    for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
        let m = encode_request(
            1,
            &Caller::default(),
            &Request::Lookup {
                parent: p,
                name: bad.to_vec(),
            },
        )
        .unwrap();
        assert_eq!(decode_request(&m), Err(DecodeError::BadName), "{bad:?}");
    }
    let long = vec![b'x'; MAX_NAME + 1];
    let m = encode_request(
        1,
        &Caller::default(),
        &Request::Unlink {
            parent: p,
            name: long,
        },
    )
    .unwrap();
    assert!(matches!(
        decode_request(&m),
        Err(DecodeError::TooLong("name", 256))
    ));
    // A walk may hold slashes, but not NUL.
    let m = encode_request(
        1,
        &Caller::default(),
        &Request::Walk {
            parent: p,
            path: b"a/../b".to_vec(),
            follow: true,
        },
    )
    .unwrap();
    assert!(decode_request(&m).is_ok());
    let m = encode_request(
        1,
        &Caller::default(),
        &Request::Walk {
            parent: p,
            path: b"a\0".to_vec(),
            follow: true,
        },
    )
    .unwrap();
    assert_eq!(decode_request(&m), Err(DecodeError::BadName));
}

#[test]
fn header_checks() {
    let m = encode_request(9, &Caller::default(), &Request::StatFs).unwrap();
    assert_eq!(
        decode_request(&m).unwrap(),
        (9, Caller::default(), Request::StatFs)
    );
    let mut bad = m.clone();
    bad[0] ^= 1;
    assert!(matches!(
        decode_request(&bad),
        Err(DecodeError::BadMagic(_))
    ));
    let mut bad = m.clone();
    // Version 1 (before the create and unlink replies carried the parent's attributes),
    // and a future one.
    bad[2] = 1;
    assert_eq!(decode_request(&bad), Err(DecodeError::Version(1)));
    bad[2] = VERSION + 1;
    assert_eq!(decode_request(&bad), Err(DecodeError::Version(VERSION + 1)));
    let mut bad = m.clone();
    bad[4] = 99;
    assert_eq!(decode_request(&bad), Err(DecodeError::UnknownOp(99)));
    let mut bad = m.clone();
    bad.push(0);
    assert!(matches!(
        decode_request(&bad),
        Err(DecodeError::LengthMismatch { .. })
    ));
    // A request decoded as a reply and the other way round are refused.
    assert!(decode_reply(&m).is_err());
    let r = encode_reply(9, Op::StatFs, &Err(Errno::EIO)).unwrap();
    assert!(decode_request(&r).is_err());
    // A request with a status is refused.
    let mut bad = m;
    bad[16] = 1;
    assert!(decode_request(&bad).is_err());
}

#[test]
fn counts_larger_than_the_body_are_refused_before_allocating() {
    let mut m = encode_request(1, &Caller::default(), &Request::Forget { items: vec![] }).unwrap();
    // After the empty caller envelope (10 bytes).
    m[HEADER_LEN + 10..HEADER_LEN + 14].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode_request(&m), Err(DecodeError::Truncated));
    let mut r = encode_reply(1, Op::ReadDir, &Ok(Reply::Dir(vec![], true))).unwrap();
    r[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode_reply(&r), Err(DecodeError::Truncated));
}

#[test]
fn oversized_and_mismatched_encodings_fail() {
    // The largest caller envelope still leaves room for the largest inline write.
    let most = Caller::new(1, 2, (0..MAX_GROUPS as u32).collect());
    let data = vec![0u8; MAX_INLINE_WRITE];
    assert!(
        encode_request(
            1,
            &most,
            &Request::Write {
                fh: 1,
                offset: 0,
                data
            }
        )
        .is_ok()
    );
    let data = vec![0u8; MAX_INLINE_WRITE + 1];
    assert!(matches!(
        encode_request(
            1,
            &most,
            &Request::Write {
                fh: 1,
                offset: 0,
                data
            }
        ),
        Err(EncodeError::TooLarge(_))
    ));
    assert_eq!(
        encode_reply(1, Op::GetAttr, &Ok(Reply::Empty)),
        Err(EncodeError::Mismatch(Op::GetAttr))
    );
}

#[test]
fn unknown_status_decodes_as_eio() {
    let mut r = encode_reply(3, Op::GetAttr, &Err(Errno::ENOENT)).unwrap();
    r[16..20].copy_from_slice(&4242u32.to_le_bytes());
    assert_eq!(decode_reply(&r).unwrap(), (3, Op::GetAttr, Err(Errno::EIO)));
}

#[test]
fn caller_envelopes_with_too_many_groups_are_refused() {
    let mut m = encode_request(1, &Caller::new(5, 6, vec![7]), &Request::StatFs).unwrap();
    // The group count, right after uid and gid.
    m[HEADER_LEN + 8..HEADER_LEN + 10].copy_from_slice(&(MAX_GROUPS as u16 + 1).to_le_bytes());
    assert_eq!(
        decode_request(&m),
        Err(DecodeError::BadValue("group count", MAX_GROUPS as u64 + 1))
    );
    // A caller built with more groups sends the first MAX_GROUPS.
    let many = Caller::new(1, 1, (0..1000).collect());
    assert_eq!(many.groups.len(), MAX_GROUPS);
}

#[test]
fn appends_and_locks_refuse_inconsistent_bodies() {
    let both = Request::Append {
        fh: 1,
        data: vec![1],
        reserve: 5,
    };
    let m = encode_request(1, &Caller::default(), &both).unwrap();
    assert!(matches!(
        decode_request(&m),
        Err(DecodeError::BadValue("append reserve", 5))
    ));
    let neither = Request::Append {
        fh: 1,
        data: vec![],
        reserve: 0,
    };
    assert!(decode_request(&encode_request(1, &Caller::default(), &neither).unwrap()).is_err());
    let backwards = Request::SetLock(LockRequest {
        fh: 1,
        owner: 2,
        range: LockRange {
            kind: LockKind::Read,
            start: 10,
            end: 9,
            pid: 0,
        },
    });
    assert!(matches!(
        decode_request(&encode_request(1, &Caller::default(), &backwards).unwrap()),
        Err(DecodeError::BadValue("lock range end", 9))
    ));
}

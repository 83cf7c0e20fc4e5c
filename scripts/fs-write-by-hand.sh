#!/bin/bash
# Sequential 1 GiB writes with fsync through a braid-fs mount, by hand (issue 11's write
# goal): `braid fs serve` in host 1 and `braid fs mount` in host 0 of a 4 x 1 Gbit/s
# testbed, then per run `rm`, `sync`, drop the page cache, `dd if=/dev/zero of=MNT/f bs=1M
# count=1024 conv=fsync`; prints dd's rate and how long its fsync(2) took (strace -T).
# Several binaries alternate in turns of RUNS runs each, so an A/B shares its minutes.
# Needs root, fuse3 and strace; makes the testbed `fsw` and removes it, the export and
# the mount at the end.
# usage: scripts/fs-write-by-hand.sh RUNS TURNS BRAID [BRAID...]
set -euo pipefail
# The testbed's hosts talk over non-loopback addresses, which braid authenticates: one
# cluster secret for this run (or the caller's), read by both ends from the environment.
export BRAID_SECRET=${BRAID_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
RUNS=$1 TURNS=$2
shift 2
[ $# -ge 1 ] || { echo "usage: $0 RUNS TURNS BRAID [BRAID...]" >&2; exit 64; }
command -v strace >/dev/null || { echo "strace missing (apt-get install strace)" >&2; exit 1; }
"$1" testbed up --name fsw --hosts 2 --rail-count 4 >/dev/null
EXPORT=$(mktemp -d /var/tmp/fsw-export.XXXXXX) MNT=$(mktemp -d /tmp/fsw-mnt.XXXXXX)
TRACE=$(mktemp)
SP='' MP=''
stop() {
    [ -n "$MP" ] && { kill "$MP" 2>/dev/null || true; wait "$MP" 2>/dev/null || true; }
    mountpoint -q "$MNT" && fusermount3 -u "$MNT" 2>/dev/null || true
    [ -n "$SP" ] && { kill "$SP" 2>/dev/null || true; wait "$SP" 2>/dev/null || true; }
    SP='' MP=''
}
cleanup() {
    stop
    "$1" testbed down --name fsw >/dev/null 2>&1 || true
    rm -rf "$EXPORT" "$TRACE"
    rmdir "$MNT" 2>/dev/null || true
}
trap "cleanup $1" EXIT
LISTEN=198.18.0.2:18630,198.18.1.2:18630,198.18.2.2:18630,198.18.3.2:18630
RAILS=198.18.0.1=198.18.0.2:18630,198.18.1.1=198.18.1.2:18630,198.18.2.1=198.18.2.2:18630,198.18.3.1=198.18.3.2:18630
for turn in $(seq 1 "$TURNS"); do
    for B in "$@"; do
        ip netns exec fsw-h1 "$B" fs serve --export "$EXPORT" --listen "$LISTEN" --no-root-squash >/dev/null 2>&1 &
        SP=$!
        for _ in $(seq 100); do
            ip netns exec fsw-h1 ss -ltnH 'sport = :18630' | grep -q . && break
            sleep 0.1
        done
        # nsenter, not `ip netns exec`: that one gives the mount a mount namespace of its own.
        nsenter --net=/run/netns/fsw-h0 "$B" fs mount --rails "$RAILS" "$MNT" >/dev/null 2>&1 &
        MP=$!
        for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.1; done
        mountpoint -q "$MNT" || { echo "$B: the mount did not come up" >&2; exit 1; }
        for _ in $(seq 1 "$RUNS"); do
            rm -f "$MNT/f"
            sync
            echo 3 >/proc/sys/vm/drop_caches
            rate=$(strace -T -e trace=fsync -o "$TRACE" dd if=/dev/zero of="$MNT/f" bs=1M \
                count=1024 conv=fsync 2>&1 | tail -1 | awk '{print $(NF-1), $NF}')
            echo "turn $turn $B: $rate, fsync $(grep -o '<[0-9.]*>' "$TRACE" | tr -d '<>') s"
        done
        rm -f "$MNT/f"
        stop
    done
done

#!/bin/bash
# Writes through a braid-fs mount on a 4 x 1 Gbit/s testbed, for the checks in
# docs/FS-BENCH.md ("Writes: stalls at every growth and every new registration"):
#   series RUNS server|mount   RUNS 1 GiB `dd conv=fsync`s through one mount, each file
#                              removed afterwards on the server or through the mount
#   timeline                   one 1 GiB `dd conv=fsync`, with the server's receive rate on
#                              its rails every 50 ms
#   verify GIB                 GIB GiB of random data, compared (md5) as written, on the
#                              server and through the mount after dropping the page cache;
#                              prints the rails the client gave up
# Needs root, fuse3 and python3; makes the testbed `fsc` and removes it, the export and the
# mount at the end.
# usage: scripts/fs-write-checks.sh BRAID series RUNS server|mount
#        scripts/fs-write-checks.sh BRAID timeline
#        scripts/fs-write-checks.sh BRAID verify GIB
set -euo pipefail
# The testbed's hosts talk over non-loopback addresses, which braid authenticates: one
# cluster secret for this run (or the caller's), read by both ends from the environment.
export BRAID_SECRET=${BRAID_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
B=$1 MODE=$2
"$B" testbed up --name fsc --hosts 2 --rail-count 4 >/dev/null
EXPORT=$(mktemp -d /var/tmp/fsc-export.XXXXXX) MNT=$(mktemp -d /tmp/fsc-mnt.XXXXXX)
LOGS=$(mktemp -d)
SP='' MP=''
cleanup() {
    [ -n "$MP" ] && { kill "$MP" 2>/dev/null || true; wait "$MP" 2>/dev/null || true; }
    mountpoint -q "$MNT" && fusermount3 -u "$MNT" 2>/dev/null || true
    [ -n "$SP" ] && { kill "$SP" 2>/dev/null || true; wait "$SP" 2>/dev/null || true; }
    "$B" testbed down --name fsc >/dev/null 2>&1 || true
    rm -rf "$EXPORT" "$LOGS"
    rmdir "$MNT" 2>/dev/null || true
}
trap cleanup EXIT
LISTEN=198.18.0.2:18640,198.18.1.2:18640,198.18.2.2:18640,198.18.3.2:18640
RAILS=198.18.0.1=198.18.0.2:18640,198.18.1.1=198.18.1.2:18640,198.18.2.1=198.18.2.2:18640,198.18.3.1=198.18.3.2:18640
ip netns exec fsc-h1 "$B" fs serve --export "$EXPORT" --listen "$LISTEN" --no-root-squash >"$LOGS/serve" 2>&1 &
SP=$!
for _ in $(seq 100); do
    ip netns exec fsc-h1 ss -ltnH 'sport = :18640' | grep -q . && break
    sleep 0.1
done
# nsenter, not `ip netns exec`: that one gives the mount a mount namespace of its own.
nsenter --net=/run/netns/fsc-h0 "$B" fs mount --rails "$RAILS" "$MNT" >"$LOGS/mount" 2>&1 &
MP=$!
for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.1; done
mountpoint -q "$MNT" || { echo "the mount did not come up" >&2; exit 1; }
dd_rate() { tail -1 | awk '{print $(NF-1), $NF}'; }
case $MODE in
series)
    RUNS=$3 WHERE=$4
    for r in $(seq 1 "$RUNS"); do
        sync
        echo "run $r: $(dd if=/dev/zero of="$MNT/w-$r" bs=1M count=1024 conv=fsync 2>&1 | dd_rate)"
        if [ "$WHERE" = server ]; then rm -f "$EXPORT/w-$r"; else rm -f "$MNT/w-$r"; fi
    done
    ;;
timeline)
    sync
    echo 3 >/proc/sys/vm/drop_caches
    # The sampler stops after 4 s or 0.3 s without traffic once traffic has begun.
    ip netns exec fsc-h1 python3 - >"$LOGS/timeline" <<'PY' &
import time
def rx():
    t = 0
    for l in open('/proc/net/dev').read().splitlines()[2:]:
        name, rest = l.split(':', 1)
        if name.strip() != 'lo':
            t += int(rest.split()[0])
    return t
prev, t0, quiet, seen = rx(), time.time(), 0, False
while time.time() - t0 < 4 and quiet < 6:
    time.sleep(0.05)
    v = rx(); rate = (v - prev) / 0.05 / 1e6; prev = v
    seen |= rate > 1
    quiet = quiet + 1 if seen and rate <= 1 else 0
    print(f"{time.time() - t0:5.2f} s {rate:7.1f} MB/s")
PY
    S=$!
    dd if=/dev/zero of="$MNT/t" bs=1M count=1024 conv=fsync 2>&1 | dd_rate
    wait $S
    cat "$LOGS/timeline"
    ;;
verify)
    GIB=$3
    head -c $((64 << 20)) /dev/urandom >"$LOGS/src"
    stream() { for _ in $(seq 1 $((GIB * 16))); do cat "$LOGS/src"; done; }
    stream | dd of="$MNT/big" bs=1M iflag=fullblock conv=fsync 2>&1 | dd_rate
    want=$(stream | md5sum | cut -d' ' -f1)
    server=$(md5sum <"$EXPORT/big" | cut -d' ' -f1)
    echo 3 >/proc/sys/vm/drop_caches
    mount=$(md5sum <"$MNT/big" | cut -d' ' -f1)
    [ "$want" = "$server" ] && [ "$want" = "$mount" ] && echo "every byte equal" || {
        echo "DIFFERENT: written $want, server $server, mount $mount"
        exit 1
    }
    echo "rails the client gave up: $(grep -c 'rail failed' "$LOGS/mount" || true)"
    ;;
*)
    echo "unknown mode $MODE" >&2
    exit 64
    ;;
esac

#!/bin/bash
# 4 MiB writes over N unshaped testbed rails against N independent iperf3 pairs on the same
# addresses (issue 17's bandwidth goal), in alternation. braid runs twice per round: with
# bench's default buffers (one 4 MiB slot per write in flight, 64 MiB on each side, which
# stream through DRAM) and with `--slots 1` (one buffer re-sent, as ib_write_bw does and as
# each iperf3 client re-sends its one 128 KiB buffer, which stays in the caches). Needs root
# and iperf3; makes the testbed `bwi` and removes it at the end.
# usage: scripts/bw-vs-iperf3.sh [BRAID] [ROUNDS] [RAILS]
set -euo pipefail
# The testbed's hosts talk over non-loopback addresses, which braid authenticates: one
# cluster secret for this run (or the caller's), read by both ends from the environment.
export BRAID_SECRET=${BRAID_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
BRAID=${1:-target/release/braid}
ROUNDS=${2:-3}
N=${3:-4}
command -v iperf3 >/dev/null || { echo "iperf3 missing (apt-get install iperf3)" >&2; exit 1; }
"$BRAID" testbed up --name bwi --hosts 2 --rail-count "$N" --rate none >/dev/null
cleanup() { "$BRAID" testbed down --name bwi >/dev/null 2>&1 || true; }
trap cleanup EXIT
H0="ip netns exec bwi-h0"; H1="ip netns exec bwi-h1"
out=$(mktemp -d)
listen=$(seq 0 $((N - 1)) | sed 's/.*/198.18.&.2:19900/' | paste -sd,)
rails=$(seq 0 $((N - 1)) | sed 's/.*/198.18.&.1=198.18.&.2:19900/' | paste -sd,)
for r in $(seq 1 "$ROUNDS"); do
    for slots in default 1; do
        $H1 "$BRAID" bench server --listen "$listen" >/dev/null 2>&1 &
        sp=$!
        sleep 0.4
        extra=(); [ "$slots" = default ] || extra=(--slots "$slots")
        $H0 "$BRAID" bench write -s 4M -D 3 --rails "$rails" "${extra[@]}" \
            --json "$out/b-$slots.json" >/dev/null 2>&1 || echo "round $r: braid run failed" >&2
        wait $sp || true
    done
    pids=()
    for i in $(seq 0 $((N - 1))); do
        $H1 iperf3 -s -1 -B 198.18.$i.2 -p $((19910 + i)) >/dev/null 2>&1 &
        pids+=($!)
    done
    sleep 0.4
    cpids=()
    for i in $(seq 0 $((N - 1))); do
        $H0 iperf3 -c 198.18.$i.2 -B 198.18.$i.1 -p $((19910 + i)) -t 3 -J > "$out/i$i.json" 2>/dev/null &
        cpids+=($!)
    done
    wait "${cpids[@]}" || true
    wait "${pids[@]}" || true
    python3 - "$out" "$N" "$r" <<'PY'
import json, sys
d, n, r = sys.argv[1], int(sys.argv[2]), sys.argv[3]
b = {k: json.load(open(f"{d}/b-{k}.json"))["results"][0] for k in ("default", "1")}
ip = sum(json.load(open(f"{d}/i{i}.json"))["end"]["sum_received"]["bits_per_second"] / 8e6
         for i in range(n))
bd, b1 = b["default"]["bw_mb_s"], b["1"]["bw_mb_s"]
print(f"round {r}: braid {bd:.1f} MB/s ({b['default']['slots']} slots), {b1:.1f} MB/s (1 slot) "
      f"over {n} rails; {n} iperf3 pairs {ip:.1f} MB/s; braid/iperf3 {bd / ip:.3f} and {b1 / ip:.3f}")
PY
done
rm -rf "$out"

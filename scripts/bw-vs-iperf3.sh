#!/bin/bash
# 4 MiB writes over N unshaped testbed rails against N independent iperf3 pairs on the same
# addresses (issue 17's bandwidth goal), in alternation. Needs root and iperf3; makes the
# testbed `bwi` and removes it at the end.
# usage: scripts/bw-vs-iperf3.sh [BRAID] [ROUNDS] [RAILS]
set -euo pipefail
BRAID=${1:-target/release/braid}
ROUNDS=${2:-3}
N=${3:-4}
command -v iperf3 >/dev/null || { echo "iperf3 missing (apt-get install iperf3)" >&2; exit 1; }
"$BRAID" testbed up --name bwi --hosts 2 --rails "$N" --rate none >/dev/null
cleanup() { "$BRAID" testbed down --name bwi >/dev/null 2>&1 || true; }
trap cleanup EXIT
H0="ip netns exec bwi-h0"; H1="ip netns exec bwi-h1"
out=$(mktemp -d)
listen=$(seq 0 $((N - 1)) | sed 's/.*/198.18.&.2:19900/' | paste -sd,)
rails=$(seq 0 $((N - 1)) | sed 's/.*/198.18.&.1=198.18.&.2:19900/' | paste -sd,)
for r in $(seq 1 "$ROUNDS"); do
    $H1 "$BRAID" bench server --listen "$listen" >/dev/null 2>&1 &
    sp=$!
    sleep 0.4
    $H0 "$BRAID" bench write -s 4M -D 3 --rails "$rails" --json "$out/b.json" >/dev/null 2>&1 \
        || echo "round $r: braid run failed" >&2
    wait $sp || true
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
braid = json.load(open(f"{d}/b.json"))["results"][0]["bw_mb_s"]
ip = sum(json.load(open(f"{d}/i{i}.json"))["end"]["sum_received"]["bits_per_second"] / 8e6
         for i in range(n))
print(f"round {r}: braid {braid:.1f} MB/s over {n} rails; {n} iperf3 pairs {ip:.1f} MB/s; "
      f"braid/iperf3 {braid / ip:.3f}")
PY
done
rm -rf "$out"

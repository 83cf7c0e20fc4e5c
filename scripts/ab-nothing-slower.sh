#!/bin/bash
# Paired "nothing slower" check of two braid binaries, run in alternation A B A B ... so
# that load changes on a shared machine hit both: the demo's 4-rail RMA efficiency (4 MiB
# messages, shaped 4 x 1 Gbit/s), 4 MiB write bandwidth over 4 unshaped testbed rails, and
# 8 B write-with-immediate latency on loopback (busy polling). Run as root.
# usage: scripts/ab-nothing-slower.sh BRAID_A BRAID_B [ROUNDS]
set -u
# The testbed's hosts talk over non-loopback addresses, which braid authenticates: one
# cluster secret for this run (or the caller's), read by both ends from the environment.
export BRAID_SECRET=${BRAID_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
A=$1; B=$2; R=${3:-3}
# The loopback latency compares braid's TCP path: builds with same-host rails would
# otherwise use shared-memory rings there (BRAID_TRANSPORT=auto to measure those).
export BRAID_TRANSPORT=${BRAID_TRANSPORT:-tcp}
out=$(mktemp -d); trap 'rm -rf "$out"; "$A" testbed down --name abns >/dev/null 2>&1' EXIT
bin() { if [ "$1" = A ]; then echo "$A"; else echo "$B"; fi; }
for i in $(seq 1 "$R"); do
  for t in A B; do
    "$(bin $t)" demo --rail-count 4 -D 2 --sizes 4M --json "$out/d.json" --chart "$out/d.svg" >/dev/null 2>&1
    python3 -c "import json;r=json.load(open('$out/d.json'))['rows'];print('demo $i $t rma 4 rails efficiency', ['%.4f'%x['efficiency'] for x in r if x['mode']=='rma' and x['rails']==4][0])"
  done
done
"$A" testbed up --name abns --hosts 2 --rail-count 4 --unshaped >/dev/null
rails=198.18.0.1=198.18.0.2:18515,198.18.1.1=198.18.1.2:18515,198.18.2.1=198.18.2.2:18515,198.18.3.1=198.18.3.2:18515
for i in $(seq 1 "$R"); do
  for t in A B; do
    ip netns exec abns-h1 "$(bin $t)" bench server --listen 198.18.0.2,198.18.1.2,198.18.2.2,198.18.3.2 >/dev/null 2>&1 &
    s=$!
    for _ in $(seq 1 100); do ip netns exec abns-h1 ss -ltn | grep -q ':18515 ' && break; sleep 0.05; done
    ip netns exec abns-h0 "$(bin $t)" bench write --rails $rails -s 4M -D 5 --json - 2>/dev/null |
      python3 -c "import json,sys;print('unshaped $i $t MB/s %.1f'%json.load(sys.stdin)['results'][0]['bw_mb_s'])"
    wait $s
  done
done
port=47600
for i in $(seq 1 $((R * 3))); do
  for t in A B; do
    port=$((port + 1))
    "$(bin $t)" bench server --listen 127.0.0.1:$port >/dev/null 2>&1 &
    s=$!
    for _ in $(seq 1 100); do ss -ltn | grep -q ":$port " && break; sleep 0.05; done
    timeout 60 "$(bin $t)" bench write-lat --rails 127.0.0.1=127.0.0.1:$port -s 8 --iters 20000 --poll-only --json - 2>/dev/null |
      python3 -c "import json,sys;print('write-lat $i $t median us %.2f'%json.load(sys.stdin)['results'][0]['lat_us_median'])"
    wait $s
  done
done

#!/bin/bash
# Rails of different speeds: 4 MiB writes at depth 8 over a testbed whose rails have the given
# rates, N runs of D seconds, each beside the sum of the rails' framing limits.
#   scripts/rail-speeds.sh BRAID RATES [N] [D]     e.g. target/release/braid 1gbit,500kbit 5 10
# Makes testbed "rs" (198.18.0.0/15 addresses) and removes it afterwards. Prints one line per
# run: MB/s, percent of the sum, rails given up during the run (client, server), hedges.
set -u
# The testbed's hosts talk over non-loopback addresses, which braid authenticates: one
# cluster secret for this run (or the caller's), read by both ends from the environment.
export BRAID_SECRET=${BRAID_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}
B=$(realpath "$1"); RATES=$2; N=${3:-3}; D=${4:-10}
NAME=rs; PORT=18900
cleanup() { "$B" testbed down --name $NAME >/dev/null 2>&1; }
trap cleanup EXIT
"$B" testbed down --name $NAME >/dev/null 2>&1
"$B" testbed up --name $NAME --rates "$RATES" > /tmp/rs-testbed.txt || exit 1
SUM=$(grep -oE "framing limit [0-9.]+" /tmp/rs-testbed.txt | awk '{s += $3} END {printf "%.2f", s}')
RAILS=$(awk -v p=$PORT '$1 == "rail" && $3 == "h0-h1:" {printf "%s%s=%s:%d", (n++?",":""), $4, $8, p}' /tmp/rs-testbed.txt)
LISTEN=$(echo "$RAILS" | tr ',' '\n' | sed -E 's/.*=([0-9.]+):.*/\1/' | awk -v p=$PORT '{printf "%s%s:%d", (NR>1?",":""), $1, p}')
echo "rates $RATES: sum of framing limits $SUM MB/s; rails $RAILS"
for i in $(seq 1 "$N"); do
    P=$((PORT + i)); R=${RAILS//:$PORT/:$P}; L=${LISTEN//:$PORT/:$P}
    RUST_LOG=braid=info,braid_proto::proto::session::hedge=debug ip netns exec $NAME-h1 \
        "$B" bench server --listen "$L" > /tmp/rs-server.log 2>&1 &
    SP=$!
    sleep 0.5
    RUST_LOG=braid=info,braid_proto::proto::session::hedge=debug timeout $((D + 60)) \
        ip netns exec $NAME-h0 "$B" bench write --rails "$R" -s 4M -q 8 -D "$D" \
        --json /tmp/rs-$i.json > /tmp/rs-client.log 2>&1
    rc=$?
    wait $SP
    MBS=$(python3 -c "import json;print(round(json.load(open('/tmp/rs-$i.json'))['results'][0]['bw_mb_s'], 2))" 2>/dev/null || echo 0)
    strip() { sed 's/\x1b\[[0-9;]*m//g' "$1"; }
    echo "run $i: rc $rc, $MBS MB/s, $(python3 -c "print(f'{100*$MBS/$SUM:.1f}')")% of $SUM;" \
        "rails given up: client $(strip /tmp/rs-client.log | grep -c 'rail failed'), server $(strip /tmp/rs-server.log | grep -c 'rail failed');" \
        "hedges: client $(grep -c 'slow to ack' /tmp/rs-client.log), server $(grep -c 'slow to ack' /tmp/rs-server.log)"
done

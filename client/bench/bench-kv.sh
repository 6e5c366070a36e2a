#!/usr/bin/env bash
# client/bench/bench-kv.sh: `make bench-kv`, the server issue's single-client
# latency figures. For each protocol (NOPaxos, Multi-Paxos) and durability
# (async: acknowledged on replication; sync: durable in LMDB first) it starts
# a fresh 3-replica cluster on loopback over the TCP fabric, runs
# flowkv-bench-lat (client/bench/kv_lat.c: puts and gets of 64-byte values
# one at a time, against a raw TCP ping-pong of the same size in the same
# run), and stops the cluster. The last line is
#   bench-kv: nopaxos_put_ratio=.. multipaxos_put_ratio=.. rawnop_ratio=..
#             nopaxos_put_vs_rawnop=.. nopaxos_put_ratio_x=..  (async, medians)
# Target (issue): NOPaxos put median at most 3 times the raw TCP round trip.
# The ratios are over the raw round trip with both ends on one CPU;
# nopaxos_put_ratio_x is over the one across two CPUs (kv_lat.c says why
# both are measured).
# rawnop_ratio is the same pattern of messages with no work at all (see
# kv_lat.c): the part of the ratio this machine's scheduler and loopback
# cost before flowkv does anything.
#
#   client/bench/bench-kv.sh [BUILD_DIR]      OPS=2000 ROUNDS=5 by default
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/lib.sh" # fk_local_conf, fk_base_port
B=${1:-$root/build}
OPS=${OPS:-2000}
ROUNDS=${ROUNDS:-5}
WORK=$(mktemp -d /tmp/fkbenchkv.XXXXXX)
declare -a PIDS=()
stop_all() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    PIDS=()
}
trap 'stop_all; rm -rf "$WORK"' EXIT

# one PROTO DURABILITY: prints flowkv-bench-lat's table and keeps its last line.
one() {
    local d=$WORK/$1-$2
    fk_local_conf "$d/cluster.conf" "$1" "$2" "$(fk_base_port)"
    for i in 0 1 2; do
        FLOWKV_LOG=warn "$B/bin/flowkv-server" -c "$d/cluster.conf" -i $i --new-cluster \
            >"$d/log$i" 2>&1 &
        PIDS+=($!)
    done
    local up=0
    for _ in $(seq 60); do
        "$B/bin/flowkv" -c "$d/cluster.conf" -t 1000 put warmup x >/dev/null 2>&1 && { up=1; break; }
        sleep 0.5
    done
    echo "== $1, durability $2"
    if [ $up = 1 ]; then
        timeout 300 "$B/bin/flowkv-bench-lat" -c "$d/cluster.conf" -n "$OPS" -r "$ROUNDS" \
            -l "$1-$2" | tee "$d/out"
    else
        echo "bench-kv: the $1 cluster did not serve within 30 s: $(tail -n 2 "$d/log0")" >&2
    fi
    stop_all
    tail -n 1 "$d/out" 2>/dev/null >>"$WORK/lines"
}

for proto in nopaxos multipaxos; do
    for dur in async sync; do one $proto $dur; done
done
echo
cat "$WORK/lines"
field() { sed -n "s/^kv-lat: $1-async .* $2=\([0-9.]*\).*/\1/p" "$WORK/lines"; }
nr=$(field nopaxos put_ratio)
mr=$(field multipaxos put_ratio)
echo "bench-kv: nopaxos_put_ratio=${nr:-none} multipaxos_put_ratio=${mr:-none}" \
    "rawnop_ratio=$(field nopaxos rawnop_ratio) nopaxos_put_vs_rawnop=$(field nopaxos put_vs_rawnop)" \
    "nopaxos_put_ratio_x=$(field nopaxos put_ratio_x)"
[ -n "$nr" ] && [ -n "$mr" ]

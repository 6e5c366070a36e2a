#!/usr/bin/env bash
# ycsb/bench/repro-multihandle.sh: reproduction of a libflowkv/cluster hang
# with several client handles at once (found by issue 7's benchmark; not a
# test: it fails only some of the time).
#
#   repro-multihandle.sh [nopaxos|multipaxos] [THREADS] [PIPELINE] [TRIES]
#
# Each try: a fresh 3-replica cluster (flowkv-cluster.sh), 400 records of
# workload_dfi_b loaded by one handle, then 8,000 operations from THREADS
# (2) runner threads, i.e. THREADS libflowkv handles in one process, each
# with PIPELINE (1) requests in flight, bounded by 40 s; then `flowkv
# status` from a new client. Seen here (2 cores, 2026-11-22, built from
# commit e72e649): with 2 to 4 handles 3 runs of 7 stopped making progress
# (exit 124) and afterwards one or two replicas answered no new client
# ("unreachable") while their processes still ran; a stuck runner thread
# sat in flowkv_poll -> rejoin_due -> join -> flow_target_join ->
# flow__call, waiting FLOW__CALL_TIMEOUT_NS (5 s) for a replica that did
# not answer. One handle (THREADS=1, any pipeline) never hung. Built from
# the working tree at 08:58 (714fc58 plus uncommitted flows/ and server/
# changes) it hung 0 of 6 times (2 and 4 handles): perhaps fixed there.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
proto=${1:-multipaxos}
threads=${2:-2}
pipeline=${3:-1}
tries=${4:-3}
hung=0
for ((i = 1; i <= tries; i++)); do
    t=$(mktemp -d)
    conf=$("$here/flowkv-cluster.sh" start "$t" "$proto" 3) || {
        rm -rf "$t"
        exit 1
    }
    w=(-c "$conf" -P "$root/ycsb/workloads/workload_dfi_b" -p recordcount=400)
    timeout 30 "$root/build/bin/flowkv-ycsb" load "${w[@]}" -threads 1 >"$t/load.txt" 2>&1
    timeout 40 "$root/build/bin/flowkv-ycsb" run "${w[@]}" -threads "$threads" \
        -p "flowkv.pipeline=$pipeline" -p operationcount=8000 >"$t/run.txt" 2>&1
    rc=$?
    [ $rc -eq 124 ] && hung=$((hung + 1))
    echo "try $i: $proto threads=$threads pipeline=$pipeline: run exit $rc;" \
        "$(grep -E 'Throughput|Return=' "$t/run.txt" | tr '\n' ' ')"
    echo "  status: $(timeout 10 "$root/build/bin/flowkv" -c "$conf" -t 1000 status |
        awk 'NR > 1 { printf "r%s=%s ", $1, $2 }')"
    "$here/flowkv-cluster.sh" stop "$t" >/dev/null 2>&1
    rm -rf "$t"
done
echo "repro: $hung of $tries runs hung"

#!/usr/bin/env bash
# flowkv-ycsb against real 3-replica flowkv clusters on loopback (issue 7),
# once per protocol (NOPaxos, Multi-Paxos), each in a fresh temporary
# directory on free ports (ycsb/bench/flowkv-cluster.sh):
#   1. load workload_dfi_b (500 records of one 64-byte field) and run 2,000
#      operations with -db flowkv (the default) and -c <cluster file):
#      every operation returns OK;
#   2. a loaded record is in the cluster, readable with the flowkv CLI, in
#      ycsb_record's encoding (76 bytes, header "YR" 1 0, one field of 64);
#   3. (Multi-Paxos) records of three fields: partial updates (GET + CAS)
#      and scans longer than one flowkv scan, every operation OK;
#   4. YCSB's bundled workloads a to f, files unmodified (the default
#      record: 10 fields of 100 bytes, 1,048 bytes encoded): load, then
#      1,000 operations of each, every operation OK;
#   5. a record over flowkv's 1 MiB values is refused at open with a
#      message naming its size.
# The EXIT trap stops exactly the clusters it started and removes the
# directory; every flowkv-ycsb run is bounded by timeout.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/../lib.sh"
build=${BUILD:-build}
case "$build" in /*) ;; *) build=$root/$build ;; esac
ycsb=$build/bin/flowkv-ycsb
cli=$build/bin/flowkv
cluster=$root/ycsb/bench/flowkv-cluster.sh
tmp=$(mktemp -d)
trap 'for p in nopaxos multipaxos orphan; do [ -d "$tmp/$p" ] && "$cluster" stop "$tmp/$p" >/dev/null 2>&1; done; rm -rf "$tmp"' EXIT

for need in "$ycsb" "$cli" "$root/build/bin/flowkv-server"; do
    if [ ! -x "$need" ]; then
        t_fail "prerequisites" "$need is missing (make)"
        t_done
    fi
done

# Every program says its version (the one release number, fk_version.h).
v=$("$build/bin/flowkv-server" --version | awk '{ print $2 }')
vs="$("$ycsb" --version) / $("$cli" --version) / $("$build/bin/flowkv-sim" --version)"
[ "$vs" = "flowkv-ycsb $v / flowkv $v / flowkv-sim $v" ] && t_ok "--version: $vs" ||
    t_fail "--version of flowkv-ycsb, flowkv, flowkv-sim" "'$vs', server $v"

# phase NAME OPS ARGS...: one bounded flowkv-ycsb run, then its report.
phase() {
    local name=$1 want=$2
    shift 2
    if timeout --kill-after=5 60 "$ycsb" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"; then
        t_ycsb_all_ok "$name" "$tmp/$name.out" "$want"
    else
        t_fail "$name" "exit $?: $(tail -n 2 "$tmp/$name.err" | tr '\n' ' ')"
    fi
}

for proto in nopaxos multipaxos; do
    if ! conf=$("$cluster" start "$tmp/$proto" "$proto" 3 2>"$tmp/$proto.start"); then
        t_fail "$proto: 3-replica cluster starts" "$(tail -n 3 "$tmp/$proto.start" | tr '\n' ' ')"
        continue
    fi
    t_ok "$proto: 3-replica cluster starts"
    common=(-c "$conf" -P "$root/ycsb/workloads/workload_dfi_b" -p recordcount=500)
    # `load flowkv`: the binding named after the verb, as YCSB's `ycsb load DB`.
    phase "$proto-load" 500 load flowkv "${common[@]}" -threads 1 -p flowkv.pipeline=8
    phase "$proto-run" 2000 run "${common[@]}" -p operationcount=2000 -threads 1 \
        -p flowkv.pipeline=8

    key=$("$ycsb" load "${common[@]}" --dry-run | awk 'NR == 1 { print $3 }')
    # The CLI prints the value and a newline unless the value ends in one.
    timeout 20 "$cli" -c "$conf" get "$key" >"$tmp/$proto.val" 2>/dev/null
    head=$(head -c 12 "$tmp/$proto.val" | od -An -tx1 | tr -d ' \n')
    bytes=$(wc -c <"$tmp/$proto.val")
    last=$(tail -c 2 "$tmp/$proto.val" | od -An -tx1 | tr -d ' \n')
    if [ -n "$key" ] && [ "$head" = "595201000100000040000000" ] &&
        { [ "$bytes" -eq 77 ] || [ "$bytes" -eq 76 ] && [ "${last#??}" = 0a ]; }; then
        t_ok "$proto: record $key readable with the flowkv CLI, 76 bytes in ycsb_record encoding"
    else
        t_fail "$proto: record $key readable with the flowkv CLI" "header '$head', $bytes bytes"
    fi
    if [ "$proto" = multipaxos ]; then
        # Three fields per record: partial updates (GET + CAS) and scans of up
        # to 40 records (chains of 16-pair flowkv scans). The load rewrites
        # every key of the first load, so scans meet only records of this
        # shape.
        multi=(-c "$conf" -P "$root/ycsb/workloads/workloada" -p recordcount=1000
            -p operationcount=400 -p fieldcount=3 -p fieldlength=16 -p readproportion=0.4
            -p updateproportion=0.4 -p scanproportion=0.2 -p maxscanlength=40
            -p requestdistribution=uniform)
        phase "$proto-load-3f" 1000 load "${multi[@]}" -p flowkv.pipeline=16
        phase "$proto-run-3f" 400 run "${multi[@]}" -p flowkv.pipeline=4
    fi
    # The bundled workloads as YCSB ships them (their record counts, and a
    # pipeline); the load rewrites every key the runs above wrote, so the
    # scans of E meet only default records.
    phase "$proto-load-a" 1000 load -c "$conf" -P "$root/ycsb/workloads/workloada" \
        -p flowkv.pipeline=8
    for w in a b c d e f; do
        phase "$proto-run-$w" 1000 run -c "$conf" -P "$root/ycsb/workloads/workload$w" \
            -p flowkv.pipeline=8
    done
    "$cluster" stop "$tmp/$proto" >/dev/null 2>&1
    # Many requests in flight at once (4 threads of 64: 256 default records,
    # five kv.oum fragments each under NOPaxos, more than a replica's OUM
    # buffer of 1,024), on an async cluster: NOPaxos once took what
    # overflowed for dropped, and its gap agreements and the clients'
    # resends fed each other: no progress at all (nop_oum_intake).
    if conf=$(DURABILITY=async "$cluster" start "$tmp/$proto-async" "$proto" 3 2>"$tmp/$proto-async.start"); then
        phase "$proto-async-load-4x64" 6000 load -c "$conf" \
            -P "$root/ycsb/workloads/workloada" -p recordcount=6000 -threads 4 -p flowkv.pipeline=64
        # 256 handles from two threads (flowkv.handles: a thread serves
        # its handles with flowkv_poll_set), one request in flight each.
        phase "$proto-async-run-b-256-handles" 4000 run -c "$conf" \
            -P "$root/ycsb/workloads/workloadb" -p recordcount=6000 -p operationcount=4000 \
            -p writeallfields=true -threads 2 -p flowkv.handles=128 -p flowkv.pipeline=128
        "$cluster" stop "$tmp/$proto-async" >/dev/null 2>&1
    else
        t_fail "$proto: async 3-replica cluster starts" "$(tail -n 3 "$tmp/$proto-async.start" | tr '\n' ' ')"
    fi
done

# stop ends the replicas of a cluster whose run-local.sh died before the
# replicas file was written (a start that failed half way): they are found
# by their cluster file. They used to run on after the benchmark.
if conf=$("$cluster" start "$tmp/orphan" nopaxos 3 2>"$tmp/orphan.start"); then
    kill -KILL "$(cat "$tmp/orphan/pid")"
    rm -f "$tmp/orphan/replicas"
    sleep 0.5
    before=$(pgrep -f -- "$conf" | wc -l)
    "$cluster" stop "$tmp/orphan" >/dev/null 2>&1
    sleep 0.5
    after=$(pgrep -f -- "$conf" | wc -l)
    if [ "$before" -eq 3 ] && [ "$after" -eq 0 ]; then
        t_ok "stop ends the replicas of a run-local.sh that died (3 before, 0 after)"
    else
        t_fail "stop ends orphaned replicas" "replicas before stop $before, after $after"
        for p in $(pgrep -f -- "$conf"); do kill -KILL "$p" 2>/dev/null; done
    fi
else
    t_fail "stop ends orphaned replicas" "start: $(tail -n 3 "$tmp/orphan.start" | tr '\n' ' ')"
fi

# A record over flowkv's 1 MiB values (one field of 1 MiB: 1,048,588 bytes
# encoded): open refuses it before any request (no cluster needed).
out=$(timeout 20 "$ycsb" load -c "$tmp/none.conf" -P "$root/ycsb/workloads/workloada" \
    -p recordcount=10 -p fieldcount=1 -p fieldlength=1048576 2>&1)
rc=$?
if [ $rc -eq 1 ] && grep -q "1048588 bytes encoded" <<<"$out"; then
    t_ok "a 1,048,588-byte record is refused at open with its size"
else
    t_fail "a 1,048,588-byte record is refused at open" "exit $rc: $out"
fi

t_done

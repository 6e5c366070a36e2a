#!/usr/bin/env bash
# ycsb/bench/capacity.sh: flowkv at a million records (issue 24).
#
#   capacity.sh [-r RECORDS] [-o DIR] [-p PROTOCOLS] [-s STAGES]
#
# On 3-replica clusters on loopback, for each protocol (-p, default
# "multipaxos nopaxos"), async unless said, with YCSB's default record (10
# fields of 100 bytes, the bundled workloads'), by stage (-s, default
# "small restart big sync etcd"):
#   small:   with workload_dfi_b's 64-byte records: YCSB-B at RECORDS
#            against the peak at 5,000 records, same run (small_ratio);
#   restart: the 1,000-record baseline of `big`'s restart;
#   big:     load RECORDS (default 1,000,000) records, then workloads A to F
#            for 10 s each: throughput and each operation's p95; a
#            replica's anonymous resident memory (RssAnon) and data
#            directory; restart: a follower killed with SIGKILL right after
#            a YCSB-B run and started again, from exec to its "serving" log
#            line (the median of three), against the 1,000-record cluster
#            (restart_ratio); catch-up: a follower's data directory wiped
#            while YCSB-B runs, its transfer (its log line) against
#            mdb_copy of the leader's environment to the same disk, as the
#            same state per second: mdb_copy's time over the transfer's
#            (catchup_ratio; catchup_bytes_ratio: the transfer's MiB/s of
#            records over mdb_copy's MiB/s of file, below), how many
#            transfers it took, and the cluster's throughput meanwhile;
#   sync:    a cluster with sync durability (fsync before each
#            acknowledgement) running YCSB-B;
#   etcd:    the baseline, same records: etcd (3 members, through its gRPC
#            API, fsync as always, its backend quota raised to 8 GiB)
#            loaded and run the same way.
# Ends with one line, Multi-Paxos' figures unprefixed and NOPaxos' with
# nop_ (a figure whose stage did not run is 0):
#   capacity: load_ratio_etcd=X ycsbb_ratio_etcd=Y sync_ycsbb_ratio_etcd=S
#             rss_mib=Z restart_ratio=R catchup_ratio=C
#             catchup_bytes_ratio=CB records=N
#             load_ops=L ycsbb_ops=B etcd_load_ops=E etcd_ycsbb_ops=F
#             sync_ycsbb_ops=Z small_ratio=Q catchup_transfers=K
#             catchup_ycsbb_ops=T nop_load_ratio_etcd=... (the same for
#             NOPaxos)
# Every wait is bounded; every process started here is stopped by PID;
# each cluster's directory goes once measured (a million default records
# take about 2 GB a replica after a load at random, 1.3 GB after a transfer).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/tests/lib.sh"
. "$here/replicas.sh"
B=${BUILD:-$root/build}
# shellcheck disable=SC2034 # used by replicas.sh
SERVER=$B/bin/flowkv-server
CLI=$B/bin/flowkv
YCSB=$B/bin/flowkv-ycsb
WLS=$root/ycsb/workloads
WL=$WLS/workloadb # YCSB's default record; YCSB-B
records=1000000
out=$root/build/bench-capacity
protos="multipaxos nopaxos"
stages="small restart big sync etcd"
while getopts "r:o:p:s:" o; do
    case $o in
    p) protos=$OPTARG ;;
    s) stages=$OPTARG ;;
    r) records=$OPTARG ;;
    o) out=$OPTARG ;;
    *) echo "usage: capacity.sh [-r RECORDS] [-o DIR] [-p PROTOCOLS] [-s STAGES]" >&2; exit 2 ;;
    esac
done
rm -rf "$out"
mkdir -p "$out"
declare -A PID
cleanup() {
    for p in "${PID[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${PID[@]}"; do wait "$p" 2>/dev/null; done
    [ -d "$out/etcd" ] && "$here/etcd-cluster.sh" stop "$out/etcd" >/dev/null 2>&1
}
trap cleanup EXIT
export FLOWKV_LOG=info

leader_of() { "$CLI" -c "$1/cluster.conf" -t 1000 status 2>/dev/null | awk '$2 == "leader" { print $1; exit }'; }
# log_ns FILE TEXT: the time of the first log line with TEXT, in ns since the epoch.
log_ns() {
    local t
    t=$(grep -m1 -- "$2" "$1" | cut -d' ' -f1)
    [ -n "$t" ] && date -d "$t" +%s%N
}
wait_line() { # wait_line FILE TEXT SECONDS
    for _ in $(seq $(($3 * 10))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}

# The functions that start replicas run in this shell (never in $(...),
# which would lose their PIDs) and leave their figure in RESULT.

# p95s FILE: "OP p95_us" for each operation of a YCSB report.
p95s() {
    awk -F', ' '$2 == "95thPercentileLatency(us)" { gsub(/[][]/, "", $1); printf "%s%s %s", sep, $1, $3; sep = ", " }' "$1"
}

# cluster DIR N [DURABILITY [WORKLOAD]]: a fresh cluster holding N records
# of WORKLOAD's (default $WL); RESULT = the load's ops/s.
cluster() {
    local d=$1 n=$2
    fk_local_conf "$d/cluster.conf" "${PROTO:-multipaxos}" "${3:-async}" "$(fk_base_port)"
    for i in 0 1 2; do start "$d" $i --new-cluster; done
    serving "$d" || return 1
    timeout 1200 "$YCSB" load -c "$d/cluster.conf" -P "${4:-$WL}" -p recordcount="$n" -threads 1 \
        -p flowkv.pipeline=128 >"$d/load.txt" 2>&1
    RESULT=$(ops_of "$d/load.txt")
}
run_w() { # run_w DIR N SECONDS OUT [WORKLOAD]: ops/s of WORKLOAD (default $WL)
    timeout $(($3 + 60)) "$YCSB" run -c "$1/cluster.conf" -P "${5:-$WL}" -p recordcount="$2" \
        -threads 1 -p flowkv.pipeline=128 -p operationcount=0 -p maxexecutiontime="$3" >"$4" 2>&1
    ops_of "$4"
}
run_b() { run_w "$@"; } # run_b DIR N SECONDS OUT [WORKLOAD]: YCSB-B
# workloads DIR N KEY: workloads A to F, in YCSB's recommended order but
# for E last (its inserts, like D's, add records past the loaded ones),
# 10 s each; ops/s and p95s into F[KEY.w] and F[KEY.p95.w].
workloads() {
    local w
    for w in a b c f d e; do
        F[$3.$w]=$(run_w "$1" "$2" 10 "$1/run-$w.txt" "$WLS/workload$w")
        F[$3.p95.$w]=$(p95s "$1/run-$w.txt")
        echo "capacity: $3 workload $w: ${F[$3.$w]} ops/s, p95 ${F[$3.p95.$w]} us"
    done
}
# max_rss DIR: the largest anonymous resident memory of its replicas, MiB.
max_rss() {
    local r m=0
    for i in 0 1 2; do
        r=$(awk '/^RssAnon:/ { print int($2 / 1024) }' "/proc/${PID[$1.$i]}/status" 2>/dev/null)
        [ "${r:-0}" -gt "$m" ] && m=$r
    done
    echo "$m"
}
# catch_up DIR N: a follower's data directory wiped while YCSB-B runs 20 s;
# sets CU_LEADER, CU_FOLLOWER, CU_OPS (the cluster's ops/s meanwhile) and
# CU_XFER ("MiB s MiB/s" of the first transfer, from its log line).
catch_up() {
    local d=$1 ycsb
    CU_LEADER=$(leader_of "$d")
    CU_FOLLOWER=$(((${CU_LEADER:-0} + 2) % 3))
    run_b "$d" "$2" 20 "$d/catchup.txt" >/dev/null &
    ycsb=$!
    sleep 3
    stop "$d" "$CU_FOLLOWER" KILL
    rm -rf "$d/data$CU_FOLLOWER"
    : >"$d/log$CU_FOLLOWER"
    start "$d" "$CU_FOLLOWER"
    wait_line "$d/log$CU_FOLLOWER" "state transfer: complete" 120 || echo "capacity: no transfer completed in $d" >&2
    wait "$ycsb"
    CU_OPS=$(ops_of "$d/catchup.txt")
    CU_XFER=$(sed -n 's/.*state transfer: complete, \([0-9.]*\) MiB in .*, \([0-9.]*\) s (\([0-9.]*\) MiB\/s).*/\1 \2 \3/p' "$d/log$CU_FOLLOWER" | head -n 1)
}
drop() { # drop DIR: stops a cluster and frees its disk
    for i in 0 1 2; do stop "$1" $i TERM; done
    rm -rf "$1"/data*
}
# restart_ns DIR: a follower killed and started again, from exec to its
# "serving" log line (restored from disk, core started, network up; RESULT,
# ns): the median of three.
restart_ns() {
    local d=$1 l f t0 t1
    local -a t=()
    for _ in 1 2 3; do
        l=$(leader_of "$d")
        f=$(((${l:-0} + 1) % 3))
        stop "$d" $f KILL
        : >"$d/log$f"
        t0=$(date +%s%N)
        start "$d" $f
        wait_line "$d/log$f" " serving (" 60 || { echo "capacity: replica $f did not restart" >&2; return 1; }
        t1=$(log_ns "$d/log$f" " serving (")
        t+=($((t1 - t0)))
        serving "$d" || return 1
    done
    RESULT=$(printf '%s\n' "${t[@]}" | sort -n | sed -n 2p)
    echo "capacity: restarts of $d: ${t[*]} ns" >&2
}

want() { case " $stages " in *" $1 "*) return 0 ;; esac; return 1; }
declare -A F # every figure, by "protocol.name" (0 where a stage did not run)

# suite PROTOCOL: the flowkv stages for one protocol.
suite() {
    local p=$1 d x
    local dfi=$WLS/workload_dfi_b
    export PROTO=$p
    if want small; then
        echo "capacity: $p: 64-byte records, 5,000 and $records"
        d=$out/$p-small
        cluster "$d" 5000 async "$dfi" || return 1
        F[$p.small_ops]=$(run_b "$d" 5000 10 "$d/run.txt" "$dfi")
        drop "$d"
        d=$out/$p-dfi
        cluster "$d" "$records" async "$dfi" || return 1
        F[$p.dfi_ops]=$(run_b "$d" "$records" 10 "$d/run.txt" "$dfi")
        drop "$d"
    fi
    if want restart; then
        echo "capacity: $p: 1,000-record cluster (restart baseline)"
        d=$out/$p-tiny
        cluster "$d" 1000 || return 1
        run_b "$d" 1000 10 "$d/run.txt" >/dev/null # the same recent writes as the big one's
        restart_ns "$d" || return 1
        F[$p.tiny_ns]=$RESULT
        drop "$d"
    fi
    if want big; then
        echo "capacity: $p: $records records"
        d=$out/$p-big
        cluster "$d" "$records" || return 1
        F[$p.load]=$RESULT
        workloads "$d" "$records" "$p"
        F[$p.rss]=$(max_rss "$d")
        F[$p.disk]=$(du -sm "$d/data0" | cut -f1)
        if want restart; then
            restart_ns "$d" || return 1
            F[$p.big_ns]=$RESULT
            serving "$d" || return 1
        fi
        # Catch-up while YCSB-B runs, and mdb_copy of the leader's
        # environment. The first transfer, and how many it took: a
        # follower whose state lands behind every log it could be synced
        # from fetches again (README, Limits).
        catch_up "$d" "$records"
        F[$p.cu_ops]=$CU_OPS
        read -r F[$p.xmib] F[$p.xs] F[$p.xrate] <<<"${CU_XFER:-0 0 0}"
        F[$p.caught]=no
        for _ in $(seq 60); do
            "$CLI" -c "$d/cluster.conf" -t 1000 put probe y >/dev/null 2>&1
            x=$("$CLI" -c "$d/cluster.conf" -t 1000 status 2>/dev/null | awk 'NR > 1 { print $7 }' | sort -u | wc -l)
            [ "$x" = 1 ] && { F[$p.caught]=yes; break; }
            sleep 0.5
        done
        # Counted once it caught up: a refetch may end after the YCSB run.
        F[$p.xfers]=$(grep -c "state transfer: complete" "$d/log$CU_FOLLOWER")
        local t0 t1
        t0=$(date +%s%N)
        mdb_copy "$d/data$CU_LEADER" "$out/copy" 2>/dev/null ||
            { mkdir -p "$out/copy" && mdb_copy "$d/data$CU_LEADER" "$out/copy"; }
        sync
        t1=$(date +%s%N)
        F[$p.copy_mib]=$(du -sm "$out/copy" | cut -f1)
        F[$p.copy_rate]=$(awk -v m="${F[$p.copy_mib]}" -v ns=$((t1 - t0)) 'BEGIN { printf "%.1f", m / (ns / 1e9) }')
        F[$p.copy_s]=$(awk -v ns=$((t1 - t0)) 'BEGIN { printf "%.2f", ns / 1e9 }')
        rm -rf "$out/copy"
        drop "$d"
    fi
    if want sync; then
        echo "capacity: $p: $records records, sync durability"
        d=$out/$p-sync
        cluster "$d" "$records" sync || return 1
        F[$p.sync_ops]=$(run_b "$d" "$records" 10 "$d/run.txt")
        drop "$d"
    fi
}

for p in $protos; do
    suite "$p" || exit 1
done

# etcd, same records, loaded with two threads of 64 in flight, flowkv with
# one thread of 128 (libflowkv's most for one handle): the same depth. A
# second flowkv thread gave it nothing more, the cluster's two cores being
# busy, while etcd waits on its fsyncs and gains from it; at 64 in flight
# flowkv loaded a million records 10-25% slower (2026-11-27: Multi-Paxos
# 35k against 39-44k ops/s). Then each workload with one thread of 128,
# as flowkv, and the best of that and 64 threads of one, YCSB's own model.
if want etcd; then
    echo "capacity: etcd, $records records"
    ecd=$out/etcd
    ep=$(ETCD_QUOTA_BYTES=$((8 << 30)) "$here/etcd-cluster.sh" start "$ecd" 3) || exit 1
    ebase=(-db etcd -p "etcd.endpoints=$ep" -p recordcount="$records")
    timeout 1800 "$YCSB" load "${ebase[@]}" -P "$WL" -threads 2 -p flowkv.pipeline=64 >"$ecd/load.txt" 2>&1
    F[etcd.load]=$(ops_of "$ecd/load.txt")
    for w in a b c f d e; do
        F[etcd.$w]=0
        for cfg in "1 128" "64 1"; do
            read -r t n <<<"$cfg"
            timeout 120 "$YCSB" run "${ebase[@]}" -P "$WLS/workload$w" -threads "$t" \
                -p flowkv.pipeline="$n" -p operationcount=0 -p maxexecutiontime=10 \
                >"$ecd/run-$w-$t.txt" 2>&1
            o=$(ops_of "$ecd/run-$w-$t.txt")
            if [ "${o:-0}" -gt "${F[etcd.$w]}" ]; then
                F[etcd.$w]=$o
                F[etcd.p95.$w]=$(p95s "$ecd/run-$w-$t.txt")
            fi
        done
        echo "capacity: etcd workload $w: ${F[etcd.$w]} ops/s, p95 ${F[etcd.p95.$w]:-} us"
    done
    F[etcd.disk]=$(du -sm "$ecd/m0" | cut -f1)
    "$here/etcd-cluster.sh" stop "$ecd" >/dev/null 2>&1
    rm -rf "$ecd"/m*/
fi

f() { echo "${F[$1]:-0}"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b ? a / b : 0 }'; }
echo "capacity: YCSB's default record (1,048 bytes), $records records, 3 replicas"
printf 'capacity: %-10s %10s' system load_ops/s
for w in a b c d e f; do printf ' %10s' "$w"; done
echo
for s in $protos etcd; do
    printf 'capacity: %-10s %10s' "$s" "$(f "$s.load")"
    for w in a b c d e f; do printf ' %10s' "$(f "$s.$w")"; done
    echo
done
for w in a b c d e f; do
    printf 'capacity: workload %s p95 (us):' "$w"
    for s in $protos etcd; do printf ' %s %s;' "$s" "${F[$s.p95.$w]:-}"; done
    echo
done
line="capacity:"
for p in $protos; do
    k=""
    [ "$p" = nopaxos ] && k=nop_
    echo "capacity: $p: replica anonymous memory $(f "$p.rss") MiB, data directory $(f "$p.disk") MiB (etcd member $(f etcd.disk) MiB)"
    echo "capacity: $p: restart $(($(f "$p.big_ns") / 1000000)) ms at $records records, $(($(f "$p.tiny_ns") / 1000000)) ms at 1,000"
    echo "capacity: $p: catch-up $(f "$p.xmib") MiB in $(f "$p.xs") s = $(f "$p.xrate") MiB/s (the first of $(f "$p.xfers") transfers; caught up after the run: ${F[$p.caught]:-no}); mdb_copy $(f "$p.copy_mib") MiB in $(f "$p.copy_s") s = $(f "$p.copy_rate") MiB/s; YCSB-B meanwhile $(f "$p.cu_ops") ops/s"
    echo "capacity: $p: sync durability YCSB-B $(f "$p.sync_ops") ops/s; etcd (gRPC, fsync) load $(f etcd.load) ops/s, YCSB-B $(f etcd.b) ops/s"
    echo "capacity: $p: 64-byte records: YCSB-B $(f "$p.dfi_ops") ops/s at $records, $(f "$p.small_ops") at 5,000"
    line+=" ${k}load_ratio_etcd=$(ratio "$(f "$p.load")" "$(f etcd.load)")"
    line+=" ${k}ycsbb_ratio_etcd=$(ratio "$(f "$p.b")" "$(f etcd.b)")"
    line+=" ${k}sync_ycsbb_ratio_etcd=$(ratio "$(f "$p.sync_ops")" "$(f etcd.b)")"
    line+=" ${k}rss_mib=$(f "$p.rss") ${k}restart_ratio=$(ratio "$(f "$p.big_ns")" "$(f "$p.tiny_ns")")"
    # The same state per second: the transfer sends the records (about
    # 1.03 GiB at a million default records) while mdb_copy copies the
    # environment's pages, about half full after a load at random (about
    # 2 GiB, `mdb_copy -c` as much), so MiB/s against MiB/s measured the
    # pages' fill, not the speed (catchup_bytes_ratio keeps that figure).
    line+=" ${k}catchup_ratio=$(ratio "$(f "$p.copy_s")" "$(f "$p.xs")")"
    line+=" ${k}catchup_bytes_ratio=$(ratio "$(f "$p.xrate")" "$(f "$p.copy_rate")")"
    [ -z "$k" ] && line+=" records=$records"
    line+=" ${k}load_ops=$(f "$p.load") ${k}ycsbb_ops=$(f "$p.b")"
    [ -z "$k" ] && line+=" etcd_load_ops=$(f etcd.load) etcd_ycsbb_ops=$(f etcd.b)"
    line+=" ${k}sync_ycsbb_ops=$(f "$p.sync_ops") ${k}small_ratio=$(ratio "$(f "$p.dfi_ops")" "$(f "$p.small_ops")")"
    line+=" ${k}catchup_transfers=$(f "$p.xfers") ${k}catchup_ycsbb_ops=$(f "$p.cu_ops")"
done
echo "$line"

#!/usr/bin/env bash
# ycsb/bench/capacity.sh: Multi-Paxos at a million records (issue 24, the
# part that works today: the state in LMDB, transfers in chunks).
#
#   capacity.sh [-r RECORDS] [-o DIR]
#
# On 3-replica async Multi-Paxos clusters on loopback, with workload_dfi_b's
# 64-byte records (YCSB's default record needs values over 1,024 bytes,
# which this version refuses: README, Limits):
#   - load RECORDS (default 1,000,000) records, then YCSB-B for 10 s; the
#     same at 5,000 records, same run: the ratio of the two peaks;
#   - a replica's anonymous resident memory (RssAnon) and data directory;
#   - restart: a follower killed with SIGKILL right after a YCSB-B run and
#     started again, from exec to its "serving" log line (the median of
#     three), at RECORDS against a 1,000-record cluster (restart_ratio);
#   - catch-up: a follower's data directory wiped while YCSB-B runs; its
#     transfer rate (its log line) against mdb_copy of the leader's
#     environment to the same disk (catchup_ratio), and the cluster's
#     throughput meanwhile.
#   - the baselines, same records: etcd (3 members, through its gRPC API,
#     fsync as always) loaded and run the same way, and a Multi-Paxos
#     cluster with sync durability (fsync before each acknowledgement).
# Ends with one line:
#   capacity: records=N load_ops=L ycsbb_ops=Y ycsbb_5k_ops=S small_ratio=Y/S
#             rss_mib=M restart_ratio=R catchup_ratio=C catchup_transfers=K
#             catchup_ycsbb_ops=T etcd_load_ops=E etcd_ycsbb_ops=F
#             load_ratio_etcd=L/E ycsbb_ratio_etcd=Y/F sync_ycsbb_ops=Z
#             sync_ycsbb_ratio_etcd=Z/F
# YCSB's default record, NOPaxos and workloads A-F are not in it yet.
# Every wait is bounded; every process started here is stopped by PID.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/tests/lib.sh"
B=${BUILD:-$root/build}
SERVER=$B/bin/flowkv-server
CLI=$B/bin/flowkv
YCSB=$B/bin/flowkv-ycsb
WL=$root/ycsb/workloads/workload_dfi_b
records=1000000
out=$root/build/bench-capacity
while getopts "r:o:" o; do
    case $o in
    r) records=$OPTARG ;;
    o) out=$OPTARG ;;
    *) echo "usage: capacity.sh [-r RECORDS] [-o DIR]" >&2; exit 2 ;;
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

start() { # start DIR ID [flags]
    local d=$1 i=$2
    shift 2
    "$SERVER" -c "$d/cluster.conf" -i "$i" -m off "$@" >>"$d/log$i" 2>&1 &
    PID[$d.$i]=$!
}
stop() { # stop DIR ID SIGNAL (bounded 5 s, then KILL)
    local p=${PID[$1.$2]:-}
    [ -n "$p" ] || return 0
    kill -"$3" "$p" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    unset "PID[$1.$2]"
}
leader_of() { "$CLI" -c "$1/cluster.conf" -t 1000 status 2>/dev/null | awk '$2 == "leader" { print $1; exit }'; }
serving() {
    for _ in $(seq 60); do
        "$CLI" -c "$1/cluster.conf" -t 1000 put probe x >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "capacity: the cluster in $1 does not serve" >&2
    return 1
}
ops_of() { awk -F', ' '$1=="[OVERALL]" && $2=="Throughput(ops/sec)" {printf "%.0f", $3}' "$1"; }
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

# cluster DIR N [DURABILITY]: a fresh cluster holding N records; RESULT =
# the load's ops/s.
cluster() {
    local d=$1 n=$2
    fk_local_conf "$d/cluster.conf" multipaxos "${3:-async}" "$(fk_base_port)"
    for i in 0 1 2; do start "$d" $i --new-cluster; done
    serving "$d" || return 1
    timeout 900 "$YCSB" load -c "$d/cluster.conf" -P "$WL" -p recordcount="$n" -threads 1 \
        -p flowkv.pipeline=64 >"$d/load.txt" 2>&1
    RESULT=$(ops_of "$d/load.txt")
}
run_b() { # run_b DIR N SECONDS OUT
    timeout $(($3 + 60)) "$YCSB" run -c "$1/cluster.conf" -P "$WL" -p recordcount="$2" -threads 1 \
        -p flowkv.pipeline=128 -p operationcount=0 -p maxexecutiontime="$3" >"$4" 2>&1
    ops_of "$4"
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

echo "capacity: small cluster (5,000 records)"
small=$out/small
cluster "$small" 5000 || exit 1
small_ops=$(run_b "$small" 5000 10 "$small/run.txt")
for i in 0 1 2; do stop "$small" $i TERM; done

echo "capacity: 1,000-record cluster (restart baseline)"
tiny=$out/tiny
cluster "$tiny" 1000 || exit 1
run_b "$tiny" 1000 10 "$tiny/run.txt" >/dev/null # the same recent writes as the big one's
restart_ns "$tiny" || exit 1
tiny_ns=$RESULT
for i in 0 1 2; do stop "$tiny" $i TERM; done

echo "capacity: $records records"
big=$out/big
cluster "$big" "$records" || exit 1
load_ops=$RESULT
big_ops=$(run_b "$big" "$records" 10 "$big/run.txt")
rss=0
for i in 0 1 2; do
    r=$(awk '/^RssAnon:/ { print int($2 / 1024) }' "/proc/${PID[$big.$i]}/status" 2>/dev/null)
    [ "${r:-0}" -gt "$rss" ] && rss=$r
done
disk=$(du -sm "$big/data0" | cut -f1)
restart_ns "$big" || exit 1
big_ns=$RESULT
serving "$big" || exit 1

# Catch-up while YCSB-B runs, and mdb_copy of the leader's environment.
l=$(leader_of "$big")
f=$(((${l:-0} + 2) % 3))
run_b "$big" "$records" 20 "$big/catchup.txt" >/dev/null &
ycsb=$!
sleep 3
stop "$big" $f KILL
rm -rf "$big/data$f"
: >"$big/log$f"
start "$big" $f
wait_line "$big/log$f" "state transfer: complete" 120 || echo "capacity: no transfer completed" >&2
wait "$ycsb"
catch_ops=$(ops_of "$big/catchup.txt")
# The first transfer (the recovery's, under load) and how many followed:
# a follower that falls more than the leader's log window behind while a
# transfer runs fetches the state again (README, Limits).
xfer=$(sed -n 's/.*state transfer: complete, \([0-9.]*\) MiB in .*, \([0-9.]*\) s (\([0-9.]*\) MiB\/s).*/\1 \2 \3/p' "$big/log$f" | head -n 1)
xfers=$(grep -c "state transfer: complete" "$big/log$f")
caught=no
for _ in $(seq 60); do
    "$CLI" -c "$big/cluster.conf" -t 1000 put probe y >/dev/null 2>&1
    c=$("$CLI" -c "$big/cluster.conf" -t 1000 status 2>/dev/null | awk 'NR > 1 { print $7 }' | sort -u | wc -l)
    [ "$c" = 1 ] && { caught=yes; break; }
    sleep 0.5
done
t0=$(date +%s%N)
mdb_copy "$big/data$l" "$out/copy" 2>/dev/null || { mkdir -p "$out/copy" && mdb_copy "$big/data$l" "$out/copy"; }
sync
t1=$(date +%s%N)
copy_mib=$(du -sm "$out/copy" | cut -f1)
copy_rate=$(awk -v m="$copy_mib" -v ns=$((t1 - t0)) 'BEGIN { printf "%.1f", m / (ns / 1e9) }')
for i in 0 1 2; do stop "$big" $i TERM; done

# Sync durability, same records.
echo "capacity: $records records, sync durability"
syncd=$out/sync
cluster "$syncd" "$records" sync || exit 1
sync_ops=$(run_b "$syncd" "$records" 10 "$syncd/run.txt")
for i in 0 1 2; do stop "$syncd" $i TERM; done

# etcd, same records, loaded and run as flowkv is (two threads of 64 in
# flight; then one thread of 128, and the best of that and 64 threads of
# one, YCSB's own model).
echo "capacity: etcd, $records records"
ecd=$out/etcd
ep=$("$here/etcd-cluster.sh" start "$ecd" 3) || exit 1
ebase=(-db etcd -P "$WL" -p "etcd.endpoints=$ep" -p recordcount="$records")
timeout 1200 "$YCSB" load "${ebase[@]}" -threads 2 -p flowkv.pipeline=64 >"$ecd/load.txt" 2>&1
etcd_load=$(ops_of "$ecd/load.txt")
etcd_ops=0
for cfg in "1 128" "64 1"; do
    read -r t p <<<"$cfg"
    timeout 120 "$YCSB" run "${ebase[@]}" -threads "$t" -p flowkv.pipeline="$p" -p operationcount=0 \
        -p maxexecutiontime=10 >"$ecd/run-$t.txt" 2>&1
    o=$(ops_of "$ecd/run-$t.txt")
    [ "${o:-0}" -gt "$etcd_ops" ] && etcd_ops=$o
done
"$here/etcd-cluster.sh" stop "$ecd" >/dev/null 2>&1

read -r xmib xs xrate <<<"${xfer:-0 0 0}"
echo "capacity: load $load_ops ops/s; YCSB-B $big_ops ops/s at $records records, $small_ops at 5,000"
echo "capacity: replica anonymous memory $rss MiB, data directory $disk MiB"
echo "capacity: restart $((big_ns / 1000000)) ms at $records records, $((tiny_ns / 1000000)) ms at 1,000"
echo "capacity: etcd (gRPC, fsync) load $etcd_load ops/s, YCSB-B $etcd_ops ops/s; flowkv sync YCSB-B $sync_ops ops/s"
echo "capacity: catch-up $xmib MiB in $xs s = $xrate MiB/s (the first of $xfers transfers; caught up after the run: $caught); mdb_copy $copy_mib MiB at $copy_rate MiB/s; YCSB-B meanwhile $catch_ops ops/s"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b ? a / b : 0 }'; }
printf 'capacity: records=%s load_ops=%s ycsbb_ops=%s ycsbb_5k_ops=%s small_ratio=%s rss_mib=%s restart_ratio=%s catchup_ratio=%s catchup_transfers=%s catchup_ycsbb_ops=%s etcd_load_ops=%s etcd_ycsbb_ops=%s load_ratio_etcd=%s ycsbb_ratio_etcd=%s sync_ycsbb_ops=%s sync_ycsbb_ratio_etcd=%s\n' \
    "$records" "$load_ops" "$big_ops" "$small_ops" \
    "$(awk -v a="$big_ops" -v b="$small_ops" 'BEGIN { printf "%.2f", b ? a / b : 0 }')" "$rss" \
    "$(awk -v a="$big_ns" -v b="$tiny_ns" 'BEGIN { printf "%.2f", b ? a / b : 0 }')" \
    "$(awk -v a="$xrate" -v b="$copy_rate" 'BEGIN { printf "%.2f", b ? a / b : 0 }')" "$xfers" "$catch_ops" \
    "$etcd_load" "$etcd_ops" "$(ratio "$load_ops" "$etcd_load")" "$(ratio "$big_ops" "$etcd_ops")" \
    "$sync_ops" "$(ratio "$sync_ops" "$etcd_ops")"

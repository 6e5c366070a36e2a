#!/usr/bin/env bash
# ycsb/bench/capacity.sh: flowkv at a million records (issue 24).
#
#   capacity.sh [-r RECORDS] [-o DIR]
#
# On 3-replica clusters on loopback (Multi-Paxos, async unless said), with
# YCSB's default record (10 fields of 100 bytes, the bundled workloads'):
#   - load RECORDS (default 1,000,000) records, then workloads A to F for
#     10 s each: throughput and each operation's p95;
#   - a replica's anonymous resident memory (RssAnon) and data directory;
#   - restart: a follower killed with SIGKILL right after a YCSB-B run and
#     started again, from exec to its "serving" log line (the median of
#     three), at RECORDS against a 1,000-record cluster (restart_ratio);
#   - catch-up: a follower's data directory wiped while YCSB-B runs; its
#     transfer rate (its log line) against mdb_copy of the leader's
#     environment to the same disk (catchup_ratio), and the cluster's
#     throughput meanwhile;
#   - with workload_dfi_b's 64-byte records: YCSB-B at RECORDS against the
#     peak at 5,000 records, same run (small_ratio);
#   - the baselines, same records: etcd (3 members, through its gRPC API,
#     fsync as always, its backend quota raised to 8 GiB) loaded and run
#     the same way, and a cluster with sync durability (fsync before each
#     acknowledgement) running YCSB-B.
#   - NOPaxos, async, the same records: load, workloads A to F, a
#     replica's anonymous memory, and a wiped follower's catch-up.
# Ends with one line:
#   capacity: load_ratio_etcd=X ycsbb_ratio_etcd=Y sync_ycsbb_ratio_etcd=S
#             rss_mib=Z restart_ratio=R catchup_ratio=C records=N
#             load_ops=L ycsbb_ops=B etcd_load_ops=E etcd_ycsbb_ops=F
#             sync_ycsbb_ops=Z small_ratio=Q catchup_transfers=K
#             catchup_ycsbb_ops=T nop_load_ratio_etcd=X2
#             nop_ycsbb_ratio_etcd=Y2 nop_rss_mib=Z2 nop_catchup_ratio=C2
# Every wait is bounded; every process started here is stopped by PID;
# each cluster's directory goes once measured (a million default records
# take about 1.3 GB a replica).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/tests/lib.sh"
B=${BUILD:-$root/build}
SERVER=$B/bin/flowkv-server
CLI=$B/bin/flowkv
YCSB=$B/bin/flowkv-ycsb
WLS=$root/ycsb/workloads
WL=$WLS/workloadb # YCSB's default record; YCSB-B
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
        -p flowkv.pipeline=64 >"$d/load.txt" 2>&1
    RESULT=$(ops_of "$d/load.txt")
}
run_w() { # run_w DIR N SECONDS OUT [WORKLOAD]: ops/s of WORKLOAD (default $WL)
    timeout $(($3 + 60)) "$YCSB" run -c "$1/cluster.conf" -P "${5:-$WL}" -p recordcount="$2" \
        -threads 1 -p flowkv.pipeline=128 -p operationcount=0 -p maxexecutiontime="$3" >"$4" 2>&1
    ops_of "$4"
}
run_b() { run_w "$@"; } # run_b DIR N SECONDS OUT [WORKLOAD]: YCSB-B
# workloads DIR N LABEL OPS P95: workloads A to F, in YCSB's recommended
# order but for E last (its inserts, like D's, add records past the loaded
# ones), 10 s each; ops/s and p95s into the associative arrays named OPS
# and P95.
workloads() {
    local -n ops_=$4 p95_=$5
    for w in a b c f d e; do
        ops_[$w]=$(run_w "$1" "$2" 10 "$1/run-$w.txt" "$WLS/workload$w")
        p95_[$w]=$(p95s "$1/run-$w.txt")
        echo "capacity: $3 workload $w: ${ops_[$w]} ops/s, p95 ${p95_[$w]} us"
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

DFI=$WLS/workload_dfi_b
echo "capacity: 64-byte records, 5,000 and $records"
small=$out/small
cluster "$small" 5000 async "$DFI" || exit 1
small_ops=$(run_b "$small" 5000 10 "$small/run.txt" "$DFI")
drop "$small"
dfi=$out/dfi
cluster "$dfi" "$records" async "$DFI" || exit 1
dfi_ops=$(run_b "$dfi" "$records" 10 "$dfi/run.txt" "$DFI")
drop "$dfi"

echo "capacity: 1,000-record cluster (restart baseline)"
tiny=$out/tiny
cluster "$tiny" 1000 || exit 1
run_b "$tiny" 1000 10 "$tiny/run.txt" >/dev/null # the same recent writes as the big one's
restart_ns "$tiny" || exit 1
tiny_ns=$RESULT
drop "$tiny"

echo "capacity: $records records"
big=$out/big
cluster "$big" "$records" || exit 1
load_ops=$RESULT
declare -A W_OPS W_P95
workloads "$big" "$records" flowkv W_OPS W_P95
big_ops=${W_OPS[b]}
rss=$(max_rss "$big")
disk=$(du -sm "$big/data0" | cut -f1)
restart_ns "$big" || exit 1
big_ns=$RESULT
serving "$big" || exit 1

# Catch-up while YCSB-B runs, and mdb_copy of the leader's environment.
# The first transfer (the recovery's, under load) and how many followed:
# a follower that falls more than the leader's log window behind while a
# transfer runs fetches the state again (README, Limits).
catch_up "$big" "$records"
l=$CU_LEADER
catch_ops=$CU_OPS
xfer=$CU_XFER
xfers=$(grep -c "state transfer: complete" "$big/log$CU_FOLLOWER")
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
rm -rf "$out/copy"
drop "$big"

# Sync durability, same records.
echo "capacity: $records records, sync durability"
syncd=$out/sync
cluster "$syncd" "$records" sync || exit 1
sync_ops=$(run_b "$syncd" "$records" 10 "$syncd/run.txt")
drop "$syncd"

# NOPaxos, async, same records: load, workloads, memory, catch-up.
echo "capacity: $records records, nopaxos"
nopd=$out/nopaxos
PROTO=nopaxos cluster "$nopd" "$records" || exit 1
nop_load=$RESULT
declare -A N_OPS N_P95
workloads "$nopd" "$records" nopaxos N_OPS N_P95
nop_rss=$(max_rss "$nopd")
catch_up "$nopd" "$records"
nop_catch_ops=$CU_OPS
nxfer=$CU_XFER
drop "$nopd"

# etcd, same records, loaded and run as flowkv is (two threads of 64 in
# flight; then each workload with one thread of 128, and the best of that
# and 64 threads of one, YCSB's own model).
echo "capacity: etcd, $records records"
ecd=$out/etcd
ep=$(ETCD_QUOTA_BYTES=$((8 << 30)) "$here/etcd-cluster.sh" start "$ecd" 3) || exit 1
ebase=(-db etcd -p "etcd.endpoints=$ep" -p recordcount="$records")
timeout 1800 "$YCSB" load "${ebase[@]}" -P "$WL" -threads 2 -p flowkv.pipeline=64 >"$ecd/load.txt" 2>&1
etcd_load=$(ops_of "$ecd/load.txt")
declare -A E_OPS E_P95
for w in a b c f d e; do
    E_OPS[$w]=0
    for cfg in "1 128" "64 1"; do
        read -r t p <<<"$cfg"
        timeout 120 "$YCSB" run "${ebase[@]}" -P "$WLS/workload$w" -threads "$t" \
            -p flowkv.pipeline="$p" -p operationcount=0 -p maxexecutiontime=10 \
            >"$ecd/run-$w-$t.txt" 2>&1
        o=$(ops_of "$ecd/run-$w-$t.txt")
        if [ "${o:-0}" -gt "${E_OPS[$w]}" ]; then
            E_OPS[$w]=$o
            E_P95[$w]=$(p95s "$ecd/run-$w-$t.txt")
        fi
    done
    echo "capacity: etcd workload $w: ${E_OPS[$w]} ops/s, p95 ${E_P95[$w]:-} us"
done
etcd_ops=${E_OPS[b]}
etcd_disk=$(du -sm "$ecd/m0" | cut -f1)
"$here/etcd-cluster.sh" stop "$ecd" >/dev/null 2>&1
rm -rf "$ecd"/m*/

read -r xmib xs xrate <<<"${xfer:-0 0 0}"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b ? a / b : 0 }'; }
echo "capacity: YCSB's default record (1,048 bytes), $records records, 3 replicas"
printf 'capacity: %-9s %10s %10s' system load_ops/s ""
for w in a b c d e f; do printf ' %10s' "$w"; done
echo
printf 'capacity: %-9s %10s %10s' flowkv "$load_ops" ""
for w in a b c d e f; do printf ' %10s' "${W_OPS[$w]}"; done
echo
printf 'capacity: %-9s %10s %10s' etcd "$etcd_load" ""
for w in a b c d e f; do printf ' %10s' "${E_OPS[$w]}"; done
echo
for w in a b c d e f; do
    echo "capacity: workload $w p95 (us): flowkv ${W_P95[$w]}; nopaxos ${N_P95[$w]}; etcd ${E_P95[$w]:-}; ratio $(ratio "${W_OPS[$w]}" "${E_OPS[$w]}")x"
done
printf 'capacity: %-9s %10s %10s' nopaxos "$nop_load" ""
for w in a b c d e f; do printf ' %10s' "${N_OPS[$w]}"; done
echo
read -r nmib ns nrate <<<"${nxfer:-0 0 0}"
echo "capacity: nopaxos replica anonymous memory $nop_rss MiB; catch-up $nmib MiB in $ns s = $nrate MiB/s, YCSB-B meanwhile $nop_catch_ops ops/s"
echo "capacity: replica anonymous memory $rss MiB, data directory $disk MiB (etcd member $etcd_disk MiB)"
echo "capacity: restart $((big_ns / 1000000)) ms at $records records, $((tiny_ns / 1000000)) ms at 1,000"
echo "capacity: etcd (gRPC, fsync) load $etcd_load ops/s, YCSB-B $etcd_ops ops/s; flowkv sync YCSB-B $sync_ops ops/s"
echo "capacity: catch-up $xmib MiB in $xs s = $xrate MiB/s (the first of $xfers transfers; caught up after the run: $caught); mdb_copy $copy_mib MiB at $copy_rate MiB/s; YCSB-B meanwhile $catch_ops ops/s"
echo "capacity: 64-byte records: YCSB-B $dfi_ops ops/s at $records, $small_ops at 5,000"
printf 'capacity: load_ratio_etcd=%s ycsbb_ratio_etcd=%s sync_ycsbb_ratio_etcd=%s rss_mib=%s restart_ratio=%s catchup_ratio=%s records=%s load_ops=%s ycsbb_ops=%s etcd_load_ops=%s etcd_ycsbb_ops=%s sync_ycsbb_ops=%s small_ratio=%s catchup_transfers=%s catchup_ycsbb_ops=%s nop_load_ratio_etcd=%s nop_ycsbb_ratio_etcd=%s nop_rss_mib=%s nop_catchup_ratio=%s\n' \
    "$(ratio "$load_ops" "$etcd_load")" "$(ratio "$big_ops" "$etcd_ops")" \
    "$(ratio "$sync_ops" "$etcd_ops")" "$rss" "$(ratio "$big_ns" "$tiny_ns")" \
    "$(ratio "$xrate" "$copy_rate")" "$records" "$load_ops" "$big_ops" "$etcd_load" "$etcd_ops" \
    "$sync_ops" "$(ratio "$dfi_ops" "$small_ops")" "$xfers" "$catch_ops" \
    "$(ratio "$nop_load" "$etcd_load")" "$(ratio "${N_OPS[b]}" "$etcd_ops")" "$nop_rss" \
    "$(ratio "$nrate" "$copy_rate")"

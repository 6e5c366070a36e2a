#!/usr/bin/env bash
# ycsb/bench/member.sh: the time to add a replica to a Multi-Paxos cluster
# that holds a lot of data (issue 28: "time to add a replica holding 1
# GiB"), and YCSB-B's throughput through membership changes.
#
#   member.sh [-r RECORDS] [-o DIR]
#
# On loopback: four nodes in the cluster file, `members = 0, 1, 2`; the
# three members load RECORDS (default 1,000,000) of YCSB's default record
# (about 1 GiB of keys and values); then node 3 starts with an empty data
# directory (a learner: it fetches the state as a stream, consensus/
# cons_xfer.h) and `flowkv member add 3` waits until the leader admits it.
# The time from the start of node 3 to the committed change is printed
# beside mdb_copy of the leader's environment to the same disk (the
# baseline: copying the data once), as a ratio. Then YCSB-B runs 20 s
# twice, the second time through `flowkv member remove 2` and `member add
# 2` (a member out and back, each a change of the voting set under load),
# and both throughputs are printed.
# Ends with one line:
#   member: records=N data_mib=M add_ms=A copy_ms=C add_over_copy=R
#           ycsbb_ops=B ycsbb_changes_ops=X
# Every wait is bounded; every process started here is stopped by PID.
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
WL=$root/ycsb/workloads/workloadb
records=1000000
out=$root/build/bench-member
while getopts "r:o:" o; do
    case $o in
    r) records=$OPTARG ;;
    o) out=$OPTARG ;;
    *) echo "usage: member.sh [-r RECORDS] [-o DIR]" >&2; exit 2 ;;
    esac
done
rm -rf "$out"
mkdir -p "$out"
declare -A PID
cleanup() {
    for p in "${PID[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${PID[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT
export FLOWKV_LOG=info

d=$out/c
mkdir -p "$d"
base=$(fk_base_port)
{
    printf '[cluster]\nprotocol = multipaxos\ndurability = async\ntoken = member-bench-token-0123456789\nmembers = 0, 1, 2\n'
    for i in 0 1 2 3; do
        printf '[node %d]\naddress = 127.0.0.1:%d\nfabric = tcp\ndata_dir = data%d\n' "$i" $((base + i)) "$i"
    done
} >"$d/cluster.conf"
cd "$d" || exit 1
for i in 0 1 2; do start "$d" $i --new-cluster; done
serving "$d" || exit 1
echo "member: loading $records records"
timeout 1800 "$YCSB" load -c "$d/cluster.conf" -P "$WL" -p recordcount="$records" -threads 1 \
    -p flowkv.pipeline=64 >"$d/load.txt" 2>&1
echo "member: loaded at $(ops_of "$d/load.txt") ops/s"
leader=$("$CLI" -c "$d/cluster.conf" -t 1000 status 2>/dev/null | awk '$2 == "leader" { print $1; exit }')

t0=$(date +%s%N)
start "$d" 3
add=$("$CLI" -c "$d/cluster.conf" -t 600000 member add 3 2>&1)
rc=$?
t1=$(date +%s%N)
[ $rc = 0 ] || { echo "member: add failed: $add" >&2; exit 1; }
add_ms=$(((t1 - t0) / 1000000))
echo "member: node 3 added ($add) in $add_ms ms: $(grep -m1 'state transfer: complete' "$d/log3" | sed 's/.*state transfer: //')"

t0=$(date +%s%N)
mdb_copy "$d/data${leader:-0}" "$out/copy" 2>/dev/null ||
    { mkdir -p "$out/copy" && mdb_copy "$d/data${leader:-0}" "$out/copy"; }
t1=$(date +%s%N)
copy_ms=$(((t1 - t0) / 1000000))
mib=$(du -sm "$out/copy" | cut -f1)
echo "member: mdb_copy of replica ${leader:-0}'s environment: $mib MiB in $copy_ms ms"
rm -rf "$out/copy"

run_b() { # run_b SECONDS OUT: YCSB-B ops/s
    timeout $(($1 + 60)) "$YCSB" run -c "$d/cluster.conf" -P "$WL" -p recordcount="$records" \
        -threads 1 -p flowkv.pipeline=128 -p operationcount=0 -p maxexecutiontime="$1" >"$2" 2>&1
    ops_of "$2"
}
plain=$(run_b 20 "$d/b-plain.txt")
run_b 20 "$d/b-changes.txt" >/dev/null &
yp=$!
sleep 5
r1=$("$CLI" -c "$d/cluster.conf" -t 60000 member remove 2 2>&1)
sleep 3
r2=$("$CLI" -c "$d/cluster.conf" -t 60000 member add 2 2>&1)
wait "$yp"
changes=$(ops_of "$d/b-changes.txt")
echo "member: YCSB-B $plain ops/s without changes, $changes with a remove ($r1) and an add ($r2)"
for i in 0 1 2 3; do stop "$d" $i TERM; done
ratio=$(awk -v a="$add_ms" -v c="$copy_ms" 'BEGIN { printf "%.2f", (c > 0 ? a / c : 0) }')
echo "member: records=$records data_mib=$mib add_ms=$add_ms copy_ms=$copy_ms add_over_copy=$ratio ycsbb_ops=$plain ycsbb_changes_ops=$changes"

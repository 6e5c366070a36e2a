#!/usr/bin/env bash
# ycsb/bench/clients.sh: clients at scale (`make bench-clients`).
#
#   clients.sh [-o DIR] [-p PROTOCOLS] [-h "1 16 64 256 1024"] [-r RECORDS] [-s SECONDS]
#
# For each protocol (3 replicas, async durability) and for etcd (3
# members, through its gRPC API, fsync as always), loads RECORDS records
# of YCSB's default record (workloadb, 1,048 bytes; default 100,000), then
# runs YCSB-B for SECONDS (default 10) at each handle count N, each handle
# with one request in flight (the handles of a process share a channel:
# client/flowkv.h), driven two ways by one flowkv-ycsb process: "loop",
# 4 threads (fewer for N < 4) each serving N/4 handles (flowkv.handles,
# flowkv_poll_set: an event-driven application tier), and "threads", N
# threads of one handle each (a thread-per-request tier; on a machine of
# few cores its context switches, not the replicas, bound it). etcd runs
# the same two ways (N/4 calls in flight on each thread's gRPC channel, or
# N threads of one call). Before them, the peak of one handle with a deep
# pipeline (1 thread, 128 in flight), the baseline the 1,024-handle
# throughput is compared with. Prints, per system and count, ops/s, the
# p95 of reads and a replica's resident memory (the largest of the three,
# VmRSS: anonymous memory and the LMDB pages it touched) at the end of
# the run, and ends with one line:
#   clients: handles=1024 ops_ratio_peak=X rss_mib=Y etcd_ratio_min=Z
# X: ops/s at 1,024 handles (loop) over the deep-pipeline peak (the lower
# of the two protocols), Y: the largest replica RSS at 1,024 handles
# (MiB, either way), Z: the smallest flowkv/etcd ratio at any count, way
# and protocol (each against etcd driven the same way); then the same per
# protocol (mpx_..., nop_..., with the threads way's ratio at 1,024).
# Every wait is bounded; every process started here is stopped by PID.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/tests/lib.sh"
. "$here/replicas.sh"
B=${BUILD:-$root/build}
# shellcheck disable=SC2034 # used by replicas.sh
SERVER=$B/bin/flowkv-server
# shellcheck disable=SC2034 # used by replicas.sh
CLI=$B/bin/flowkv
YCSB=$B/bin/flowkv-ycsb
WL=$root/ycsb/workloads/workloadb
records=100000
secs=10
handles="1 16 64 256 1024"
out=$root/build/bench-clients
protos="multipaxos nopaxos"
while getopts "o:p:h:r:s:" o; do
    case $o in
    o) out=$OPTARG ;;
    p) protos=$OPTARG ;;
    h) handles=$OPTARG ;;
    r) records=$OPTARG ;;
    s) secs=$OPTARG ;;
    *) echo "usage: clients.sh [-o DIR] [-p PROTOCOLS] [-h COUNTS] [-r RECORDS] [-s SECONDS]" >&2; exit 2 ;;
    esac
done
rm -rf "$out"
mkdir -p "$out"
declare -A PID F
cleanup() {
    for p in "${PID[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${PID[@]}"; do wait "$p" 2>/dev/null; done
    [ -d "$out/etcd" ] && "$here/etcd-cluster.sh" stop "$out/etcd" >/dev/null 2>&1
}
trap cleanup EXIT
export FLOWKV_LOG=warn

stop_all() { # stop_all DIR: its replicas, TERM (bounded 5 s each), then KILL
    local i
    for i in 0 1 2; do stop "$1" "$i" TERM; done
}
# p95_of FILE: the read p95 of a YCSB report, us.
p95_of() { awk -F', ' '$1=="[READ]" && $2=="95thPercentileLatency(us)" {print $3}' "$1"; }
# rss_of PID...: the largest VmRSS among them, MiB.
rss_of() {
    local m=0 r p
    for p in "$@"; do
        r=$(awk '/^VmRSS:/ { print int($2 / 1024) }' "/proc/$p/status" 2>/dev/null)
        [ "${r:-0}" -gt "$m" ] && m=$r
    done
    echo "$m"
}
# run DIR_OR_ENDPOINTS KEY THREADS PIPELINE HANDLES [PIDS...]: YCSB-B for
# $secs s, THREADS threads of HANDLES handles (flowkv; etcd: one channel)
# and PIPELINE requests in flight each; F[KEY.ops], F[KEY.p95], F[KEY.rss]
# (the largest RSS of PIDS as the run ends).
run() {
    local tgt=$1 key=$2 t=$3 n=$4 hp=$5 y
    shift 5
    local -a base
    if [ -f "$tgt/cluster.conf" ]; then
        base=(-c "$tgt/cluster.conf" -p flowkv.handles="$hp")
    else
        base=(-db etcd -p "etcd.endpoints=$tgt")
    fi
    timeout $((secs + 120)) "$YCSB" run "${base[@]}" -P "$WL" -p recordcount="$records" \
        -threads "$t" -p flowkv.pipeline="$n" -p operationcount=0 -p maxexecutiontime="$secs" \
        >"$out/$key.txt" 2>&1 &
    y=$!
    sleep $((secs - 1))
    F[$key.rss]=$(rss_of "$@")
    wait "$y"
    F[$key.ops]=$(ops_of "$out/$key.txt")
    F[$key.p95]=$(p95_of "$out/$key.txt")
    echo "clients: $key: ${F[$key.ops]:-0} ops/s, read p95 ${F[$key.p95]:-?} us, replica RSS ${F[$key.rss]} MiB"
}

for p in $protos; do
    d=$out/$p
    fk_local_conf "$d/cluster.conf" "$p" async "$(fk_base_port)"
    for i in 0 1 2; do start "$d" $i --new-cluster; done
    serving "$d" || exit 1
    timeout 1200 "$YCSB" load -c "$d/cluster.conf" -P "$WL" -p recordcount="$records" -threads 1 \
        -p flowkv.pipeline=64 >"$d/load.txt" 2>&1
    echo "clients: $p: loaded $records records at $(ops_of "$d/load.txt") ops/s"
    pids=("${PID[$d.0]}" "${PID[$d.1]}" "${PID[$d.2]}")
    run "$d" "$p.peak" 1 128 1 "${pids[@]}"
    for h in $handles; do
        lt=$((h < 4 ? h : 4))
        run "$d" "$p.loop.$h" "$lt" $((h / lt)) $((h / lt)) "${pids[@]}"
        run "$d" "$p.threads.$h" "$h" 1 1 "${pids[@]}"
    done
    stop_all "$d"
    rm -rf "$d"/data*
done

ecd=$out/etcd
ep=$("$here/etcd-cluster.sh" start "$ecd" 3) || exit 1
timeout 1800 "$YCSB" load -db etcd -p "etcd.endpoints=$ep" -P "$WL" -p recordcount="$records" \
    -threads 2 -p flowkv.pipeline=64 >"$ecd/load.txt" 2>&1
echo "clients: etcd: loaded $records records at $(ops_of "$ecd/load.txt") ops/s"
mapfile -t epids < <(awk '{ print $1 }' "$ecd/pids")
for h in $handles; do
    lt=$((h < 4 ? h : 4))
    run "$ep" "etcd.loop.$h" "$lt" $((h / lt)) 1 "${epids[@]}"
    run "$ep" "etcd.threads.$h" "$h" 1 1 "${epids[@]}"
done
"$here/etcd-cluster.sh" stop "$ecd" >/dev/null 2>&1
rm -rf "$ecd"/m*/

ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { printf "%.2f", b ? a / b : 0 }'; }
min() { awk -v a="$1" -v b="$2" 'BEGIN { print (a < b ? a : b) }'; }
max() { awk -v a="$1" -v b="$2" 'BEGIN { print (a > b ? a : b) }'; }
printf 'clients: %-18s %8s' "system (ops/s)" peak
for h in $handles; do printf ' %8s' "$h"; done
echo
for s in $protos etcd; do
    for w in loop threads; do
        printf 'clients: %-18s %8s' "$s $w" "${F[$s.peak.ops]:--}"
        for h in $handles; do printf ' %8s' "${F[$s.$w.$h.ops]:-0}"; done
        echo
    done
done
last=${handles##* }
line="clients: handles=$last"
per=""
ops_ratio=9999 rss=0 emin=9999
for p in $protos; do
    k=${p:0:3}
    [ "$k" = mul ] && k=mpx
    r=$(ratio "${F[$p.loop.$last.ops]:-0}" "${F[$p.peak.ops]:-0}")
    rt=$(ratio "${F[$p.threads.$last.ops]:-0}" "${F[$p.peak.ops]:-0}")
    e=9999
    for h in $handles; do
        for w in loop threads; do
            e=$(min "$e" "$(ratio "${F[$p.$w.$h.ops]:-0}" "${F[etcd.$w.$h.ops]:-0}")")
        done
    done
    m=$(max "${F[$p.loop.$last.rss]:-0}" "${F[$p.threads.$last.rss]:-0}")
    per+=" ${k}_ops_ratio_peak=$r ${k}_threads_ops_ratio_peak=$rt ${k}_rss_mib=$m ${k}_etcd_ratio_min=$e ${k}_peak_ops=${F[$p.peak.ops]:-0} ${k}_ops_${last}=${F[$p.loop.$last.ops]:-0}"
    ops_ratio=$(min "$ops_ratio" "$r")
    rss=$(max "$rss" "$m")
    emin=$(min "$emin" "$e")
done
echo "$line ops_ratio_peak=$ops_ratio rss_mib=$rss etcd_ratio_min=$emin$per"

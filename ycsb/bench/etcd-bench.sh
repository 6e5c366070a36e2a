#!/usr/bin/env bash
# ycsb/bench/etcd-bench.sh: the etcd side of the DFI replication benchmark:
# YCSB workload B with one 64-byte field per record
# (ycsb/workloads/workload_dfi_b) against a local etcd cluster, through its
# native gRPC API (flowkv-ycsb -db etcd, the default) or its JSON gateway
# (-a json: -db etcd-json).
#
#   etcd-bench.sh [-a grpc|json] [-o DIR] [-m MEMBERS] [-r RECORDS] [-s SECONDS]
#                 [-t "1 4 16 32 64"] [-d "2x64"] [-f "0.1 0.25 0.5 0.75 0.9 1.0 1.2"]
#                 [-b BUILD]
#
# 1. Starts MEMBERS (3) members (etcd-cluster.sh) under DIR/etcd-cluster and
#    loads RECORDS (10000) records with 8 threads. With -a json, a baseline:
#    the curl tool's sequential reads over one connection against
#    flowkv-ycsb's one-thread reads of the same key, printed as a ratio.
# 2. Closed loop: one run of SECONDS (8) per thread count in -t, one request
#    in flight per thread (YCSB's model), and one per TxD in -d: T threads
#    each keeping D requests in flight (flowkv.pipeline, as flowkv is
#    driven). The highest throughput is the peak.
# 3. Open loop: one run per fraction f in -f (none with -f "") at
#    -target f * peak with 64 threads; latency counts from each operation's
#    intended start, so queueing past saturation shows (coordinated
#    omission).
# Writes DIR/etcd[-json]-closed.csv (config,achieved,p50,p95,p99) and
# appends to DIR/results.csv the rows
#   system,protocol,replicas,offered,achieved,p50,p95,p99
# as etcd (or etcd-json),raft,MEMBERS,<offered ops/s>,<achieved ops/s>,<us>,<us>,<us>
# (percentiles of the READ series: 95% of workload B's operations; UPDATE's
# are in each run's report, kept as DIR/etcd[-json]-*.txt). Prints a table
# and ends with the line "etcd_peak=<ops/s> etcd_api=grpc|json". Every run
# is bounded (maxexecutiontime plus a timeout); the cluster is stopped on
# exit, whatever happens.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/build/bench
members=3
records=10000
secs=8
threads="1 4 16 32 64"
depths="2x64"
fractions="0.1 0.25 0.5 0.75 0.9 1.0 1.2"
build=$root/build
api=grpc
while getopts "a:o:m:r:s:t:d:f:b:" opt; do
    case $opt in
    a) api=$OPTARG ;;
    d) depths=$OPTARG ;;
    o) out=$OPTARG ;;
    m) members=$OPTARG ;;
    r) records=$OPTARG ;;
    s) secs=$OPTARG ;;
    t) threads=$OPTARG ;;
    f) fractions=$OPTARG ;;
    b) build=$OPTARG ;;
    *) exit 2 ;;
    esac
done
case $api in
grpc) db=etcd tag=etcd ;;
json) db=etcd-json tag=etcd-json ;;
*)
    echo "etcd-bench: -a $api: grpc or json" >&2
    exit 2
    ;;
esac
ycsb=$build/bin/flowkv-ycsb
[ -x "$ycsb" ] || {
    echo "etcd-bench: $ycsb missing (make)" >&2
    exit 1
}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cdir=$out/$tag-cluster
trap '"$here/etcd-cluster.sh" stop "$cdir" >/dev/null 2>&1' EXIT

ep=$("$here/etcd-cluster.sh" start "$cdir" "$members") || exit 1
base=(-db "$db" -P "$root/ycsb/workloads/workload_dfi_b" -p "etcd.endpoints=$ep"
    -p "recordcount=$records")

# ycsb NAME ARGS...: one bounded flowkv-ycsb run; report in $out/$tag-NAME.txt.
ycsb() {
    local name=$1
    shift
    timeout --kill-after=5 $((secs + 60)) "$ycsb" "$@" >"$out/$tag-$name.txt" 2>"$out/$tag-$name.err" || {
        echo "etcd-bench: $name failed: $(tail -n 2 "$out/$tag-$name.err")" >&2
        return 1
    }
    # Any return code but OK means the figure is not clean: say so.
    if grep -E 'Return=' "$out/$tag-$name.txt" | grep -qv 'Return=OK'; then
        echo "etcd-bench: $name: $(grep -E 'Return=' "$out/$tag-$name.txt" | grep -v OK | tr '\n' ' ')" >&2
    fi
}

# field FILE SERIES METRIC: one number of a YCSB report.
field() {
    awk -F', ' -v s="[$2]" -v m="$3" '$1 == s && $2 == m { print $3 }' "$1"
}

ycsb load load "${base[@]}" -threads 8 -p operationcount=0 || exit 1
echo "etcd-bench: loaded $records records into $members members ($ep)"

# Baseline (the gateway only), measured in the same run: the curl tool
# sending N range requests for one loaded key over one keep-alive
# connection, one after the other, against flowkv-ycsb with one thread
# reading that key N times. The ratio says what the binding (libcurl
# multi, JSON, record checks) costs over the plainest HTTP client.
if [ "$api" = json ]; then
    n=2000
    key=$("$ycsb" load "${base[@]}" --dry-run | awk 'NR == 1 { print $3 }')
    kb=$(printf '%s' "$key" | base64 -w0)
    url=${ep%%,*}/v3/kv/range
    for ((i = 0; i < n; i++)); do
        printf 'url = "%s"\ndata = "{\\"key\\":\\"%s\\"}"\noutput = "/dev/null"\n' "$url" "$kb"
    done >"$out/etcd-curl.cfg"
    t0=$(date +%s%N)
    timeout 120 curl -sf -K "$out/etcd-curl.cfg" || echo "etcd-bench: curl baseline failed" >&2
    t1=$(date +%s%N)
    curl_ops=$(awk -v n=$n -v ns=$((t1 - t0)) 'BEGIN { printf "%.0f", n / (ns / 1e9) }')
    ycsb baseline run "${base[@]}" -threads 1 -p recordcount=1 -p readproportion=1 \
        -p updateproportion=0 -p "operationcount=$n" || exit 1
    one=$(printf '%.0f' "$(field "$out/$tag-baseline.txt" OVERALL "Throughput(ops/sec)")")
    echo "baseline: curl $curl_ops reads/s, flowkv-ycsb -db etcd-json (1 thread) $one reads/s:" \
        "ratio $(awk -v a="$one" -v b="$curl_ops" 'BEGIN { printf "%.2f", a / b }')"
fi

printf '%-10s %10s %10s %10s %10s\n' config "ops/s" "p50(us)" "p95(us)" "p99(us)"
echo "config,achieved,p50,p95,p99" >"$out/$tag-closed.csv"
peak=0
# Configs: "T" is T threads with one request each, "TxD" T threads with D.
for cfg in $threads $depths; do
    t=${cfg%x*} d=1
    [ "$cfg" = "$t" ] || d=${cfg#*x}
    ycsb "closed-$cfg" run "${base[@]}" -threads "$t" -p "flowkv.pipeline=$d" \
        -p operationcount=0 -p "maxexecutiontime=$secs" || continue
    f=$out/$tag-closed-$cfg.txt
    tput=$(field "$f" OVERALL "Throughput(ops/sec)")
    row="$(printf '%.0f' "$tput"),$(field "$f" READ 50thPercentileLatency\(us\)),$(field "$f" READ 95thPercentileLatency\(us\)),$(field "$f" READ 99thPercentileLatency\(us\))"
    echo "$cfg,$row" >>"$out/$tag-closed.csv"
    printf '%-10s %10s %10s %10s %10s\n' "$cfg" ${row//,/ }
    peak=$(awk -v a="$peak" -v b="$tput" 'BEGIN { print (b > a) ? b : a }')
done
peak=$(printf '%.0f' "$peak")
[ "$peak" -gt 0 ] || {
    echo "etcd-bench: no closed-loop run succeeded" >&2
    exit 1
}

[ -s "$out/results.csv" ] || echo "system,protocol,replicas,offered,achieved,p50,p95,p99" >"$out/results.csv"
printf '\n%-10s %10s %10s %10s %10s\n' offered "ops/s" "p50(us)" "p95(us)" "p99(us)"
for fr in $fractions; do
    target=$(awk -v p="$peak" -v f="$fr" 'BEGIN { printf "%d", p * f }')
    [ "$target" -gt 0 ] || continue
    ycsb "open-$target" run "${base[@]}" -threads 64 -target "$target" \
        -p "operationcount=$((target * secs))" -p "maxexecutiontime=$((secs * 2))" || continue
    f=$out/$tag-open-$target.txt
    row="$(printf '%.0f' "$(field "$f" OVERALL "Throughput(ops/sec)")"),$(field "$f" READ 50thPercentileLatency\(us\)),$(field "$f" READ 95thPercentileLatency\(us\)),$(field "$f" READ 99thPercentileLatency\(us\))"
    echo "$tag,raft,$members,$target,$row" >>"$out/results.csv"
    printf '%-10s %10s %10s %10s %10s\n' "$target" ${row//,/ }
done
echo "etcd_peak=$peak etcd_api=$api"

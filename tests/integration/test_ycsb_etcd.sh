#!/usr/bin/env bash
# flowkv-ycsb against a real 3-member etcd cluster on loopback, through
# etcd's gRPC API (-db etcd) and, for the last step, its JSON gateway
# (-db etcd-json):
#   1. load and run workload B (1,000 records of one 64-byte field, 2,000
#      operations) with -db etcd: every operation returns OK;
#   2. a loaded record is in etcd, readable with etcdctl, in ycsb_record's
#      encoding (76 bytes: "YR", version 1, one field of 64 bytes);
#   3. records of three fields, then partial updates (the Range + Txn
#      read-modify-write), reads and scans, then workloads E (inserts and
#      scans) and F (YCSB's read-modify-write): every operation returns OK;
#   4. a CAS conflict: four threads of partial updates of one record, with
#      one attempt each (etcd.update_tries=1), lose Txn compares to each
#      other (some updates fail); with 1,000 attempts every one succeeds;
#   5. the JSON gateway binding loads and runs workload B, all OK.
# The cluster runs under a temporary directory; the EXIT trap stops exactly
# its members (ycsb/bench/etcd-cluster.sh stop) and removes the directory.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/../lib.sh"
build=${BUILD:-build}
case "$build" in /*) ;; *) build=$root/$build ;; esac
ycsb=$build/bin/flowkv-ycsb
cluster=$root/ycsb/bench/etcd-cluster.sh
tmp=$(mktemp -d)
trap '"$cluster" stop "$tmp" >/dev/null 2>&1; rm -rf "$tmp"' EXIT

for need in "$ycsb" /usr/bin/etcd /usr/bin/etcdctl; do
    if [ ! -x "$need" ]; then
        t_fail "prerequisites" "$need is missing (make; deploy/deps.sh)"
        t_done
    fi
done

if ! ep=$("$cluster" start "$tmp" 3 2>"$tmp/start.err"); then
    t_fail "3-member etcd cluster starts" "$(tail -n 3 "$tmp/start.err" | tr '\n' ' ')"
    t_done
fi
t_ok "3-member etcd cluster starts"

common=(-db etcd -P "$root/ycsb/workloads/workloadb" -p "etcd.endpoints=$ep"
    -p recordcount=1000 -p operationcount=2000 -p fieldcount=1 -p fieldlength=64)

# phase NAME OPS ARGS...: runs flowkv-ycsb (bounded) and checks its report.
phase() {
    local name=$1 want=$2
    shift 2
    if timeout --kill-after=5 120 "$ycsb" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"; then
        t_ycsb_all_ok "$name" "$tmp/$name.out" "$want"
    else
        t_fail "$name" "exit $?: $(tail -n 2 "$tmp/$name.err" | tr '\n' ' ')"
    fi
}

phase load-b 1000 load "${common[@]}" -threads 4
phase run-b 2000 run "${common[@]}" -threads 4 -p flowkv.pipeline=4

# The first loaded key (keynum 0), read back with etcdctl: 76 bytes of
# ycsb_record encoding.
key=$("$ycsb" load "${common[@]}" --dry-run | awk 'NR == 1 { print $3 }')
val=$(ETCDCTL_API=3 timeout 20 etcdctl --endpoints="$ep" --command-timeout=10s -w json get "$key" |
    grep -o '"value":"[^"]*"' | cut -d'"' -f4)
bytes=$(printf '%s' "$val" | base64 -d 2>/dev/null | wc -c)
head=$(printf '%s' "$val" | base64 -d 2>/dev/null | head -c 12 | od -An -tx1 | tr -d ' \n')
if [ -n "$key" ] && [ "$bytes" -eq 76 ] && [ "$head" = "595201000100000040000000" ]; then
    t_ok "record $key readable with etcdctl, 76 bytes in ycsb_record encoding"
else
    t_fail "record $key readable with etcdctl" "got $bytes bytes, header '$head'"
fi

# Three fields per record, updates of one field (range + txn), scans. The
# load rewrites every key of the first load, so that a scan, which runs to
# the end of the key space, meets only records of this shape (a one-field
# record of 64 bytes is larger than this workload's records: an error).
multi=(-db etcd -P "$root/ycsb/workloads/workloada" -p "etcd.endpoints=$ep"
    -p recordcount=1000 -p operationcount=400 -p fieldcount=3 -p fieldlength=16
    -p readproportion=0.4 -p updateproportion=0.4 -p scanproportion=0.2
    -p maxscanlength=5 -p requestdistribution=uniform)
phase load-3f 1000 load "${multi[@]}" -threads 4
phase run-3f 400 run "${multi[@]}" -threads 2 -p flowkv.pipeline=4
# YCSB's other operation types over the same records: workload E (inserts
# of new keys and scans) and workload F (read-modify-write: a read, then a
# write of the whole record).
shape=(-p "etcd.endpoints=$ep" -p recordcount=1000 -p operationcount=300 -p fieldcount=3
    -p fieldlength=16 -p maxscanlength=5)
phase run-e 300 run -db etcd -P "$root/ycsb/workloads/workloade" "${shape[@]}" -threads 2 \
    -p flowkv.pipeline=4
# Workload F's report counts every read under READ (a read-modify-write
# reads first, as Java YCSB's does) and its writes under UPDATE and
# READ-MODIFY-WRITE: 300 reads, as many updates as read-modify-writes.
if timeout --kill-after=5 120 "$ycsb" run -db etcd -P "$root/ycsb/workloads/workloadf" \
    "${shape[@]}" -threads 2 -p flowkv.pipeline=4 >"$tmp/run-f.out" 2>"$tmp/run-f.err"; then
    get() { awk -F', ' -v s="[$1]" -v m="$2" '$1 == s && $2 == m { print $3 }' "$tmp/run-f.out"; }
    reads=$(get READ Operations) rmw=$(get READ-MODIFY-WRITE Operations) upd=$(get UPDATE Operations)
    other=$(grep -E 'Return=|FAILED' "$tmp/run-f.out" | grep -v 'Return=OK' | head -n 3 | tr '\n' ' ')
    if [ "${reads:-0}" -eq 300 ] && [ "${rmw:-0}" -gt 0 ] && [ "${upd:-0}" -eq "${rmw:-0}" ] &&
        [ -z "$other" ]; then
        t_ok "run-f: 300 operations, $rmw of them read-modify-writes, all OK"
    else
        t_fail "run-f" "READ=${reads:-0} READ-MODIFY-WRITE=${rmw:-0} UPDATE=${upd:-0} other: ${other:-none}"
    fi
else
    t_fail "run-f" "exit $?: $(tail -n 2 "$tmp/run-f.err" | tr '\n' ' ')"
fi

# A CAS conflict: every operation a partial update of the one record, from
# four threads with four in flight each. One Txn attempt: the compare on
# mod_revision fails whenever another update came between its Range and
# its Txn, so some updates fail; 1,000 attempts: all succeed.
cas=(-db etcd -P "$root/ycsb/workloads/workloada" -p "etcd.endpoints=$ep"
    -p recordcount=1 -p operationcount=400 -p fieldcount=3 -p fieldlength=16
    -p readproportion=0 -p updateproportion=1 -p requestdistribution=uniform)
if timeout --kill-after=5 120 "$ycsb" run "${cas[@]}" -threads 4 -p flowkv.pipeline=4 \
    -p etcd.update_tries=1 >"$tmp/cas1.out" 2>"$tmp/cas1.err"; then
    okn=$(awk -F', ' '$1 == "[UPDATE]" && $2 == "Return=OK" { print $3 }' "$tmp/cas1.out")
    bad=$(awk -F', ' '$1 ~ /UPDATE/ && $2 ~ /^Return=/ && $2 != "Return=OK" { s += $3 } END { print s + 0 }' "$tmp/cas1.out")
    if [ "${okn:-0}" -gt 0 ] && [ "$bad" -gt 0 ] && [ $((okn + bad)) -eq 400 ]; then
        t_ok "CAS conflict: one attempt each, $bad of 400 concurrent partial updates lost the Txn compare"
    else
        t_fail "CAS conflict with one attempt" "OK=${okn:-0} failed=$bad (want both > 0, 400 in all)"
    fi
else
    t_fail "CAS conflict with one attempt" "exit $?: $(tail -n 2 "$tmp/cas1.err" | tr '\n' ' ')"
fi
phase cas-retried 400 run "${cas[@]}" -threads 4 -p flowkv.pipeline=4 -p etcd.update_tries=1000

# The JSON gateway binding, kept for comparison: workload B, all OK.
json=(-db etcd-json -P "$root/ycsb/workloads/workloadb" -p "etcd.endpoints=$ep"
    -p recordcount=500 -p operationcount=1000 -p fieldcount=1 -p fieldlength=64)
phase json-load 500 load "${json[@]}" -threads 2
phase json-run 1000 run "${json[@]}" -threads 2 -p flowkv.pipeline=4

t_done

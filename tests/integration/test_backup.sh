#!/usr/bin/env bash
# test_backup.sh: backup and restore (issue 28 item 2, server/srv_backup.h).
#   1. A Multi-Paxos cluster holding over 100 MiB (YCSB's default record,
#      115,000 records) is backed up with `flowkv snapshot save` while a
#      YCSB update workload runs against it (every operation OK: the
#      replica kept serving), and `flowkv snapshot status` checks the file.
#   2. A new NOPaxos cluster is seeded from it (`flowkv-server --restore`
#      on every replica), serves, and its own backup holds exactly the same
#      pairs (same count, same digest over every key and value) as the
#      file it was restored from; a sample of keys reads the same from both
#      clusters through the CLI.
#   3. A damaged copy is refused by status and by --restore (which leaves
#      the data directory without state); --restore into a replica that
#      holds state is refused; a backup from the NOPaxos leader (its views
#      are held until committed) restores into a Multi-Paxos cluster.
# Every wait is bounded; replicas are stopped by PID.
set -u
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SERVER=$ROOT/build/bin/flowkv-server
CLI=$ROOT/build/bin/flowkv
YCSB=$ROOT/build/bin/flowkv-ycsb
declare -A PID
. "$ROOT/tests/cluster/cluster-lib.sh"
W=$(mktemp -d /tmp/fkbackup.XXXXXX)
RECORDS=${FK_BACKUP_RECORDS:-115000}
cleanup() {
    for k in "${!PID[@]}"; do kill -KILL "${PID[$k]}" 2>/dev/null; done
    for k in "${!PID[@]}"; do wait "${PID[$k]}" 2>/dev/null; done
    rm -rf "$W"
}
trap cleanup EXIT
export FLOWKV_LOG=warn
base=$(fk_base_port)

# status_of FILE KEY: a line of `flowkv snapshot status FILE`.
status_of() { "$CLI" snapshot status "$1" 2>/dev/null | awk -v k="$2" '$1 == k { print $2 }'; }
stop_all() { for i in 0 1 2; do stop "$1" "$i" TERM; done; }

# 1. Load, then save while updates run.
fk_local_conf "$W/a/cluster.conf" multipaxos async "$base"
for i in 0 1 2; do start "$W/a" "$i" -N; done
if ! wait_serving "$W/a"; then
    t_fail "multipaxos cluster serves" "$(tail -n 3 "$W/a/log0" | tr '\n' ' ')"
    t_done
fi
ycsb_common=(-c "$W/a/cluster.conf" -P "$ROOT/ycsb/workloads/workloada" -p recordcount="$RECORDS")
t0=$(date +%s%N)
if timeout --kill-after=5 300 "$YCSB" load flowkv "${ycsb_common[@]}" -threads 1 \
    -p flowkv.pipeline=32 >"$W/load.out" 2>"$W/load.err"; then
    t_ok "loaded $RECORDS records of YCSB's default record in $((($(date +%s%N) - t0) / 1000000)) ms"
else
    t_fail "load $RECORDS records" "$(tail -n 2 "$W/load.err" | tr '\n' ' ')"
fi
timeout --kill-after=5 120 "$YCSB" run flowkv "${ycsb_common[@]}" -threads 1 -p flowkv.pipeline=4 \
    -p operationcount=20000000 -p maxexecutiontime=6 -p updateproportion=1 -p readproportion=0 \
    >"$W/run.out" 2>"$W/run.err" &
runpid=$!
sleep 1
t0=$(date +%s%N)
"$CLI" -c "$W/a/cluster.conf" -t 10000 snapshot save "$W/a.db" >"$W/save.out" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
wait "$runpid"
runrc=$?
bytes=$(status_of "$W/a.db" data_bytes)
pairs=$(status_of "$W/a.db" pairs)
if [ "$rc" = 0 ] && [ "${pairs:-0}" -ge "$RECORDS" ] && [ "${bytes:-0}" -ge $((100 << 20)) ]; then
    t_ok "snapshot save under updates: $pairs pairs, $bytes bytes of keys and values in $ms ms ($(cut -c 1-150 "$W/save.out"))"
else
    t_fail "snapshot save of over 100 MiB" "rc=$rc pairs=${pairs:-?} bytes=${bytes:-?}: $(head -c 300 "$W/save.out")"
fi
ops=$(awk -F', ' '$1 == "[UPDATE]" && $2 == "Operations" { print $3 }' "$W/run.out")
if [ "$runrc" = 0 ] && [ "${ops:-0}" -gt 0 ] && t_ycsb_all_ok "updates during the save" "$W/run.out" "$ops" >"$W/ok.txt"; then
    cat "$W/ok.txt"
else
    cat "$W/ok.txt" 2>/dev/null
    t_fail "updates during the save all OK" "rc=$runrc ops=${ops:-none} $(tail -n 2 "$W/run.err" | tr '\n' ' ')"
fi
if "$CLI" snapshot status "$W/a.db" >"$W/status.out" 2>&1 && grep -q '^checksum .* (ok)$' "$W/status.out" &&
    [ "$(status_of "$W/a.db" protocol)" = multipaxos ]; then
    t_ok "snapshot status checks the file whole ($(tr -s ' \n' ' ' <"$W/status.out" | cut -c 1-200))"
else
    t_fail "snapshot status" "$(head -c 300 "$W/status.out")"
fi
"$CLI" -w json snapshot status "$W/a.db" | /usr/bin/python3 -c 'import json, sys; d = json.load(sys.stdin); sys.exit(0 if d["pairs"] > 0 and len(d["checksum"]) == 16 else 1)' &&
    t_ok "snapshot status -w json parses" || t_fail "snapshot status -w json" "$("$CLI" -w json snapshot status "$W/a.db" | head -c 200)"

# 2. Restore into a new NOPaxos cluster.
fk_local_conf "$W/b/cluster.conf" nopaxos async $((base + 10))
t0=$(date +%s%N)
for i in 0 1 2; do start "$W/b" "$i" --restore "$W/a.db" -l info; done
if wait_serving "$W/b"; then
    t_ok "a new nopaxos cluster restored from the multipaxos backup serves in $((($(date +%s%N) - t0) / 1000000)) ms"
else
    t_fail "the restored cluster serves" "$(grep -h -m 2 -E 'E |restor' "$W"/b/log* | tr '\n' ' ' | cut -c 1-300)"
fi
n=$(grep -l "restored $pairs pairs from $W/a.db" "$W"/b/log* 2>/dev/null | wc -l)
[ "$n" = 3 ] && t_ok "every replica logged the restore of $pairs pairs" ||
    t_fail "every replica logged the restore" "$n of 3: $(grep -h -m 3 restor "$W"/b/log* | tr '\n' ' ' | cut -c 1-300)"
# (wait_serving put probe=x on both clusters: the same pair.)
"$CLI" -c "$W/b/cluster.conf" -t 10000 snapshot save "$W/b.db" >"$W/saveb.out" 2>&1
if [ "$(status_of "$W/b.db" pairs)" = "$(status_of "$W/a.db" pairs)" ] &&
    [ -n "$(status_of "$W/b.db" pairs_digest)" ] &&
    [ "$(status_of "$W/b.db" pairs_digest)" = "$(status_of "$W/a.db" pairs_digest)" ] &&
    [ "$(status_of "$W/b.db" sessions)" -lt 50 ]; then
    t_ok "the restored cluster holds every key and value of the backup ($(status_of "$W/b.db" pairs) pairs, digest $(status_of "$W/b.db" pairs_digest))"
else
    t_fail "the restored cluster holds the backup's pairs" "a: $(status_of "$W/a.db" pairs) $(status_of "$W/a.db" pairs_digest), b: $(status_of "$W/b.db" pairs) $(status_of "$W/b.db" pairs_digest) $(head -c 200 "$W/saveb.out")"
fi
# Keys by name: every 5,000th key YCSB loaded reads back from the new cluster.
miss=0 n=0
for key in $("$YCSB" load "${ycsb_common[@]}" --dry-run 2>/dev/null | awk 'NR % 5000 == 1 { print $3 }'); do
    n=$((n + 1))
    "$CLI" -c "$W/b/cluster.conf" get "$key" >/dev/null 2>&1 || miss=$((miss + 1))
done
[ "$n" -ge 20 ] && [ "$miss" = 0 ] && t_ok "$n sampled YCSB keys read from the restored cluster" ||
    t_fail "sampled keys on the restored cluster" "$miss of $n missing"
"$CLI" -c "$W/b/cluster.conf" put after-restore yes >/dev/null 2>&1 &&
    [ "$("$CLI" -c "$W/b/cluster.conf" get after-restore 2>/dev/null)" = yes ] &&
    t_ok "the restored cluster takes writes" || t_fail "the restored cluster takes writes" ""

# 3. Refusals.
cp "$W/a.db" "$W/bad.db"
printf 'Z' | dd of="$W/bad.db" bs=1 seek=$((50 << 20)) conv=notrunc status=none
out=$("$CLI" snapshot status "$W/bad.db" 2>&1)
rc=$?
[ "$rc" = 3 ] && [[ $out == *"checksum mismatch"* ]] && t_ok "a damaged file is refused by status (exit 3: ${out:0:120})" ||
    t_fail "status refuses a damaged file" "rc=$rc $out"
fk_local_conf "$W/c/cluster.conf" multipaxos async $((base + 20))
out=$(timeout 120 "$SERVER" -c "$W/c/cluster.conf" -i 0 -m off --restore "$W/bad.db" 2>&1)
rc=$?
if [ "$rc" = 1 ] && [[ $out == *"checksum mismatch"* ]]; then
    t_ok "--restore refuses a damaged file (exit 1: $(echo "$out" | tail -n 1 | cut -c 1-150))"
else
    t_fail "--restore refuses a damaged file" "rc=$rc $(echo "$out" | tail -n 2)"
fi
stop_all "$W/a"
out=$(timeout 60 "$SERVER" -c "$W/a/cluster.conf" -i 1 -m off --restore "$W/b.db" 2>&1)
rc=$?
if [ "$rc" = 1 ] && [[ $out == *"holds a replica's state"* ]]; then
    t_ok "--restore into a replica with state is refused (exit 1)"
else
    t_fail "--restore into a replica with state is refused" "rc=$rc $(echo "$out" | tail -n 2)"
fi
# The NOPaxos leader's backup (views held until committed) into Multi-Paxos.
l=$(leader_of "$W/b")
"$CLI" -c "$W/b/cluster.conf" -t 10000 snapshot save "$W/lead.db" "${l:-0}" >"$W/savel.out" 2>&1
rc=$?
[ "$rc" = 0 ] && [ "$(status_of "$W/lead.db" replica)" = "${l:-0}" ] &&
    t_ok "a backup from the nopaxos leader (replica ${l:-?}): $(cut -c 1-120 "$W/savel.out")" ||
    t_fail "a backup from the nopaxos leader" "rc=$rc $(head -c 200 "$W/savel.out")"
stop_all "$W/b"
rm -rf "$W/c/data0"
for i in 0 1 2; do start "$W/c" "$i" --restore "$W/lead.db"; done
wait_serving "$W/c" >/dev/null
v=$("$CLI" -c "$W/c/cluster.conf" get after-restore 2>/dev/null)
"$CLI" -c "$W/c/cluster.conf" del after-restore >/dev/null 2>&1
"$CLI" -c "$W/c/cluster.conf" -t 10000 snapshot save "$W/c.db" >/dev/null 2>&1
if [ "$v" = yes ] && [ "$(status_of "$W/c.db" pairs_digest)" = "$(status_of "$W/a.db" pairs_digest)" ]; then
    t_ok "restored into multipaxos from the nopaxos leader's backup: the same pairs"
else
    t_fail "nopaxos backup into multipaxos" "v=$v $(status_of "$W/c.db" pairs) $(status_of "$W/c.db" pairs_digest)"
fi
stop_all "$W/c"
t_done

#!/usr/bin/env bash
# test_cluster.sh: real flowkv-server replicas on loopback, for each
# protocol: every operation through the CLI and the library, malformed
# requests, SIGKILL of the leader under a running workload (every
# acknowledged write stays readable, the cluster serves again), a replica
# restarted from its LMDB directory catches up, a replica started empty
# recovers by state transfer, SIGTERM leaves environments that reopen;
# then, on both protocols, 64 MiB streamed to wiped followers under a
# writer, with the receiver and then the sender killed mid-transfer.
# Every wait is bounded; every process started here is stopped by PID.
set -u
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-$ROOT/build}
SERVER=$B/bin/flowkv-server
CLI=$B/bin/flowkv
KV=$B/tests-aux/kv_check
HIST=$B/tests-aux/kv_history
WORK=$(mktemp -d /tmp/fkcluster.XXXXXX)
declare -A PID
cleanup() {
    for p in "${PID[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${PID[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT
export FLOWKV_LOG=${FLOWKV_LOG:-info}
. "$ROOT/tests/cluster/cluster-lib.sh"


cli_scan() { # cli_scan DIR: the CLI pages a long scan (after kv_check paging)
    local c="$1/cluster.conf" n
    n=$("$CLI" -c "$c" scan pg- 10000 | wc -l) && [ "$n" -eq 10000 ] || { echo "$n lines"; return 1; }
    [ "$("$CLI" -c "$c" scan pg-00010 100 pg-00012)" = "$(printf 'pg-00010\t00010\npg-00011\t00011')" ] || return 2
    "$CLI" -c "$c" scan pg- 10001 2>/dev/null; [ $? -eq 2 ] || return 3
}

quota_full() { # quota_full DIR BYTES: the library and the CLI at the data quota, then room again
    local c="$1/cluster.conf" err
    "$KV" "$c" quota fill || return 1
    err=$(head -c 2010 /dev/zero | tr '\0' x | "$CLI" -c "$c" put q-cli 2>&1); [ $? -eq 3 ] || return 2
    case $err in "flowkv: put: quota exceeded ("*" of $2 bytes)") ;; *) echo "$err"; return 3 ;; esac
    "$KV" "$c" quota clear || return 4
}

# metrics_and_health DIR: every replica's /metrics parses with the
# Prometheus client's own text-format parser (Debian's
# python3-prometheus-client, under Debian's python3), each family's lines
# together, request latencies as histograms, one replica with
# flowkv_is_leader 1, build and process metrics; /health answers 200 with
# health "true" on each.
metrics_and_health() {
    local i a
    for i in 0 1 2; do
        metrics_of "$1" $i >"$1/metrics$i.txt"
        /usr/bin/python3 - "$1/metrics$i.txt" <<'PY' || return 1
import sys
from prometheus_client.parser import text_string_to_metric_families
raw = open(sys.argv[1]).read()
text = raw[raw.index("# HELP"):]
fams = {f.name: f for f in text_string_to_metric_families(text)}
# Each family's samples in one group: a name, once left, never comes back.
seen, last = set(), None
for line in text.splitlines():
    if line.startswith("#") or not line:
        continue
    name = line.split("{")[0].split(" ")[0]
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in fams:
            name = name[: -len(suffix)]
    if name != last:
        assert name not in seen, "family %s is split" % name
        seen.add(name)
        last = name
h = fams["flowkv_request_seconds"]
assert h.type == "histogram", h.type
les = [s.labels["le"] for s in h.samples if s.name.endswith("_bucket") and s.labels["op"] == "put"]
assert les[-1] == "+Inf" and len(les) > 5, les
assert fams["flowkv_lmdb_commit_seconds"].type == "histogram"
for f in ("flowkv_is_leader", "flowkv_build_info", "process_resident_memory_bytes", "process_open_fds"):
    assert fams[f].type == "gauge", f
assert fams["process_cpu_seconds"].type == "counter"
assert fams["process_resident_memory_bytes"].samples[0].value > 1 << 20
assert fams["flowkv_build_info"].samples[0].labels["version"]
print(int(fams["flowkv_is_leader"].samples[0].value))
PY
    done >"$1/leaders.txt"
    [ "$(awk '{ s += $1 } END { print s }' "$1/leaders.txt")" = 1 ] ||
        { echo "flowkv_is_leader: $(tr '\n' ' ' <"$1/leaders.txt")"; return 1; }
    for i in 0 1 2; do
        a=$(http_of "$1" $i /health)
        [[ $a == "HTTP/1.1 200 OK"* ]] && grep -q '"health":"true"' <<<"$a" ||
            { echo "replica $i /health: $a"; return 1; }
    done
}

# lone_health PROTO BASEPORT: one replica of a 3-replica cluster, alone,
# knows no leader: /health answers 503 and says why.
lone_health() {
    local d=$WORK/$1-lone a=""
    fk_local_conf "$d/cluster.conf" "$1" sync "$2"
    start "$d" 0 --new-cluster
    for _ in $(seq 30); do
        a=$(http_of "$d" 0 /health)
        [[ $a == "HTTP/1.1 503 "* ]] && break
        sleep 0.2
    done
    stop "$d" 0 TERM
    [[ $a == "HTTP/1.1 503 Service Unavailable"* ]] && grep -q '"health":"false"' <<<"$a" &&
        grep -q '"reason":' <<<"$a" || { echo "got: $a"; return 1; }
}

# state_dump DIR PROTO: SIGUSR1 makes each replica log one line of its
# protocol state (srv_node_dump) and keep serving; `flowkv status` shows
# each log's end beside its commit point.
state_dump() {
    local d=$1 i n line st
    for i in 0 1 2; do
        n=$(grep -c ' state: ' "$d/log$i")
        kill -USR1 "${PID[$d.$i]}" || { echo "replica $i is gone"; return 1; }
        for _ in $(seq 20); do
            [ "$(grep -c ' state: ' "$d/log$i")" -gt "$n" ] && break
            sleep 0.1
        done
        line=$(grep ' state: ' "$d/log$i" | tail -n 1)
        [[ "$line" == *" commit "[0-9]*" failed sends "[0-9]*"; durable "[0-9]* ]] ||
            { echo "replica $i logged no state line within 2 s: ${line:-nothing}"; return 1; }
        if [ "$2" = nopaxos ] && [ "$i" = "$(leader_of "$d")" ]; then
            [[ "$line" == *" leader log "*" acked "* ]] || { echo "the leader's line names no follower: $line"; return 1; }
        fi
    done
    st=$("$CLI" -c "$d/cluster.conf" status) || { echo "status failed after SIGUSR1"; return 1; }
    # Columns: id role protocol fabric term leader commit applied lag last.
    awk 'NR > 1 && ($10 == "" || $10 < $7) { bad = 1 } END { exit bad }' <<<"$st" ||
        { echo "a replica's last slot is missing or below its commit: $st"; return 1; }
}

run_protocol() {
    local proto=$1 base=$2 d=$WORK/$1
    # A small quota, for the quota checks: 2 MiB holds Multi-Paxos' 1 MiB
    # value.
    local quota=2MiB
    fk_local_conf "$d/cluster.conf" "$proto" sync "$base" "$quota"
    for i in 0 1 2; do start "$d" $i --new-cluster; done
    if wait_serving "$d"; then t_ok "$proto: 3 replicas serve"; else
        t_fail "$proto: 3 replicas serve" "no put succeeded within 30 s: $(tail -n 3 "$d/log0")"
        for i in 0 1 2; do stop "$d" $i KILL; done
        return
    fi
    t_check "$proto: every CLI command, with its exit status" cli_ops "$d" "$proto"
    t_check "$proto: /metrics parses as Prometheus text (families grouped, latency histograms, one leader); /health 200" \
        metrics_and_health "$d"
    t_check "$proto: a replica alone, with no leader, answers /health with 503 and the reason" \
        lone_health "$proto" $((base + 200))
    t_check "$proto: SIGUSR1 logs each replica's protocol state; status shows each log's end" state_dump "$d" "$proto"
    if [ "$proto" = multipaxos ]; then
        local l0 sent
        l0=$(leader_of "$d")
        sent=$(metric "$d" "$l0" 'flowkv_peer_messages_total{flow="replicate",dir="out"}')
        if [ "$sent" -gt 0 ] && on_replicate_flow "$d" $(((l0 + 1) % 3)) >/dev/null &&
            on_replicate_flow "$d" $(((l0 + 2) % 3)) >/dev/null; then
            t_ok "$proto: the leader's accepts travel on its replicate flow ($sent messages sent)"
        else
            t_fail "$proto: replicate flow" "leader $l0 sent $sent messages on kv.bcast.$l0; followers received $(metric "$d" $(((l0 + 1) % 3)) 'flowkv_peer_messages_total{flow="replicate",dir="in"}') and $(metric "$d" $(((l0 + 2) % 3)) 'flowkv_peer_messages_total{flow="replicate",dir="in"}')"
        fi
    fi
    t_check "$proto: every library call (sync, pipelined, limits, status)" "$KV" "$d/cluster.conf" api
    t_check "$proto: flowkv_scan_range pages through 50,000 keys, 10,000 per call" \
        "$KV" "$d/cluster.conf" paging 50000
    t_check "$proto: flowkv scan prints 10,000 pairs, and stops at an end key" cli_scan "$d"
    t_check "$proto: a full cluster answers quota exceeded (N of M bytes)" quota_full "$d" 2097152
    t_check "$proto: a client with a wrong token is refused with a clear error" wrong_token "$d"
    "$KV" "$d/cluster.conf" garbage 0 >/dev/null 2>&1
    t_check "$proto: malformed request bytes leave the replicas serving" "$CLI" -c "$d/cluster.conf" put after-garbage ok

    # SIGKILL the leader while a client writes.
    local acks=$d/acks leader
    leader=$(leader_of "$d")
    "$KV" "$d/cluster.conf" write w 300 "$acks" >"$d/writer.out" 2>&1 &
    local writer=$!
    sleep 1
    stop "$d" "$leader" KILL
    # `status` fails while a replica is down, naming it (etcdctl endpoint health).
    local st_out st_rc
    st_out=$("$CLI" -c "$d/cluster.conf" -t 1000 status 2>&1)
    st_rc=$?
    if [ $st_rc -eq 4 ] && grep -q "flowkv: status: replica $leader is unreachable" <<<"$st_out"; then
        t_ok "$proto: flowkv status exits 4 and names replica $leader while it is down"
    else
        t_fail "$proto: flowkv status while a replica is down" "exit $st_rc: $(tr '\n' ' ' <<<"$st_out")"
    fi
    local t0=$(date +%s%N)
    wait_serving "$d"
    local t1=$(date +%s%N)
    if wait "$writer"; then t_ok "$proto: writer went on after the leader ($leader) was killed: $(cat "$d/writer.out"), unavailable $(((t1 - t0) / 1000000)) ms"; else
        t_fail "$proto: writer after leader kill" "$(cat "$d/writer.out")"
    fi
    t_check "$proto: every acknowledged write is readable after the leader died" "$KV" "$d/cluster.conf" verify w "$acks"

    # The killed replica restarts from its LMDB directory and catches up.
    start "$d" "$leader"
    if wait_caught_up "$d" "$leader"; then t_ok "$proto: replica $leader restarted from disk caught up"; else
        t_fail "$proto: restart from disk" "replica $leader commit $(status_field "$d" "$leader" 7): $(tail -n 3 "$d/log$leader")"
    fi
    # The new leader's replicate flow, open all along, reaches it again.
    [ "$proto" = multipaxos ] &&
        t_check "$proto: the restarted replica hears the new leader's replicate flow" on_replicate_flow "$d" "$leader"

    # A follower loses its disk and recovers by state transfer.
    local f=$(((leader + 1) % 3))
    [ "$(leader_of "$d")" = "$f" ] && f=$(((f + 1) % 3))
    stop "$d" $f KILL
    rm -rf "$d/data$f"
    start "$d" $f
    if wait_caught_up "$d" $f; then t_ok "$proto: replica $f started empty recovered by state transfer"; else
        t_fail "$proto: empty restart" "replica $f commit $(status_field "$d" $f 7): $(tail -n 3 "$d/log$f")"
    fi

    # SIGTERM drains; the environments reopen cleanly.
    local clean=1
    for i in 0 1 2; do stop "$d" $i TERM || clean=0; done
    [ $clean = 1 ] && t_ok "$proto: SIGTERM stops every replica with status 0" ||
        t_fail "$proto: SIGTERM" "a replica exited non-zero: $(tail -n 2 "$d"/log*)"
    local ok=1
    for i in 0 1 2; do mdb_stat -e "$d/data$i" >/dev/null 2>&1 || ok=0; done
    [ $ok = 1 ] && t_ok "$proto: LMDB environments reopen after SIGTERM (mdb_stat)" ||
        t_fail "$proto: LMDB after SIGTERM" "mdb_stat failed"
}

# ---- state transfer of a large state (issue 24) ------------------------------
# Both protocols keep their state in LMDB and move it in chunks
# (cons_xfer.h).

# wait_log DIR ID TEXT [N]: replica ID's log holds TEXT at least N times
# (default 1), within 60 s.
wait_log() {
    for _ in $(seq 600); do
        [ "$(grep -c -- "$3" "$1/log$2" 2>/dev/null)" -ge "${4:-1}" ] && return 0
        sleep 0.1
    done
    return 1
}

# live_dump DIR ID: replica ID's live key-value pairs (the set "sm.live"
# names, kv_store.h), as mdb_dump prints them; the replica is stopped.
live_dump() {
    local db=data
    mdb_dump -p -s meta "$1/data$2" 2>/dev/null | grep -A1 -x ' sm.live' | tail -n 1 | grep -qx ' \\01' && db=data.1
    mdb_dump -p -s "$db" "$1/data$2" | sed -n '/^HEADER=END$/,$p'
}

# all_caught_up DIR: the three replicas report the same commit (bounded 30 s).
all_caught_up() {
    local c
    for _ in $(seq 60); do
        "$CLI" -c "$1/cluster.conf" -t 1000 put probe z >/dev/null 2>&1
        c=$(for i in 0 1 2; do status_field "$1" $i 7; done | sort -u | wc -w)
        [ "$c" = 1 ] && return 0
        sleep 0.5
    done
    return 1
}

# xfer_into DIR F: F has lost its disk and restarts empty; sets XFER_FROM to
# the replica it first fetches from (from its log).
xfer_into() {
    stop "$1" "$2" KILL
    rm -rf "$1/data$2"
    : >"$1/log$2"
    start "$1" "$2"
    wait_log "$1" "$2" "state transfer: fetching" || return 1
    XFER_FROM=$(sed -n 's/.*state transfer: fetching the state from replica \([0-9]*\).*/\1/p' "$1/log$2" | head -n 1)
}

run_transfer() { # run_transfer PROTO BASEPORT
    local proto=$1 d=$WORK/transfer-$1 base=$2 n=67200 # 67,200 values of 1,000 bytes: 64.1 MiB
    fk_local_conf "$d/cluster.conf" "$proto" async "$base" 256MiB
    # Small chunks, one in flight: the transfer takes seconds (it takes 0.15 s
    # with the defaults), so the kills below land in its middle.
    sed -i 's/^\[cluster\]$/&\ntransfer_chunk = 4KiB\ntransfer_window = 1/' "$d/cluster.conf"
    for i in 0 1 2; do start "$d" $i --new-cluster; done
    wait_serving "$d" || { t_fail "$proto transfer: 3 replicas serve" "$(tail -n 3 "$d/log0")"; return; }
    t_check "$proto transfer: 64 MiB loaded (67,200 values of 1,000 bytes)" "$KV" "$d/cluster.conf" bulk load b $n
    local l f
    l=$(leader_of "$d")
    f=$(((l + 1) % 3))

    # A wiped follower fetches the state while a writer runs; killed
    # mid-transfer, it restarts and fetches it again.
    "$HIST" "$d/cluster.conf" run "$d/hist" --clients 4 --keys 8 --seconds 25 >"$d/hist.out" 2>&1 &
    local hist=$!
    xfer_into "$d" $f || t_fail "$proto transfer: the wiped follower starts fetching" "$(tail -n 3 "$d/log$f")"
    sleep 0.1
    if grep -q "state transfer: complete" "$d/log$f"; then
        t_fail "$proto transfer: receiver killed mid-transfer" "the transfer was over within 0.1 s: $(grep 'state transfer' "$d/log$f")"
    else
        stop "$d" $f KILL
        start "$d" $f
        if wait_log "$d" $f "state transfer: complete" && wait_caught_up "$d" $f; then
            t_ok "$proto transfer: a receiver killed mid-transfer restarts and completes ($(grep -o 'complete, .*' "$d/log$f" | tail -n 1))"
        else
            t_fail "$proto transfer: receiver killed mid-transfer" "$(grep 'state transfer' "$d/log$f" | tail -n 3)"
        fi
    fi

    # A sender killed mid-transfer: the receiver fetches from the other one.
    local g=$(((l + 2) % 3))
    xfer_into "$d" $g || t_fail "$proto transfer: the second wiped follower starts fetching" "$(tail -n 3 "$d/log$g")"
    local s=$XFER_FROM
    sleep 0.1
    if grep -q "state transfer: complete" "$d/log$g"; then
        t_fail "$proto transfer: sender killed mid-transfer" "the transfer was over within 0.1 s"
    else
        stop "$d" "$s" KILL
        if wait_log "$d" $g "state transfer: complete" && grep -q "from replica .* (again" "$d/log$g"; then
            t_ok "$proto transfer: a sender ($s) killed mid-transfer, the receiver completes from another replica"
        else
            t_fail "$proto transfer: sender killed mid-transfer" "$(grep 'state transfer' "$d/log$g" | tail -n 3)"
        fi
        start "$d" "$s"
    fi
    wait "$hist"
    if all_caught_up "$d"; then
        t_ok "$proto transfer: every replica caught up after the transfers"
    else
        t_fail "$proto transfer: catch-up" "commits: $(for i in 0 1 2; do status_field "$d" $i 7; done | tr '\n' ' ')"
    fi
    t_check "$proto transfer: the writer's history is linearizable ($(head -c 120 "$d/hist.out"))" "$HIST" check "$d/hist"
    t_check "$proto transfer: every one of the 67,200 loaded values reads back" "$KV" "$d/cluster.conf" bulk check b $n
    for i in 0 1 2; do stop "$d" $i TERM; done
    local same=1
    for i in 1 2; do cmp -s <(live_dump "$d" 0) <(live_dump "$d" $i) || same=0; done
    [ $same = 1 ] && t_ok "$proto transfer: the three replicas hold the same pairs ($(live_dump "$d" 0 | wc -l) dump lines)" ||
        t_fail "$proto transfer: same pairs" "live sets differ: $(for i in 0 1 2; do live_dump "$d" $i | wc -l; done | tr '\n' ' ')"
}

run_protocol multipaxos "$(fk_base_port)"
run_protocol nopaxos "$(fk_base_port)"
run_transfer multipaxos "$(fk_base_port)"
run_transfer nopaxos "$(fk_base_port)"
t_done

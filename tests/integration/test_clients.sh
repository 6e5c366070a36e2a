#!/usr/bin/env bash
# test_clients.sh: clients at scale on real replicas, for each protocol.
# 1,024 handles from four processes (kv_clients: one thread a handle, the
# handles of a process on one channel, client/flowkv.h) each put and get
# their key; a process of 200 handles killed with SIGKILL mid-request gives
# its flow memory back (flowkv_flow_memory_bytes within 10% of its level
# before it joined) while the others go on being served; a cluster whose
# flow_memory holds one client process refuses a second one with the
# documented message, and the first is still served.
# On tcp over loopback here; tests/rdma-vm/cluster.sh runs the first part
# (1,024 handles, 200 killed) on verbs (FK_TEST_FABRIC, FK_TEST_HOSTS:
# fk_local_conf) with FK_CLIENTS_REFUSAL=0: the refusal is the flows
# node's memory accounting at attach, the same on both fabrics, and a
# refused process of 256 handles takes minutes under emulation.
# Every wait is bounded; every process started here is stopped by PID.
set -u
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-$ROOT/build}
SERVER=$B/bin/flowkv-server
CLI=$B/bin/flowkv
CLIENTS=$B/tests-aux/kv_clients
WORK=$(mktemp -d /tmp/fkclients.XXXXXX)
declare -A PID
cleanup() {
    for p in "${PID[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${PID[@]}"; do wait "$p" 2>/dev/null; done
    exec 7>&- 8>&- 9>&- 6>&- 5>&- 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
export FLOWKV_LOG=${FLOWKV_LOG:-warn}

. "$ROOT/tests/cluster/cluster-lib.sh"
# memory DIR ID [NAME]: the metric NAME (default flowkv_flow_memory_bytes)
# of replica ID (bounded 5 s).
memory() { metric "$1" "$2" "${3:-flowkv_flow_memory_bytes}"; }
# settled DIR ID [NAME]: memory DIR ID NAME once two readings 0.3 s apart
# agree (rings and reply stages come and go for a moment as a process's
# channel grows), bounded 6 s.
settled() {
    local a b
    a=$(memory "$@")
    for _ in $(seq 20); do
        sleep 0.3
        b=$(memory "$@")
        [ "$a" = "$b" ] && break
        a=$b
    done
    echo "$a"
}
# clients DIR KEY N TAG FD: kv_clients in the background, its stdin a
# pipe whose write end this shell holds on FD (closing FD ends it; no
# other process holds it), its output in DIR/TAG.out.
clients() {
    local d=$1 k=$2 n=$3 tag=$4 fd=$5
    mkfifo "$d/$tag.in"
    "$CLIENTS" "$d/cluster.conf" "$n" "$tag" <"$d/$tag.in" >"$d/$tag.out" 2>"$d/$tag.err" 5>&- 6>&- 7>&- 8>&- &
    PID[$k]=$!
    eval "exec $fd>\"\$d/\$tag.in\""
}
wait_out() { # wait_out FILE TEXT SECONDS
    for _ in $(seq $(($3 * 10))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}
finish() { # finish KEY FD FILE: closes its stdin and reaps it (bounded 30 s); its exit status
    local p=${PID[$1]} rc
    eval "exec $2>&-"
    for _ in $(seq 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p"
    rc=$?
    unset "PID[$1]"
    return $rc
}
# near A B: A within 10% of B.
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= b / 10) }'; }

for proto in multipaxos nopaxos; do
    d=$WORK/$proto
    fk_local_conf "$d/cluster.conf" "$proto" async "$(fk_base_port)"
    for i in 0 1 2; do start "$d" $i --new-cluster; done
    if ! wait_serving "$d"; then
        t_fail "$proto: cluster serves" "no put succeeded in 30 s"
        continue
    fi
    # 1,024 handles: three processes of 256, 312 and 256, then one of 200.
    m0=$(memory "$d" 0)
    clients "$d" A 256 a 5
    clients "$d" B 312 b 6
    clients "$d" C 256 c 7
    ok=1
    for t in a b c; do wait_out "$d/$t.out" "answered\|failed" 120 || ok=0; done
    m1=$(settled "$d" 0)
    c1=$(settled "$d" 0 flowkv_flow_client_memory_bytes)
    clients "$d" D 200 d 8
    wait_out "$d/d.out" "answered\|failed" 120 || ok=0
    m2=$(settled "$d" 0)
    c2=$(settled "$d" 0 flowkv_flow_client_memory_bytes)
    if [ $ok = 1 ] && [ "$(cat "$d"/[abcd].out | grep -c '^answered')" = 4 ]; then
        t_ok "$proto: 1,024 handles from four processes each put and get (flow memory $m0 -> $m1 -> $m2 bytes)"
    else
        t_fail "$proto: 1,024 handles each put and get" "$(for t in a b c d; do printf '%s: %s %s; ' "$t" "$(head -n 1 "$d/$t.out" 2>/dev/null)" "$(head -n 2 "$d/$t.err" 2>/dev/null | tr '\n' ' ')"; done)"
    fi
    [ "$m2" -gt "$m1" ] && [ "$m1" -gt "$m0" ] && t_ok "$proto: flowkv_flow_memory_bytes grows with client processes" ||
        t_fail "$proto: flowkv_flow_memory_bytes grows with client processes" "$m0 -> $m1 -> $m2"
    # The 200 handles of D die mid-request (each does a put and a get
    # every 20 ms); the replicas reclaim their rings: the clients' share
    # of the flow memory (their request rings) comes back to within 10%
    # of its level before D joined (D's channel added a quarter to it), the
    # total too (the replicas' reply stages for D go with its connection:
    # flow_source_sweep).
    sleep 0.5
    kill -KILL "${PID[D]}"
    wait "${PID[D]}" 2>/dev/null
    unset "PID[D]"
    exec 8>&-
    back=0
    for _ in $(seq 100); do
        m3=$(memory "$d" 0)
        c3=$(memory "$d" 0 flowkv_flow_client_memory_bytes)
        near "$m3" "$m1" && near "$c3" "$c1" && { back=1; break; }
        sleep 0.2
    done
    [ $back = 1 ] && [ "$c2" -gt $((c1 + c1 / 5)) ] &&
        t_ok "$proto: 200 handles killed mid-request: flow memory back to $m3 (was $m1 before they joined), the clients' rings to $c3 ($c1 before, $c2 with them)" ||
        t_fail "$proto: flow memory after 200 handles were killed" "$m3 bytes ($m1 before they joined), clients' $c3 ($c1 before, $c2 with them)"
    sa=0
    for k in A:5:a B:6:b C:7:c; do
        IFS=: read -r key fd tag <<<"$k"
        finish "$key" "$fd" || sa=1
    done
    served=$(awk '/^served/ { s += $2 } END { print s + 0 }' "$d"/[abc].out)
    [ $sa = 0 ] && [ "$served" -gt 0 ] && t_ok "$proto: the other 824 served every request meanwhile ($served answered)" ||
        t_fail "$proto: the other 824 served every request" "$(cat "$d"/[abc].err | head -n 2 | tr '\n' ' ')"

    for i in 0 1 2; do stop "$d" $i TERM; done
    [ "${FK_CLIENTS_REFUSAL:-1}" = 0 ] && continue

    # Refusal: a cluster with room for the request rings of one client
    # process of 64 handles at each replica (kv.req's, and kv.oum's for
    # NOPaxos: README, Limits; rings grow with a process's handles, and a
    # growth holds the old ring and the new one at once), but not for a
    # second process of 256: that one is refused (some of its handles
    # open before its rings outgrow the room), and the first goes on being
    # served.
    d=$WORK/$proto-limit
    fk_local_conf "$d/cluster.conf" "$proto" async "$(fk_base_port)"
    [ "$proto" = nopaxos ] && lim=900KiB || lim=400KiB
    sed -i "s/^\[cluster\]$/[cluster]\nflow_memory = $lim/" "$d/cluster.conf"
    for i in 0 1 2; do start "$d" $i --new-cluster; done
    wait_serving "$d" || t_fail "$proto: a cluster with flow_memory = $lim serves" "no put in 30 s"
    # The probes' rings come back once the replicas read their ends.
    for _ in $(seq 100); do
        [ "$(memory "$d" 0 flowkv_flow_client_memory_bytes)$(memory "$d" 1 flowkv_flow_client_memory_bytes)$(memory "$d" 2 flowkv_flow_client_memory_bytes)" = 000 ] && break
        sleep 0.1
    done
    clients "$d" E 64 e 5
    wait_out "$d/e.out" "answered\|failed" 60
    ce=$(memory "$d" 0 flowkv_flow_client_memory_bytes)
    out=$("$CLIENTS" "$d/cluster.conf" 256 f </dev/null 2>&1)
    case "$out" in
    *"refused this client: client memory limit reached ("*" bytes"*)
        t_ok "$proto: a client past flow_memory is refused: $(head -n 1 <<<"$out")" ;;
    *) t_fail "$proto: a client past flow_memory is refused with the limit's message" "$out" ;;
    esac
    if grep -q "^answered 64" "$d/e.out" && finish E 5 && grep -q "^served [1-9]" "$d/e.out"; then
        t_ok "$proto: the client within the limit is served throughout ($(grep '^served' "$d/e.out"), its rings $ce bytes at replica 0)"
    else
        t_fail "$proto: the client within the limit is served" "$(cat "$d/e.out" "$d/e.err" | tr '\n' ' ')"
    fi
    for i in 0 1 2; do stop "$d" $i TERM; done
done
t_done

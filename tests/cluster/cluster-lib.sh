# shellcheck shell=bash
# tests/cluster/cluster-lib.sh: helpers for shell tests that run real
# flowkv-server replicas (tests/integration/test_cluster.sh on loopback,
# tests/rdma-vm/cluster.sh on Soft-RoCE). Source it after tests/lib.sh with
# SERVER and CLI set (KV, tests-aux/kv_check, for the checks that use it)
# and `declare -A PID`; a
# cluster is a directory DIR holding cluster.conf (fk_local_conf) and the
# replicas' logs DIR/logN. Every wait is bounded; replicas are started in
# the background, recorded in PID[DIR.ID] and stopped by PID.

# start DIR ID [flags]: one replica in the background, its metrics on
# its own address's host, port BASE+50+ID (metrics_addr).
start() {
    local d=$1 i=$2
    shift 2
    "$SERVER" -c "$d/cluster.conf" -i "$i" -m "$(metrics_addr "$d" "$i")" "$@" >>"$d/log$i" 2>&1 &
    PID[$d.$i]=$!
}
# metrics_addr DIR ID: HOST:PORT of replica ID's metrics page: the host of
# its address, the port the first node's plus 50 plus ID.
metrics_addr() {
    local base host
    base=$(sed -n 's/^address = .*:\([0-9]*\)$/\1/p' "$1/cluster.conf" | head -n 1)
    host=$(awk -v id="$2" '/^\[node / { n = $2 + 0 } /^address = / && n == id { sub(/^address = /, ""); sub(/:[0-9]+$/, ""); print; exit }' "$1/cluster.conf")
    echo "$host:$((base + 50 + $2))"
}

# http_of DIR ID PATH: replica ID's answer to GET PATH on its metrics
# address, status line and headers included (bounded 5 s).
http_of() {
    local a
    a=$(metrics_addr "$1" "$2")
    timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "GET $3 HTTP/1.1\r\nHost: x\r\n\r\n" >&3 && cat <&3' \
        _ "${a%:*}" "${a##*:}" "$3" 2>/dev/null | tr -d '\r'
}

# metrics_of DIR ID: replica ID's metrics page (bounded 5 s).
metrics_of() { http_of "$1" "$2" /metrics; }

# metric DIR ID SAMPLE: the value of SAMPLE (name{labels}) on replica ID's
# metrics page, 0 when absent (bounded 5 s).
metric() {
    local v
    v=$(metrics_of "$1" "$2" | awk -v s="$3" 'index($0, s " ") == 1 { print $2 }')
    echo "${v:-0}"
}

# on_replicate_flow DIR ID: replica ID takes protocol messages from its
# peers' replicate flows (Multi-Paxos: the leader's accepts and commits on
# kv.bcast.<leader>), within 10 s.
on_replicate_flow() {
    local n
    for _ in $(seq 20); do
        n=$(metric "$1" "$2" 'flowkv_peer_messages_total{flow="replicate",dir="in"}')
        [ "$n" -gt 0 ] && return 0
        sleep 0.5
    done
    echo "replica $2 received nothing on a replicate flow"
    return 1
}

stop() { # stop DIR ID SIGNAL: signals the replica and reaps it (bounded)
    local p=${PID[$1.$2]:-}
    [ -n "$p" ] || return 0
    kill -"$3" "$p" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    local rc=$?
    unset "PID[$1.$2]"
    return $rc
}

# status_field DIR ID COLUMN: a column of `flowkv status` for replica ID.
status_field() {
    "$CLI" -c "$1/cluster.conf" -t 1000 status 2>/dev/null | awk -v id="$2" -v col="$3" '$1 == id { print $col }'
}

leader_of() { "$CLI" -c "$1/cluster.conf" -t 1000 status 2>/dev/null | awk '$2 == "leader" { print $1; exit }'; }

wait_serving() { # wait_serving DIR: a put succeeds (bounded 30 s)
    for _ in $(seq 60); do
        "$CLI" -c "$1/cluster.conf" -t 1000 put probe x >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    return 1
}

wait_caught_up() { # wait_caught_up DIR ID: its commit point reaches the leader's (bounded 30 s)
    local l c
    for _ in $(seq 60); do
        "$CLI" -c "$1/cluster.conf" -t 1000 put probe y >/dev/null 2>&1
        l=$(leader_of "$1")
        if [ -n "$l" ] && [ "$l" != "$2" ]; then
            c=$(status_field "$1" "$2" 7)
            [ -n "$c" ] && [ "$c" = "$(status_field "$1" "$l" 7)" ] && return 0
        fi
        sleep 0.5
    done
    return 1
}

cli_ops() { # cli_ops DIR PROTO: every CLI command and its exit status
    local c="$1/cluster.conf" out rc
    # A failed step says which (its number is the return status) and what
    # the command answered, so that a failure in CI can be told apart.
    "$CLI" -c "$c" put k1 v1 && [ "$("$CLI" -c "$c" get k1)" = v1 ] || { echo "put/get k1"; return 1; }
    echo -n from-stdin | "$CLI" -c "$c" put k2 && [ "$("$CLI" -c "$c" get k2)" = from-stdin ] || {
        echo "put from stdin"
        return 2
    }
    out=$("$CLI" -c "$c" get missing 2>&1)
    rc=$?
    [ $rc -eq 1 ] || { echo "get missing: exit status $rc: $out"; return 3; }
    out=$("$CLI" -c "$c" cas k1 wrong v2 2>&1)
    rc=$?
    [ $rc -eq 5 ] || { echo "cas k1 wrong: exit status $rc: $out"; return 4; }
    "$CLI" -c "$c" cas k1 v1 v2 && [ "$("$CLI" -c "$c" get k1)" = v2 ] || { echo "cas k1 v1 v2"; return 5; }
    out=$("$CLI" -c "$c" scan k 2) && [ "$out" = "$(printf 'k1\tv2\nk2\tfrom-stdin')" ] || {
        echo "scan k 2: $out"
        return 6
    }
    "$CLI" -c "$c" del k2 && { "$CLI" -c "$c" get k2 >/dev/null 2>&1; [ $? -eq 1 ]; } || { echo "del k2"; return 7; }
    # The size limits: the largest key works, one byte more is refused
    # with the error that names the limit (README, Limits).
    local k511 k512 err
    k511=$(head -c 511 /dev/zero | tr '\0' k)
    k512=${k511}k
    "$CLI" -c "$c" put "$k511" v511 && [ "$("$CLI" -c "$c" get "$k511")" = v511 ] || return 8
    err=$("$CLI" -c "$c" put "$k512" v 2>&1); [ $? -eq 3 ] || return 8
    [ "$err" = "flowkv: put: key over the size limit of 511 bytes" ] || { echo "$err"; return 8; }
    # Values: 1 MiB (Multi-Paxos; NOPaxos 4096 bytes of key and value a
    # request, its ordered multicast's limit), read back whole; one byte
    # more is refused, with the limit named.
    local max=1048576
    [ "$2" = nopaxos ] && max=$((4096 - 3))
    head -c "$max" /dev/urandom >"$1/big.in"
    "$CLI" -c "$c" put big <"$1/big.in" && "$CLI" -c "$c" get big >"$1/big.out" || return 9
    head -c "$max" "$1/big.out" | cmp -s - "$1/big.in" || return 9
    [ "$(stat -c %s "$1/big.out")" -eq $((max + 1)) ] || return 9 # and a newline
    err=$(head -c $((max + 1)) /dev/zero | "$CLI" -c "$c" put big 2>&1); [ $? -eq 3 ] || return 9
    case $err in *"value over the size limit of 1048576 bytes"*) ;; *) echo "$err"; return 9 ;; esac
    if [ "$2" = nopaxos ]; then
        case $err in *"nopaxos carries at most 4096 bytes"*) ;; *) echo "$err"; return 9 ;; esac
    fi
    "$CLI" -c "$c" del big || return 9 # room under the 2 MiB quota
    err=$("$CLI" -c "$c" frobnicate 2>&1); [ $? -eq 2 ] || { echo "frobnicate: not status 2"; return 10; }
    case $err in *"unknown command 'frobnicate'"*) ;; *) echo "frobnicate: $err"; return 10; esac
    err=$("$CLI" -c "$c" get 2>&1); [ $? -eq 2 ] || { echo "get without a key: not status 2"; return 10; }
    [ "$err" = "flowkv: get takes KEY (0 given)" ] || { echo "$err"; return 10; }
    [ "$("$CLI" --version)" = "flowkv $("$SERVER" --version | awk '{ print $2 }')" ] || return 10
    # -w json: get, scan and status parse as JSON; keys and values base64.
    "$CLI" -c "$c" put "j s" "v 1" || return 12
    python3 -c 'import base64, json, sys
g = json.loads(sys.argv[1]); s = json.loads(sys.argv[2]); st = json.loads(sys.argv[3])
assert base64.b64decode(g["key"]) == b"j s" and base64.b64decode(g["value"]) == b"v 1", g
assert s["count"] == len(s["kvs"]) == 1 and base64.b64decode(s["kvs"][0]["value"]) == b"v 1", s
assert st["healthy"] and len(st["replicas"]) == 3 and all(r["reachable"] for r in st["replicas"]), st' \
        "$("$CLI" -c "$c" -w json get "j s")" "$("$CLI" -c "$c" -w json scan "j " 5 "j!")" \
        "$("$CLI" -c "$c" -w json status)" || { echo "-w json output"; return 12; }
    "$CLI" -c "$c" del "j s" || return 12
    out=$("$CLI" -c "$c" status 2>&1)
    grep -q leader <<<"$out" || { echo "status shows no leader: $out"; return 11; }
    return 0
}

wrong_token() { # wrong_token DIR: a client with another token is refused, clearly
    sed 's/^token = .*/token = not-the-cluster-token-42/' "$1/cluster.conf" >"$1/wrong.conf"
    local out rc
    out=$("$CLI" -c "$1/wrong.conf" -t 2000 get k1 2>&1)
    rc=$?
    [ $rc -eq 3 ] || { echo "exit status $rc, not 3: $out"; return 1; }
    grep -q 'wrong cluster token' <<<"$out" || { echo "unclear error: $out"; return 1; }
    grep -q 'refused connection .*wrong cluster token' "$1"/log* || { echo "no replica logged it"; return 1; }
}


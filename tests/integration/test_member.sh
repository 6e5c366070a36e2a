#!/usr/bin/env bash
# test_member.sh: changing the replica set of a running Multi-Paxos cluster
# (issue 28 item 1; consensus/mpx.h, "Reconfiguration"). Four nodes in the
# cluster file, `members = 0, 1, 2`: node 3 runs as a learner and catches
# up. While kv_history's clients run, `flowkv member replace 2 3` makes it a
# member in place of node 2, which is then stopped; node 2 starts again
# from its disk (a learner now) and replaces the leader, which hands over
# and is stopped: no operation fails, the history is linearizable, and
# the longest time without an answer around each change is printed (the
# unavailability figure). The CLI
# refuses a change that names no learner or member, NOPaxos answers
# "not supported", and a NOPaxos cluster file with `members` is refused
# at start. Then `flowkv-deploy` (its local runner) brings up four nodes,
# replaces a member, adds the stopped one back from its disk and removes
# another, writing each new configuration into the cluster file. Every wait is bounded; replicas are stopped by PID (the
# deploy's through its own down, then its pid files).
set -u
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-$ROOT/build}
case $B in /*) ;; *) B=$ROOT/$B ;; esac
# shellcheck disable=SC2034 # SERVER: for tests/cluster/cluster-lib.sh
SERVER=$B/bin/flowkv-server
CLI=$B/bin/flowkv
HIST=$B/tests-aux/kv_history
WORK=$(mktemp -d /tmp/fkmember.XXXXXX)
declare -A PID
histpid=""
cleanup() {
    [ -n "$histpid" ] && kill -KILL "$histpid" 2>/dev/null
    for p in "${PID[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${PID[@]}"; do wait "$p" 2>/dev/null; done
    for f in "$WORK"/dep/hosts/*/run/flowkv-*.pid; do
        [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
export FLOWKV_LOG=${FLOWKV_LOG:-warn}
. "$ROOT/tests/cluster/cluster-lib.sh"

# conf FILE PROTOCOL NODES [MEMBERS]: a cluster file on loopback.
conf() {
    local base
    base=$(fk_base_port)
    {
        echo "[cluster]"
        echo "protocol = $2"
        echo "durability = async"
        echo "token = member-test-token-0123456789"
        [ -n "${4:-}" ] && echo "members = $4"
        for i in $(seq 0 $(($3 - 1))); do
            printf '[node %d]\naddress = 127.0.0.1:%d\nfabric = tcp\ndata_dir = data%d\n' \
                "$i" $((base + i)) "$i"
        done
    } >"$1"
}
cli() { "$CLI" -c "$d/cluster.conf" -t 3000 "$@"; }

d=$WORK/mpx
mkdir -p "$d"
conf "$d/cluster.conf" multipaxos 4 "0, 1, 2"
cd "$d" || exit 1
for i in 0 1 2 3; do start "$d" "$i" --new-cluster; done
if ! wait_serving "$d"; then
    t_fail "a cluster of three members and a learner serves" "$(tail -n 3 "$d"/log*)"
    t_done
fi
out=$(cli member list 2>&1)
t_check "member list: epoch 0, members 0,1,2, learner 3 ($out)" grep -qx "epoch 0 members 0,1,2 learners 3" <<<"$out"
cli member add 1 >/dev/null 2>"$d/err"
rc=$?
t_check "member add of a member is refused (exit $rc: $(head -c 120 "$d/err"))" [ "$rc" = 2 ]
cli member replace 2 7 >/dev/null 2>&1
rc=$?
t_check "member replace naming no node is refused (exit $rc)" [ "$rc" = 2 ]

"$HIST" "$d/cluster.conf" run "$d/hist" --clients 4 --keys 8 --seconds 20 --timeout-ms 5000 \
    >"$d/hist.out" 2>&1 &
histpid=$!
sleep 3
t0=$("$HIST" now)
out=$(cli member replace 2 3 2>&1)
rc=$?
t1=$("$HIST" now)
t_check "member replace 2 3 while clients run ($out, $(((t1 - t0) / 1000000)) ms)" [ "$rc" = 0 ]
sleep 1
stop "$d" 2 TERM >/dev/null
out=$(cli member list 2>&1)
t_check "member list after the change: $out" grep -qx "epoch 1 members 0,1,3 learners 2" <<<"$out"
start "$d" 2
sleep 1
t_check "the restarted replica says the cluster file's members are behind its configuration" \
    grep -q 'newer than the cluster file.s (epoch 0): set .members = 0,1,3. and .epoch = 1.' "$d/log2"
l=$(leader_of "$d")
t2=$("$HIST" now)
out=$(cli member replace "${l:-0}" 2 2>&1)
rc=$?
t3=$("$HIST" now)
t_check "member replace ${l:-?} 2, the leader by a restarted learner ($out, $(((t3 - t2) / 1000000)) ms)" [ "$rc" = 0 ]
sleep 1
nl=$(leader_of "$d")
t_check "a new leader (${nl:-none}) among the new members" [ -n "$nl" ] && [ "$nl" != "${l:-0}" ]
stop "$d" "${l:-0}" TERM >/dev/null
wait "$histpid"
histpid=""
failed=$(sed -n 's/.*failed=\([0-9]*\).*/\1/p' "$d/hist.out" | head -n 1)
ops=$(sed -n 's/.*ops=\([0-9]*\).*/\1/p' "$d/hist.out" | head -n 1)
if [ "${failed:-x}" = 0 ] && [ "${ops:-0}" -gt 100 ]; then
    t_ok "no operation failed through the change and the old member's stop ($ops answered)"
else
    t_fail "no failed operation through the change" "$(head -c 300 "$d/hist.out")"
fi
t_check "the history through the change is linearizable" "$HIST" check "$d/hist"
g1=$(hist_gap "$d/hist" "$t0" "$t1")
g2=$(hist_gap "$d/hist" "$t2" "$t3")
t_ok "unavailability during member replace: longest time without an answer ${g1} replacing a follower, ${g2} replacing the leader"
t_check "the new membership serves without the old leader" cli put after-change yes
for i in 0 1 2 3; do stop "$d" "$i" TERM >/dev/null; done

# NOPaxos: no membership changes yet, said plainly.
n=$WORK/nop
mkdir -p "$n"
conf "$n/cluster.conf" nopaxos 3 "0, 1, 2"
out=$(cd "$n" && timeout 20 "$SERVER" -c cluster.conf -i 0 --new-cluster 2>&1)
rc=$?
t_check "a nopaxos cluster file with members is refused at start (exit $rc)" \
    grep -q "nopaxos has no membership changes" <<<"$out"
conf "$n/cluster.conf" nopaxos 3
d=$n
cd "$n" || exit 1
for i in 0 1 2; do start "$n" "$i" --new-cluster; done
if wait_serving "$n"; then
    out=$(cli member remove 2 2>&1)
    rc=$?
    t_check "member remove on nopaxos: exit $rc, $out" grep -q "not supported" <<<"$out"
else
    t_fail "the nopaxos cluster serves" "$(tail -n 3 "$n"/log*)"
fi
for i in 0 1 2; do stop "$n" "$i" TERM >/dev/null; done

# flowkv-deploy add, replace, remove (deploy/flowkv-deploy, local runner).
w=$WORK/dep
mkdir -p "$w"
base=$(fk_base_port)
{
    printf '[cluster]\nprotocol = multipaxos\ndurability = async\ntoken = member-deploy-token-0123456\nmembers = 0, 1, 2\n'
    for i in 0 1 2 3; do
        printf '[node %d]\naddress = 127.0.0.1:%d\nhost = h%d\nfabric = tcp\ndata_dir = /var/lib/flowkv/%d\n' \
            "$i" $((base + i)) "$i" "$i"
    done
} >"$w/cluster.conf"
dep() { timeout 240 "$ROOT/deploy/flowkv-deploy" -c "$w/cluster.conf" --runner local --root "$w/hosts" "$@"; }
mem() { "$CLI" -c "$w/cluster.conf" -t 3000 member list 2>&1; }
if out=$(dep up 2>&1); then
    t_check "deploy up: members 0,1,2 and learner 3 ($(mem))" grep -qx "epoch 0 members 0,1,2 learners 3" <<<"$(mem)"
    out=$(dep replace 0 3 2>&1)
    t_check "deploy replace 0 3: $(tail -n 2 <<<"$out" | tr '\n' ' ')" grep -qx "epoch 1 members 1,2,3 learners 0" <<<"$(mem)"
    out=$(dep add 0 2>&1)
    t_check "deploy add 0, the replaced node from its disk: $(tail -n 1 <<<"$out")" \
        grep -qx "epoch 2 members 0,1,2,3 learners -" <<<"$(mem)"
    out=$(dep remove 2 2>&1)
    t_check "deploy remove 2: $(tail -n 2 <<<"$out" | tr '\n' ' ')" grep -qx "epoch 3 members 0,1,3 learners 2" <<<"$(mem)"
    t_check "deploy wrote the new members and epoch into the cluster file, once" \
        [ "$(grep -cE '^(members = 0, 1, 3|epoch = 3)$' "$w/cluster.conf")" = 2 ] &&
        [ "$(grep -cE '^(members|epoch) =' "$w/cluster.conf")" = 2 ]
    t_check "and into every host's copy" grep -qx "epoch = 3" "$w/hosts/h2/etc/flowkv/cluster.conf"
    t_check "the cluster serves after the deploy's changes" "$CLI" -c "$w/cluster.conf" -t 3000 put deployed yes
    dep down >/dev/null 2>&1
else
    t_fail "deploy up of four nodes" "$(tail -n 3 <<<"$out")"
fi
t_done

# tests/faults/scenarios.sh: the fault-injection scenarios, sourced by
# tests/integration/test_faults.sh after tests/lib.sh and netns.sh.
#
# Each scenario runs on a fresh 3-replica cluster (sync durability) in its
# own namespaces (netns.sh), under a client workload in the client
# namespace that records its history, injects one fault a little after the
# workload starts, and reports one t_ok / t_fail line with the operations
# completed, the unavailability window (fault to the first write completed
# after it) and the violations found (a non-linearizable history, or an
# acknowledged write lost). A scenario that cannot run (namespaces, cluster
# start, client) fails; nothing is skipped.
#
#   fx_run PROTO SCENARIO   one scenario; SCENARIO is one of FX_SCENARIOS
#   fx_table                prints the results as "# " lines
#
# The workload client is $KVH, build/tests-aux/kv_history (tests/cluster/
# kv_history.c): N threads of random get/put/cas/del, a history file and a
# linearizability check. The whole-cluster restart adds a kv_check writer
# ($KV) whose acknowledged writes are all read back after the restart.
#
# Knobs (environment): FX_SECONDS workload length (default 8), FX_CLIENTS
# (4), FX_KEYS (8), FX_FAULT_AT seconds into the workload (2), FX_PART_S
# partition length (3; the sequencer's host: FX_SEQ_PART_S, 6, past the
# failover's detection), FX_DOWN_S follower downtime (2), FX_LOSS percent (5),
# FX_DELAY_MS and FX_JITTER_MS the delay per packet (5 ms + 0..5 ms),
# FX_CUT_REQS_MAX the requests the other replicas may take while the
# client cannot reach the leader (2000 in FX_PART_S and the dumps' time:
# resends, a few hundred; the loop this guards against, 74,568),
# FX_TIMEOUT_MS client timeout per operation (1000; under loss
# FX_LOSS_TIMEOUT_MS, 3000), FX_SIDE_WRITES the kv_check writer's count
# (1500), FX_KEEP where failed scenarios leave their logs (FX_KEEP_ALL=1:
# every scenario).

# shellcheck disable=SC2034 # read by test_faults.sh
FX_SCENARIOS="leader-crash follower-restart leader-partition client-cut loss delay sequencer-failover sequencer-partition cluster-restart"
FX_SECONDS=${FX_SECONDS:-8}
FX_CLIENTS=${FX_CLIENTS:-4}
FX_KEYS=${FX_KEYS:-8}
FX_FAULT_AT=${FX_FAULT_AT:-2}
FX_PART_S=${FX_PART_S:-3}
FX_SEQ_PART_S=${FX_SEQ_PART_S:-6}
FX_DOWN_S=${FX_DOWN_S:-2}
FX_LOSS=${FX_LOSS:-5}
FX_DELAY_MS=${FX_DELAY_MS:-5}
FX_JITTER_MS=${FX_JITTER_MS:-5}
FX_TIMEOUT_MS=${FX_TIMEOUT_MS:-1000}
# Under loss a lost SYN alone costs 1 s (TCP's first retransmission), so
# the clients there get a longer per-operation timeout.
FX_LOSS_TIMEOUT_MS=${FX_LOSS_TIMEOUT_MS:-3000}
FX_SIDE_WRITES=${FX_SIDE_WRITES:-1500}
FX_CUT_REQS_MAX=${FX_CUT_REQS_MAX:-2000}
FX_ROWS=()

# fx__label PROTO SCENARIO: the name the report uses.
fx__label() {
    case $2 in
    leader-crash) echo "leader crash (kill -9)" ;;
    follower-restart) echo "follower crash, restart from disk" ;;
    leader-partition) echo "leader partitioned into a minority, healed" ;;
    client-cut) echo "the client cut off from the leader only, healed" ;;
    loss) echo "${FX_LOSS}% packet loss on every host" ;;
    delay) echo "${FX_DELAY_MS} ms + 0..${FX_JITTER_MS} ms delay on every host's packets" ;;
    sequencer-failover)
        if [ "$1" = nopaxos ]; then echo "sequencer failover (kill -9 the replica hosting the sequencer)"; else
            echo "kill -9 of the first replica of the sequencers list (sequencer-failover slot; Multi-Paxos has no sequencer)"
        fi
        ;;
    sequencer-partition)
        if [ "$1" = nopaxos ]; then echo "the sequencer's host cut off ${FX_SEQ_PART_S}s: failover, then the old sequencer retires"; else
            echo "the first replica of the sequencers list cut off ${FX_SEQ_PART_S}s (sequencer-partition slot; Multi-Paxos has no sequencer)"
        fi
        ;;
    cluster-restart) echo "whole-cluster kill -9 and restart from disk" ;;
    esac
}

# ---- workload --------------------------------------------------------------

# fx__workload_start DIR TIMEOUT_MS: the client in the background; FX_WL =
# its PID. timeout is a safety net: kv_history bounds its own run.
fx__workload_start() {
    local d=$1
    ip netns exec "$NSC_CL" timeout -k 5 $((FX_SECONDS + 30)) "$KVH" "$NSC_CONF" run "$d/history" \
        --clients "$FX_CLIENTS" --keys "$FX_KEYS" --seconds "$FX_SECONDS" --timeout-ms "$2" \
        --ok-after-file "$d/fault_at" >"$d/workload.out" 2>&1 &
    FX_WL=$!
}

# fx__stamp DIR: marks the moment of the fault on the clients' clock
# (CLOCK_MONOTONIC ns). Taken once the fault is in place (the process
# reaped, the rule loaded), so that a write invoked just before cannot count
# as served after it.
fx__stamp() { "$KVH" now >"$1/fault_at"; }

# fx__workload_wait DIR: waits for the client; sets FX_OPS, FX_INDET,
# FX_UNAVAIL and FX_WHY (non-empty when the client itself failed).
fx__workload_wait() {
    local d=$1 rc line
    wait "$FX_WL"
    rc=$?
    FX_WL=""
    FX_WHY=""
    line=$(grep -m1 '^history:' "$d/workload.out")
    FX_OPS=$(sed -n 's/.* ops=\([0-9]*\).*/\1/p' <<<"$line")
    FX_INDET=$(sed -n 's/.* failed=\([0-9]*\).*/\1/p' <<<"$line")
    FX_UNAVAIL=$(sed -n 's/.*unavailable_ms=\([^ ]*\).*/\1/p' <<<"$line")
    [ $rc -eq 0 ] && [ -n "$line" ] ||
        FX_WHY="client exited $rc: $(tail -n 2 "$d/workload.out" | tr '\n' ' ')"
    : "${FX_OPS:=0}"
}

# fx__violations DIR: sets FX_VIOL (a count, or "?") and FX_VWHY.
fx__violations() {
    local d=$1 rc out
    FX_VWHY=""
    out=$(timeout -k 5 120 "$KVH" check "$d/history" 2>&1)
    rc=$?
    echo "$out" >"$d/check.out"
    case $rc in
    0) FX_VIOL=0 ;;
    1)
        FX_VIOL=1
        FX_VWHY="not linearizable: $(tail -n 2 <<<"$out" | tr '\n' ' ')"
        ;;
    3)
        FX_VIOL="?"
        FX_VWHY="linearizability check inconclusive: $(tail -n 1 <<<"$out")"
        ;;
    *)
        FX_VIOL="?"
        FX_VWHY="check exited $rc: $(tail -n 1 <<<"$out")"
        ;;
    esac
}

# fx__verify_acks DIR PREFIX ACKS: every acknowledged write is readable;
# adds the missing ones to FX_VIOL.
fx__verify_acks() {
    local out m t0=$SECONDS i
    # A client that cannot open is retried for 10 s, then the replicas are
    # killed and restarted from disk once more (a second crash the writes
    # must survive as well): whether the writes survived is the question
    # here; the open failure is reported beside it.
    while :; do
        out=$(ip netns exec "$NSC_CL" timeout -k 5 60 "$KV" "$NSC_CONF" verify "$2" "$3" 2>&1)
        echo "$out" >>"$1/verify.out"
        grep -q '^kv_check: open:' <<<"$out" || break
        if [ $((SECONDS - t0)) -ge 10 ]; then
            [ -z "${FX_REDONE:-}" ] || break
            FX_REDONE=1
            FX_NOTE="$FX_NOTE; no new client could open for 10 s after the workload, so the replicas were restarted again to read the writes back"
            FX_VWHY="a new client could not open for 10 s after the workload"
            for i in 0 1 2; do nsc_kill "$i"; done
            for i in 0 1 2; do nsc_start "$i"; done
            nsc_wait_serving 20
        fi
        sleep 0.5
    done
    m=$(sed -n 's/.* checked, \([0-9]*\) missing or wrong$/\1/p' <<<"$out" | tail -n 1)
    if [ -z "$m" ]; then
        FX_VIOL="?"
        FX_VWHY="${FX_VWHY:+$FX_VWHY; }verify gave no count: $(tail -n 1 <<<"$out")"
    elif [ "$m" -gt 0 ]; then
        [ "${FX_VIOL:-0}" = "?" ] || FX_VIOL=$((${FX_VIOL:-0} + m))
        FX_VWHY="${FX_VWHY:+$FX_VWHY; }$m acknowledged writes lost: $(grep -m2 acknowledged "$1/verify.out" | tr '\n' ' ')"
    else
        : "${FX_VIOL:=0}"
    fi
    FX_NOTE="$FX_NOTE; read back: $(tail -n 1 <<<"$out")"
}

# ---- faults ----------------------------------------------------------------

# fx__caught_up I: the cluster takes a write and replica I's commit point
# reaches the leader's (15 s). Once the write succeeded no other is made: a
# follower learns a commit point one heartbeat after the leader, so a
# status taken right after each write often found it one slot behind.
fx__caught_up() {
    local end=$((SECONDS + 15)) st l c lc put=""
    while [ $SECONDS -lt $end ]; do
        [ "$put" = ok ] || { put=$(nsc_cli -t 1000 put probe z 2>&1) && put="ok"; }
        st=$(nsc_cli -t 1000 status 2>/dev/null)
        l=$(awk '$2 == "leader" { print $1; exit }' <<<"$st")
        c=$(awk -v id="$1" '$1 == id && $2 != "unreachable" { print $7 }' <<<"$st")
        lc=$(awk -v id="$l" '$1 == id { print $7 }' <<<"$st")
        [ "$put" = ok ] && [ -n "$l" ] && [ -n "$c" ] && [ "$c" = "$lc" ] && return 0
        sleep 0.3
    done
    # Every replica's status row and protocol state: what the one behind
    # waits for, and what the others do about it.
    FX_WHY="replica $1 did not catch up, or no write succeeded, within 15 s; status: $(awk \
        'NR > 1 { $1 = $1; printf "[%s] ", $0 }' <<<"$st"); last put: ${put:-none}; $(nsc_dump | tr '\n' ' ')"
    FLOWKV_LOG=debug nsc_cli -t 2000 put probe z >"$NSC_DIR/probe-debug.out" 2>&1
    return 1
}

# fx__seq_back I: the killed sequencer host I restarts from its disk after
# the failover: it learns where the sequencer went from its peers instead
# of starting a competing session of its own (server/srv_net.c), and
# catches up.
fx__seq_back() {
    nsc_start "$1"
    fx__caught_up "$1" || return 1
    if [ "$NSC_PROTO" = nopaxos ] && [ "$(grep -c 'sequencer started' "$NSC_DIR/log$1")" -gt 1 ]; then
        FX_WHY="replica $1, restarted after the failover, started a sequencer of its own"
        return 1
    fi
}

# fx__reqs_to_others L: the client requests (kv.req and kv.oum messages)
# every replica but L has taken, from their state dumps.
fx__reqs_to_others() {
    nsc_dump | awk -v l="[$1]" '$1 != l && match($0, / req [0-9]+ oum [0-9]+/) {
        split(substr($0, RSTART, RLENGTH), f, " "); n += f[2] + f[4] } END { print n + 0 }'
}

# fx__inject PROTO SCENARIO DIR: the fault, while the workload runs; sets
# FX_NOTE (what was done) and FX_WHY on a fault that could not be made. The
# leader is asked again at the fault (the one found at the start otherwise).
fx__inject() {
    local sc=$2 d=$3 l f i
    case $sc in
    leader-crash)
        l=$(nsc_leader)
        l=${l:-$FX_LEADER}
        nsc_kill "$l"
        fx__stamp "$d"
        FX_NOTE="killed leader $l"
        ;;
    follower-restart)
        l=$(nsc_leader)
        f=$(((${l:-$FX_LEADER} + 1) % 3))
        nsc_kill "$f"
        fx__stamp "$d"
        sleep "$FX_DOWN_S"
        nsc_start "$f"
        FX_NOTE="follower $f down ${FX_DOWN_S}s"
        FX_AFTER="fx__caught_up $f"
        ;;
    leader-partition)
        l=$(nsc_leader)
        l=${l:-$FX_LEADER}
        nsc_partition "$l" || FX_WHY="nft could not partition host $l"
        fx__stamp "$d"
        sleep "$FX_PART_S"
        nsc_heal
        FX_NOTE="leader $l cut off ${FX_PART_S}s"
        FX_AFTER="fx__caught_up $l"
        ;;
    client-cut)
        # The cluster is whole; only this client cannot reach the leader,
        # so it cannot be served until the cut heals (a follower answers
        # "not the leader", naming it). It must wait for it, not bounce
        # between the followers: a client whose join of the leader failed
        # sent each request on to the next replica at every such answer,
        # thousands of round trips a second.
        l=$(nsc_leader)
        l=${l:-$FX_LEADER}
        local before after
        before=$(fx__reqs_to_others "$l")
        nsc_cut_client "$l" || FX_WHY="nft could not cut the client off host $l"
        fx__stamp "$d"
        sleep "$FX_PART_S"
        after=$(fx__reqs_to_others "$l")
        nsc_heal
        FX_NOTE="the client cut off leader $l ${FX_PART_S}s; the others took $((after - before)) requests meanwhile"
        [ $((after - before)) -le "$FX_CUT_REQS_MAX" ] ||
            FX_WHY="the other replicas took $((after - before)) requests while the client could not reach leader $l (at most $FX_CUT_REQS_MAX)"
        ;;
    loss | delay)
        # Set before the workload started (fx_run) and the stamp taken
        # then; it stays for the whole workload.
        FX_NOTE="$sc on for the whole workload"
        ;;
    sequencer-failover)
        nsc_seq_fail
        fx__stamp "$d"
        FX_NOTE="killed replica $NSC_SEQ, restarted from disk after the workload"
        FX_AFTER="fx__seq_back $NSC_SEQ"
        ;;
    sequencer-partition)
        f=$(sed -n 's/^sequencers *= *\([0-9]*\).*/\1/p' "$NSC_CONF")
        nsc_partition "$f" || FX_WHY="nft could not partition host $f"
        fx__stamp "$d"
        sleep "$FX_SEQ_PART_S"
        nsc_heal
        FX_NOTE="replica $f cut off ${FX_SEQ_PART_S}s"
        FX_AFTER="fx__caught_up $f"
        FX_SEQ_HOST=$f
        ;;
    cluster-restart)
        for i in 0 1 2; do nsc_kill "$i"; done
        fx__stamp "$d"
        for i in 0 1 2; do nsc_start "$i"; done
        FX_NOTE="all 3 killed and restarted"
        ;;
    esac
}

# ---- one scenario ----------------------------------------------------------

fx__result() { # fx__result PROTO SCENARIO OK WHY
    local label row
    label="$1: $(fx__label "$1" "$2")"
    row="$(printf '%-19s %-10s %6s %6s %10s %5s' "$2" "$1" "$FX_OPS" "$FX_INDET" \
        "${FX_UNAVAIL:-none}" "$FX_VIOL")"
    local what="ops=$FX_OPS indeterminate=$FX_INDET unavailable_ms=${FX_UNAVAIL:-none} violations=$FX_VIOL ($FX_NOTE)"
    if [ "$3" = 1 ]; then
        t_ok "$label: $what"
        FX_ROWS+=("$row  ok")
    else
        t_fail "$label" "$4; $what"
        FX_ROWS+=("$row  FAIL")
    fi
}

# fx__why TEXT: adds TEXT (if any) to the scenario's failure reasons.
fx__why() { [ -z "$1" ] || why="${why:+$why; }$1"; }

fx_run() {
    local proto=$1 sc=$2 d=$FX_WORK/$1-$2 i why=""
    FX_OPS=0 FX_INDET="-" FX_UNAVAIL="" FX_VIOL="?" FX_NOTE="not run" FX_WHY="" FX_VWHY=""
    FX_AFTER="" FX_WL="" FX_REDONE="" FX_SEQ_HOST=""
    if ! nsc_up "$FX_RUNID" 3; then
        fx__result "$proto" "$sc" 0 "the namespaces could not be made"
        return
    fi
    nsc_conf "$d" "$proto"
    for i in 0 1 2; do nsc_start "$i" --new-cluster; done
    if ! nsc_wait_serving 20; then
        fx__result "$proto" "$sc" 0 "the cluster did not serve within 20 s: $(tail -n 2 "$d/log0" | tr '\n' ' ')"
        fx__teardown "$d" 0
        return
    fi
    FX_LEADER=$(nsc_wait_leader 10)
    if [ -z "$FX_LEADER" ]; then
        fx__result "$proto" "$sc" 0 "flowkv status named no leader within 10 s: $(nsc_cli -t 1000 status 2>&1 | tr -s ' \n' ' ')"
        fx__teardown "$d" 0
        return
    fi
    # The workload and the kv_check side writer (cluster-restart only: the
    # acknowledged writes that must survive kill -9 of every replica).
    local side=""
    if [ "$sc" = loss ]; then
        nsc_loss "$FX_LOSS" || fx__why "nft could not set ${FX_LOSS}% loss"
        fx__stamp "$d"
    fi
    if [ "$sc" = delay ]; then
        nsc_delay "$FX_DELAY_MS" "$FX_JITTER_MS" ||
            fx__why "could not delay packets (iptables NFQUEUE, $NFQ): $(cat "$d"/delay-*.log 2>/dev/null | tr '\n' ' ')"
        fx__stamp "$d"
    fi
    fx__workload_start "$d" "$(case $sc in loss | delay) echo "$FX_LOSS_TIMEOUT_MS" ;; *) echo "$FX_TIMEOUT_MS" ;; esac)"
    if [ "$sc" = cluster-restart ]; then
        # A fixed count (about 1 s of writes before the fault and a few
        # after), so that it ends by itself and closes its handle: a client
        # killed mid-run is a fault of its own, not this scenario's.
        : >"$d/side-acks"
        ip netns exec "$NSC_CL" timeout -k 5 $((FX_SECONDS + 20)) "$KV" "$NSC_CONF" write side \
            "$FX_SIDE_WRITES" "$d/side-acks" >"$d/side.out" 2>&1 &
        side=$!
    fi
    sleep "$FX_FAULT_AT"
    fx__inject "$proto" "$sc" "$d"
    fx__why "$FX_WHY"
    fx__workload_wait "$d"
    fx__why "$FX_WHY"
    if [ -n "$side" ]; then
        wait "$side"
        i=$?
        FX_NOTE="$FX_NOTE; kv_check writer: $(wc -l <"$d/side-acks") writes acknowledged, exit $i"
        case $i in 124 | 137) fx__why "the kv_check writer did not end within $((FX_SECONDS + 20)) s" ;; esac
    fi
    nsc_loss 0
    nsc_delay 0
    nsc_heal
    # A replica this scenario left running must still run; a restarted or
    # healed one must catch up.
    local dead=""
    for i in "${!NSC_PID[@]}"; do
        nsc_alive "$i" || dead="${dead}replica $i exited: $(grep -v ' [ID] ' "$d/log$i" | tail -n 2 | tr '\n' ' '); "
    done
    fx__why "${dead%; }"
    if [ -z "$dead" ] && [ -n "$FX_AFTER" ] && ! $FX_AFTER; then
        fx__why "$FX_WHY"
    fi
    # The sequencer's host kept answering the majority: a replica that took
    # over did so from a minority (it cost a session change, and once left
    # clients stamping messages with the old sequencer that were dropped).
    if [ "$sc" = leader-partition ] && grep -q 'took over' "$d"/log[0-9]; then
        fx__why "a replica cut off in a minority took over the sequencer: $(grep -h 'took over' "$d"/log[0-9] | head -n 1)"
    fi
    # The majority failed over; the cut-off host, back, heard of the new
    # session and retired its sequencer (flows/flow_node.c).
    if [ "$sc" = sequencer-partition ] && [ "$proto" = nopaxos ]; then
        grep -q 'took over' "$d"/log[0-9] || fx__why "no replica took over the sequencer"
        grep -q 'sequencer session [0-9]* retired' "$d/log$FX_SEQ_HOST" ||
            fx__why "replica $FX_SEQ_HOST did not retire its sequencer after the partition"
    fi
    FX_VIOL=""
    fx__violations "$d"
    [ -z "$side" ] || fx__verify_acks "$d" side "$d/side-acks"
    [[ "$FX_UNAVAIL" =~ ^[0-9]+$ ]] || fx__why "no write completed after the fault"
    [ "$FX_OPS" -gt 0 ] || fx__why "no operation completed"
    fx__why "$FX_VWHY"
    if [ -z "$why" ]; then fx__result "$proto" "$sc" 1 ""; else fx__result "$proto" "$sc" 0 "$why"; fi
    fx__teardown "$d" "$([ -z "$why" ] && echo 1 || echo 0)"
}

# fx__teardown DIR PASSED: stops everything; a failed scenario's logs and
# client output are kept in $FX_KEEP.
fx__teardown() {
    local d=$1
    [ -z "${FX_WL:-}" ] || { kill -KILL "$FX_WL" 2>/dev/null; wait "$FX_WL" 2>/dev/null; }
    nsc_down
    if { [ "$2" != 1 ] || [ -n "${FX_KEEP_ALL:-}" ]; } && [ -n "${FX_KEEP:-}" ] && [ -d "$d" ]; then
        mkdir -p "$FX_KEEP/$(basename "$d")"
        cp "$d"/log* "$d"/*.out "$d/cluster.conf" "$FX_KEEP/$(basename "$d")/" 2>/dev/null
        [ -f "$d/history" ] && cp "$d/history" "$FX_KEEP/$(basename "$d")/" 2>/dev/null
    fi
    rm -rf "$d"
}

fx_table() {
    local r
    echo "# $(printf '%-19s %-10s %6s %6s %10s %5s' scenario protocol ops indet unavail_ms viol)  result"
    for r in "${FX_ROWS[@]}"; do echo "# $r"; done
}

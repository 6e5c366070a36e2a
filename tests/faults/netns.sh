# tests/faults/netns.sh: a flowkv cluster in network namespaces, with fault
# primitives. Source it (bash), then:
#
#   nsc_up RUNID N          N host namespaces fk<RUNID>-h0.., a client
#                           namespace fk<RUNID>-c and a bridge namespace
#                           fk<RUNID>-br joining them; returns 1 (and undoes
#                           what it made) when any step fails
#   nsc_conf DIR PROTO      writes DIR/cluster.conf: one node per host
#                           namespace, fabric tcp, sync durability, a token,
#                           sequencers = 0, 1, 2, data_dir DIR/data<i>
#   nsc_start i [FLAGS]     starts replica i inside host i's namespace
#                           (FLAGS: --new-cluster ...), log in DIR/log<i>
#   nsc_kill i              SIGKILL, reaped (bounded)
#   nsc_stop i / nsc_cont i SIGSTOP / SIGCONT
#   nsc_alive i             replica i was started and has not exited
#   nsc_restart i           kill, then start from its data directory
#   nsc_restart_empty i     kill, remove its data directory, start
#   nsc_partition i         host i drops all traffic to and from the other
#                           hosts and the client; nsc_heal removes it
#   nsc_cut_client i        host i drops all traffic to and from the client
#                           only (the replicas still reach each other);
#                           nsc_heal removes it
#   nsc_loss PERCENT        random drop of PERCENT% of the packets on every
#                           host's wire, input and output (so a host-to-host
#                           packet crosses two drop points); 0 removes it
#   nsc_delay MS JITTER     every host's and the client's outgoing packets
#                           on eth0 held MS ms plus 0..JITTER ms, in order
#                           (so a host-to-host packet is delayed once); 0
#                           removes it. This kernel has no sch_netem: an
#                           iptables NFQUEUE rule (--queue-bypass) hands them
#                           to $NFQ (tests/faults/nfq_delay.c) in that
#                           namespace, which lets each go when due
#   nsc_seq_fail            kills the replica hosting the NOPaxos sequencer
#                           (the first entry of `sequencers`); NSC_SEQ = its id
#   nsc_client CMD...       runs CMD in the client namespace
#   nsc_cli ARGS...         the flowkv CLI in the client namespace
#   nsc_leader              the id `flowkv status` reports as leader
#   nsc_wait_leader [S]     the same, asked until one is named (S s, 10)
#   nsc_wait_serving [S]    a put succeeds from the client namespace (S s)
#   nsc_kill_all            kills every replica started here
#   nsc_dump                each running replica's protocol state (SIGUSR1,
#                           srv_node_dump), one '[i] state: ...' line each
#   nsc_down                removes everything nsc_up made and stops every
#                           process started in it; idempotent, safe from an
#                           EXIT trap and before nsc_up
#   nsc_reap_stale          removes namespaces left by an earlier run that
#                           was killed before its trap ran (RUNID = that
#                           run's PID, now dead, and nothing left inside)
#
# Isolation: the hosts and the client live on 10.213.X.0/24 (X from RUNID)
# inside their namespaces only; the bridge sits in its own namespace with no
# address, and the root namespace gets nothing (no interface, no route, no
# nft rule), so no packet can leave these namespaces. nft tables live in the
# host namespaces and go away with them.
#
# Needs root, iproute2 (ip netns), nftables (nft) and iptables (legacy, for
# NFQUEUE), and SERVER / CLI / NFQ set to the flowkv-server, flowkv and
# nfq_delay binaries.

NSC_PORT=7100
NSC_RUNID=""
NSC_N=0
NSC_NET=""
NSC_BR=""
NSC_CL=""
NSC_CADDR=""
NSC_DIR=""
NSC_CONF=""
NSC_PROTO=""
NSC_HOSTS=()
NSC_ADDR=()
declare -A NSC_PID=()
declare -A NSC_DELAY_PID=()

nsc__host() { echo "fk$NSC_RUNID-h$1"; }

# nsc__ns_gone NS: waits (bounded 5 s) until NS no longer has processes.
nsc__ns_gone() {
    local _
    for _ in $(seq 50); do
        [ -z "$(ip netns pids "$1" 2>/dev/null)" ] && return 0
        sleep 0.1
    done
    return 1
}

nsc_up() {
    local runid=$1 n=$2 i
    nsc_down
    NSC_RUNID=$runid
    NSC_N=$n
    NSC_NET="10.213.$((1 + runid % 250))"
    NSC_BR="fk$runid-br"
    NSC_CL="fk$runid-c"
    NSC_CADDR="$NSC_NET.200"
    NSC_HOSTS=()
    NSC_ADDR=()
    for ((i = 0; i < n; i++)); do
        NSC_HOSTS[i]=$(nsc__host "$i")
        NSC_ADDR[i]="$NSC_NET.$((10 + i))"
    done
    # Every link is made inside the namespaces (ip -n): the root namespace
    # never sees an interface, even for a moment.
    if ! nsc__build >&2; then
        echo "nsc_up: could not build the namespaces for run $runid" >&2
        nsc_down
        return 1
    fi
}

nsc__build() {
    local i
    ip netns add "$NSC_BR" &&
        ip -n "$NSC_BR" link set lo up &&
        ip -n "$NSC_BR" link add br0 type bridge &&
        ip -n "$NSC_BR" link set br0 up &&
        nsc__attach "$NSC_CL" c "$NSC_CADDR" || return 1
    for ((i = 0; i < NSC_N; i++)); do
        nsc__attach "${NSC_HOSTS[i]}" "h$i" "${NSC_ADDR[i]}" || return 1
    done
}

# nsc__attach NS TAG ADDR: namespace NS with eth0 = ADDR/24, wired to br0.
nsc__attach() {
    ip netns add "$1" &&
        ip -n "$1" link set lo up &&
        ip -n "$NSC_BR" link add "v-$2" type veth peer name eth0 netns "$1" &&
        ip -n "$NSC_BR" link set "v-$2" master br0 &&
        ip -n "$NSC_BR" link set "v-$2" up &&
        ip -n "$1" addr add "$3/24" dev eth0 &&
        ip -n "$1" link set eth0 up
}

nsc_conf() {
    local dir=$1 i
    NSC_PROTO=$2
    mkdir -p "$dir"
    NSC_DIR=$(cd "$dir" && pwd)
    NSC_CONF=$NSC_DIR/cluster.conf
    {
        echo "[cluster]"
        echo "protocol = $NSC_PROTO"
        echo "durability = sync"
        echo "token = faults-token-$NSC_RUNID-0123456789"
        echo "sequencers = 2, 1, 0"
        for ((i = 0; i < NSC_N; i++)); do
            echo "[node $i]"
            echo "address = ${NSC_ADDR[i]}:$NSC_PORT"
            echo "fabric = tcp"
            echo "data_dir = data$i"
        done
    } >"$NSC_CONF"
}

nsc_start() {
    local i=$1
    shift
    [ -z "${NSC_PID[$i]:-}" ] || nsc_kill "$i"
    # ip netns exec execs the command, so $! is the replica itself.
    # The braces keep bash's "Killed" job report (printed when a replica
    # killed here is reaped, or at exit) off the test's output.
    { ip netns exec "${NSC_HOSTS[i]}" "$SERVER" -c "$NSC_CONF" -i "$i" "$@" >>"$NSC_DIR/log$i" 2>&1 & } 2>/dev/null
    NSC_PID[$i]=$!
}

# nsc__signal i SIG: SIG to replica i, if it runs.
nsc__signal() {
    local p=${NSC_PID[$1]:-}
    [ -n "$p" ] && kill -"$2" "$p" 2>/dev/null
}

nsc_kill() {
    local p=${NSC_PID[$1]:-} _
    [ -n "$p" ] || return 0
    kill -KILL "$p" 2>/dev/null
    # Our own child stays a zombie (kill -0 still succeeds) until reaped, so
    # the state in /proc says when it is gone; wait only then (bounded 5 s).
    for _ in $(seq 100); do
        case $(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null) in "" | Z) break ;; esac
        sleep 0.05
    done
    wait "$p" 2>/dev/null
    unset "NSC_PID[$1]"
    return 0
}

# nsc_alive i: replica i was started here and has not exited.
nsc_alive() {
    local p=${NSC_PID[$1]:-}
    [ -n "$p" ] || return 1
    case $(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null) in "" | Z) return 1 ;; esac
    return 0
}

nsc_dump() {
    local i _
    declare -A before
    for i in "${!NSC_PID[@]}"; do
        before[$i]=$(grep -c ' state: ' "$NSC_DIR/log$i" 2>/dev/null)
        nsc__signal "$i" USR1
    done
    # Logged at the replica's next tick (1 ms); bounded 2 s.
    for _ in $(seq 20); do
        sleep 0.1
        for i in "${!NSC_PID[@]}"; do
            [ "$(grep -c ' state: ' "$NSC_DIR/log$i" 2>/dev/null)" -gt "${before[$i]}" ] || continue 2
        done
        break
    done
    for i in "${!NSC_PID[@]}"; do
        echo "[$i] $(grep ' state: ' "$NSC_DIR/log$i" 2>/dev/null | tail -n 1 | sed 's/.* state: /state: /')"
    done
}

nsc_stop() { nsc__signal "$1" STOP; }
nsc_cont() { nsc__signal "$1" CONT; }

nsc_restart() {
    nsc_kill "$1"
    nsc_start "$1"
}

nsc_restart_empty() {
    nsc_kill "$1"
    rm -rf "${NSC_DIR:?}/data$1"
    nsc_start "$1"
}

nsc_kill_all() {
    local i
    for i in "${!NSC_PID[@]}"; do nsc__signal "$i" CONT; done
    for i in "${!NSC_PID[@]}"; do nsc_kill "$i"; done
}

nsc_partition() {
    local i=$1 j others=""
    for ((j = 0; j < NSC_N; j++)); do
        [ "$j" = "$i" ] || others="$others${others:+, }${NSC_ADDR[j]}"
    done
    others="$others, $NSC_CADDR"
    # Dropped, not rejected: a real partition answers nothing.
    ip netns exec "${NSC_HOSTS[i]}" nft -f - <<EOF
table inet nsc_part {
    chain in {
        type filter hook input priority 0; policy accept;
        ip saddr { $others } drop
    }
    chain out {
        type filter hook output priority 0; policy accept;
        ip daddr { $others } drop
    }
}
EOF
}

nsc_cut_client() {
    ip netns exec "${NSC_HOSTS[$1]}" nft -f - <<EOF
table inet nsc_part {
    chain in {
        type filter hook input priority 0; policy accept;
        ip saddr $NSC_CADDR drop
    }
    chain out {
        type filter hook output priority 0; policy accept;
        ip daddr $NSC_CADDR drop
    }
}
EOF
}

nsc_heal() {
    local i
    for ((i = 0; i < NSC_N; i++)); do
        ip netns exec "${NSC_HOSTS[i]}" nft delete table inet nsc_part 2>/dev/null
    done
    return 0
}

nsc_loss() {
    local pct=$1 i rc=0
    for ((i = 0; i < NSC_N; i++)); do
        ip netns exec "${NSC_HOSTS[i]}" nft delete table inet nsc_loss 2>/dev/null
        [ "$pct" -gt 0 ] || continue
        ip netns exec "${NSC_HOSTS[i]}" nft -f - <<EOF || rc=1
table inet nsc_loss {
    chain in {
        type filter hook input priority 0; policy accept;
        iifname "eth0" numgen random mod 100 < $pct drop
    }
    chain out {
        type filter hook output priority 0; policy accept;
        oifname "eth0" numgen random mod 100 < $pct drop
    }
}
EOF
    done
    return $rc
}

nsc_delay() {
    local ms=$1 jit=${2:-0} ns p rc=0 k
    local rule=(OUTPUT -o eth0 -j NFQUEUE --queue-num 0 --queue-bypass)
    for ns in "${NSC_HOSTS[@]}" "$NSC_CL"; do
        [ -n "$ns" ] || continue
        while ip netns exec "$ns" iptables-legacy -D "${rule[@]}" 2>/dev/null; do :; done
        p=${NSC_DELAY_PID[$ns]:-}
        if [ -n "$p" ]; then
            kill -TERM "$p" 2>/dev/null
            for k in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$p" 2>/dev/null
            wait "$p" 2>/dev/null
            unset "NSC_DELAY_PID[$ns]"
        fi
        [ "$ms" -gt 0 ] || continue
        ip netns exec "$ns" "$NFQ" 0 "$ms" "$jit" >"$NSC_DIR/delay-$ns.log" 2>&1 &
        NSC_DELAY_PID[$ns]=$!
        # Bound to its queue before the rule sends anything there.
        for k in $(seq 50); do grep -q "^nfq_delay: queue" "$NSC_DIR/delay-$ns.log" && break; sleep 0.1; done
        grep -q "^nfq_delay: queue" "$NSC_DIR/delay-$ns.log" &&
            ip netns exec "$ns" iptables-legacy -A "${rule[@]}" || rc=1
    done
    return $rc
}

nsc_seq_fail() {
    NSC_SEQ=$(sed -n 's/^sequencers *= *\([0-9]*\).*/\1/p' "$NSC_CONF")
    NSC_SEQ=${NSC_SEQ:-0}
    nsc_kill "$NSC_SEQ"
}

nsc_client() { ip netns exec "$NSC_CL" "$@"; }

nsc_cli() { ip netns exec "$NSC_CL" "$CLI" -c "$NSC_CONF" "$@"; }

nsc_leader() {
    nsc_cli -t 1000 status 2>/dev/null | awk '$2 == "leader" { print $1; exit }'
}

# nsc_wait_leader [S]: prints the leader's id once `flowkv status` names one
# (S s, default 10); NSC_STATUS keeps the last status table.
nsc_wait_leader() {
    local end=$((SECONDS + ${1:-10})) l
    while [ $SECONDS -lt $end ]; do
        NSC_STATUS=$(nsc_cli -t 1000 status 2>&1)
        l=$(awk '$2 == "leader" { print $1; exit }' <<<"$NSC_STATUS")
        [ -n "$l" ] && echo "$l" && return 0
        sleep 0.3
    done
    return 1
}

nsc_wait_serving() {
    local end=$((SECONDS + ${1:-30}))
    while [ $SECONDS -lt $end ]; do
        nsc_cli -t 1000 put probe x >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}

nsc_down() {
    local ns p
    nsc_kill_all
    nsc_delay 0
    [ -n "$NSC_RUNID" ] || return 0
    for ns in $(ip netns list 2>/dev/null | awk -v p="^fk$NSC_RUNID-" '$1 ~ p { print $1 }'); do
        # Anything still inside (a client this suite started) goes first,
        # by its id, so the namespace really disappears.
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        nsc__ns_gone "$ns"
        ip netns del "$ns" 2>/dev/null
    done
    return 0
}

nsc_reap_stale() {
    local ns id
    for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^fk[0-9]+-(br|c|h[0-9]+)$/ { print $1 }'); do
        id=${ns#fk}
        id=${id%%-*}
        [ "$id" != "$NSC_RUNID" ] || continue
        kill -0 "$id" 2>/dev/null && continue
        [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] || continue
        echo "nsc: removing stale namespace $ns" >&2
        ip netns del "$ns" 2>/dev/null
    done
    return 0
}

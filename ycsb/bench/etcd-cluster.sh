#!/usr/bin/env bash
# ycsb/bench/etcd-cluster.sh: a local etcd cluster on loopback for the YCSB
# etcd binding (issue 7).
#
#   etcd-cluster.sh start <dir> [members]   start members (default 3), wait
#                                           until every one is healthy, print
#                                           the client endpoints
#   etcd-cluster.sh stop <dir>              stop exactly the members started
#                                           with this <dir>
#
# Every member listens on 127.0.0.1 only, on ports that no socket uses when
# it starts (drawn from [PORT_LO, PORT_HI), below the kernel's ephemeral range
# so that outgoing connections cannot take them, and checked with ss). If a
# member still loses a port race it exits; the start is then retried with new
# ports, at most START_TRIES times.
#
# Files under <dir>: m<i>/ (data), m<i>.log (member log), pids ("PID NAME"
# lines, the only processes stop ever signals), endpoints (client URLs, comma
# separated, the value for -p etcd.endpoints=...).
#
# Members run Debian's etcd (etcd-server, /usr/bin/etcd; ETCD overrides) with
# its defaults: every write is fsynced to the WAL before it is acknowledged.
# ETCD_QUOTA_BYTES, when set, raises its backend quota (default 2 GiB; etcd
# suggests at most 8 GiB): a million YCSB default records need more.
# Waits are bounded: HEALTH_WAIT_S for health, STOP_WAIT_S for exits.
set -u

ETCD=${ETCD:-/usr/bin/etcd}
PORT_LO=20000
PORT_HI=32000
START_TRIES=3
HEALTH_WAIT_S=${HEALTH_WAIT_S:-30}
STOP_WAIT_S=10

die() {
    echo "etcd-cluster: $*" >&2
    exit 1
}

usage() {
    echo "usage: $0 start|stop <dir> [members]" >&2
    exit 2
}

# port_free PORT: nothing listens on PORT (TCP) and no socket is bound to it.
port_free() {
    [ -z "$(ss -Htan "sport = :$1" 2>/dev/null)" ]
}

# pick_ports N: prints N distinct free ports.
pick_ports() {
    local n=$1 got=() p tries=0
    while [ ${#got[@]} -lt "$n" ]; do
        tries=$((tries + 1))
        [ $tries -le 1000 ] || die "no free ports in [$PORT_LO, $PORT_HI)"
        p=$((PORT_LO + RANDOM % (PORT_HI - PORT_LO)))
        case " ${got[*]} " in *" $p "*) continue ;; esac
        port_free "$p" && got+=("$p")
    done
    echo "${got[@]}"
}

# alive PID: PID has not exited. Not is_ours: until a member this script
# just started execs etcd, its command line is this script's, and reading
# it as "not ours" then made a start give up on a healthy cluster and leave
# that member running (flowkv-cluster.sh had the same race).
alive() {
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# is_ours PID: PID is alive (not a zombie) and is an etcd of this dir.
is_ours() {
    alive "$1" && [ -r "/proc/$1/cmdline" ] &&
        tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF -- "--data-dir $dir/"
}

# stop_members: SIGTERM to each recorded PID still ours, bounded wait, then
# SIGKILL. Removes the pids file.
stop_members() {
    [ -f "$dir/pids" ] || return 0
    local pids=() pid i
    while read -r pid _; do
        # A member that has not exec'd etcd yet gets a moment to.
        for ((i = 0; i < 20; i++)); do
            [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" && ! is_ours "$pid" || break
            sleep 0.05
        done
        [[ "$pid" =~ ^[0-9]+$ ]] && is_ours "$pid" && pids+=("$pid")
    done <"$dir/pids"
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for ((i = 0; i < STOP_WAIT_S * 10; i++)); do
        local alive=0
        for pid in "${pids[@]}"; do is_ours "$pid" && alive=1; done
        [ $alive -eq 0 ] && break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        if is_ours "$pid"; then
            echo "etcd-cluster: member $pid ignored SIGTERM for ${STOP_WAIT_S}s; SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null
        fi
    done
    rm -f "$dir/pids"
}

# healthy URL: the member answers /health with "health":"true" (it has a
# leader and can serve a linearizable read).
healthy() {
    curl -sf --max-time 2 "$1/health" 2>/dev/null | grep -q '"health":"true"'
}

# start_once N: one attempt; returns 0 when every member is healthy.
start_once() {
    local n=$1 ports i cluster="" urls="" token="flowkv-ycsb-$$-$RANDOM"
    read -r -a ports <<<"$(pick_ports $((2 * n)))"
    for ((i = 0; i < n; i++)); do
        cluster+="${cluster:+,}m$i=http://127.0.0.1:${ports[$((2 * i + 1))]}"
        urls+="${urls:+,}http://127.0.0.1:${ports[$((2 * i))]}"
    done
    : >"$dir/pids"
    for ((i = 0; i < n; i++)); do
        local c=${ports[$((2 * i))]} p=${ports[$((2 * i + 1))]}
        rm -rf "$dir/m$i"
        "$ETCD" --name "m$i" --data-dir "$dir/m$i/" \
            --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
            --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
            --initial-cluster "$cluster" --initial-cluster-state new \
            --initial-cluster-token "$token" \
            ${ETCD_QUOTA_BYTES:+--quota-backend-bytes "$ETCD_QUOTA_BYTES"} \
            --logger zap --log-outputs stderr </dev/null >"$dir/m$i.log" 2>&1 &
        echo "$! m$i" >>"$dir/pids"
    done
    echo "$urls" >"$dir/endpoints"
    local deadline=$((SECONDS + HEALTH_WAIT_S)) u ok
    while [ $SECONDS -lt $deadline ]; do
        ok=1
        while read -r pid _; do
            alive "$pid" || return 1 # a member died (port race, bad flag)
        done <"$dir/pids"
        for u in ${urls//,/ }; do healthy "$u" || ok=0; done
        [ $ok -eq 1 ] && return 0
        sleep 0.2
    done
    return 2
}

cmd=${1:-}
[ $# -ge 2 ] || usage
dir=$2
members=${3:-3}
case "$cmd" in
start)
    [[ "$members" =~ ^[1-9]$ ]] || die "members must be 1 to 9, not '$members'"
    [ -x "$ETCD" ] || die "$ETCD not found (Debian package etcd-server; run deploy/deps.sh)"
    command -v curl >/dev/null || die "curl not found"
    command -v ss >/dev/null || die "ss not found (iproute2)"
    mkdir -p "$dir" || die "cannot create $dir"
    dir=$(cd "$dir" && pwd)
    [ ! -s "$dir/pids" ] || die "$dir/pids exists: stop that cluster first"
    for ((try = 1; try <= START_TRIES; try++)); do
        start_once "$members"
        rc=$?
        [ $rc -eq 0 ] && {
            cat "$dir/endpoints"
            exit 0
        }
        stop_members
        if [ $rc -eq 2 ]; then
            die "members not healthy after ${HEALTH_WAIT_S}s; logs: $dir/m*.log"
        fi
        echo "etcd-cluster: a member exited during start (try $try); logs: $dir/m*.log" >&2
    done
    die "could not start $members members in $START_TRIES tries"
    ;;
stop)
    [ -d "$dir" ] || die "no directory $dir"
    dir=$(cd "$dir" && pwd)
    stop_members
    ;;
*) usage ;;
esac

#!/usr/bin/env bash
# ycsb/bench/flowkv-cluster.sh: a local flowkv cluster for flowkv-ycsb runs
# (issue 7), started with deploy/run-local.sh in a directory of its own.
#
#   flowkv-cluster.sh start <dir> <nopaxos|multipaxos> [replicas]
#       starts a fresh cluster (replicas: 3, 5 or 7; default 3) under
#       <dir>/cluster, waits until every replica answers (at most
#       READY_WAIT_S), prints the cluster file's path; DURABILITY=async
#       (default sync) is passed to run-local.sh -D
#   flowkv-cluster.sh stop <dir>
#       stops exactly the cluster started with this <dir>
#
# Ports: run-local.sh uses BASE..BASE+n-1 (replicas) and BASE+100.. (metrics);
# BASE is drawn from [PORT_LO, PORT_HI), below both etcd-cluster.sh's range
# and the kernel's ephemeral range, with every port checked free with ss. A
# start that loses a port race fails to come up and is retried with new
# ports, at most START_TRIES times. The directory must not hold a cluster
# already: a restarted NOPaxos group may not come back, so benchmark
# clusters always start fresh.
#
# Files under <dir>: cluster/ (run-local.sh's directory: cluster.conf, data,
# log/<id>.log), run-local.log, pid (run-local.sh's PID), replicas (the
# replicas' PIDs). stop sends SIGTERM to run-local.sh (which drains and
# stops its replicas), waits STOP_WAIT_S, then SIGKILLs run-local.sh and the
# recorded replica PIDs that are still flowkv-server processes of <dir>.
set -u

PORT_LO=12000
PORT_HI=19000
START_TRIES=3
READY_WAIT_S=${READY_WAIT_S:-40}
STOP_WAIT_S=15

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

die() {
    echo "flowkv-cluster: $*" >&2
    exit 1
}

port_free() {
    [ -z "$(ss -Htan "sport = :$1" 2>/dev/null)" ]
}

# pick_base N: a base port whose N replica and N metrics ports are free.
pick_base() {
    local n=$1 b i ok
    for _ in $(seq 200); do
        b=$((PORT_LO + RANDOM % (PORT_HI - PORT_LO - 200)))
        ok=1
        for ((i = 0; i < n; i++)); do
            port_free $((b + i)) && port_free $((b + 100 + i)) || ok=0
        done
        [ $ok -eq 1 ] && {
            echo "$b"
            return 0
        }
    done
    return 1
}

# alive PID: this script's own child PID has not exited. Not is_ours:
# until the child execs run-local.sh its command line is this script's, and
# reading it then as "not ours" made a start give up on a cluster that was
# coming up (a retry in about one start of 25) and start another over it,
# whose replicas nobody stopped.
alive() {
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# is_ours PID: a live process whose command line names this directory.
is_ours() {
    alive "$1" && [ -r "/proc/$1/cmdline" ] &&
        tr '\0' ' ' <"/proc/$1/cmdline" | grep -qF -- "$dir/cluster"
}

stop_cluster() {
    [ -f "$dir/pid" ] || return 0
    local pid reps=() p i
    pid=$(cat "$dir/pid")
    [ -f "$dir/replicas" ] && read -r -a reps <"$dir/replicas"
    # A start that failed wrote no replicas file, and a run-local.sh that
    # died left its replicas running (one was found an hour after a make
    # bench-style run): those are found by their cluster file, which names
    # this directory (is_ours checks each).
    [ ${#reps[@]} -gt 0 ] || read -r -a reps < <(pgrep -f -- "$dir/cluster/cluster.conf" | tr '\n' ' ')
    # Our own child that has not exec'd run-local.sh yet (a start that
    # timed out at once) gets a moment to become it.
    for ((i = 0; i < 20; i++)); do
        [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" && ! is_ours "$pid" || break
        sleep 0.05
    done
    if [[ "$pid" =~ ^[0-9]+$ ]] && is_ours "$pid"; then
        kill -TERM "$pid" 2>/dev/null
        for ((i = 0; i < STOP_WAIT_S * 10; i++)); do
            is_ours "$pid" || break
            sleep 0.1
        done
        if is_ours "$pid"; then
            echo "flowkv-cluster: run-local.sh $pid ignored SIGTERM for ${STOP_WAIT_S}s; SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null
        fi
    fi
    for p in "${reps[@]}"; do
        if [[ "$p" =~ ^[0-9]+$ ]] && is_ours "$p"; then
            echo "flowkv-cluster: replica $p still running; SIGKILL" >&2
            kill -KILL "$p" 2>/dev/null
        fi
    done
    rm -f "$dir/pid" "$dir/replicas"
}

# start_once PROTO N: one attempt; 0 when every replica answered.
start_once() {
    local proto=$1 n=$2 base pid i
    base=$(pick_base "$n") || die "no free ports in [$PORT_LO, $PORT_HI)"
    rm -rf "$dir/cluster"
    "$root/deploy/run-local.sh" -p "$proto" -n "$n" -d "$dir/cluster" -P "$base" \
        -D "${DURABILITY:-sync}" </dev/null >"$dir/run-local.log" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/pid"
    for ((i = 0; i < READY_WAIT_S * 5; i++)); do
        alive "$pid" || return 1
        if grep -q "cluster is serving" "$dir/run-local.log"; then
            pgrep -P "$pid" -f flowkv-server | tr '\n' ' ' >"$dir/replicas"
            return 0
        fi
        sleep 0.2
    done
    return 2
}

cmd=${1:-}
[ $# -ge 2 ] || {
    echo "usage: $0 start <dir> <nopaxos|multipaxos> [replicas] | stop <dir>" >&2
    exit 2
}
dir=$2
case "$cmd" in
start)
    proto=${3:-}
    n=${4:-3}
    case "$proto" in nopaxos | multipaxos) ;; *) die "protocol must be nopaxos or multipaxos" ;; esac
    [ -x "$root/build/bin/flowkv-server" ] || die "build/bin/flowkv-server missing (make)"
    command -v ss >/dev/null || die "ss not found (iproute2)"
    mkdir -p "$dir" || die "cannot create $dir"
    dir=$(cd "$dir" && pwd)
    [ ! -s "$dir/pid" ] || die "$dir/pid exists: stop that cluster first"
    for ((try = 1; try <= START_TRIES; try++)); do
        start_once "$proto" "$n"
        rc=$?
        [ $rc -eq 0 ] && {
            echo "$dir/cluster/cluster.conf"
            exit 0
        }
        stop_cluster
        [ $rc -eq 2 ] && die "not ready after ${READY_WAIT_S}s; logs: $dir/run-local.log"
        cp "$dir/run-local.log" "$dir/run-local.try$try.log" 2>/dev/null
        echo "flowkv-cluster: run-local.sh exited during start (try $try; $dir/run-local.try$try.log)" >&2
    done
    die "could not start the cluster in $START_TRIES tries; see $dir/run-local.log"
    ;;
stop)
    [ -d "$dir" ] || die "no directory $dir"
    dir=$(cd "$dir" && pwd)
    stop_cluster
    ;;
*) die "unknown command '$cmd'" ;;
esac

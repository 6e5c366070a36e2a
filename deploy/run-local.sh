#!/usr/bin/env bash
# deploy/run-local.sh: a local flowkv cluster in the foreground (`make run`).
#
#   deploy/run-local.sh [-p nopaxos|multipaxos] [-n REPLICAS] [-d DIR] [-P BASEPORT]
#                       [-D sync|async]
#
# Writes DIR/cluster.conf (default ./run) the first time, with a random
# token, replicas on 127.0.0.1:BASEPORT.. over the TCP fabric and data in
# DIR/data/<id>, durability sync (-D async: a write is acknowledged once
# replicated in memory, LMDB is written behind; common/fk_conf.h); later
# runs with the same protocol and size restart the replicas from their data
# (a different protocol or size starts a new
# cluster: the old directory is moved to DIR.old-<time>). Replica logs go to
# stdout prefixed with [rN] and to DIR/log/<id>.log. Ctrl-C (or SIGTERM)
# stops every replica with SIGTERM (they drain and close LMDB), waits for
# them, and exits 0. A cluster that does not come up, or a replica that
# exits on its own, stops the others and exits 1 with the reason.
set -eu

proto=nopaxos
replicas=3
dir=run
base=7100
durability=sync
while getopts "p:n:d:P:D:h" opt; do
    case $opt in
    p) proto=$OPTARG ;;
    n) replicas=$OPTARG ;;
    d) dir=$OPTARG ;;
    P) base=$OPTARG ;;
    D) durability=$OPTARG ;;
    *) sed -n '2,15p' "$0"; exit 2 ;;
    esac
done
case $proto in nopaxos | multipaxos) ;; *)
    echo "run-local: protocol '$proto': nopaxos or multipaxos" >&2; exit 2 ;;
esac
case $durability in sync | async) ;; *)
    echo "run-local: durability '$durability': sync or async" >&2; exit 2 ;;
esac
case $replicas in 3 | 5 | 7) ;; *)
    echo "run-local: replicas '$replicas': 3, 5 or 7" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
server=$root/build/bin/flowkv-server
cli=$root/build/bin/flowkv
[ -x "$server" ] || { echo "run-local: $server missing: run make" >&2; exit 2; }

conf=$dir/cluster.conf
new=""
if [ -f "$conf" ]; then
    have_proto=$(sed -n 's/^protocol *= *\([a-z]*\).*/\1/p' "$conf")
    have_n=$(grep -c '^\[node ' "$conf" || true)
    if [ "$have_proto" != "$proto" ] || [ "$have_n" != "$replicas" ]; then
        old="$dir.old-$(date +%Y%m%d-%H%M%S)"
        echo "run-local: $conf is a $have_n-replica $have_proto cluster; moving it to $old"
        mv "$dir" "$old"
    fi
fi
if [ ! -f "$conf" ]; then
    new=1
    mkdir -p "$dir/data" "$dir/log"
    token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
    {
        echo "; flowkv cluster written by deploy/run-local.sh (format: common/fk_conf.h)"
        echo "[cluster]"
        echo "protocol   = $proto"
        echo "durability = $durability"
        echo "token      = $token"
        # Every replica may take over the NOPaxos sequencer, in this order:
        # the last first, so that view 0's leader (replica 0) does not host
        # it and one failure never takes both (common/fk_conf.h).
        echo "sequencers = $(seq -s ', ' $((replicas - 1)) -1 0)"
        for ((i = 0; i < replicas; i++)); do
            echo
            echo "[node $i]"
            echo "address  = 127.0.0.1:$((base + i))"
            echo "fabric   = tcp"
            echo "data_dir = data/$i"
            echo "metrics  = 127.0.0.1:$((base + 100 + i))"
        done
    } >"$conf"
fi
mkdir -p "$dir/log"

pids=()
stop() { # stop STATUS: stops every replica, exits with STATUS
    trap '' INT TERM
    echo
    echo "run-local: stopping ${#pids[@]} replicas"
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        # Bounded: a replica drains within 2 s; then it is killed.
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    echo "run-local: stopped; data kept in $dir/data (run again to restart from it)"
    exit "$1"
}
trap 'stop 0' INT TERM

for ((i = 0; i < replicas; i++)); do
    "$server" -c "$conf" -i "$i" ${new:+--new-cluster} \
        > >(tee -a "$dir/log/$i.log" | sed -u "s/^/[r$i] /") 2>&1 &
    pids+=($!)
done

# Ready when a status call reaches every replica (bounded: 30 s).
ready=""
for _ in $(seq 60); do
    sleep 0.5
    for i in "${!pids[@]}"; do
        if ! kill -0 "${pids[$i]}" 2>/dev/null; then
            echo "run-local: replica $i exited at start: $(tail -n 1 "$dir/log/$i.log" 2>/dev/null)" >&2
            stop 1
        fi
    done
    if "$cli" -c "$conf" -t 1000 status 2>/dev/null | awk 'NR > 1 && $2 == "unreachable" { bad = 1 } END { exit bad }'; then
        ready=1
        break
    fi
done
if [ -z "$ready" ]; then
    echo "run-local: the cluster did not come up within 30 s (see $dir/log/)" >&2
    stop 1
fi
cat <<EOF

flowkv: a $replicas-replica $proto cluster is serving on 127.0.0.1:$base..$((base + replicas - 1))
  cluster file:  $conf   (the CLI and flowkv-ycsb take it with -c $conf)
  try:           $cli -c $conf put greeting hello
                 $cli -c $conf get greeting
                 $cli -c $conf scan
                 $cli -c $conf status
  metrics:       curl http://127.0.0.1:$((base + 100))/metrics
  stop:          Ctrl-C (replicas drain and close LMDB; data stays in $dir/data)

EOF
"$cli" -c "$conf" status || true
# Serves until Ctrl-C (the trap exits 0); a replica that exits on its own
# ends the run.
set +e
wait -n "${pids[@]}"
rc=$?
echo "run-local: a replica exited on its own (status $rc, see $dir/log/); stopping the others" >&2
stop 1

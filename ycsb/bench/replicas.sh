# shellcheck shell=bash
# ycsb/bench/replicas.sh: sourced by the benchmarks that run their own
# local replicas (capacity.sh, clients.sh). The caller defines SERVER and
# CLI (binaries) and `declare -A PID` (DIR.ID -> pid; its EXIT trap kills
# what is left there). Every wait is bounded.

start() { # start DIR ID [flags]: replica ID of DIR/cluster.conf, no metrics page
    local d=$1 i=$2
    shift 2
    "$SERVER" -c "$d/cluster.conf" -i "$i" -m off "$@" >>"$d/log$i" 2>&1 &
    PID[$d.$i]=$!
}
stop() { # stop DIR ID SIGNAL (bounded 5 s, then KILL)
    local p=${PID[$1.$2]:-}
    [ -n "$p" ] || return 0
    kill -"$3" "$p" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
    unset "PID[$1.$2]"
}
serving() { # serving DIR: a put succeeds (bounded 30 s)
    for _ in $(seq 60); do
        "$CLI" -c "$1/cluster.conf" -t 1000 put probe x >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "$(basename "$0" .sh): the cluster in $1 does not serve" >&2
    return 1
}
# ops_of FILE: a YCSB report's overall throughput, ops/s.
ops_of() { awk -F', ' '$1=="[OVERALL]" && $2=="Throughput(ops/sec)" {printf "%.0f", $3}' "$1"; }

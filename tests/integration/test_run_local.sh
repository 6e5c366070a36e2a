#!/usr/bin/env bash
# test_run_local.sh: deploy/run-local.sh (`make run`) says how it ended:
# a cluster that cannot start (its first replica's port taken) exits 1
# with the replica's reason; a replica that dies while serving ends the
# run with status 1; Ctrl-C (SIGTERM here) stops every replica and exits 0.
# Every wait is bounded; every process started here is stopped by PID.
set -u
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RUN=$ROOT/deploy/run-local.sh
WORK=$(mktemp -d /tmp/fkrunlocal.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    # Replicas a broken run-local.sh left behind: started by this test
    # (their command lines name its directory), so ended here by PID.
    for p in $(pgrep -f -- "$WORK/"); do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$WORK"
}
trap cleanup EXIT
export FLOWKV_LOG=warn

# ended PID SECONDS: waits for PID, a child of this shell, to end
# (bounded) and sets st to its exit status, or to "running".
ended() {
    st=running
    for _ in $(seq $(($2 * 10))); do
        if ! kill -0 "$1" 2>/dev/null; then
            wait "$1"
            st=$?
            return
        fi
        sleep 0.1
    done
}

# server_pids DIR: the flowkv-server processes of the cluster in DIR.
server_pids() { pgrep -f -- "-c $1/cluster.conf -i" || true; }

# 1. The first replica's port is taken: exit 1, naming the replica.
base=$(fk_base_port)
python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(60)' "$base" &
holder=$!
pids+=("$holder")
sleep 0.5
"$RUN" -d "$WORK/a" -P "$base" >"$WORK/a.out" 2>&1 &
run=$!
pids+=("$run")
ended "$run" 45
if [ "$st" = 1 ] && grep -q 'run-local: replica 0 exited at start' "$WORK/a.out" &&
    [ -z "$(server_pids "$WORK/a")" ]; then
    t_ok "a cluster that cannot start exits 1 with the reason ($(grep -m 1 'exited at start' "$WORK/a.out" | cut -c 1-110))"
else
    t_fail "a cluster that cannot start exits 1" "status $st: $(tail -n 3 "$WORK/a.out" | tr '\n' ' ')"
fi
kill "$holder" 2>/dev/null

# 2. Serving, then a replica killed: the run ends with status 1.
base=$(fk_base_port)
"$RUN" -d "$WORK/b" -P "$base" >"$WORK/b.out" 2>&1 &
run=$!
pids+=("$run")
for _ in $(seq 300); do grep -q 'cluster is serving' "$WORK/b.out" && break; sleep 0.1; done
victim=$(server_pids "$WORK/b" | head -n 1)
if grep -q 'cluster is serving' "$WORK/b.out" && [ -n "$victim" ]; then
    kill -KILL "$victim"
    ended "$run" 30
    if [ "$st" = 1 ] && grep -q 'a replica exited on its own' "$WORK/b.out" && [ -z "$(server_pids "$WORK/b")" ]; then
        t_ok "a replica that dies while serving ends the run with status 1, the others stopped"
    else
        t_fail "a replica that dies ends the run with status 1" "status $st: $(tail -n 3 "$WORK/b.out" | tr '\n' ' ')"
    fi
else
    t_fail "run-local serves" "$(tail -n 3 "$WORK/b.out" | tr '\n' ' ')"
fi

# 3. Serving, then SIGTERM (Ctrl-C): every replica stops, status 0.
"$RUN" -d "$WORK/b" -P "$base" >"$WORK/c.out" 2>&1 &
run=$!
pids+=("$run")
for _ in $(seq 300); do grep -q 'cluster is serving' "$WORK/c.out" && break; sleep 0.1; done
kill -TERM "$run"
ended "$run" 30
if [ "$st" = 0 ] && grep -q 'run-local: stopped' "$WORK/c.out" && [ -z "$(server_pids "$WORK/b")" ]; then
    t_ok "SIGTERM stops every replica and exits 0 (restarted from its data: $(grep -c 'starting a new cluster' "$WORK/c.out") new-cluster lines)"
else
    t_fail "SIGTERM stops the cluster with status 0" "status $st: $(tail -n 3 "$WORK/c.out" | tr '\n' ' ')"
fi
t_done

#!/usr/bin/env bash
# tests/rdma-vm/pair.sh: runs one perftest program between the two Soft-RoCE
# hosts of the VM: the server on host B (rxe1), the client on host A (rxe0)
# connecting to B's address. Only inside the VM (vm.sh run).
#
#   pair.sh [-s SECS] TOOL [ARG...]      e.g. pair.sh ib_write_lat -n 200
#
# Adds -d, -x (the IPv4 RoCE v2 GID index found at boot) and a port of its
# own to both sides. Prints the client's output, then the server's with
# "server| " before each line. Exits 0 only when both sides exit 0 within
# SECS (default 60) seconds; both are killed by PID otherwise.
set -u
secs=60
if [ "${1:-}" = "-s" ]; then
    secs=$2
    shift 2
fi
[ $# -ge 1 ] || { echo "usage: pair.sh [-s SECS] TOOL [ARG...]" >&2; exit 2; }
[ "${RDMA_VM:-0}" = 1 ] || { echo "pair.sh: runs only inside the VM (vm.sh run)" >&2; exit 2; }
tool=$1
shift
# One port per call, so a server that is slow to exit never blocks the next.
port=$((20000 + RANDOM % 20000))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

timeout --kill-after=2 "$secs" "$tool" -d "$RDMA_DEV_B" -x "$RDMA_GID_B" -p "$port" "$@" \
    >"$tmp/server" 2>&1 &
spid=$!
# The client gives up at once if nobody listens yet: wait (bounded) for the
# server's TCP port, through which perftest exchanges QP numbers and keys.
for _ in $(seq 1 100); do
    ss -ltnH "sport = :$port" 2>/dev/null | grep -q . && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
done
timeout --kill-after=2 "$secs" "$tool" -d "$RDMA_DEV_A" -x "$RDMA_GID_A" -p "$port" "$@" \
    "$RDMA_IP_B" >"$tmp/client" 2>&1
crc=$?
src=0
wait "$spid" || src=$?
cat "$tmp/client"
sed 's/^/server| /' "$tmp/server"
if [ "$crc" -ne 0 ] || [ "$src" -ne 0 ]; then
    echo "pair.sh: $tool failed: client status $crc, server status $src"
    exit 1
fi
exit 0

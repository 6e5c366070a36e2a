#!/usr/bin/env bash
# tests/rdma-vm/repeat.sh: runs one command again and again inside the
# rdma-vm guest, to measure how often a flaky check fails (README.md, "Torn
# words on rxe" was found this way). Bounded by a count and a time limit.
#
#   vm.sh run -t 300 tests/rdma-vm/repeat.sh N SECS CMD [ARG...]
#
# Runs CMD at most N times and starts no new run after SECS seconds; each
# run is limited to 120 s. Prints the output of every failed run and the rxe
# hardware counters (retries, duplicates, drops) after it, then
#   repeat: F failures in R runs
# and exits 1 when F > 0. The guest is set up as verbs_suite.sh does it
# (MTU 9000, same-host rules); FLOWKV_FABRIC=verbs unless already set.
set -u
[ "${RDMA_VM:-0}" = 1 ] || { echo "repeat.sh: runs only inside the VM" >&2; exit 2; }
[ $# -ge 3 ] || { echo "usage: repeat.sh N SECS CMD [ARG...]" >&2; exit 2; }
n=$1 secs=$2
shift 2
ip link set "$RDMA_IF_A" mtu 9000 && ip link set "$RDMA_IF_B" mtu 9000 || exit 1
ip rule add pref 5 from "$RDMA_IP_A" to "$RDMA_IP_A" lookup local 2>/dev/null
ip rule add pref 5 from "$RDMA_IP_B" to "$RDMA_IP_B" lookup local 2>/dev/null
export FLOWKV_FABRIC=${FLOWKV_FABRIC:-verbs}

# hw_counters: the non-zero rxe hardware counters of both devices.
hw_counters() {
    local d f
    for d in "$RDMA_DEV_A" "$RDMA_DEV_B"; do
        printf '%s:' "$d"
        for f in /sys/class/infiniband/"$d"/ports/1/hw_counters/*; do
            [ "$(cat "$f")" != 0 ] && printf ' %s=%s' "${f##*/}" "$(cat "$f")"
        done
        echo
    done
}

end=$(($(date +%s) + secs))
fails=0 i=0
while [ "$i" -lt "$n" ] && [ "$(date +%s)" -lt "$end" ]; do
    i=$((i + 1))
    if ! out=$(timeout --kill-after=5 120 "$@" 2>&1); then
        fails=$((fails + 1))
        echo "== run $i failed:"
        echo "$out" | tail -n 20
        hw_counters
    fi
done
echo "repeat: $fails failures in $i runs"
[ "$fails" -eq 0 ]

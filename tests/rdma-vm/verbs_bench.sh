#!/usr/bin/env bash
# tests/rdma-vm/verbs_bench.sh: `make bench-rdma`, inside the rdma-vm guest.
# Measures, in the same run and between the same two hosts (A = rxe0,
# B = rxe1, across the veth wire):
#   baseline  perftest ib_write_lat -s 64 and ib_write_bw -s 64
#             (tests/rdma-vm/bench-baseline.sh, RUNS runs, medians);
#   fabric    build/tests-aux/verbs_bench with FLOWKV_FABRIC=verbs: a 64-byte
#             one-sided write ping-pong waiting the way flows targets wait,
#             and a stream of 64-byte writes (RUNS runs, medians);
# then prints
#   rdma-bench: latency_ratio=<fabric RTT / ib_write_lat RTT> bandwidth_ratio=<fabric B/s / ib_write_bw B/s>
# ib_write_lat reports half a round trip (t_typical), so its RTT is twice
# that. The flows benchmark (flows/bench) cannot give these ratios: it runs
# both of its processes on one node address and compares with raw TCP; it
# is run too, on host A, and its table printed for information. The ratios
# come from the fabric operations flows is made of, host to host.
#
#   verbs_bench.sh BUILD_DIR [RUNS]
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: verbs_bench.sh BUILD_DIR [RUNS]}
runs=${2:-3}
[ "${RDMA_VM:-0}" = 1 ] || { echo "verbs_bench.sh: runs only inside the VM" >&2; exit 2; }

median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}

# perftest itself sometimes fails a run under TCG (a client that gives up):
# the baseline is taken again, at most 3 times.
base=""
for try in 1 2 3; do
    base=$("$here/bench-baseline.sh" "$runs" | tee /dev/stderr | grep '^rdma-baseline:') && break
    echo "verbs_bench: the perftest baseline failed (try $try)"
done
[ -n "$base" ] || exit 1
lat=$(sed -n 's/.*write_lat_us=\([0-9.]*\).*/\1/p' <<<"$base")
bw=$(sed -n 's/.*write_bw_64B_MBps=\([0-9.]*\).*/\1/p' <<<"$base")

export FLOWKV_FABRIC=verbs FLOWKV_LOG=warn
rtts=() bws=()
for i in $(seq 1 "$runs"); do
    out=$(timeout --kill-after=5 120 "$build/tests-aux/verbs_bench" 1000 20000 2>&1)
    rc=$?
    echo "$out"
    line=$(grep '^verbs-bench:' <<<"$out")
    if [ "$rc" -ne 0 ] || [ -z "$line" ] || ! grep -q 'backend=verbs' <<<"$line"; then
        echo "verbs_bench: run $i failed (status $rc)"
        exit 1
    fi
    rtts+=("$(sed -n 's/.*rtt_us=\([0-9.]*\).*/\1/p' <<<"$line")")
    bws+=("$(sed -n 's/.*bw_MBps=\([0-9.]*\).*/\1/p' <<<"$line")")
done
rtt=$(printf '%s\n' "${rtts[@]}" | median)
fbw=$(printf '%s\n' "${bws[@]}" | median)
echo "fabric over verbs: rtt_us=$rtt (runs: ${rtts[*]}) bw_64B_MBps=$fbw (runs: ${bws[*]})"
echo "perftest: ib_write_lat t_typical_us=$lat (RTT $(awk -v l="$lat" 'BEGIN { print 2 * l }') us)" \
    "ib_write_bw_64B_MBps=$bw"
# The flows benchmark over verbs, for information: it runs its two
# processes on one node address, so on host A alone (rxe0 loops the
# traffic back; the preference-5 rule is verbs_suite.sh's) and against raw
# TCP, not against perftest.
fb=$build/bin/flows-bench
if [ -x "$fb" ]; then
    ip link set "$RDMA_IF_A" mtu 9000 2>/dev/null
    ip rule add pref 5 from "$RDMA_IP_A" to "$RDMA_IP_A" lookup local 2>/dev/null
    echo "flows-bench over verbs on host A (rxe0), for information:"
    FLOWKV_RDMA_DEVICE=$RDMA_DEV_A timeout --kill-after=5 200 "$fb" 2>&1 | grep -v ' W flows' |
        sed 's/^/  /'
fi
awk -v r="$rtt" -v l="$lat" -v f="$fbw" -v b="$bw" 'BEGIN {
    printf "rdma-bench: latency_ratio=%.2f bandwidth_ratio=%.2f\n", r / (2 * l), f / b }'

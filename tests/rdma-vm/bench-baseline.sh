#!/usr/bin/env bash
# tests/rdma-vm/bench-baseline.sh: the RDMA baseline for flows over verbs.
# Runs inside the VM (make bench-rdma-baseline, or vm.sh run this script):
# perftest's ib_write_lat and ib_write_bw between rxe0 (host A) and rxe1
# (host B), RUNS times each (default 5), and prints the medians:
#
#   rdma-baseline: write_lat_us=<median of t_typical, 64 B>
#                  write_bw_64B_MBps=<median BW average, 64 B messages>
#                  write_bw_8KiB_MBps=<median BW average, 8 KiB messages>
#
# 64 B is the tuple size the flows benchmark compares at; 8 KiB is DFI's
# default segment size. MB/s is perftest's MB/sec, which is MiB/s (2^20 bytes
# per second, `ib_write_bw --help`).
set -u
here=$(cd "$(dirname "$0")" && pwd)
runs=${1:-5}

# median: the middle value of the numbers on stdin (lower middle if even).
median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}

# measure COLUMN TOOL ARG...: runs TOOL $runs times through pair.sh and
# prints column COLUMN of each result row; exits 1 if a run fails. A run
# whose figure is not a number (perftest's clock calibration failed under
# TCG, the row reads "inf") is repeated, at most 3 times.
measure() {
    local col=$1 out i try v
    shift
    for i in $(seq 1 "$runs"); do
        for try in 1 2 3; do
            if ! out=$("$here/pair.sh" "$@" 2>&1); then
                echo "bench-baseline: $* failed (run $i):" >&2
                tail -n 5 <<<"$out" >&2
                return 1
            fi
            v=$(grep -m 1 -E '^ *[0-9]+ +[0-9]+ +([0-9.]+|inf) ' <<<"$out" |
                awk -v c="$col" '{ print $c }')
            [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]] && break
            echo "bench-baseline: $* run $i try $try gave no figure ('$v'); again" >&2
        done
        if ! [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
            echo "bench-baseline: no figure from $* (run $i):" >&2
            cat <<<"$out" >&2
            return 1
        fi
        echo "$v"
    done
}

lat=$(measure 5 ib_write_lat -s 64 -n 2000) || exit 1
bw64=$(measure 4 ib_write_bw -s 64 -n 20000) || exit 1
bw8k=$(measure 4 ib_write_bw -s 8192 -n 5000) || exit 1
echo "ib_write_lat 64 B t_typical (us): $(tr '\n' ' ' <<<"$lat")"
echo "ib_write_bw 64 B BW average (MB/s): $(tr '\n' ' ' <<<"$bw64")"
echo "ib_write_bw 8 KiB BW average (MB/s): $(tr '\n' ' ' <<<"$bw8k")"
echo "rdma-baseline: write_lat_us=$(median <<<"$lat") write_bw_64B_MBps=$(median <<<"$bw64")" \
    "write_bw_8KiB_MBps=$(median <<<"$bw8k") runs=$runs"

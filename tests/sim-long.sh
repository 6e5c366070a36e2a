#!/usr/bin/env bash
# `make sim-long`: the long simulation campaign. 200,000 seeds of
# Multi-Paxos, 200,000 of NOPaxos and 50,000 of NOPaxos in durable mode
# (override with MPX=, NOP=, DURABLE=, and FIRST= for the first seed), each
# split into one shard per core. Every shard prints a progress line every
# 15 s; failures print their replay command; the last line is the summary:
#   sim-long: mpx=N/F nop=N/F nop_durable=N/F (seeds/failed) in M min
# The status is non-zero if any seed failed.
set -u
sim=${BUILD:-build}/bin/flowkv-sim
[ -x "$sim" ] || { echo "sim-long: $sim missing (make all)" >&2; exit 2; }
mpx=${MPX:-200000} nop=${NOP:-200000} durable=${DURABLE:-50000} first=${FIRST:-1}
jobs=$(nproc 2>/dev/null || echo 2)
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
start=$(date +%s)

# campaign NAME SEEDS ARGS...: runs the shards in parallel, prints their
# progress as it comes, and sets ran/failed to the totals.
campaign() {
    local name=$1 seeds=$2
    shift 2
    local per=$(((seeds + jobs - 1) / jobs)) pids=() k
    for ((k = 0; k < jobs; k++)); do
        local from=$((first + k * per)) count=$per
        [ $((k * per + count)) -le "$seeds" ] || count=$((seeds - k * per))
        [ "$count" -gt 0 ] || break
        "$sim" "$@" --first "$from" --seeds "$count" 2>&1 |
            tee "$dir/$name.$k" | grep --line-buffered -E "seeds done|^FAIL|replay:" |
            sed -u "s/^/[$name shard $k] /" &
        pids+=($!)
    done
    wait "${pids[@]}"
    ran=0 failed=0
    for f in "$dir/$name".*; do
        local line
        line=$(grep -E "^flowkv-sim [a-z ()]+: [0-9]+ seeds \(" "$f" | tail -n 1)
        if [ -z "$line" ]; then
            echo "sim-long: a $name shard ended without its summary:" >&2
            tail -n 5 "$f" >&2
            failed=$((failed + 1))
            continue
        fi
        ran=$((ran + $(sed -E 's/.*: ([0-9]+) seeds.*/\1/' <<<"$line")))
        failed=$((failed + $(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")))
    done
    echo "sim-long: $name: $ran seeds, $failed failed, $(($(date +%s) - start)) s so far"
}

campaign mpx "$mpx" --proto mpx
mpx_r=$ran mpx_f=$failed
campaign nop "$nop" --proto nop
nop_r=$ran nop_f=$failed
campaign nop_durable "$durable" --proto nop --durable
dur_r=$ran dur_f=$failed

mins=$(awk -v s=$(($(date +%s) - start)) 'BEGIN { printf "%.1f", s / 60 }')
echo "sim-long: mpx=$mpx_r/$mpx_f nop=$nop_r/$nop_f nop_durable=$dur_r/$dur_f (seeds/failed) in $mins min"
[ $((mpx_f + nop_f + dur_f)) -eq 0 ]

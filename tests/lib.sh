# tests/lib.sh: helpers for shell tests; source it, then call t_ok / t_fail
# for each check and t_done at the end. Output matches tests/check.h so that
# tests/run.sh counts shell tests and C tests alike.
t__pass=0
t__fail=0
t__skip=0
t__skip_why=""
t__n=0

# t_ok NAME: one passed check.
t_ok() {
    t__n=$((t__n + 1))
    t__pass=$((t__pass + 1))
    echo "ok $t__n - $1"
}

# t_fail NAME WHY: one failed check; WHY names what was expected.
t_fail() {
    t__n=$((t__n + 1))
    t__fail=$((t__fail + 1))
    echo "not ok $t__n - $1: $2"
}

# t_skip NAME WHY: one check that cannot run here (only for what the
# machine lacks, e.g. root). Counted apart and shown in the summary line
# ("K skipped (WHY)"), never as passed.
t_skip() {
    t__n=$((t__n + 1))
    t__skip=$((t__skip + 1))
    t__skip_why=$2
    echo "ok $t__n - $1 # SKIP $2"
}

# t_replay PREFIX FILE [quiet]: each "ok N - NAME" and "not ok N - NAME:
# WHY" line another test printed into FILE becomes one check here, named
# "PREFIXNAME"; T_REPLAYED says how many. Other lines starting with "# "
# and "verbs-counters:" are shown as they are, unless quiet.
t_replay() {
    local line
    T_REPLAYED=0
    while IFS= read -r line; do
        if [[ $line =~ ^ok\ ([0-9]+\ )?-\ (.*)$ ]]; then
            t_ok "$1${BASH_REMATCH[2]}"
            T_REPLAYED=$((T_REPLAYED + 1))
        elif [[ $line =~ ^not\ ok\ ([0-9]+\ )?-\ ([^:]*)(:\ (.*))?$ ]]; then
            t_fail "$1${BASH_REMATCH[2]}" "${BASH_REMATCH[4]:-failed}"
            T_REPLAYED=$((T_REPLAYED + 1))
        elif [ -z "${3:-}" ] && [[ $line =~ ^(verbs-counters:|#\ ) ]] && [[ ! $line =~ ^#\ check: ]]; then
            echo "$line"
        fi
    done <"$2"
}

# t_check NAME COMMAND...: runs COMMAND; passes when it exits 0.
t_check() {
    local name=$1
    shift
    local out
    if out=$("$@" 2>&1); then
        t_ok "$name"
    else
        t_fail "$name" "'$*' failed: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
    fi
}

# t_done: prints the summary line and exits 1 if anything failed.
t_done() {
    if [ "$t__skip" -gt 0 ]; then
        echo "# skipped: $t__skip ($t__skip_why)"
        echo "# check: ${T_NAME:-$(basename "$0")} passed=$t__pass failed=$t__fail skipped=$t__skip"
    else
        echo "# check: ${T_NAME:-$(basename "$0")} passed=$t__pass failed=$t__fail"
    fi
    [ "$t__fail" -eq 0 ] && [ $((t__pass + t__skip)) -gt 0 ]
    exit $?
}

# fk_local_conf FILE PROTO DURABILITY BASEPORT [QUOTA]: a 3-replica cluster
# file on 127.0.0.1:BASEPORT.. over the tcp fabric, data in dataN beside
# FILE, every replica a sequencer candidate, the protocol's default quota
# unless QUOTA (e.g. 1MiB) is given. BASEPORT from fk_base_port stays below the
# kernel's ephemeral range, where a client socket could take a replica's port.
# FK_TEST_FABRIC (default tcp) and FK_TEST_HOSTS (three addresses, default
# 127.0.0.1 three times) place the same cluster elsewhere: the Soft-RoCE
# guest runs tests this way on verbs (tests/rdma-vm/cluster.sh).
fk_base_port() { echo $((20000 + RANDOM % 12000)); }
fk_local_conf() {
    local hosts
    read -r -a hosts <<<"${FK_TEST_HOSTS:-127.0.0.1 127.0.0.1 127.0.0.1}"
    mkdir -p "$(dirname "$1")"
    {
        echo "[cluster]"
        echo "protocol = $2"
        echo "durability = $3"
        echo "token = local-test-token-0123456789"
        echo "sequencers = 2, 1, 0"
        if [ -n "${5:-}" ]; then echo "quota = $5"; fi
        for i in 0 1 2; do
            printf '[node %d]\naddress = %s:%d\nfabric = %s\ndata_dir = data%d\n' \
                "$i" "${hosts[$i]}" $(($4 + i)) "${FK_TEST_FABRIC:-tcp}" "$i"
        done
    } >"$1"
}

# hist_gap HISTORY FROM TO: (kv_history's history file) the longest time in [FROM, TO] (CLOCK_MONOTONIC
# ns) without an answered operation, in ms, and when it began (ms after FROM).
hist_gap() {
    awk -v from="$2" -v to="$3" '!/^#/ && $6 != "unknown" && $9 >= from && $9 <= to { print $9 }' "$1" |
        sort -n | awk -v from="$2" -v to="$3" '
            BEGIN { last = from; g = 0; at = from }
            { if ($1 - last > g) { g = $1 - last; at = last } last = $1 }
            END { if (to - last > g) { g = to - last; at = last } printf "%d ms from +%d ms\n", g / 1000000, (at - from) / 1000000 }'
}

# fk_deploy_conf FILE PROTOCOL DURABILITY BASEPORT TOKEN: a 3-node cluster
# file for deploy/flowkv-deploy's local runner: node i on 127.0.0.1 at
# BASEPORT+i, host hI (a directory), data in /var/lib/flowkv/I under it.
fk_deploy_conf() {
    {
        echo "[cluster]"
        echo "protocol = $2"
        echo "durability = $3"
        echo "token = $5"
        echo "sequencers = 2, 1, 0"
        for i in 0 1 2; do
            printf '[node %d]\naddress = 127.0.0.1:%d\nhost = h%d\nfabric = tcp\ndata_dir = /var/lib/flowkv/%d\n' \
                "$i" $(($4 + i)) "$i" "$i"
        done
    } >"$1"
}

# t_ycsb_all_ok NAME FILE OPS: one check: the flowkv-ycsb report in FILE
# counts OPS operations, all Return=OK, with no -FAILED series and no other
# return code. A read-modify-write (workload F) is reported three times,
# as itself and as its READ and its UPDATE (YCSB's convention), so each
# counts once here.
t_ycsb_all_ok() {
    local name=$1 f=$2 want=$3 ops okn other rmw
    rmw=$(awk -F', ' '$1 == "[READ-MODIFY-WRITE]" && $2 == "Operations" { print $3 }' "$f")
    want=$((want + 2 * ${rmw:-0}))
    ops=$(awk -F', ' '$2 == "Operations" && $1 !~ /FAILED/ { s += $3 } END { print s + 0 }' "$f")
    okn=$(awk -F', ' '$2 == "Return=OK" { s += $3 } END { print s + 0 }' "$f")
    other=$(grep -E 'Return=|FAILED' "$f" | grep -v 'Return=OK' | head -n 3 | tr '\n' ' ')
    if [ "$ops" -eq "$want" ] && [ "$okn" -eq "$want" ] && [ -z "$other" ]; then
        t_ok "$name: $want operations, all OK"
    else
        t_fail "$name" "operations=$ops Return=OK=$okn (want $want) other: ${other:-none}"
    fi
}

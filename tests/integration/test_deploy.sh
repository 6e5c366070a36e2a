#!/usr/bin/env bash
# test_deploy.sh: deploy/flowkv-deploy brings a 3-replica cluster up, reports
# status and logs, takes it down and up again (restarted from disk, no
# --new-cluster), through its local runner: every "host" is a directory
# with its own /etc, /usr/local and data, and the script runs each
# replica from the systemd unit it installed there (the ssh runner differs
# only in how a command reaches a host and in using systemctl). The unit is
# checked with systemd-analyze verify. Every process is stopped by the
# script's own down, then by PID from its pid files.
set -u
. "$(dirname "$0")/../lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=$ROOT/deploy/flowkv-deploy
CLI=${BUILD:-$ROOT/build}/bin/flowkv
case $CLI in /*) ;; *) CLI=$ROOT/$CLI ;; esac
WORK=$(mktemp -d /tmp/fkdeploy.XXXXXX)
HOSTS=$WORK/hosts
cleanup() {
    for f in "$HOSTS"/*/run/flowkv-*.pid; do
        [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

fk_deploy_conf "$WORK/cluster.conf" nopaxos sync "$(fk_base_port)" deploy-test-token-012345
dep() { timeout 180 "$D" -c "$WORK/cluster.conf" --runner local --root "$HOSTS" "$@"; }

if out=$(dep up 2>&1); then
    t_ok "flowkv-deploy up: a new cluster serves ($(tail -n 1 <<<"$out"))"
else
    t_fail "flowkv-deploy up" "$(tail -n 5 <<<"$out")"
    t_done
fi
ok=1
for i in 0 1 2; do
    for f in usr/local/bin/flowkv-server etc/flowkv/cluster.conf etc/systemd/system/flowkv@.service \
        usr/local/share/doc/flowkv/README.md \
        var/lib/flowkv/$i/data.mdb; do
        [ -e "$HOSTS/h$i/$f" ] || { ok=0; echo "missing h$i/$f"; }
    done
    [ -e "$HOSTS/h$i/etc/flowkv/flowkv-$i.env" ] && { ok=0; echo "h$i kept --new-cluster"; }
done
[ $ok = 1 ] && t_ok "each host has the programs, the cluster file, its unit and data; --new-cluster removed" ||
    t_fail "installed files" "see above"

unit=$(dep unit)
doc=$(sed -n 's|^Documentation=file://||p' <<<"$unit")
grep -q '^Type=notify$' <<<"$unit" && grep -q '^Restart=on-failure$' <<<"$unit" &&
    grep -q '^LimitMEMLOCK=infinity$' <<<"$unit" && grep -q '^User=flowkv$' <<<"$unit" &&
    grep -q '^ExecStart=.* -i %i ' <<<"$unit" && [ -f "$HOSTS/h1$doc" ] &&
    t_ok "the template unit flowkv@.service: Type=notify, Restart=on-failure, LimitMEMLOCK=infinity, User=flowkv, -i %i, Documentation installed ($doc)" ||
    t_fail "unit contents" "$unit"
# systemd's own check of the unit as instance 1 (its ExecStart binary
# exists in the host's root).
cp "$HOSTS/h1/etc/systemd/system/flowkv@.service" "$WORK/flowkv@.service"
sed -i "s|^ExecStart=/usr/local|ExecStart=$HOSTS/h1/usr/local|" "$WORK/flowkv@.service"
if command -v systemd-analyze >/dev/null; then
    if v=$(cd "$WORK" && systemd-analyze verify "$WORK/flowkv@.service" "flowkv@1.service" 2>&1 | grep -v -i -E 'network-online|multi-user|Failed to (prepare|create).*cgroup|Unit.*not found|bus'); [ -z "$v" ]; then
        t_ok "systemd-analyze verify accepts the unit"
    else
        t_fail "systemd-analyze verify" "$v"
    fi
else
    t_fail "systemd-analyze verify" "systemd-analyze is not installed"
fi

"$CLI" -c "$WORK/cluster.conf" put deployed yes >/dev/null 2>&1 &&
    [ "$("$CLI" -c "$WORK/cluster.conf" get deployed 2>/dev/null)" = yes ] &&
    t_ok "the CLI reads the same cluster file: put and get" || t_fail "put/get" "CLI failed"
st=$(dep status 2>&1)
[ "$(grep -c ': active$' <<<"$st")" = 3 ] && grep -q leader <<<"$st" &&
    t_ok "flowkv-deploy status: 3 replicas active, a leader" || t_fail "status" "$st"
lg=$(dep logs 2 2>&1)
grep -q '== replica 2 on h2' <<<"$lg" && grep -q 'serving' <<<"$lg" &&
    t_ok "flowkv-deploy logs 2" || t_fail "logs" "$(tail -n 3 <<<"$lg")"

if dep down >/dev/null 2>&1 && [ "$(dep status 2>/dev/null | grep -c ': inactive$')" = 3 ]; then
    t_ok "flowkv-deploy down stops every replica"
else
    t_fail "down" "$(dep status 2>&1 | head -n 3)"
fi
if out=$(dep up 2>&1) && grep -q 'restarted from disk' <<<"$out" &&
    [ "$("$CLI" -c "$WORK/cluster.conf" get deployed 2>/dev/null)" = yes ]; then
    t_ok "up again restarts the cluster from disk with its data"
else
    t_fail "second up" "$(tail -n 3 <<<"$out")"
fi
dep down >/dev/null 2>&1
t_done

#!/usr/bin/env bash
# deploy/deps.sh: makes sure the Debian packages flowkv builds and tests with
# are installed. Quick (one dpkg-query) when everything is present.
#
#   deploy/deps.sh [SET]            install what SET lacks (root, or sudo -n)
#   deploy/deps.sh --check [SET]    only report; exit 1 if something is missing
#   deploy/deps.sh --list [SET]     print SET's packages, one per line
#
# SET is `build` (what `make`, `make run` and `make install` need: the
# compiler and the libraries' -dev packages) or `all` (default: build plus
# what `make test` and the benchmarks run: RDMA tools, lint, clang for the
# fuzzers, etcd, gnuplot, nftables, and the Soft-RoCE VM's qemu and
# perftest).
#
# Without root or password-less sudo it prints the exact apt-get command and
# exits 1, so `make test` stops with a clear message instead of failing later.
set -eu

# Build: compiler, pkg-config and the -dev packages of the chosen libraries.
# flowkv-ycsb's etcd bindings: gRPC's C core and protobuf-c (-db etcd, etcd's
# native API), libcurl and jansson (-db etcd-json, its JSON gateway).
BUILD_PKGS="build-essential make pkg-config libibverbs-dev librdmacm-dev libuv1-dev
libxxhash-dev liblmdb-dev libinih-dev libsodium-dev libcurl4-openssl-dev
libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libjansson-dev"
# Run and test: RDMA userspace (rxe provider, ibv_devices), LMDB tools,
# lint and fuzz tooling, etcd (the YCSB etcd binding's peer and etcdctl),
# gnuplot (make bench's p95-against-throughput plot), nftables (the fault
# suite's loss and partitions), iptables and libnetfilter-queue (its packet
# delay: the NFQUEUE target and tests/faults/nfq_delay, this kernel having
# no sch_netem), and the Prometheus client's text-format parser (the test of
# the replicas' /metrics, test_cluster.sh).
TEST_PKGS="rdma-core ibverbs-utils lmdb-utils clang-format cppcheck clang iproute2
etcd-server etcd-client gnuplot-nox nftables iptables libnetfilter-queue-dev
python3-prometheus-client"
# Soft-RoCE VM tier (tests/rdma-vm): qemu boots Debian's kernel (fetched with
# apt-get download) with a busybox initramfs; the guest runs the host's
# rdma-core, iproute2 (rdma, ip netns) and perftest over 9p.
RDMA_VM_PKGS="qemu-system-x86 busybox-static kmod cpio perftest ibverbs-providers
rdmacm-utils"

mode=install
case ${1:-} in --check | --list) mode=${1#--}; shift ;; esac
case ${1:-all} in
build) want=$(echo $BUILD_PKGS ${FLOWKV_EXTRA_PKGS:-}) ;;
all) want=$(echo $BUILD_PKGS $TEST_PKGS $RDMA_VM_PKGS ${FLOWKV_EXTRA_PKGS:-}) ;;
*) echo "deps: set '$1': build or all" >&2; exit 2 ;;
esac
if [ "$mode" = list ]; then
    tr ' ' '\n' <<<"$want"
    exit 0
fi

# One dpkg-query for all: it prints "NAME install ok installed" for each
# installed package; any other state, or no line at all, counts as missing.
installed=$(dpkg-query -W -f='${Package} ${Status}\n' $want 2>/dev/null |
    awk '$2 == "install" && $3 == "ok" && $4 == "installed" { print $1 }' || true)
missing=""
for p in $want; do
    if ! grep -qx "$p" <<<"$installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi
missing=${missing# }
if [ "$mode" = check ]; then
    echo "deps: missing packages: $missing" >&2
    exit 1
fi

cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing"
if [ "$(id -u)" -eq 0 ]; then
    sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
else
    echo "deps: missing packages: $missing" >&2
    echo "deps: run as root:  $cmd" >&2
    exit 1
fi

echo "deps: installing $missing"
# Retried once: a mirror hiccup during update should not fail a CI run.
for attempt in 1 2; do
    if $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends $missing; then
        exit 0
    fi
    echo "deps: apt-get failed (attempt $attempt)" >&2
    sleep 5
done
exit 1

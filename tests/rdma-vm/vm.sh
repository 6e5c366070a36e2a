#!/usr/bin/env bash
# tests/rdma-vm/vm.sh: runs a command inside a small VM that has two
# Soft-RoCE "hosts": rxe0 on vethA (10.77.0.1) and rxe1 on vethB (10.77.0.2),
# the two ends of a veth pair that RoCE v2 packets really cross (policy
# routing in guest.sh; why not two network namespaces: MULTICAST.md).
#
#   vm.sh prepare                     fetch the kernel, build the initramfs
#   vm.sh run [-t SECS] [-o DIR] CMD [ARG...]
#                                     boot, run CMD in the guest, power off
#   vm.sh shell                       boot to an interactive guest shell
#
# Why a VM: the host kernel has no InfiniBand support, so rdma_rxe cannot be
# loaded here. Debian's linux-image-6.1.0-*-amd64 ships rdma_rxe.ko; qemu
# boots it under TCG (no KVM on these machines) with a busybox initramfs
# (tests/rdma-vm/init), and the guest chroots into the host's root, shared
# read-only over 9p, so it runs the host's rdma-core, perftest and test
# binaries unchanged. DESIGN.md (Testing tiers) has the verified facts.
#
# `run` sees CMD exactly as the host does: the same absolute paths, the repo
# (read-only) as the working directory. What CMD writes to $RDMA_OUT comes
# back to the host in DIR (default build/rdma-vm/runs/<id>). The guest
# exports, for CMD and everything it starts:
#   RDMA_DEV_A=rxe0  RDMA_IF_A=vethA  RDMA_IP_A=10.77.0.1
#   RDMA_DEV_B=rxe1  RDMA_IF_B=vethB  RDMA_IP_B=10.77.0.2
#   RDMA_GID_A / RDMA_GID_B  index of the RoCE v2 IPv4 GID (perftest -x)
#   RDMA_OUT  writable directory that comes back;  RDMA_VM=1
# A process of host A uses rxe0 and binds 10.77.0.1; host B's, rxe1 and
# 10.77.0.2 (tests/rdma-vm/pair.sh runs perftest that way). The exit
# status of `run` is CMD's; 125 means the VM gave no result (boot failure,
# crash or timeout: see console.log in DIR).
#
# Bounded: CMD is stopped inside the guest after SECS (default 480), and
# qemu is killed by PID RDMA_VM_BOOT_SLACK seconds later at the latest.
# Environment: RDMA_VM_DIR (cache, default <repo>/build/rdma-vm),
# RDMA_VM_KERNEL_PKG (force a linux-image package), RDMA_VM_MEM (MiB, 2048),
# RDMA_VM_CPUS (2), RDMA_VM_CPU (qemu -cpu model, see below).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${RDMA_VM_DIR:-$repo/build/rdma-vm}
mem=${RDMA_VM_MEM:-2048}
cpus=${RDMA_VM_CPUS:-2}
# The guest CPU: TCG's "max" without ERMS and FSRM. With them the guest
# kernel's memcpy is `rep movsb`, which TCG runs one byte at a time, and
# rxe places every RDMA WRITE and READ reply with that memcpy: an aligned
# 8-byte word then lands byte by byte and a reader polling it sees it torn
# (README.md, "Torn words on rxe"). Without them memcpy moves 8-byte words,
# as hardware RNICs place an aligned word in one PCIe write.
cpu_model=${RDMA_VM_CPU:-max,erms=off,fsrm=off}
boot_slack=${RDMA_VM_BOOT_SLACK:-180}

# Modules the guest loads, in this order, each after its dependencies
# (resolved with modules.dep). crc32_generic first: rdma_rxe asks the crypto
# API for "crc32" (the ICRC) and fails to create a device without it.
GUEST_MODULES="crc32_generic virtio_pci 9pnet_virtio 9p veth rdma_rxe ib_uverbs
rdma_ucm ib_umad"

die() {
    echo "vm: $*" >&2
    exit 125
}

# Prints the newest linux-image-6.1.0-N-amd64 package apt knows, or nothing.
newest_kernel_pkg() {
    apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' 2>/dev/null |
        awk '{ print $1 }' | sort -V | tail -n 1
}

# fetch_kernel PKG DIR: downloads PKG with apt-get download, keeps vmlinuz
# and the guest modules (flat, in load order listed in DIR/modules.order).
fetch_kernel() {
    local pkg=$1 dir=$2 tmp ver m
    tmp=$(mktemp -d "$cache/fetch.XXXXXX")
    # apt drops privileges to _apt for downloads; a root-owned temporary
    # directory makes it warn and download unsandboxed, so give it ours.
    chmod 0777 "$tmp"
    echo "vm: downloading $pkg" >&2
    (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>"$tmp/apt.err") ||
        { cat "$tmp/apt.err" >&2; rm -rf "$tmp"; die "apt-get download $pkg failed"; }
    dpkg-deb -x "$tmp"/*.deb "$tmp/root"
    ver=$(basename "$(ls -d "$tmp"/root/lib/modules/*/ | head -n 1)")
    depmod -b "$tmp/root" "$ver"
    mkdir -p "$tmp/out/modules"
    cp "$tmp/root/boot/vmlinuz-$ver" "$tmp/out/vmlinuz"
    for m in $GUEST_MODULES; do
        modprobe -d "$tmp/root" -S "$ver" --show-depends "$m" ||
            { rm -rf "$tmp"; die "module $m not found in $pkg"; }
    done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' >"$tmp/paths"
    while read -r m; do
        cp "$m" "$tmp/out/modules/"
        basename "$m" >>"$tmp/out/modules.order"
    done <"$tmp/paths"
    echo "$ver" >"$tmp/out/version"
    rm -rf "$dir"
    mv "$tmp/out" "$dir"
    rm -rf "$tmp"
}

# build_initramfs KDIR FILE: busybox, the modules and tests/rdma-vm/init.
build_initramfs() {
    local kdir=$1 file=$2 tmp
    tmp=$(mktemp -d "$cache/initramfs.XXXXXX")
    mkdir -p "$tmp"/{bin,dev,proc,sys,root,host,lib/modules}
    cp /bin/busybox "$tmp/bin/busybox"
    ln -s busybox "$tmp/bin/sh"
    cp "$kdir"/modules/*.ko "$tmp/lib/modules/"
    cp "$kdir/modules.order" "$tmp/lib/modules/"
    cp "$here/init" "$tmp/init"
    chmod 0755 "$tmp/init"
    (cd "$tmp" && find . -print0 | sort -z |
        cpio --quiet -o -0 -H newc --owner=0:0) | gzip -1 >"$file.tmp"
    mv "$file.tmp" "$file"
    rm -rf "$tmp"
}

# prepare: sets KERNEL_DIR and INITRAMFS, fetching and building what the
# cache lacks. Serialised with flock so concurrent test runs share one cache.
prepare() {
    local pkg hash
    mkdir -p "$cache"
    exec 9>"$cache/.lock"
    flock -w 900 9 || die "cache lock $cache/.lock held for 900 s"
    command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing (make deps)"
    [ -x /bin/busybox ] || die "/bin/busybox missing (make deps: busybox-static)"
    pkg=${RDMA_VM_KERNEL_PKG:-$(newest_kernel_pkg)}
    if [ -z "$pkg" ] && [ -z "$(ls "$cache/kernel" 2>/dev/null)" ] && [ "$(id -u)" -eq 0 ]; then
        # Fresh machine whose package lists were never fetched.
        echo "vm: no kernel package in apt-cache; running apt-get update" >&2
        apt-get update -qq >&2 || true
        pkg=$(newest_kernel_pkg)
    fi
    if [ -z "$pkg" ]; then
        # Offline or apt lists gone: fall back to what the cache holds.
        pkg=$(ls "$cache/kernel" 2>/dev/null | sort -V | tail -n 1)
        [ -n "$pkg" ] || die "no linux-image-6.1.0-*-amd64 in apt-cache and none cached"
    fi
    KERNEL_DIR=$cache/kernel/$pkg
    if [ ! -s "$KERNEL_DIR/vmlinuz" ] || [ ! -s "$KERNEL_DIR/modules.order" ]; then
        mkdir -p "$cache/kernel"
        fetch_kernel "$pkg" "$KERNEL_DIR"
        # Older kernels are not used again (qemu has read a running one).
        find "$cache/kernel" -mindepth 1 -maxdepth 1 ! -name "$pkg" -exec rm -rf {} +
    fi
    # The initramfs is rebuilt whenever init, busybox or the modules change.
    hash=$(cat "$here/init" /bin/busybox "$KERNEL_DIR/modules.order" | sha256sum | cut -c1-12)
    INITRAMFS=$cache/initramfs-$pkg-$hash.cpio.gz
    if [ ! -s "$INITRAMFS" ]; then
        echo "vm: building $(basename "$INITRAMFS")" >&2
        rm -f "$cache"/initramfs-*.cpio.gz
        build_initramfs "$KERNEL_DIR" "$INITRAMFS"
    fi
    exec 9>&-
}

# A path the guest can pass on its kernel command line (no spaces, quotes).
check_path() {
    case $1 in
    *[[:space:]\'\"\\]*) die "path '$1' has spaces or quotes; the guest cannot use it" ;;
    esac
}

# boot OUT SECS INTERACTIVE: starts qemu and waits for it, at most SECS plus
# the boot slack; qemu is killed by PID on timeout or when we are signalled.
boot() {
    local out=$1 secs=$2 interactive=$3 limit qpid rc=0 serial
    limit=$((secs + boot_slack))
    local append="console=ttyS0 panic=-1 loglevel=4 flowkv_repo=$repo flowkv_out=$out"
    append="$append flowkv_timeout=$secs flowkv_shell=$interactive"
    # A background job's stdin is /dev/null unless redirected: the
    # interactive shell hands qemu ours through fd 8 (Ctrl-A x quits qemu).
    if [ "$interactive" = 1 ]; then
        serial=(-serial mon:stdio)
        exec 8<&0
    else
        serial=(-serial "file:$out/console.log")
        exec 8</dev/null
    fi
    # TCG, not KVM: KVM hung on these machines (DESIGN.md). -no-reboot turns
    # the guest's poweroff, and any panic (panic=-1), into qemu exiting.
    qemu-system-x86_64 -machine pc,accel=tcg -cpu "$cpu_model" -smp "$cpus" -m "$mem" \
        -nodefaults -no-user-config -display none -no-reboot "${serial[@]}" \
        -kernel "$KERNEL_DIR/vmlinuz" -initrd "$INITRAMFS" -append "$append" \
        -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
        -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
        -fsdev local,id=out,path="$out",security_model=none,multidevs=remap \
        -device virtio-9p-pci,fsdev=out,mount_tag=out \
        -pidfile "$out/qemu.pid" <&8 &
    qpid=$!
    # shellcheck disable=SC2064 # expand qpid now: kill this qemu, no other
    trap "kill -KILL $qpid 2>/dev/null; wait $qpid 2>/dev/null" EXIT
    trap "exit 143" TERM INT HUP
    local waited=0
    while kill -0 "$qpid" 2>/dev/null && [ "$waited" -lt "$limit" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 "$qpid" 2>/dev/null; then
        echo "vm: guest still running after ${limit}s; killing qemu (pid $qpid)" >&2
        kill -KILL "$qpid" 2>/dev/null || true
    fi
    wait "$qpid" || rc=$?
    trap - EXIT TERM INT HUP
    [ "$rc" -eq 0 ] || echo "vm: qemu exited with status $rc" >&2
}

# new_outdir: a fresh directory under the cache; keeps the last 20 runs.
new_outdir() {
    local runs=$cache/runs d
    mkdir -p "$runs"
    ls -1d "$runs"/*/ 2>/dev/null | sort | head -n -19 | while read -r d; do rm -rf "$d"; done
    d=$runs/$(date +%Y%m%d-%H%M%S)-$$
    mkdir -p "$d"
    echo "$d"
}

cmd_run() {
    local secs=480 out="" q=() a started rc
    while [ $# -gt 0 ]; do
        case $1 in
        -t) secs=$2; shift 2 ;;
        -o) out=$2; shift 2 ;;
        --) shift; break ;;
        *) break ;;
        esac
    done
    [ $# -ge 1 ] || die "usage: vm.sh run [-t SECS] [-o DIR] CMD [ARG...]"
    prepare
    if [ -z "$out" ]; then
        out=$(new_outdir)
    else
        mkdir -p "$out"
        out=$(cd "$out" && pwd)
        rm -f "$out"/{rc,output.log,console.log,cmd.sh,qemu.pid}
    fi
    check_path "$repo"
    check_path "$out"
    # A CMD that is a file outside the repo (say in /tmp) is copied into OUT,
    # since the guest sees neither the host's /tmp nor its /run.
    if [ -f "$1" ] && [[ $(realpath "$1") != "$repo"/* ]]; then
        cp "$1" "$out/$(basename "$1")"
        chmod +x "$out/$(basename "$1")"
        set -- "$out/$(basename "$1")" "${@:2}"
    fi
    for a in "$@"; do q+=("$(printf '%q' "$a")"); done
    printf '#!/bin/bash\nexec %s\n' "${q[*]}" >"$out/cmd.sh"
    chmod +x "$out/cmd.sh"
    basename "$KERNEL_DIR" >"$out/kernel"
    started=$(date +%s)
    boot "$out" "$secs" 0
    echo "vm: guest ran $(($(date +%s) - started))s; results in $out" >&2
    [ -f "$out/output.log" ] && cat "$out/output.log"
    if [ ! -s "$out/rc" ]; then
        echo "vm: no result from the guest; last console lines:" >&2
        tail -n 30 "$out/console.log" 2>/dev/null | sed 's/^/vm| /' >&2
        exit 125
    fi
    rc=$(cat "$out/rc")
    exit "$rc"
}

case ${1:-} in
prepare)
    prepare
    echo "kernel: $KERNEL_DIR"
    echo "initramfs: $INITRAMFS"
    ;;
run)
    shift
    cmd_run "$@"
    ;;
shell)
    prepare
    out=$(new_outdir)
    check_path "$repo"
    check_path "$out"
    boot "$out" "${RDMA_VM_SHELL_SECS:-3600}" 1
    ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac

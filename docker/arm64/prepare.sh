#!/usr/bin/env bash
# Prepare an arm64 (aarch64) Debian bookworm userland with Python 3.11 and the FedCure client's
# dependencies, run on this (x86-64) machine under qemu-user emulation, as a chroot:
#
#     sudo docker/arm64/prepare.sh            # prints the root of the tree when ready
#     sudo docker/arm64/run.sh -- python -c 'import platform; print(platform.machine())'
#
# Steps (each under a timeout; a failure stops the script with the reason and the last lines of
# that step's log, kept in the cache folder):
#   1. apt-get install qemu-user-static binfmt-support debootstrap when missing; mount
#      binfmt_misc at /proc/sys/fs/binfmt_misc when it is not, and enable qemu-aarch64;
#   2. debootstrap --foreign --arch=arm64 --variant=minbase bookworm with python3 and
#      python3-venv from the Debian mirror apt uses here, its packages unpacked natively
#      (no maintainer scripts under emulation: see below); the tree is kept as a tarball;
#   3. torch==$TORCH_VERSION for manylinux_2_28_aarch64 (PyPI's CPU build, 146 MB) downloaded
#      natively by this machine's pip (emulated TLS and hashing would take minutes), kept in the
#      cache folder;
#   4. a venv /opt/fedcure inside the tree with that wheel and `pip install ".[client]"` of this
#      checkout (pip runs emulated, from PyPI); pip's cache lives in the cache folder, so a
#      rebuilt tree downloads nothing again.
# A warm run (tree ready, same pyproject.toml and torch) only checks the tree: a few seconds.
#
# Environment: FEDCURE_ARM64_CACHE (default ~/.cache/fedcure/arm64: base tarball, torch wheel,
# pip cache, logs), FEDCURE_ARM64_ROOT (default $FEDCURE_ARM64_CACHE/rootfs), MIRROR (default: apt's
# first Debian mirror, else http://deb.debian.org/debian), TORCH_VERSION (default 2.10.0),
# FORCE=1 (rebuild the tree from the tarball), timeouts in seconds: APT_TIMEOUT (600),
# DEBOOTSTRAP_TIMEOUT (1200), PIP_TIMEOUT (1800), LOCK_TIMEOUT (5400: how long to wait for
# another prepare.sh working on the same cache). Needs root.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${FEDCURE_ARM64_CACHE:-${HOME:-/root}/.cache/fedcure/arm64}
root=${FEDCURE_ARM64_ROOT:-$cache/rootfs}
suite=bookworm
# PyPI's aarch64 torch wheels from 2.11 on are CUDA builds (libtorch_cuda.so, ~420 MB, with
# cuda-toolkit/cuDNN/NCCL wheels as dependencies, GBs); 2.10.0 is the newest CPU-only one and
# lies within the project's torch range
torch_version=${TORCH_VERSION:-2.10.0}
tarball="$cache/base-$suite-arm64.tar"
venv=/opt/fedcure

log() { echo "arm64-prepare: $*" >&2; }
die() { log "error: $*"; exit 1; }

# step NAME TIMEOUT_S CMD...: run CMD with its output in $cache/NAME.log, time it, fail loudly;
# SIGTERM/SIGINT stop the running step too (timeout passes the signal on)
step_pid=""
on_signal() {
    [ -z "$step_pid" ] || kill -TERM "$step_pid" 2>/dev/null || true
    die "stopped by a signal"
}
trap on_signal TERM INT
step() {
    local name=$1 limit=$2 t0 rc
    shift 2
    t0=$(date +%s)
    log "$name (at most ${limit} s; log $cache/$name.log)"
    set +e
    timeout --kill-after=30 "$limit" "$@" >"$cache/$name.log" 2>&1 &
    step_pid=$!
    wait "$step_pid"
    rc=$?
    step_pid=""
    set -e
    if [ "$rc" -ne 0 ]; then
        tail -n 25 "$cache/$name.log" >&2 || true
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            die "$name did not finish within $limit s (raise the timeout, or check the network)"
        fi
        die "$name failed (exit $rc); last lines of $cache/$name.log above"
    fi
    log "$name done in $(( $(date +%s) - t0 )) s"
}

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot, binfmt_misc)"
mkdir -p "$cache/pip" "$cache/wheels"
# one preparation at a time (.ci/run starts one in the background; the test's own call waits
# for it here and then finds the tree warm)
exec 9>"$cache/.lock"
if ! flock -n 9; then
    log "waiting for another prepare.sh (lock $cache/.lock)"
    flock -w "${LOCK_TIMEOUT:-5400}" 9 || die "another prepare.sh held $cache/.lock for" \
        "${LOCK_TIMEOUT:-5400} s"
fi

# 1. emulation
if ! command -v debootstrap >/dev/null || ! [ -x /usr/bin/qemu-aarch64-static ] \
   || ! command -v update-binfmts >/dev/null || ! command -v unshare >/dev/null; then
    command -v apt-get >/dev/null || die "qemu-user-static, binfmt-support and debootstrap are" \
        "missing and there is no apt-get to install them"
    install() {
        local wait=(-o DPkg::Lock::Timeout=300)  # another apt-get may be running
        DEBIAN_FRONTEND=noninteractive apt-get "${wait[@]}" install -y -qq qemu-user-static \
            binfmt-support debootstrap util-linux || { apt-get "${wait[@]}" update -qq \
            && DEBIAN_FRONTEND=noninteractive apt-get "${wait[@]}" install -y -qq \
            qemu-user-static binfmt-support debootstrap util-linux; }
    }
    export -f install
    step apt-install "${APT_TIMEOUT:-600}" bash -c install
fi
if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc \
        || die "cannot mount binfmt_misc at /proc/sys/fs/binfmt_misc (a container without" \
               "CAP_SYS_ADMIN? run it privileged)"
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || update-binfmts --import qemu-aarch64 \
        || die "cannot register qemu-aarch64 with binfmt_misc (update-binfmts failed)"
fi
grep -q '^flags:.*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 \
    || die "qemu-aarch64 is registered without the F (fix binary) flag; a chroot cannot use it"

# 2. the base tree (tarball cached)
if [ ! -s "$tarball" ]; then
    if [ -z "${MIRROR:-}" ]; then
        MIRROR=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
                 | awk '/^URIs:/ {print $2}' | grep -v security | grep -m1 debian || true)
        [ -n "$MIRROR" ] || MIRROR=$(awk '/^deb / && !/security/ {print $2; exit}' \
                 /etc/apt/sources.list 2>/dev/null || true)
        [ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
    fi
    tmp=$(mktemp -d "$cache/debootstrap.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    # debootstrap's first stage only (download and unpack, native): its second stage runs every
    # maintainer script under emulation, which took over 40 min on this 2-core machine under
    # load (update-ca-certificates alone: minutes). The packages are unpacked natively instead
    # and the few files the scripts would make are made here; ldconfig runs emulated.
    step debootstrap "${DEBOOTSTRAP_TIMEOUT:-1200}" debootstrap --foreign --arch=arm64 \
        --variant=minbase --include=python3,python3-venv "$suite" "$tmp" "$MIRROR"
    step unpack-debs 900 sh -c 'for d in "$1"/var/cache/apt/archives/*.deb; do
        dpkg-deb -x "$d" "$1" || exit 1; done' sh "$tmp"
    for f in passwd group; do
        [ -s "$tmp/etc/$f" ] || cp "$tmp/usr/share/base-passwd/$f.master" "$tmp/etc/$f"
    done
    step ldconfig 600 chroot "$tmp" /sbin/ldconfig
    rm -rf "$tmp/debootstrap"
    step pack-base 600 tar -C "$tmp" --numeric-owner \
        --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/lib/apt/lists/*' \
        -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$tmp"
    trap - EXIT
fi

# 3. the tree with the venv
if [ "${FORCE:-0}" = 1 ] || [ ! -e "$root/.fedcure-base" ]; then
    rm -rf "$root" "$root.tmp"
    mkdir -p "$root.tmp"
    step unpack-base 600 tar -C "$root.tmp" --numeric-owner -xf "$tarball"
    touch "$root.tmp/.fedcure-base"
    mv "$root.tmp" "$root"
fi
arch=$(file -b -L "$root/usr/bin/python3") || true
case "$arch" in
    *aarch64*) ;;
    *) die "$root/usr/bin/python3 is not an aarch64 binary: $arch" ;;
esac

# what the venv was built from: pyproject.toml (dependencies) and the torch version
key="torch=$torch_version $(sha256sum "$repo/pyproject.toml" | cut -c1-16)"
stamp="$root$venv/.fedcure-deps"
if [ "$(cat "$stamp" 2>/dev/null || true)" = "$key" ]; then
    log "ready (warm): $root ($key)"
    echo "$root"
    exit 0
fi
run=("$here/run.sh" --root "$root" --bind "$cache/pip=/var/cache/fedcure-pip"
     --bind "$cache/wheels=/var/cache/fedcure-wheels" --)
# pip install --no-compile: byte-compiling torch's
# thousands of modules under emulation costs minutes; Python compiles what it imports
pipenv=(env PIP_CACHE_DIR=/var/cache/fedcure-pip PIP_CERT=/etc/ssl/certs/ca-certificates.crt
        PIP_DEFAULT_TIMEOUT=120 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off)
if [ ! -x "$root$venv/bin/python" ]; then
    step venv 600 "${run[@]}" /usr/bin/python3 -m venv "$venv"
fi
# pip builds the project in its source folder: build from a copy, not from the checkout
src="$root/tmp/fedcure-src"
rm -rf "$src"
mkdir -p "$src"
tar -C "$repo" --exclude='__pycache__' --exclude='*.egg-info' \
    -cf - pyproject.toml README.md fedcure_app client edge_server cloud_server | tar -C "$src" -xf -
wheel=$(ls "$cache/wheels"/torch-"$torch_version"-cp311-cp311-manylinux_*_aarch64.whl \
        2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
    step torch-wheel "${PIP_TIMEOUT:-1800}" env -u PIP_FIND_LINKS python3 -m pip download \
        --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 --python-version 3.11 \
        --implementation cp --abi cp311 -d "$cache/wheels" "torch==$torch_version"
    wheel=$(ls "$cache/wheels"/torch-"$torch_version"-cp311-cp311-manylinux_*_aarch64.whl \
            2>/dev/null | head -n 1 || true)
    [ -n "$wheel" ] || die "pip download left no torch $torch_version aarch64 wheel in" \
        "$cache/wheels (see $cache/torch-wheel.log)"
fi
step pip-torch "${PIP_TIMEOUT:-1800}" "${run[@]}" "${pipenv[@]}" "$venv/bin/pip" install --no-compile \
    "/var/cache/fedcure-wheels/$(basename "$wheel")"
step pip-client "${PIP_TIMEOUT:-1800}" "${run[@]}" "${pipenv[@]}" "$venv/bin/pip" install --no-compile \
    "/tmp/fedcure-src[client]" "torch==$torch_version"
rm -rf "$src"
step check 600 "${run[@]}" "$venv/bin/python" -c \
    'import platform, sys, torch, flwr, fedcure_app; assert platform.machine() == "aarch64"; print(sys.version, torch.__version__)'
echo "$key" >"$stamp"
log "ready: $root ($key)"
echo "$root"

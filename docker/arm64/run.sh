#!/usr/bin/env bash
# Run a command inside the arm64 tree made by docker/arm64/prepare.sh (qemu-user emulation):
#
#     sudo docker/arm64/run.sh [--root DIR] [--bind SRC[=DST]]... -- CMD [ARG...]
#
# The command runs chrooted in a private mount namespace (`unshare --mount`), so the mounts it
# needs vanish with it and concurrent runs do not interfere: /proc, /dev, /sys, this checkout
# (read-only, at its own path, so the caller's paths stay valid), the host's CA bundle (pip
# reaches PyPI through the same trust store as the host), resolv.conf and hosts, and every
# --bind (a folder, read-write; at the same path unless =DST is given). The process keeps its
# PID through unshare, sh and chroot (each execs the next), so the caller can stop it by PID.
# The environment is the caller's, less PIP_*/VIRTUAL_ENV/PYTHONHOME, with PATH led by the
# venv's bin (/opt/fedcure/bin), HOME=/root and PYTHONDONTWRITEBYTECODE=1 (the checkout is
# shared with native processes). Root: $FEDCURE_ARM64_ROOT, else
# ~/.cache/fedcure/arm64/rootfs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
root=${FEDCURE_ARM64_ROOT:-${FEDCURE_ARM64_CACHE:-${HOME:-/root}/.cache/fedcure/arm64}/rootfs}
binds=()
while [ $# -gt 0 ]; do
    case "$1" in
        --root) root=$2; shift 2 ;;
        --bind) binds+=("$2"); shift 2 ;;
        --) shift; break ;;
        *) echo "run.sh: unknown option $1 (usage: run.sh [--root DIR] [--bind SRC[=DST]]... --" \
                "CMD...)" >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "run.sh: no command (usage: run.sh [--root DIR] -- CMD...)" >&2; exit 2; }
[ -e "$root/.fedcure-base" ] || { echo "run.sh: no arm64 tree at $root (run" \
    "docker/arm64/prepare.sh first)" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "run.sh: needs root (chroot)" >&2; exit 1; }

# the mount script, run by sh inside the new mount namespace; binds as SRC=DST lines
spec="$repo=$repo"
for b in "${binds[@]+"${binds[@]}"}"; do
    case "$b" in *=*) spec="$spec
$b" ;; *) spec="$spec
$b=$b" ;; esac
done
export FEDCURE_ARM64_MOUNTS="$spec" FEDCURE_ARM64_TREE="$root" FEDCURE_ARM64_REPO="$repo"
exec unshare --mount --propagation private -- /bin/sh -euc '
r=$FEDCURE_ARM64_TREE
mount -t proc proc "$r/proc"
mount --rbind /dev "$r/dev"
mount --rbind /sys "$r/sys"
for f in /etc/resolv.conf /etc/hosts /etc/ssl/certs/ca-certificates.crt; do
    [ -e "$f" ] || continue
    mkdir -p "$r$(dirname "$f")"
    if [ -L "$r$f" ] || [ ! -e "$r$f" ]; then rm -f "$r$f"; : >"$r$f"; fi
    mount --bind "$f" "$r$f"
done
echo "$FEDCURE_ARM64_MOUNTS" | while IFS= read -r line; do
    [ -n "$line" ] || continue
    src=${line%%=*}; dst=${line#*=}
    mkdir -p "$src" "$r$dst"
    mount --bind "$src" "$r$dst"
    if [ "$src" = "$FEDCURE_ARM64_REPO" ]; then mount -o remount,bind,ro "$r$dst"; fi
done
for v in $(env | sed -n "s/^\(PIP_[A-Za-z0-9_]*\)=.*/\1/p"); do unset "$v"; done
unset VIRTUAL_ENV PYTHONHOME FEDCURE_ARM64_MOUNTS FEDCURE_ARM64_TREE FEDCURE_ARM64_REPO
export PATH=/opt/fedcure/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root PYTHONDONTWRITEBYTECODE=1
exec chroot "$r" "$@"
' run.sh "$@"

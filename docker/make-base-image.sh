#!/bin/sh
# Build a Debian bookworm base image without any image registry: debootstrap (minbase) piped
# into `docker import`. For machines that reach an apt mirror but not Docker Hub; everyone
# else uses the default BASE_IMAGE (python:3.11-slim). Python comes later, from the
# Dockerfile (docker/install-python.sh).
#
#     sudo docker/make-base-image.sh [TAG]        # default TAG: fedcure-base:bookworm
#     BASE_IMAGE=fedcure-base:bookworm docker compose -f docker/compose.yaml build
#
# Environment: MIRROR (default: the first Debian mirror apt uses here, else
# http://deb.debian.org/debian), SUITE (default bookworm), FEDCURE_BASE_CACHE (a folder that
# keeps the root filesystem tarball, so a wiped Docker store re-imports without debootstrap;
# default ~/.cache/fedcure). Needs root, debootstrap and a running Docker daemon.
# Does nothing when TAG already exists (FORCE=1 rebuilds).
set -eu
tag=${1:-fedcure-base:bookworm}
suite=${SUITE:-bookworm}
cache=${FEDCURE_BASE_CACHE:-${HOME:-/root}/.cache/fedcure}
tarball="$cache/base-$suite-$(uname -m).tar"

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "make-base-image: $tag exists"
    exit 0
fi
if [ ! -s "$tarball" ] || [ "${FORCE:-0}" = 1 ]; then
    command -v debootstrap >/dev/null 2>&1 || {
        echo "make-base-image: debootstrap is not installed (apt-get install debootstrap)" >&2
        exit 1
    }
    if [ -z "${MIRROR:-}" ]; then
        MIRROR=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
                 | awk '/^URIs:/ {print $2}' | grep -v security | grep -m1 debian || true)
        [ -n "$MIRROR" ] || MIRROR=$(awk '/^deb / && !/security/ {print $2; exit}' \
                 /etc/apt/sources.list 2>/dev/null || true)
        [ -n "$MIRROR" ] || MIRROR=http://deb.debian.org/debian
    fi
    root=$(mktemp -d /tmp/fedcure-rootfs.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    echo "make-base-image: debootstrap --variant=minbase $suite from $MIRROR"
    debootstrap --variant=minbase "$suite" "$root" "$MIRROR" >"$root.log" 2>&1 || {
        echo "make-base-image: debootstrap failed; last lines of $root.log:" >&2
        tail -n 20 "$root.log" >&2
        exit 1
    }
    rm -f "$root.log"
    mkdir -p "$cache"
    # no downloaded .debs or package lists in the image (the Dockerfile runs apt-get update)
    tar -C "$root" --numeric-owner \
        --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/lib/apt/lists/*' \
        -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
fi
docker import "$tarball" "$tag" >/dev/null
echo "make-base-image: imported $tag ($(docker image inspect -f '{{.Size}}' "$tag") bytes)"

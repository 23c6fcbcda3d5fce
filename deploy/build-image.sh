#!/usr/bin/env bash
# Builds the samsa container image without a container registry:
#   1. the base image samsa-base:bookworm, if the Docker engine lacks it, from
#      Debian packages (debootstrap --variant=minbase with libssl3; needs
#      root and a reachable Debian mirror, not a registry);
#   2. the image from deploy/Dockerfile with that base and the release binary
#      target/release/samsa, which must already be built (cargo build
#      --release -p samsa): the Dockerfile copies it (without debug info),
#      it compiles nothing.
# With a registry, build deploy/Dockerfile directly (docs/DEPLOY.md).
#
# Usage: deploy/build-image.sh [TAG]     (default samsa:latest)
#        deploy/build-image.sh --base-only   (step 1 alone: it needs no binary,
#                                            so it can run while cargo builds)
# Environment: SAMSA_BASE_IMAGE (default samsa-base:bookworm),
#              DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
base_only=false
if [[ ${1:-} == --base-only ]]; then
    base_only=true
    shift
fi
tag=${1:-samsa:latest}
base=${SAMSA_BASE_IMAGE:-samsa-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
binary="${CARGO_TARGET_DIR:-$repo/target}/release/samsa"

if ! $base_only && [[ ! -x "$binary" ]]; then
    echo "error: $binary is missing: run cargo build --release -p samsa first" >&2
    exit 1
fi

# What the base must hold beyond minbase: libssl3, which the binary links
# (librdkafka's TLS, for the CLI tools). A base without the label is older
# than that and is built again.
packages=libssl3
have=$(docker image inspect "$base" --format '{{index .Config.Labels "samsa.base.packages"}}' 2>/dev/null || true)
if [[ $have != "$packages" ]]; then
    if ! command -v debootstrap >/dev/null; then
        echo "error: debootstrap is needed to build $base (apt-get install debootstrap)" >&2
        exit 1
    fi
    rootfs=$(mktemp -d /tmp/samsa-base.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    echo "building $base from $mirror (debootstrap, a few minutes)" >&2
    debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$mirror" >&2
    # Package caches and lists, documentation and translations are of no use
    # in the image (debian:bookworm-slim drops the same).
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
        "$rootfs"/usr/share/locale/*
    tar -C "$rootfs" -c . | docker import --change "LABEL samsa.base.packages=$packages" - "$base" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
fi

if $base_only; then
    echo "base image $base is there"
    exit 0
fi

# The build context holds only what the Dockerfile copies, not the whole
# repository with its multi-gigabyte target directory.
context=$(mktemp -d /tmp/samsa-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/target/release" "$context/deploy"
# The release profile keeps line tables for backtraces (about 100 MB of the
# binary's 127 MB); the image carries the symbols but not the line tables.
if command -v objcopy >/dev/null; then
    objcopy --strip-debug "$binary" "$context/target/release/samsa"
else
    cp "$binary" "$context/target/release/samsa"
fi
cp "$repo/deploy/samsa.toml" "$context/deploy/samsa.toml"
docker build --build-arg "BASE=$base" -f "$repo/deploy/Dockerfile" -t "$tag" "$context" >&2
docker image inspect "$tag" --format '{{.Size}}' | awk -v t="$tag" '{ printf "built %s (%.1f MB)\n", t, $1 / 1e6 }'

#!/usr/bin/env bash
# The release image's base, made here from Debian packages when no container registry is
# reachable (no python:3.11-slim to pull): debootstrap a minimal bookworm (its Python is 3.11)
# with python3, python3-venv, python3-pip and ca-certificates from the Debian mirror apt is
# configured with, bring it up to date from bookworm-updates and bookworm-security, and
# `podman import` it as a local image. BentoML's Dockerfile (bentofile `docker.base_image`)
# then builds on it exactly as on python:3.11-slim: it pip-installs uv, makes /app/.venv and
# installs the bento's packages.
#
#   bash bentos/base_image.sh [IMAGE]          # make base-image; IMAGE: localhost/graphsage-base:bookworm
#   FORCE=1 bash bentos/base_image.sh          # rebuild even when IMAGE exists
#   MIRROR=http://host/debian bash bentos/base_image.sh
#
# Needs root, debootstrap and podman (apt-get install debootstrap podman). Prints the time it took
# and the image's size. Nothing of this machine goes into the image: the proxy CA the build
# needs to reach the package index is mounted during the build only (bentos/image.py).
set -euo pipefail

IMAGE=${1:-${BASE_IMAGE:-localhost/graphsage-base:bookworm}}
SUITE=bookworm
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$ROOT/build/base-rootfs}

if [ "$(id -u)" != 0 ]; then echo "base_image.sh: debootstrap needs root" >&2; exit 1; fi
for bin in debootstrap podman; do
  command -v "$bin" >/dev/null || { echo "base_image.sh: $bin not installed (apt-get install $bin)" >&2; exit 1; }
done
if [ -z "${FORCE:-}" ] && podman image exists "$IMAGE"; then
  echo "base image $IMAGE exists ($(podman image inspect --format '{{.Size}}' "$IMAGE" | numfmt --to=si)B); FORCE=1 rebuilds"
  exit 0
fi

# The Debian mirror apt uses here (deb822 sources first, then sources.list).
if [ -z "${MIRROR:-}" ]; then
  MIRROR=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$MIRROR" ] || MIRROR=$(awk '$1 == "deb" && $3 == "'$SUITE'" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$MIRROR" ] || { echo "base_image.sh: no Debian mirror in this machine's apt sources; set MIRROR=URL" >&2; exit 1; }
fi
SECURITY=${SECURITY_MIRROR:-${MIRROR%/debian}/debian-security}

old_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
start=$(date +%s)
rm -rf "$WORK"
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
rootfs=$WORK/rootfs
echo "debootstrap $SUITE from $MIRROR -> $rootfs"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  "$SUITE" "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
  || { tail -30 "$WORK/debootstrap.log" >&2; exit 1; }
echo "debootstrap: $(($(date +%s) - start)) s"

# Security and point-release updates (debootstrap installs the suite as released).
cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY $SUITE-security main
EOF
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
  sh -c 'apt-get update -qq && apt-get upgrade -y -qq --no-install-recommends' >"$WORK/upgrade.log" 2>&1 \
  || { tail -30 "$WORK/upgrade.log" >&2; exit 1; }
echo "updates: $(grep -c '^Unpacking' "$WORK/upgrade.log" || true) packages, $(($(date +%s) - start)) s"

# As python:3.11-slim: pip may install into the system Python (BentoML's Dockerfile installs uv
# with it), no package caches, no docs; resolv.conf comes from the runtime.
rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/var/log/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
  "$rootfs"/usr/share/locale/* "$rootfs"/tmp/*
: >"$rootfs/etc/resolv.conf"

# uv (BentoML's installer) verifies TLS with its own roots; SSL_CERT_FILE points it (and Python's
# ssl) at the system bundle, which a build mounts over with the machine's (bentos/image.py).
tar -C "$rootfs" --numeric-owner -c . | podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  --change 'CMD ["python3"]' \
  --message "debootstrap --variant=minbase $SUITE ($MIRROR) + python3 python3-venv python3-pip ca-certificates" \
  - "$IMAGE" >/dev/null 2>"$WORK/import.log" || { cat "$WORK/import.log" >&2; exit 1; }
end=$(date +%s)
# The image this one replaces, unless images built on it still hold it.
if [ -n "$old_id" ] && [ "$old_id" != "$(podman image inspect --format '{{.Id}}' "$IMAGE")" ]; then
  podman rmi "$old_id" >/dev/null 2>&1 || true
fi
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
python=$(podman run --rm --runtime runc --network host --ulimit nofile=1024:1024 --ulimit nproc=1000:1000 \
  "$IMAGE" python3 --version 2>&1 || echo "python3: not runnable here")
echo "base image $IMAGE: $((end - start)) s, $(numfmt --to=si "$size")B ($size bytes), $python"

#!/usr/bin/env bash
# The size of the default (scratch) image, without a Docker daemon: builds the binary as the
# Dockerfile does, lays out the same root filesystem (this machine's Debian CA bundle stands in
# for the build stage's) and prints the layer's size as a tar and gzipped, which is what a
# registry stores and a node pulls. Usage: scripts/image-size.sh [extra go build flags]
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/tmp" "$root/home/ferry/.ferry"
CGO_ENABLED=0 go build -tags grpcnotrace -trimpath -ldflags "-s -w" "$@" -o "$root/usr/local/bin/ferry" ./cmd/ferry
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
echo 'ferry:x:10001:10001:ferry:/home/ferry:/sbin/nologin' >"$root/etc/passwd"
echo 'ferry:x:10001:' >"$root/etc/group"
tar -C "$root" --owner=0 --group=0 --numeric-owner -cf "$work/layer.tar" .
gzip -6 -c "$work/layer.tar" >"$work/layer.tar.gz"
bin=$(stat -c %s "$root/usr/local/bin/ferry")
printf 'binary      %6.1f MB\nimage (tar) %6.1f MB\nimage (gz)  %6.1f MB  (what a registry stores and a node pulls)\n' \
  "$(echo "$bin/1000000" | bc -l)" "$(echo "$(stat -c %s "$work/layer.tar")/1000000" | bc -l)" \
  "$(echo "$(stat -c %s "$work/layer.tar.gz")/1000000" | bc -l)"

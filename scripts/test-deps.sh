#!/usr/bin/env bash
# Installs the Debian packages the test suite's programs need and the machine lacks: curl, which
# a cloud VM's boot script uses to read its instance metadata (the fake clouds' VMs run those
# scripts on this machine), and python3, which SkyPilot's http examples run
# (e2e/compat_test.go). Idempotent; needs root (or sudo) only when something is missing.
set -euo pipefail
need=()
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v python3 >/dev/null 2>&1 || need+=(python3)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "test deps: need root to install ${need[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi
echo "test deps: installing ${need[*]} from Debian" >&2
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"

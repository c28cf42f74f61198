#!/usr/bin/env bash
# Installs what the bench drivers need and the machine lacks: nginx (the reference peer of
# bench/proxyload) and util-linux's taskset (CPU pinning), both from Debian. Idempotent and
# non-interactive: it does nothing when both are present. Needs root (or sudo) to install.
#
#   scripts/bench-deps.sh          install what is missing
#   scripts/bench-deps.sh --check  only report; exit 1 if something is missing
set -euo pipefail

check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "unknown argument: $1 (want --check or nothing)" >&2; exit 2 ;;
esac

# nginx lives in /usr/sbin, which a non-root PATH may lack.
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }

need=()
have nginx || need+=(nginx)
have taskset || need+=(util-linux)

if [ ${#need[@]} -eq 0 ]; then
  echo "bench deps present: nginx $( (nginx -v 2>&1 || /usr/sbin/nginx -v 2>&1) | sed 's/.*nginx\///'), taskset"
  exit 0
fi
if [ "$check_only" = 1 ]; then
  echo "missing Debian packages: ${need[*]} (run scripts/bench-deps.sh)" >&2
  exit 1
fi

SUDO=()
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "need root to install ${need[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi

# Keep the package's init scripts from starting a system-wide nginx on port 80: the drivers
# start their own, pinned, on loopback ports.
own_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee /usr/sbin/policy-rc.d >/dev/null
  "${SUDO[@]}" chmod +x /usr/sbin/policy-rc.d
  own_policy=1
fi
cleanup() { if [ "$own_policy" = 1 ]; then "${SUDO[@]}" rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT

echo "installing: ${need[*]}"
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"

have nginx && have taskset || { echo "install finished but nginx or taskset is still missing" >&2; exit 1; }
echo "bench deps installed"

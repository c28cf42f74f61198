#!/usr/bin/env bash
# A bounded fuzz run of every fuzz target in the module, one after another: FUZZTIME each
# (default 4s; the whole run about a minute). `go test` already runs each target's committed seed
# corpus (testdata/fuzz/FuzzX) as a plain test; this also mutates them. A crash fails the run, and
# go saves the input that caused it under the package's testdata/fuzz/FuzzX/, to commit with the
# fix. scripts/test.sh (make test) runs it last.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME="${FUZZTIME:-4s}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

n=0
start=$SECONDS
for file in $(find . -name '*_test.go' -not -path './.cache/*' -not -path './.git/*' | sort); do
  for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
    dir="./$(dirname "${file#./}")"
    printf '%-24s %-28s' "$dir" "$target"
    t0=$SECONDS
    if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$dir" >"$log" 2>&1; then
      echo " FAILED"
      cat "$log"
      exit 1
    fi
    echo " ok ($((SECONDS - t0))s)"
    n=$((n + 1))
  done
done
[ "$n" -gt 0 ] || { echo "no fuzz targets found"; exit 1; }
echo "$n fuzz targets, ${FUZZTIME} each, $((SECONDS - start))s"

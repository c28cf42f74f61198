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

# fuzz_once runs one target for FUZZTIME into $log.
fuzz_once() {
  go test -run '^$' -fuzz "^${2}\$" -fuzztime "$FUZZTIME" "$1" >"$log" 2>&1
}

# deadline_flake reports whether a failed run in $log is Go 1.26's fuzzing-coordinator race
# (go.dev/issue/75804, fixed in Go 1.27): at the -fuzztime boundary a worker that is still busy
# (a loaded machine) surfaces as a bare "context deadline exceeded", with no failing input
# written and nothing that panicked or failed in the target.
deadline_flake() {
  grep -q 'context deadline exceeded' "$log" &&
    ! grep -qE 'Failing input written|panic:|_test\.go:[0-9]+:' "$log"
}

n=0
start=$SECONDS
for file in $(find . -name '*_test.go' -not -path './.cache/*' -not -path './.git/*' | sort); do
  for target in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file"); do
    dir="./$(dirname "${file#./}")"
    printf '%-24s %-28s' "$dir" "$target"
    t0=$SECONDS
    if ! fuzz_once "$dir" "$target"; then
      # A real finding fails again (go replays the input it wrote); the race does not.
      if ! deadline_flake || ! { printf ' (deadline race, again)'; fuzz_once "$dir" "$target"; }; then
        echo " FAILED"
        cat "$log"
        exit 1
      fi
    fi
    echo " ok ($((SECONDS - t0))s)"
    n=$((n + 1))
  done
done
[ "$n" -gt 0 ] || { echo "no fuzz targets found"; exit 1; }
echo "$n fuzz targets, ${FUZZTIME} each, $((SECONDS - start))s"

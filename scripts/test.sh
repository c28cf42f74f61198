#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls `make test`, which calls this).
# Tools it needs are installed into .cache/bin from the Go module proxy on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION=v0.8.2
TOOLS="$PWD/.cache/bin"
mkdir -p "$TOOLS"

step() { printf '\n==> %s\n' "$*"; }

step "go mod download"
go mod download

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

step "go vet"
go vet ./...

step "staticcheck $STATICCHECK_VERSION"
if [ ! -x "$TOOLS/staticcheck" ] || ! "$TOOLS/staticcheck" -version | grep -q "(${STATICCHECK_VERSION#v})"; then
  GOBIN="$TOOLS" go install "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
fi
"$TOOLS/staticcheck" ./...

[ "${1:-}" = lint ] && exit 0

step "test cluster binaries (scripts/testcluster/build.sh; first time ~8 min, then cached)"
scripts/testcluster/build.sh

step "helm for the chart's test (scripts/helm.sh; first time a few minutes, then cached)"
scripts/helm.sh >/dev/null

step "Debian packages the tests' programs use (scripts/test-deps.sh)"
scripts/test-deps.sh

step "go test -race"
# -parallel 4, not GOMAXPROCS (2 here): e2e's parallel tests mostly wait on processes and polls
# (./e2e/ took 526 s at 2, 425-428 s at 4 on the 2-core machine, 681 s before it ran tests in parallel).
go test -race -count=1 -parallel 4 -timeout 30m ./...

step "hot-path guards: the proxy's CPU per request against a pass-through's, and with a managed key against a service's own key, without the race detector"
go test -count=1 -run 'TestHotPathWithinBudget|TestTenancyWithinBudget' ./proxy/

step "go test -fuzz (scripts/fuzz.sh)"
scripts/fuzz.sh

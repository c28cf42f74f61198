#!/usr/bin/env bash
# Prints the path of helm $HELM_VERSION, first installing it into .cache/bin from the Go module
# proxy (like staticcheck in scripts/test.sh) when it is missing or another version. The chart's
# test (charts/ferry) runs this, so `make test` needs nothing installed by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
HELM_VERSION=v3.22.0
TOOLS="$PWD/.cache/bin"
if [ ! -x "$TOOLS/helm" ] || ! go version -m "$TOOLS/helm" 2>/dev/null | grep -q "^[[:space:]]mod[[:space:]]helm.sh/helm/v3[[:space:]]$HELM_VERSION[[:space:]]"; then
  mkdir -p "$TOOLS"
  echo "helm: installing $HELM_VERSION into $TOOLS (go install, a few minutes the first time)" >&2
  GOBIN="$TOOLS" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
echo "$TOOLS/helm"

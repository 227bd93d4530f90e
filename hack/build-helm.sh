#!/usr/bin/env bash
# Builds the helm CLI from the Go module proxy into bin/ (no prebuilt binaries can be downloaded here).
# It lives in a throwaway module under bin/.build so helm's Kubernetes dependencies never meet the
# project's go.mod. Skipped when bin/helm is already at the wanted version (a stamp file records that).
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BIN:-$ROOT/bin}"
WORK="${WORK_DIR:-$BIN/.build}/helm"

if [[ -x "$BIN/helm" && "$(cat "$BIN/.helm.version" 2>/dev/null)" == "$HELM_VERSION" ]]; then
  echo "bin/helm $HELM_VERSION already built"
  exit 0
fi
mkdir -p "$WORK"
echo "building helm $HELM_VERSION from the module proxy (cold: a few minutes)"
cd "$WORK"
[[ -f go.mod ]] || go mod init gpusharing.io/throwaway/helm >/dev/null 2>&1
GOFLAGS=-mod=mod go get "helm.sh/helm/v3@$HELM_VERSION" >/dev/null 2>&1
# helm reads its own version from these variables; without them `helm version` says v3.x-dirty-unknown.
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
  -o "$BIN/helm" helm.sh/helm/v3/cmd/helm
echo "$HELM_VERSION" >"$BIN/.helm.version"

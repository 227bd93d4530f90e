#!/usr/bin/env bash
# Builds golangci-lint from the Go module proxy into bin/ (no prebuilt binaries can be downloaded here).
# `go install pkg@version` builds in module mode outside this project, so the linter's dependencies never
# enter the project's go.mod. Skipped when bin/ already holds the wanted version (a stamp file records it).
set -euo pipefail

GOLANGCI_LINT_VERSION="${GOLANGCI_LINT_VERSION:-v2.15.0}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BIN:-$ROOT/bin}"
mkdir -p "$BIN"

if [[ -x "$BIN/golangci-lint" && "$(cat "$BIN/.golangci-lint.version" 2>/dev/null)" == "$GOLANGCI_LINT_VERSION" ]]; then
  exit 0
fi
echo "building golangci-lint $GOLANGCI_LINT_VERSION from the module proxy (cold: a few minutes)"
GOBIN="$BIN" GOFLAGS=-mod=mod go install \
  -ldflags "-s -w -X main.version=${GOLANGCI_LINT_VERSION#v}" \
  "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
echo "$GOLANGCI_LINT_VERSION" >"$BIN/.golangci-lint.version"

#!/usr/bin/env bash
# Fails when `make manifests generate` changes any file: generated CRDs, RBAC, deepcopy and the reference
# under docs/reference must be committed as the generators write them. It compares checksums rather than asking git, so it also works on a tree
# with uncommitted edits (it then checks that those edits were regenerated).
set -euo pipefail
cd "$(dirname "$0")/.."
paths=(api config/crd config/rbac charts/gpusharing/files docs/reference)
snapshot() { local p; for p in "${paths[@]}"; do if [[ -e "$p" ]]; then find "$p" -type f; fi; done | LC_ALL=C sort | xargs -r sha256sum; }
before="$(snapshot)"
make --no-print-directory manifests generate >/dev/null
after="$(snapshot)"
if [[ "$before" != "$after" ]]; then
  echo "generated files were stale; 'make manifests generate' changed:" >&2
  diff <(echo "$before") <(echo "$after") | sed -n 's/^> [0-9a-f]*  /  /p' >&2
  exit 1
fi
echo "generated files are up to date"

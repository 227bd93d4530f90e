#!/usr/bin/env bash
# vulncheck.sh: govulncheck over every package, against the Go vulnerability database as of
# golang.org/x/vulndb $VULNDB_VERSION, with nothing but the Go module proxy: the database is that
# module's data/osv, indexed by hack/vulndb into the layout -db file:// reads; govulncheck is
# golang.org/x/vuln's, built at $GOVULNCHECK_VERSION. hack/vulnreport judges its findings: a vulnerability
# the code calls fails the check unless hack/vulncheck-accepted.txt accepts it (with a date and a reason).
# Raise VULNDB_VERSION to check against a newer snapshot.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${BIN:-$ROOT/bin}"
: "${VULNDB_VERSION:?}" "${GOVULNCHECK_VERSION:?}"
cd "$ROOT"

govulncheck="$BIN/govulncheck-$GOVULNCHECK_VERSION"
if [[ ! -x "$govulncheck" ]]; then
  tmp="$(mktemp -d)"
  GOBIN="$tmp" go install "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION"
  mkdir -p "$BIN"; mv "$tmp/govulncheck" "$govulncheck"; rm -rf "$tmp"
fi

db="$BIN/vulndb/$VULNDB_VERSION"
if [[ ! -f "$db/index/db.json" ]]; then
  info="$(go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION")"
  dir="$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")"
  # The snapshot's commit time, from the module's .info file: {"Version":"...","Time":"..."}.
  stamp="$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$(sed -n 's/^\t"Info": "\(.*\)",$/\1/p' <<<"$info")")"
  [[ -d "$dir/data/osv" ]] || { echo "golang.org/x/vulndb@$VULNDB_VERSION has no data/osv" >&2; exit 1; }
  rm -rf "$db.tmp"
  go run ./hack/vulndb -osv "$dir/data/osv" -out "$db.tmp" -modified "$stamp"
  rm -rf "$db"; mv "$db.tmp" "$db"
fi
findings="$(mktemp)"; trap 'rm -f "$findings"' EXIT
"$govulncheck" -db "file://$db" -format json ./... >"$findings"
go run ./hack/vulnreport -accepted hack/vulncheck-accepted.txt <"$findings"

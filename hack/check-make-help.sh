#!/usr/bin/env bash
# Checks that `make help` lists every target of a Makefile: each rule with a literal name has a `## text`
# help line, and help prints it under its `##@` section. Given a Makefile path it checks that file
# (hack/check-make-help_test.sh plants faults in copies); with none, the repository's. Exits 1 on a fault.
set -euo pipefail
cd "$(dirname "$0")/.."
mk=${1:-Makefile}

# Targets: rule lines whose name is literal (not $(VAR), not .PHONY or another special target), not
# variable assignments (:= ?= +=).
mapfile -t targets < <(grep -E '^[A-Za-z0-9][A-Za-z0-9_.-]*( [A-Za-z0-9][A-Za-z0-9_.-]*)*:([^=]|$)' "$mk" |
    sed -E 's/:.*//' | tr ' ' '\n' | sort -u)
[ "${#targets[@]}" -gt 0 ] || { echo "$mk: no targets found"; exit 1; }

out=$(make --no-print-directory -f "$mk" help)
status=0
for t in "${targets[@]}"; do
    if ! grep -qE "^$t:.*## " "$mk"; then
        echo "$mk: target $t has no help line (\"$t: ... ## what it does\")"
        status=1
    elif ! grep -qE "^  $t +[^ ]" <<<"$out"; then
        echo "$mk: make help does not list $t"
        status=1
    fi
done
while IFS= read -r section; do
    if ! grep -qxF "$section" <<<"$out"; then
        echo "$mk: make help does not print the section \"$section\""
        status=1
    fi
done < <(sed -n 's/^##@ //p' "$mk")
exit "$status"

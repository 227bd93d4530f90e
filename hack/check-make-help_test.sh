#!/usr/bin/env bash
# Tests hack/check-make-help.sh on planted Makefiles: one whose every target has a help line passes; a
# target without one, a target help cannot see (a name with a digit, once missed) and a section help does
# not print each fail with their message.
set -euo pipefail
cd "$(dirname "$0")/.."
check=hack/check-make-help.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

# clean writes a small Makefile with the repository's help rule.
clean() {
    grep -A1 -E '^help:' Makefile
    cat <<'MK'

##@ Build
.PHONY: build
build: ## Build it
	true
e2e: build ## The end-to-end test
	true
$(CURDIR)/tool: ## A file rule, not a target to list
	true
MK
}

# want NAME MESSAGE-OR-EMPTY: runs the check on $tmp/NAME.mk; an empty message means it must pass.
want() {
    local name=$1 msg=$2 out rc=0
    out=$("$check" "$tmp/$name.mk" 2>&1) || rc=$?
    if [ -z "$msg" ]; then
        if [ "$rc" -ne 0 ]; then echo "FAIL $name: want pass, got rc=$rc: $out"; failed=1; else echo "ok   $name passes"; fi
    elif [ "$rc" -eq 0 ]; then
        echo "FAIL $name: want \"$msg\", got a pass"; failed=1
    elif ! grep -qF -- "$msg" <<<"$out"; then
        echo "FAIL $name: want \"$msg\", got: $out"; failed=1
    else
        echo "ok   $name fails: $(head -1 <<<"$out" | sed "s|$tmp/||")"
    fi
}

clean >"$tmp/clean.mk"
want clean ""

{ clean; printf 'undocumented:\n\ttrue\n'; } >"$tmp/nohelp.mk"
want nohelp "target undocumented has no help line"

# The same Makefile with the help rule that matched names of letters, hyphens and underscores only.
sed -E 's|^\t@awk .*|\t@grep -hE '"'"'^[a-zA-Z_-]+:.*?## '"'"' $(MAKEFILE_LIST) \| awk '"'"'BEGIN {FS = ":.*?## "}; {printf "  %-18s %s\\n", $$1, $$2}'"'"'|' \
    "$tmp/clean.mk" >"$tmp/hidden.mk"
want hidden "make help does not list e2e"
want hidden "make help does not print the section \"Build\""

exit "$failed"

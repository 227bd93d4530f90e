#!/usr/bin/env bash
# Tests hack/check-docs.sh on planted files: a clean reference doc passes; a journal paragraph, a dated run
# stack, a heading with a date, a result without its command and a broken link each fail with their message.
set -euo pipefail
cd "$(dirname "$0")/.."
check=hack/check-docs.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

clean() {
    cat <<'DOC'
# The part

What it is. The agent reads NVML; a flag is used to pick the interval.

## Results
2026-11-27, NVIDIA H100 80GB HBM3, driver 580, `make bench-shim`:

| measured | result |
| --- | --- |
| launch | 3.5 us |
| hand-off | 1.07x |

### Swap rate
| direction | GB/s |
| --- | --- |
| out | 55 GB/s |

## Costs
Each figure comes from `test/gpu/oversub/run.sh`: 36 us per 2 MiB.
DOC
}

# want NAME MESSAGE-OR-EMPTY: runs the check on $tmp/NAME.md; an empty message means it must pass.
want() {
    local name=$1 msg=$2 out rc=0
    out=$("$check" "$tmp/$name.md" 2>&1) || rc=$?
    if [ -z "$msg" ]; then
        if [ "$rc" -ne 0 ]; then echo "FAIL $name: want pass, got rc=$rc: $out"; failed=1; else echo "ok   $name passes"; fi
    elif [ "$rc" -eq 0 ]; then
        echo "FAIL $name: want a fault ($msg), the check passed"; failed=1
    elif ! grep -qF -- "$msg" <<<"$out"; then
        echo "FAIL $name: want \"$msg\", got: $out"; failed=1
    else
        echo "ok   $name fails: $(head -1 <<<"$out" | sed "s|$tmp/||")"
    fi
}

clean >"$tmp/clean.md"
want clean ""

{ clean; printf '\n## Notes\nThis round the scheduler used to hand off late; the earlier build fixed it.\n'; } >"$tmp/journal.md"
want journal 'speaks of how the project was built'

{ clean; printf '\n## How it came about\nThe first version was written with an AI assistant.\n'; } >"$tmp/author.md"
want author 'speaks of how the project was built'

{ clean; printf '\n## More results\nA launch costs 4.7 us and a swap 90 us per GiB, 2.1x the copy.\n'; } >"$tmp/nocommand.md"
want nocommand 'measured figure in a results section with no command'

{ clean | sed 's/^| hand-off | 1.07x |$/&\n\n2026-11-26, the same machine: 1.10x./'; } >"$tmp/stack.md"
want stack 'second dated results paragraph'

{ clean; printf '\n## Results of 2026-11-24\nSee above.\n'; } >"$tmp/datedheading.md"
want datedheading 'heading with a date'

{ clean; printf '\nSee [the shim](no-such-file.md).\n'; } >"$tmp/link.md"
want link 'no such file'

# "agent" is a product component, and a word inside a code span is code, not prose.
{ clean; printf '\nThe agent wrote the status; `--session` is a flag.\n'; } >"$tmp/component.md"
want component ""

exit "$failed"

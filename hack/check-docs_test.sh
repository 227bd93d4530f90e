#!/usr/bin/env bash
# Tests hack/check-docs.sh on planted files: a clean reference doc passes; a journal paragraph, a limit of
# the means that reached a GPU host, a dated run stack, a heading with a date, a result without its command,
# a broken link and a link to a missing heading (in the same file or another) each fail with their message.
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

# plant NAME MESSAGE TEXT: the clean doc with TEXT appended, checked by want.
plant() {
    { clean; printf '\n%s\n' "$3"; } >"$tmp/$1.md"
    want "$1" "$2"
}

clean >"$tmp/clean.md"
want clean ""

built='speaks of how the project was built'
plant journal "$built" $'## Notes\nThis round the scheduler used to hand off late; the earlier build fixed it.'
plant author "$built" $'## How it came about\nWe wrote the first version in a week.'
plant writing "$built" $'## Checks\nMutation checks done while writing them: each test failed.'
plant thatday "$built" $'## Older runs\nThey ran on the shim as it was that day.'
plant devicetime "$built" $'## Not yet\nLonger phases cost device time the runs did not have.'
plant percommand "$built" $'## Running it\nThe GPU host allows 10 minutes per command; the output folder is kept between calls.'
plant nocommand 'measured figure in a results section with no command' \
    $'## More results\nA launch costs 4.7 us and a swap 90 us per GiB, 2.1x the copy.'
plant datedheading 'heading with a date' $'## Results of 2026-11-24\nSee above.'
plant link 'no such file' 'See [the shim](no-such-file.md).'
plant anchor 'no such heading' 'See [the swap rate](#swap-rates), a heading this doc does not have.'
# A link to a heading of another file among those checked resolves against that file's headings.
{ clean; printf '\nSee [its costs](clean.md#costs) and [its results](clean.md#no-results).\n'; } >"$tmp/crossanchor.md"
out=$("$check" "$tmp/clean.md" "$tmp/crossanchor.md" 2>&1) && rc=0 || rc=$?
if [ "$rc" -ne 0 ] && grep -qF 'clean.md#no-results: no such heading' <<<"$out" && ! grep -qF 'clean.md#costs' <<<"$out"; then
    echo "ok   crossanchor fails on the missing heading only"
else
    echo "FAIL crossanchor: want one fault for clean.md#no-results, got rc=$rc: $out"; failed=1
fi
# "agent" is a product component, and a word inside a code span is code, not prose.
plant component "" 'The agent wrote the status; `--session` is a flag.'

# A second dated run inside the results section.
clean | sed 's/^| hand-off | 1.07x |$/&\n\n2026-11-26, the same machine: 1.10x./' >"$tmp/stack.md"
want stack 'second dated results paragraph'

exit "$failed"

#!/usr/bin/env bash
# Checks every tracked Markdown file: relative links and their #anchors resolve, and every table row has
# as many cells as its header. Links to other sites are not fetched. Run from anywhere; exits 1 on a fault.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t files < <(git ls-files '*.md')
[ "${#files[@]}" -gt 0 ] || exit 0

awk '
# slug turns a heading into the anchor GitHub gives it: lower case, punctuation dropped, spaces to hyphens.
function slug(h) {
    h = tolower(h)
    gsub(/[^a-z0-9 _-]/, "", h)
    gsub(/ /, "-", h)
    return h
}
# cells counts the cells of a table row, ignoring pipes inside code spans and escaped pipes.
function cells(row,    r) {
    r = row
    gsub(/`[^`]*`/, "", r)
    gsub(/\\\|/, "", r)
    sub(/^[ \t]*\|/, "", r)
    sub(/\|[ \t]*$/, "", r)
    return gsub(/\|/, "|", r) + 1
}
FNR == 1 { infence = 0; intable = 0 }
/^[ \t]*```/ { infence = !infence; intable = 0; next }
infence { next }
/^#+ / {
    h = $0; sub(/^#+ +/, "", h); sub(/ +#* *$/, "", h)
    s = slug(h); n = ++seen[FILENAME, s]
    anchors[FILENAME, (n > 1 ? s "-" (n - 1) : s)] = 1
}
/^[ \t]*\|/ {
    if (!intable) { intable = 1; want = cells($0); hdr = FNR }
    else if (cells($0) != want) {
        printf "%s:%d: table row has %d cells, its header (line %d) %d\n", FILENAME, FNR, cells($0), hdr, want
        bad = 1
    }
    next
}
{ intable = 0 }
{
    line = $0
    gsub(/`[^`]*`/, "", line)
    while (match(line, /\]\([^) ]+\)/)) {
        t = substr(line, RSTART + 2, RLENGTH - 3)
        line = substr(line, RSTART + RLENGTH)
        if (t ~ /^[a-z]+:/) continue
        links[++nl] = FILENAME "\t" FNR "\t" t
    }
}
END {
    for (i = 1; i <= nl; i++) {
        split(links[i], f, "\t"); src = f[1]; ln = f[2]; t = f[3]
        anchor = ""
        if (index(t, "#")) { anchor = substr(t, index(t, "#") + 1); t = substr(t, 1, index(t, "#") - 1) }
        dir = src; if (!sub(/\/[^\/]*$/, "", dir)) dir = "."
        path = (t == "" ? src : dir "/" t)
        if (t != "" && system("test -e \"" path "\"") != 0) {
            printf "%s:%s: link to %s: no such file\n", src, ln, t; bad = 1; continue
        }
        if (anchor != "" && path ~ /\.md$/) {
            # normalise a/b/../c to what FILENAME holds
            while (sub(/[^\/]+\/\.\.\//, "", path)) {}
            sub(/^\.\//, "", path); gsub(/\/\.\//, "/", path)
            if (!((path, anchor) in anchors)) {
                printf "%s:%s: link to %s#%s: no such heading\n", src, ln, t, anchor; bad = 1
            }
        }
    }
    exit bad
}
' "${files[@]}"

#!/usr/bin/env bash
# Checks the Markdown files: relative links and their #anchors resolve, and every table row has as many
# cells as its header. The reference docs (README.md and docs/*.md) are also held to reference form:
#   - no dated run stacks: no heading with a date, no second results paragraph that opens with a date in
#     one section (a re-measurement replaces the figures; older runs live in git);
#   - no words about how the project was built or the limits of what reached a machine for it
#     (BUILD_WORDS below), outside code;
#   - no measured figure (x, %, ms, us, GB/s, MiB, GiB) in a results section without a command in that
#     section or in the results heading's own text (`make ...`, a script path, a code span with a command).
# Links to other sites are not fetched. With no argument it checks every tracked Markdown file; given files,
# it checks those (anchors only into files among them) and holds all of them to reference form
# (hack/check-docs_test.sh does that). Exits 1 on a fault.
set -euo pipefail
cd "$(dirname "$0")/.."

# Reference docs that get the link and table checks only (a doc being rewritten, named here with the
# reason while it is); none now.
REFERENCE_EXEMPT=()

# Words and phrases about how the project was built, or about the limits of the means that reached a GPU
# host for it (a machine is described by its hardware and driver), matched case-insensitively as whole
# words outside code spans and fences.
BUILD_WORDS='this round|last round|this work|earlier build|previous build|used to|lab journal|predates|'\
'before the fix|since the fix|older trees?|earlier runs?|(i|we) (built|wrote|added|fixed|measured|decided)|'\
'while writing (it|them)|as it was that day|not re-measured since|'\
'device time|minutes (a|per) command|per-command limit|kept between (calls|commands)'

if [ "$#" -gt 0 ]; then
    files=("$@")
    reference=("$@")
else
    mapfile -t files < <(git ls-files '*.md')
    [ "${#files[@]}" -gt 0 ] || exit 0
    reference=()
    for f in "${files[@]}"; do
        case "$f" in README.md | docs/*.md) ;; *) continue ;; esac
        for e in "${REFERENCE_EXEMPT[@]}"; do [ "$f" = "$e" ] && continue 2; done
        reference+=("$f")
    done
fi

status=0
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
FNR == 1 { infence = 0; intable = 0; read[FILENAME] = 1 }
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
            # Headings are known only of the files read: given files, anchors into others are not checked.
            if (!(path in read)) continue
            if (!((path, anchor) in anchors)) {
                printf "%s:%s: link to %s#%s: no such heading\n", src, ln, t, anchor; bad = 1
            }
        }
    }
    exit bad
}
' "${files[@]}" || status=1

[ "${#reference[@]}" -gt 0 ] || exit "$status"
awk -v words="$BUILD_WORDS" '
BEGIN { wordre = "(^|[^a-z0-9_])(" words ")([^a-z0-9_]|$)" }
function fault(msg) { printf "%s:%d: %s\n", FILENAME, FNR, msg; bad = 1 }
function iscommand(l,    c, spans) {
    if (l ~ /(^|[^a-z0-9_-])make [a-z$-]/) return 1
    if (l ~ /[A-Za-z0-9_.\/-]+\/[A-Za-z0-9_.-]+\.(sh|py)([^a-z]|$)/) return 1
    spans = l
    while (match(spans, /`[^`]+`/)) {
        c = substr(spans, RSTART + 1, RLENGTH - 2); spans = substr(spans, RSTART + RLENGTH)
        if (c ~ /^([A-Z_]+=[^ ]* )*(make|go (test|run)|bash|sh|python3?|kubectl|helm|\.\/|hack\/|test\/|shim\/|bin\/|nvidia-smi)/) return 1
    }
    return 0
}
# closeleaf reports the first measured figure of a results section that has no command near it.
function closeleaf(    i, inherited) {
    inherited = 0
    for (i = 1; i < level; i++) if (owncmd[i]) inherited = 1
    if (isresults && figline && !cmd && !inherited)
        printf "%s:%d: measured figure in a results section with no command near it (make ..., a script path, a command in a code span)\n", FILENAME, figline
    if (isresults && figline && !cmd && !inherited) bad = 1
}
FNR == 1 {
    if (NR > 1) closeleaf()
    infence = 0; level = 0; split("", owncmd); split("", resultsat); isresults = 0
    cmd = 0; figline = 0; dated = 0; prevblank = 1
}
/^[ \t]*```/ { infence = !infence; next }
infence { if (iscommand($0)) { cmd = 1; owncmd[level] = 1 }; next }
/^#+ / {
    closeleaf()
    h = $0; match(h, /^#+/); level = RLENGTH; sub(/^#+ +/, "", h)
    for (i = level; i <= 9; i++) { owncmd[i] = 0; resultsat[i] = 0 }
    resultsat[level] = (tolower(h) ~ /result|measur|benchmark/)
    isresults = 0
    for (i = 1; i <= level; i++) if (resultsat[i]) isresults = 1
    if (h ~ /(19|20)[0-9][0-9]-[01][0-9]-[0-3][0-9]/ || tolower(h) ~ /(january|february|march|april|may|june|july|august|september|october|november|december) (19|20)[0-9][0-9]/)
        fault("heading with a date: put the date in the results table and keep one current run (older runs live in git)")
    cmd = 0; figline = 0; dated = 0; prevblank = 1
    next
}
{
    line = $0
    if (iscommand(line)) { cmd = 1; owncmd[level] = 1 }
    gsub(/`[^`]*`/, "", line)
    gsub(/\]\([^)]*\)/, "]", line)
    if (match(tolower(line), wordre)) {
        w = substr(line, RSTART, RLENGTH); gsub(/^[^A-Za-z]+|[^A-Za-z]+$/, "", w)
        if (!(tolower(w) == "used to" && tolower(line) ~ /(is|are|be|been|being) used to/))
            fault("\"" w "\" speaks of how the project was built: describe the product as it is")
    }
    if (prevblank && line ~ /^[ \t*_>-]*(19|20)[0-9][0-9]-[01][0-9]-[0-3][0-9]/) {
        if (++dated == 2) fault("second dated results paragraph in one section: keep the current run, older runs live in git")
    }
    if (isresults && !figline && line ~ /[0-9](\.[0-9]+)?[ \t]*(x|×|%|ms|us|µs|GB\/s|MiB|GiB)([^A-Za-z0-9]|$)/) figline = FNR
    prevblank = ($0 ~ /^[ \t]*$/)
}
END { closeleaf(); exit bad }
' "${reference[@]}" || status=1
exit "$status"

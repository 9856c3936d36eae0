#!/bin/sh
# skip_summary.sh JUNIT.xml - after a ctest run (--output-junit), say which
# entries were Skipped and why: the first "skipped: ..." line each printed
# (the convention of tests/CMakeLists.txt). CTest's own summary names them
# but shows no output for them. Prints nothing when none skipped; always
# exits 0 (the verdict is ctest's).
f=${1:-}
[ -n "$f" ] && [ -r "$f" ] || exit 0
awk '
function unxml(s) {
    gsub(/&quot;/, "\"", s); gsub(/&apos;/, "\047", s); gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s)
    gsub(/&amp;/, "\\&", s)
    return s
}
/<testcase / {
    name = $0; sub(/.*<testcase name="/, "", name); sub(/".*/, "", name)
    skipped = ($0 ~ /status="notrun"/); why = ""; inside = 1; next
}
inside && why == "" && /skipped:/ { why = $0; sub(/.*<system-out>/, "", why); sub(/^.*skipped: */, "", why) }
inside && /<\/testcase>/ {
    inside = 0
    if (skipped) { n++; line[n] = sprintf("  %-28s %s", name, why == "" ? "(no reason printed)" : unxml(why)) }
}
END {
    if (n) {
        printf "ctest: %d skipped:\n", n
        for (i = 1; i <= n; i++) print line[i]
    }
}' "$f"
exit 0

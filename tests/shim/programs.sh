#!/bin/sh
# programs.sh SHIM WORKDIR - real programs from Debian run under
# LD_PRELOAD=SHIM (libllmem-malloc.so), each output compared with the same
# program's output without the shim; each run must also have used the
# shim (its figures, written at exit through LLMEM_MALLOC_STATS, show
# allocations from the pool). The short form of bench/programs.sh, for
# make check: a few seconds in all.
#
# Programs: ls (recursive, of the checkout's src/ and include/ and of
# /etc/ssl), sort (two threads, on 100k generated lines), python3 (a
# threaded program that forks, plus json/re/dict work), sqlite3 (a
# generated workload). A program that is not installed is reported and,
# if nothing failed, the test exits 77 (skipped) naming it.
set -u
shim=${1:?usage: programs.sh SHIM WORKDIR}
work=${2:?usage: programs.sh SHIM WORKDIR}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" || exit 1
[ -f "$shim" ] || { echo "no shim at $shim"; exit 1; }

failed=0
missing=""
py=/usr/bin/python3

# run NAME CMD...: stdin from $work/NAME.in if present.
run() {
    name=$1
    shift
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "SKIP $name: $1 is not installed"
        missing="$missing $1"
        return 0
    fi
    input=/dev/null
    [ -f "$work/$name.in" ] && input=$work/$name.in
    "$@" <"$input" >"$work/$name.glibc" 2>"$work/$name.glibc.err"
    rc_ref=$?
    stats=$work/$name.stats
    : >"$stats"
    LD_PRELOAD=$shim LLMEM_MALLOC_STATS=$stats "$@" <"$input" >"$work/$name.shim" 2>"$work/$name.shim.err"
    rc=$?
    if [ $rc -ne $rc_ref ]; then
        echo "FAIL $name: exit status $rc under the shim, $rc_ref without"
        sed -n '1,20p' "$work/$name.shim.err"
        failed=1
    elif ! cmp -s "$work/$name.glibc" "$work/$name.shim"; then
        echo "FAIL $name: output differs under the shim"
        diff "$work/$name.glibc" "$work/$name.shim" | sed -n '1,20p'
        failed=1
    elif ! grep -q "pool on allocs_total=[1-9]" "$stats"; then
        echo "FAIL $name: the shim was not used (no allocations in its figures)"
        cat "$stats"
        failed=1
    else
        procs=$(grep -c "pool on" "$stats")
        allocs=$(sed -n 's/.*pool on allocs_total=\([0-9]*\).*/\1/p' "$stats" | awk '{s+=$1} END {print s}')
        echo "ok   $name: same output ($(wc -c <"$work/$name.shim") bytes), $allocs allocations from the pool in $procs process(es)"
    fi
}

run ls ls -laR "$here/../../src" "$here/../../include" /etc/ssl

awk 'BEGIN { x = 12345; for (i = 0; i < 100000; i++) { x = (x * 1103515245 + 12345) % 2147483648; printf "%d %s line-%d\n", x % 1000, substr("abcdefghijklmnopqrstuvwxyz", x % 26 + 1, 5), i } }' >"$work/sort.in"
run sort sort --parallel=2 -S 4M -k2,2 -k1,1n -k3

cp "$here/shim_workload.py" "$work/" 2>/dev/null
run python3 "$py" "$here/shim_workload.py"

cat >"$work/sqlite3.in" <<'EOF'
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 30000)
INSERT INTO t SELECT i, (i * 7919) % 1000, printf('value-%08d-%s', i, hex(randomblob(0) || i)) FROM c;
CREATE INDEX t_k ON t(k);
SELECT count(*), sum(k), max(length(v)) FROM t;
SELECT k, count(*), group_concat(id % 10, '') FROM t WHERE k < 5 GROUP BY k ORDER BY k;
UPDATE t SET v = v || v WHERE k % 3 = 0;
DELETE FROM t WHERE k % 5 = 1;
SELECT count(*), sum(length(v)) FROM t;
SELECT a.k, count(*) FROM t a JOIN t b ON a.k = b.k AND a.id < b.id WHERE a.k < 3 GROUP BY a.k;
EOF
run sqlite3 sqlite3 ":memory:"

if [ $failed -ne 0 ]; then exit 1; fi
if [ -n "$missing" ]; then
    echo "skipped: not installed:$missing (scripts/deps.sh test installs them)"
    exit 77
fi
exit 0

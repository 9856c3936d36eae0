#!/bin/sh
# cli_expect.sh [OPTIONS] -- COMMAND [ARG]... - run a command-line test and
# judge it on its exit status AND its output (CTest's PASS_REGULAR_EXPRESSION
# ignores the exit status, and WILL_FAIL passes on any failure, a crash or a
# sanitizer report included; this does neither).
#
#   --status N      the exit status wanted (default 0); a death by signal
#                   never matches, whatever N is
#   --expect RE     the output (stdout and stderr together, as one string:
#                   `.` matches newlines, ^ is its start) must match the
#                   extended regular expression RE (grep -E); repeatable
#   --reject RE     the output must not match RE; repeatable. Sanitizer
#                   reports (AddressSanitizer, LeakSanitizer, UBSan's
#                   "runtime error:", ThreadSanitizer) are always rejected
#   --needs REL     skip (exit 77, "skipped: ... is absent") unless REL is
#                   readable in the shared folder; repeatable
#   --if-shared REL OPT  append "OPT SHARED/REL" to the command when REL is
#                   in the shared folder (optional data), nothing otherwise
#   --shared-default DIR  the shared folder when LLMEM_SHARED_DIR is unset
#
# An argument @SHARED@ (or one containing it) in COMMAND gets the shared
# folder put in its place. The shared folder is $LLMEM_SHARED_DIR, else the
# --shared-default (tests/CMakeLists.txt passes the checkout's ../shared):
# the convention of tests/test_util.h. Exit 0 pass, 1 fail, 77 skipped.
set -u

want_status=0
shared_default=../shared
needs=""
if_rel=""
if_opt=""
nexp=0
nrej=0
while [ $# -gt 0 ]; do
    case "$1" in
        --status) want_status=$2; shift 2 ;;
        --expect) nexp=$((nexp + 1)); eval "exp_$nexp=\$2"; shift 2 ;;
        --reject) nrej=$((nrej + 1)); eval "rej_$nrej=\$2"; shift 2 ;;
        --needs) needs="$needs
$2"; shift 2 ;;
        --if-shared) if_rel=$2; if_opt=$3; shift 3 ;;
        --shared-default) shared_default=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "cli_expect: unknown option $1" >&2; exit 1 ;;
    esac
done
[ $# -gt 0 ] || { echo "cli_expect: no command" >&2; exit 1; }
shared=${LLMEM_SHARED_DIR:-$shared_default}

old_ifs=$IFS
IFS='
'
for rel in $needs; do
    if [ ! -r "$shared/$rel" ]; then
        echo "skipped: $shared/$rel is absent (the shared data folder: set LLMEM_SHARED_DIR, or put shared/ beside the checkout)"
        exit 77
    fi
done
IFS=$old_ifs

# The command with @SHARED@ replaced, rebuilt as the positional parameters.
n=$#
i=0
while [ $i -lt $n ]; do
    a=$1
    shift
    case "$a" in
        *@SHARED@*) a=$(printf '%s' "$a" | sed "s|@SHARED@|$shared|g") ;;
    esac
    set -- "$@" "$a"
    i=$((i + 1))
done
if [ -n "$if_rel" ] && [ -r "$shared/$if_rel" ]; then
    set -- "$@" "$if_opt" "$shared/$if_rel"
fi

out=$(mktemp "${TMPDIR:-/tmp}/cli_expect.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
rc=$?
cat "$out"

fail() {
    echo "cli_expect: FAIL: $*" >&2
    exit 1
}
if [ $rc -gt 128 ]; then
    fail "killed by signal $((rc - 128)) (exit $rc), wanted exit $want_status"
fi
[ "$rc" = "$want_status" ] || fail "exit status $rc, wanted $want_status"
for pat in 'ERROR: AddressSanitizer' 'ERROR: LeakSanitizer' 'runtime error:' 'WARNING: ThreadSanitizer'; do
    if grep -Fq "$pat" "$out"; then fail "a sanitizer report ($pat)"; fi
done
k=1
while [ $k -le $nexp ]; do
    eval "pat=\$exp_$k"
    grep -Ezq -- "$pat" "$out" || fail "the output does not match: $pat"
    k=$((k + 1))
done
k=1
while [ $k -le $nrej ]; do
    eval "pat=\$rej_$k"
    if grep -Ezq -- "$pat" "$out"; then fail "the output matches what it must not: $pat"; fi
    k=$((k + 1))
done
exit 0

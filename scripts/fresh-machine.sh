#!/bin/sh
# fresh-machine.sh [options] - the README's two commands as a new user runs
# them: on a throwaway Debian 12 root made with Debian's own debootstrap, in
# a plain `git clone` of this branch with nothing beside it (no ../shared),
# run `make demo`, then `make check`; then (--with-shared) bind the shared
# folder in as ../shared and run `make check` again, where nothing may skip
# but the GPU tests.
#
#   sudo scripts/fresh-machine.sh [--with-shared] [--keep] [--ref REF]
#        [--shared DIR] [--work DIR] [--base-tar FILE] [--save-base FILE]
#
#   --with-shared   also run make check with DIR (default ../shared) beside the clone
#   --ref REF       the branch or commit to clone (default: the current branch)
#   --work DIR      where the root and the logs go (default /work/fresh-machine;
#                   it needs about 6 GB); the root is deleted at the end
#   --keep          keep the root (to look around: chroot DIR/root)
#   --base-tar F    start from a tarball of a bare root saved by --save-base
#                   (skips debootstrap; the root is still bare: minbase + make)
#   --save-base F   after debootstrap, save the bare root as F for later runs
#   --base-only     stop after making (and saving) the bare root
#
# The only thing installed by hand in the root is `make` (a bare Debian has
# none; the README says to install it); everything else is what `make demo`
# and `make check` install themselves through scripts/deps.sh. The mirror is
# the one this machine's apt uses (/etc/apt/sources.list{,.d}), else
# deb.debian.org; MIRROR=URL overrides it. Logs: WORK/demo.log, check.log,
# check-shared.log; a summary (times, ctest's skipped list) on stdout and
# in WORK/summary.txt. Exit status 0 only when every step passed.
#
# Runs as root (debootstrap, chroot, mount). The root shares this kernel,
# so the tests see the same page sizes, huge pages and limits as here.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
with_shared=0
keep=0
ref=""
shared_dir="$here/../shared"
work=/work/fresh-machine
base_tar=""
save_base=""
base_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --with-shared) with_shared=1 ;;
        --keep) keep=1 ;;
        --ref) ref=$2; shift ;;
        --shared) shared_dir=$2; shift ;;
        --work) work=$2; shift ;;
        --base-tar) base_tar=$2; shift ;;
        --save-base) save_base=$2; shift ;;
        --base-only) base_only=1 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "fresh-machine: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ "$(id -u)" -ne 0 ]; then
    echo "fresh-machine: run as root (debootstrap, mount and chroot need it)" >&2
    exit 2
fi
[ -n "$ref" ] || ref=$(git -C "$here" rev-parse --abbrev-ref HEAD)
if [ "$ref" = HEAD ]; then ref=$(git -C "$here" rev-parse HEAD); fi
if [ -n "$(git -C "$here" status --porcelain --untracked-files=no)" ]; then
    echo "fresh-machine: note: uncommitted changes in $here are not in the clone (it takes $ref)"
fi

# The mirror this machine's apt uses for bookworm (deb822 .sources or
# one-line .list), the security archive excluded.
find_mirror() {
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '/^URIs:/{u=$2} /^Suites:/{ if ($0 ~ /bookworm( |$)/ && u !~ /security/) { print u; exit } }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk '$1=="deb" && $3=="bookworm" && $2 !~ /security/ { print $2; exit }' "$f"
    done
}
mirror=${MIRROR:-$(find_mirror | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null 2>&1 && [ -z "$base_tar" ]; then
    echo "fresh-machine: installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
        || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
fi

root=$work/root
mkdir -p "$work"
summary=$work/summary.txt
: >"$summary"
say() { echo "fresh-machine: $*"; echo "$*" >>"$summary"; }

mounts="src/shared dev/shm dev/pts dev sys proc"
umount_all() {
    for m in $mounts; do
        if mountpoint -q "$root/$m" 2>/dev/null; then umount -l "$root/$m" || true; fi
    done
}
# Never delete through a mount: /dev, /proc or the shared folder would go
# with the root. rm stays on the root's file system, and only runs when
# nothing is mounted under it any more.
remove_root() {
    umount_all
    for m in $mounts; do
        if mountpoint -q "$root/$m" 2>/dev/null; then
            echo "fresh-machine: $root/$m is still mounted: not deleting $root" >&2
            return 1
        fi
    done
    if grep -q " $root/" /proc/self/mounts; then
        echo "fresh-machine: something is still mounted under $root: not deleting it" >&2
        return 1
    fi
    rm -rf --one-file-system "$root"
}
cleanup() {
    if [ "$keep" -eq 0 ] && [ -d "$root" ]; then remove_root || true; else umount_all; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -e "$root" ]; then
    remove_root || exit 1
fi
mkdir -p "$root"
t0=$(date +%s)
if [ -n "$base_tar" ]; then
    tar -C "$root" -xf "$base_tar"
    say "root: from $base_tar"
else
    echo "fresh-machine: debootstrap bookworm from $mirror (log: $work/debootstrap.log)"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log"; echo "fresh-machine: debootstrap failed" >&2; exit 1; }
    # The same archives as a Debian 12 install: the release and its updates.
    cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
EOF
    say "root: debootstrap --variant=minbase bookworm $mirror"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# The network's own trust, not a package: where this machine reaches the
# npm registry through a TLS-inspecting proxy, its npm trusts that proxy's
# CA through a cafile (npm config get cafile). The root gets a copy, given
# to Node.js as extra CAs, so npm there meets the same network as here (a
# user's machine on an open network needs none). Without it the oracle and
# OpenAI-client tests skip in the root, visibly, as "registry absent".
node_ca=""
host_cafile=$(npm config get cafile 2>/dev/null || true)
if [ -n "$host_cafile" ] && [ "$host_cafile" != null ] && [ -f "$host_cafile" ]; then
    cp "$host_cafile" "$root/etc/host-npm-ca.crt"
    node_ca="NODE_EXTRA_CA_CERTS=/etc/host-npm-ca.crt"
fi

mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mount -t tmpfs -o mode=1777 shm "$root/dev/shm"

in_root() {
    chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 $node_ca \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin /bin/sh -c "$1"
}

if [ -z "$base_tar" ]; then
    echo "fresh-machine: apt-get install make (the one package the README asks for by hand)"
    in_root 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make' \
        >"$work/make-install.log" 2>&1 || { tail -20 "$work/make-install.log"; exit 1; }
    in_root 'apt-get clean'
    if [ -n "$save_base" ]; then
        umount_all
        tar --one-file-system -C "$root" -cf "$save_base" .
        say "bare root saved as $save_base"
        mount -t proc proc "$root/proc"
        mount -t sysfs sys "$root/sys"
        mount --bind /dev "$root/dev"
        mount --bind /dev/pts "$root/dev/pts"
        mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
    fi
fi
say "root ready in $(( $(date +%s) - t0 )) s"
[ "$base_only" -eq 0 ] || exit 0

# A plain clone of the branch (through a file:// URL, so a real copy of the
# objects, not hard links), at /src/llmem: /src/shared does not exist.
mkdir -p "$root/src"
git clone -q --no-hardlinks "file://$here" "$root/src/llmem"
git -C "$root/src/llmem" checkout -q "$ref"
say "clone: $(git -C "$root/src/llmem" log -1 --format='%h %s')"
[ ! -e "$root/src/shared" ] || { echo "fresh-machine: $root/src/shared exists" >&2; exit 1; }

status=0
step() { # step NAME LOG COMMAND
    name=$1 log=$2 cmd=$3
    echo "fresh-machine: $name (log: $log)"
    s=$(date +%s)
    if in_root "cd /src/llmem && $cmd" >"$log" 2>&1; then rc=0; else rc=$?; fi
    secs=$(( $(date +%s) - s ))
    if [ "$rc" -eq 0 ]; then
        say "$name: passed in $secs s"
    else
        say "$name: FAILED (exit $rc) after $secs s; the end of $log:"
        tail -40 "$log"
        status=1
    fi
    # ctest's totals and wall times, failures, and tests/skip_summary.sh's
    # list of what was skipped and why.
    awk '/^[0-9]+% tests passed|^Total Test time|\*\*\*Failed|\*\*\*Timeout|Not Run/ { print "    " $0; next }
         /^ctest: [0-9]+ skipped:/ { print "    " $0; in_skip = 1; next }
         in_skip && /^  / { print "    " $0; next }
         { in_skip = 0 }' "$log" >>"$summary"
    return $rc
}

step "make demo (no ../shared)" "$work/demo.log" "make demo" || true
grep -q "Timeline: " "$work/demo.log" || { say "make demo printed no timeline line"; status=1; }
step "make check (no ../shared)" "$work/check.log" "make check" || true

if [ "$with_shared" -eq 1 ]; then
    if [ -d "$shared_dir/models" ]; then
        mkdir -p "$root/src/shared"
        mount --bind "$shared_dir" "$root/src/shared"
        mount -o remount,bind,ro "$root/src/shared"
        step "make check (with ../shared)" "$work/check-shared.log" "make check" || true
        umount "$root/src/shared"
    else
        say "--with-shared: $shared_dir/models is absent; not run"
        status=1
    fi
fi

echo "---- summary ($summary)"
cat "$summary"
exit $status

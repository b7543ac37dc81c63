#!/usr/bin/env bash
# tools/package-test.sh: build the Debian package from a copy of this tree, lint it, install it, run and mount from the installed files, purge it.
# Run as root (CI: tools/quickstart.sh test). The build happens in a temporary directory, so that the .deb and
# dpkg-buildpackage's other outputs (written to the parent of the source tree) stay out of the clone.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
ver=$(sed -n "s/^\s*version : '\([^']*\)'.*/\1/p" meson.build | head -1)
arch=$(dpkg --print-architecture)
work="" installed=0

pkg_cleanup() {
	set +e
	[ "$installed" = 1 ] && dpkg --purge nvcachefs >/dev/null
	[ -n "$work" ] && rm -rf "$work"
}
trap pkg_cleanup EXIT

fail() {
	echo "package-test: $*" >&2
	exit 1
}

if dpkg-query -W -f='${Status}' nvcachefs 2>/dev/null | grep -q installed; then
	fail "a package nvcachefs is installed already; remove it first (this test installs its own, then removes it)"
fi
[ "$(dpkg-parsechangelog -S Version | sed 's/-[^-]*$//')" = "$ver" ] ||
	fail "debian/changelog's version is not meson.build's $ver"

echo "== build: dpkg-buildpackage -b -us -uc (in a copy of the tree)"
work=$(mktemp -d /tmp/nvc-pkg-XXXXXX)
mkdir "$work/nvcachefs"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	git ls-files -z --cached --others --exclude-standard | tar -c --null -T - | tar -x -C "$work/nvcachefs"
else
	tar -c --exclude='./build*' --exclude='./obj-*' --exclude=./results . | tar -x -C "$work/nvcachefs"
fi
if ! (cd "$work/nvcachefs" && dpkg-buildpackage -b -us -uc) >"$work/build.log" 2>&1; then
	tail -n 40 "$work/build.log" >&2
	fail "dpkg-buildpackage failed"
fi
deb=$work/nvcachefs_${ver}-1_${arch}.deb
[ -f "$deb" ] || fail "no $deb; built: $(ls "$work")"
dpkg -c "$deb"

echo "== lintian -I (errors fail)"
lrc=0
lintian -I --fail-on error "$deb" >"$work/lintian.log" 2>&1 || lrc=$?
grep -v 'running with root privileges' "$work/lintian.log" || true
[ "$lrc" = 0 ] || fail "lintian reports errors (exit status $lrc)"

echo "== install: dpkg -i"
installed=1
dpkg -i "$deb" >/dev/null
for f in /usr/bin/nvcachefs /usr/bin/nvcachectl /usr/share/man/man8/nvcachefs.8.gz \
	/usr/share/man/man8/nvcachectl.8.gz /usr/share/man/man5/nvcachefs.conf.5.gz \
	/usr/share/bash-completion/completions/nvcachectl /usr/share/doc/nvcachefs/examples/nvcachefs.conf \
	/lib/systemd/system/nvcachefs@.service /usr/bin/nvcachefs-plot-stats \
	/usr/share/man/man1/nvcachefs-plot-stats.1.gz \
	/usr/share/nvcachefs/grafana/nvcachefs.json; do
	[ -f "$f" ] || fail "$f not installed"
done
/usr/bin/nvcachefs --version
/usr/bin/nvcachefs --version | grep -q "^nvcachefs $ver " || fail "nvcachefs --version does not say $ver"
[ "$(/usr/bin/nvcachectl --version)" = "nvcachectl $ver" ] || fail "nvcachectl --version does not say $ver"
for p in /usr/share/man/man8/nvcachefs.8.gz /usr/share/man/man8/nvcachectl.8.gz /usr/share/man/man5/nvcachefs.conf.5.gz \
	/usr/share/man/man1/nvcachefs-plot-stats.1.gz; do
	[ -z "$(zcat "$p" | groff -ww -z -man 2>&1)" ] || fail "$p: groff warns"
done
bash -c '. /usr/share/bash-completion/completions/nvcachectl && complete -p nvcachectl' >/dev/null ||
	fail "the installed completion does not register"

echo "== mount from the installed files: format, mount, write, read back, flush, unmount"
# shellcheck source=tools/lib.sh
. tools/lib.sh
nvc_setup 256M
trap 'nvc_cleanup; pkg_cleanup' EXIT
/usr/bin/nvcachectl format -c "$conf"
/usr/bin/nvcachefs -c "$conf" "$mnt"
grep -q " $mnt fuse.nvcachefs " /proc/mounts || fail "$mnt is not an nvcachefs mount"
head -c 64M /dev/urandom >"$dir/ref"
dd if="$dir/ref" of="$mnt/data" bs=1M status=none conv=fsync
cmp "$dir/ref" "$mnt/data" || fail "read back differs"
/usr/bin/nvcachectl stats "$mnt" >/dev/null
/usr/bin/nvcachectl flush "$mnt"
cmp "$dir/ref" "$dir/backing/data" || fail "the backing store differs after flush"
fusermount3 -u "$mnt"
for _ in $(seq 300); do pgrep -f "nvcachefs -c $dir/" >/dev/null || break; sleep 0.1; done
pgrep -f "nvcachefs -c $dir/" >/dev/null && fail "the daemon did not exit after the unmount"
cmp "$dir/ref" "$dir/backing/data" || fail "the backing store differs after the unmount"
echo "64 MiB written through the installed nvcachefs, read back, destaged: equal"
nvc_cleanup
trap pkg_cleanup EXIT

echo "== remove: dpkg --purge"
dpkg --purge nvcachefs >/dev/null
installed=0
[ ! -e /usr/bin/nvcachefs ] || fail "/usr/bin/nvcachefs left after dpkg -r"
echo "package-test: ok"

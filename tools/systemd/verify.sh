#!/bin/sh
# tools/systemd: systemd-analyze verify on a unit file; any message fails (meson test units-verify).
# usage: verify.sh UNIT-FILE NAME   (the file is checked as NAME, e.g. nvcachefs@.service)
set -eu
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$1" "$dir/$2"
# man pages are checked by the man page tests, not here (they need not be installed)
out=$(cd "$dir" && systemd-analyze verify --man=no "./$2" 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then
	echo "$out"
	exit 1
fi
echo "$2: verified, no warnings"

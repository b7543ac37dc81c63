#!/usr/bin/env bash
# tests/man/test_man.sh NVCACHEFS PAGE...: each man page passes groff -ww without a word, and
# nvcachefs.conf(5) has an entry for every key that `nvcachefs --help` lists (the program's own table).
set -euo pipefail
nvcachefs=$1
shift
rc=0 conf=""
for page in "$@"; do
	out=$(groff -ww -z -man "$page" 2>&1) || true
	if [ -n "$out" ]; then
		echo "FAIL $page: groff -ww -z -man says:"
		echo "$out"
		rc=1
	fi
	case $page in *nvcachefs.conf.5) conf=$page ;; esac
done
[ -n "$conf" ] || { echo "FAIL no nvcachefs.conf.5 among the pages"; exit 1; }

# the keys as --help prints them: "  section.key   type  help [default: ...]"
keys=$("$nvcachefs" --help | sed -n 's/^  \([a-z_]*\.[a-z_]*\) .*/\1/p')
n=$(wc -w <<<"$keys")
[ "$n" -ge 10 ] || { echo "FAIL only $n keys parsed from nvcachefs --help"; exit 1; }
# rendered wide and without hyphenation: each key must be an entry's tag, "KEY (type..."
text=$(groff -man -Tutf8 -rLL=250n -rHY=0 -P-cbou "$conf")
for k in $keys; do
	if ! grep -qE "^ +${k//./\\.} \(" <<<"$text"; then
		echo "FAIL $conf has no entry for $k"
		rc=1
	fi
done
[ "$rc" = 0 ] && echo "ok: $# pages clean under groff -ww; $n keys, each an entry of $(basename "$conf")"
exit "$rc"

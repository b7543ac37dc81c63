#!/usr/bin/env bash
# tests/completion/test_completion.sh COMPLETION-FILE: sources nvcachectl's bash completion and checks COMPREPLY for typed lines.
set -uo pipefail
# shellcheck source=tools/completion/nvcachectl
. "$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rc=0

# comp EXPECTED WORD...: complete the last WORD ("" for a fresh one) of "nvcachectl WORD..."; the
# sorted COMPREPLY, joined by spaces, must be EXPECTED
comp()
{
	local want=$1 got
	shift
	COMP_WORDS=(nvcachectl "$@")
	COMP_CWORD=$#
	COMPREPLY=()
	_nvcachectl
	got=$(printf '%s\n' "${COMPREPLY[@]}" | sort | paste -sd ' ')
	if [ "$got" != "$want" ]; then
		echo "FAIL nvcachectl $*<TAB>: got '$got', want '$want'"
		rc=1
	fi
}

[ "$(complete -p nvcachectl)" = "complete -F _nvcachectl nvcachectl" ] || { echo "FAIL not registered"; rc=1; }

comp "stats status" st
comp "replace replace-mirror" rep
comp "--help --version" --
comp "--force --help" format --
comp "--json" stats --p --i --j
comp "--prometheus" stats /mnt --p
comp "--flush" evict --fl
comp "--partial" warm -r --pa
comp "" evict --pa

# mount points: only those of type fuse.nvcachefs, escapes decoded
cat >"$work/mtab" <<'MTAB'
/dev/sda1 / ext4 rw 0 0
nvcachefs:/srv/a /mnt/cache fuse.nvcachefs rw,nosuid,nodev 0 0
nvcachefs:/srv/b /mnt/my\040cache fuse.nvcachefs rw 0 0
other /mnt/cold fuse.sshfs rw 0 0
MTAB
export _NVCACHECTL_MTAB=$work/mtab
comp "/mnt/cache /mnt/my cache" stats ""
comp "/mnt/cache /mnt/my cache" flush /mnt/
comp "/mnt/my cache" detach /mnt/m
comp "" stats /mnt/cache ""
comp "" stats -i 1 /mnt/cache ""
comp "" stats -i ""

# files: for -c, the PATHs of the per-file commands, replace's OLD and NEW
mkdir "$work/d"
touch "$work/d/nvcachefs.conf" "$work/d/other.conf" "$work/d/dimm0"
cd "$work/d" || exit 1
comp "nvcachefs.conf" format -c nv
comp "dimm0 nvcachefs.conf other.conf" check -o x.y=1 -c ""
comp "dimm0" pin -r di
comp "dimm0" replace /mnt/cache di
comp "dimm0" replace /mnt/cache dimm0 di
comp "" replace /mnt/cache dimm0 dimm0 di
comp "dimm0" remove /mnt/cache di
comp "" remove /mnt/cache dimm0 di
comp "" format x
comp "dimm0" flush /mnt/cache di

# -o: the keys nvcachefs --help lists (when nvcachefs is on PATH)
if command -v nvcachefs >/dev/null; then
	comp "destage.max_dirty_age= destage.max_rate=" format -o destage.max
fi

[ "$rc" = 0 ] && echo "ok: nvcachectl completion"
exit "$rc"

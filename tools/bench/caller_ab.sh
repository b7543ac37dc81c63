#!/bin/bash
# tools/bench/caller_ab.sh: two builds in turn, as nobody and as root through an allow_other mount: creates, stats and unlinks of 3000 files, 4K and 1M writes (README "Security": the cost of acting as the caller).
# usage: tools/bench/caller_ab.sh BUILD_A BUILD_B [ROUNDS]; each BUILD holds fs/nvcachefs and tools/nvcachectl; run as root
set -u
A=$1 B=$2 R=${3:-2}
N="setpriv --reuid=65534 --regid=65534 --clear-groups"
# what the run in progress made, removed on any exit
dir="" mnt="" loops=()
undo() {
	[ -n "$mnt" ] && mountpoint -q "$mnt" && { fusermount3 -u "$mnt" || fusermount3 -uz "$mnt"; }
	sleep 1
	for l in "${loops[@]}"; do losetup -d "$l"; done
	[ -n "$dir" ] && rm -rf /dev/shm/"$(basename "$dir")"-* "$dir"
	dir="" mnt="" loops=()
}
trap undo EXIT

one() { # build user
	local b=$1 who=$2 tag=nvcab-$$-$RANDOM conf pre
	dir=/var/tmp/$tag; mnt=$dir/mnt; conf=$dir/c.conf
	mkdir -p $dir/backing $mnt; chmod 755 $dir; chmod 1777 $dir/backing
	for i in 0 1; do truncate -s 2G /dev/shm/$tag-d$i; loops+=($(losetup -f --show --direct-io=on /dev/shm/$tag-d$i)); done
	printf '[cache]\ndevices = %s, %s\nmetadata = /dev/shm/%s-m0, /dev/shm/%s-m1\n[backing]\npath = %s/backing\n' ${loops[0]} ${loops[1]} $tag $tag $dir > $conf
	$b/tools/nvcachectl format -c $conf >/dev/null
	$b/fs/nvcachefs -c $conf -o allow_other $mnt
	pre=""; [ $who = nobody ] && pre=$N
	# creates: open O_CREAT, write 4K, close; then stat; then unlink
	$pre /usr/bin/python3 - $mnt <<'PY'
import os, sys, time
d = os.path.join(sys.argv[1], "md"); os.mkdir(d)
n = 3000; buf = b"x" * 4096
t = time.time()
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644); os.write(fd, buf); os.close(fd)
c = n / (time.time() - t); t = time.time()
for i in range(n): os.stat(f"{d}/f{i}")
s = n / (time.time() - t); t = time.time()
for i in range(n): os.unlink(f"{d}/f{i}")
u = n / (time.time() - t)
print(f"create/s {c:.0f} stat/s {s:.0f} unlink/s {u:.0f}")
PY
	for wl in "randwrite 4k 1 prealloc" "randwrite 4k 32 prealloc" "write 4k 1 new" "write 1m 4 new"; do
		set -- $wl
		f=$mnt/fio-$1-$2-$3
		[ $4 = prealloc ] && { $pre fio --name=p --filename=$f --rw=write --bs=1m --size=256m --direct=1 >/dev/null; }
		$pre fio --name=t --filename=$f --rw=$1 --bs=$2 --iodepth=$3 --ioengine=io_uring --direct=1 --size=256m --runtime=6 --time_based=$( [ $4 = prealloc ] && echo 1 || echo 0) --output-format=terse --terse-version=3 2>/dev/null | awk -F';' -v w="$1 $2 QD$3 ($4)" '{printf "%s: %d IOPS\n", w, $49}'
		rm -f $f
	done
	undo
}
for r in $(seq $R); do
	for b in $A $B; do for who in nobody root; do echo "== round $r $b $who"; one $b $who; done; done
	t=$A; A=$B; B=$t
done

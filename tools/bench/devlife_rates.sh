#!/bin/bash
# devlife_rates.sh BUILD -- how fast nvcachectl replace rebuilds a device (copies its blocks onto the new one) and remove empties one, against the raw device's and the store's 1M writes; how long add takes into a free place and as a grow
# (three 2 GiB cache devices over /dev/shm, 1.5 GiB dirty; the backing store on /var/tmp ext4)
set -u
B=$1; T=/var/tmp/rates; S=/dev/shm/rates
cleanup() { set +e; fusermount3 -u $T/mnt 2>/dev/null; sleep 0.5; for l in ${L[@]:-}; do losetup -d $l 2>/dev/null; done; rm -rf $T $S-*; }
trap cleanup EXIT
mkdir -p $T/mnt $T/back
L=()
for i in 0 1 2 3 4 5; do truncate -s 2G $S-d$i; fallocate -l 2G $S-d$i; L+=($(losetup --find --show --direct-io=on $S-d$i)); done
fio --name=r --filename=${L[3]} --rw=write --bs=1M --direct=1 --size=1G >/dev/null 2>&1   # warm-up
raw=$(fio --name=r --filename=${L[3]} --rw=write --bs=1M --direct=1 --size=1G --output-format=terse 2>/dev/null | cut -d';' -f48)
store=$(fio --name=s --filename=$T/back/probe --rw=write --bs=1M --direct=1 --size=1G --output-format=terse 2>/dev/null | cut -d';' -f48); rm -f $T/back/probe
# a device-to-device copy of 512 MiB (dd, 2 MiB direct reads and writes): what a copy can do at best here
copy=$(dd if=${L[0]} of=${L[3]} bs=2M count=256 iflag=direct oflag=direct 2>&1 | awk '/copied/ {print $(NF-1), $NF}')
wipefs -q -a ${L[3]}
printf "[cache]\ndevices = ${L[0]}, ${L[1]}, ${L[2]}\nmetadata = $S-m0, $S-m1\n[backing]\npath = $T/back\n[destage]\nidle_after = 0\nmax_dirty_age = 0\n" > $T/c.conf
$B/tools/nvcachectl format -c $T/c.conf --force >/dev/null
$B/fs/nvcachefs -c $T/c.conf $T/mnt >/dev/null 2>&1
sleep 0.5
run() { # what, command...
  local what=$1; shift
  fio --name=w --directory=$T/mnt --filename=$what --rw=write --bs=1M --direct=1 --size=1536M >/dev/null 2>&1
  local dev_dirty=$($B/tools/nvcachectl stats $T/mnt --json | /usr/bin/python3 -c "import json,sys; t=json.load(sys.stdin)['total']; print(t['gauges']['dirty_bytes'], t['devices'][$IDX]['gauges']['dirty_bytes'])")
  local t0=$(date +%s.%N); "$@" >/dev/null; local rc=$?; local t1=$(date +%s.%N)
  /usr/bin/python3 -c "
dt=$t1-$t0; tot, dev = [int(x)/2**20 for x in '$dev_dirty'.split()]
moved = dev if '$what' == 'replace' else tot
how = 'copied onto the new device' if '$what' == 'replace' else 'destaged (all the dirty data) and the device emptied'
print(f'$what: rc $rc, {tot:.0f} MiB dirty in the cache, {dev:.0f} MiB on the device; {moved:.0f} MiB {how} in {dt:.2f} s: {moved/dt:.0f} MiB/s; raw device 1M write {$raw/1024:.0f} MiB/s, store 1M write {$store/1024:.0f} MiB/s, dd device-to-device copy $copy')"
}
IDX=1 run replace $B/tools/nvcachectl replace $T/mnt ${L[1]} ${L[3]}
IDX=2 run remove $B/tools/nvcachectl remove $T/mnt ${L[2]}
# add: into the removed device's place, then a fifth device as a new member (a grow); nothing is copied
timed() { local t0=$(date +%s.%N); "$@" >/dev/null; local rc=$?; local t1=$(date +%s.%N); /usr/bin/python3 -c "print(f'{($t1-$t0)*1000:.0f} ms, rc $rc')"; }
echo "add into a free place (2 GiB device): $(timed $B/tools/nvcachectl add $T/mnt ${L[5]})"
echo "add as a new member, a grow (2 GiB device): $(timed $B/tools/nvcachectl add $T/mnt ${L[4]})"
$B/tools/nvcachectl stats $T/mnt | grep '^device'

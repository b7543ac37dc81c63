#!/bin/bash
# tools/bench/rss.sh: the daemon's own DRAM and mount time per GiB of cache, on sparse emulated DIMMs.
#
# usage: tools/bench/rss.sh [-r ROUNDS] [-b BLOCK] [-f PERCENT] BUILD_DIR[,BUILD_DIR2...] SIZE_GIB...
# For every round, size and build (alternating builds within a round): two sparse loop-device DIMMs of
# SIZE/2 GiB each over /dev/shm files, mirrors in /dev/shm, format, mount (time from exec to the mount
# showing in /proc/mounts), wait 1 s, read /proc/PID/status, unmount, clean up.  With -f PERCENT the
# cache is first filled that far (one file written with 1 MiB O_DIRECT writes, then flushed): the
# slots' state is then all touched, as in a cache in use (the DIMM files take that much RAM).
# Own DRAM = RssAnon (heap, stacks, anonymous mmaps). The metadata mirrors are /dev/shm files mapped
# shared: they show in RssShmem and are not counted (pmem in production); shared libraries are RssFile.
# Prints one line per mount: build size_gib mount_ms rss_mib rss_anon_mib rss_file_mib rss_shmem_mib
# anon_mib_per_gib threads.  Timing runs hold /tmp/nvc-bench.lock (one benchmark at a time on this machine).
set -euo pipefail
if [ "${1:-}" = --one ]; then # internal: one mount, under the benchmark lock
	one=1 b=$2 g=$3 bs=$4 fill=$5
fi
rounds=1 bs=${bs:-64K} fill=${fill:-0}
[ -n "${one:-}" ] || while getopts r:b:f: o; do
	case $o in
	r) rounds=$OPTARG ;;
	f) fill=$OPTARG ;;
	b) bs=$OPTARG ;;
	*) exit 2 ;;
	esac
done
if [ -z "${one:-}" ]; then
	shift $((OPTIND - 1))
	IFS=, read -ra builds <<<"$1"
	shift
	sizes=("$@")
fi

tag=nvc-rss-$$
dir=/var/tmp/$tag
loops=() pid=
cleanup() {
	set +e
	mountpoint -q "$dir/mnt" && fusermount3 -u "$dir/mnt"
	if [ -n "$pid" ]; then
		for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	fi
	mountpoint -q "$dir/mnt" && fusermount3 -uz "$dir/mnt"
	for l in "${loops[@]}"; do losetup -d "$l"; done
	loops=() pid=
	rm -f /dev/shm/"$tag"-*
	rm -rf "$dir"
}
trap cleanup EXIT

one() { # build size_gib
	local b=$1 g=$2 t0 t1 i
	mkdir -p "$dir/backing" "$dir/mnt"
	for i in 0 1; do
		truncate -s $((g * 512))M /dev/shm/"$tag"-dimm$i.img
		loops+=("$(losetup --find --show --direct-io=on /dev/shm/"$tag"-dimm$i.img)")
	done
	cat >"$dir/c.conf" <<CONF
[cache]
devices = ${loops[0]}, ${loops[1]}
metadata = /dev/shm/$tag-meta0, /dev/shm/$tag-meta1
block_size = $bs
[backing]
path = $dir/backing
CONF
	"$b/tools/nvcachectl" format -c "$dir/c.conf" >/dev/null
	t0=$(date +%s%N)
	"$b/fs/nvcachefs" -f -c "$dir/c.conf" "$dir/mnt" >"$dir/log" 2>&1 &
	pid=$!
	until grep -q " $dir/mnt " /proc/mounts; do
		kill -0 "$pid" 2>/dev/null || { cat "$dir/log" >&2; exit 1; }
		sleep 0.005
	done
	t1=$(date +%s%N)
	if [ "$fill" -gt 0 ]; then
		dd if=/dev/zero of="$dir/mnt/fill" bs=1M count=$((g * 1024 * fill / 100)) oflag=direct \
			status=none
		"$b/tools/nvcachectl" flush "$dir/mnt" >/dev/null
	fi
	sleep 1
	awk -v b="$b" -v g="$g" -v ms=$(((t1 - t0) / 1000000)) '
		/^VmRSS:/ { r = $2 } /^RssAnon:/ { a = $2 } /^RssFile:/ { f = $2 } /^RssShmem:/ { s = $2 }
		/^Threads:/ { t = $2 }
		END { printf "%s %d %d %.1f %.1f %.1f %.1f %.2f %d\n", b, g, ms, r / 1024, a / 1024, f / 1024,
		      s / 1024, a / 1024 / g, t }' /proc/"$pid"/status
	cleanup
}

if [ -n "${one:-}" ]; then
	one "$b" "$g"
	exit 0
fi
echo "# build size_gib mount_ms rss_mib anon_mib file_mib shmem_mib anon_mib_per_gib threads (block $bs, filled $fill%)"
for _ in $(seq "$rounds"); do
	for g in "${sizes[@]}"; do
		for b in "${builds[@]}"; do
			flock /tmp/nvc-bench.lock "$0" --one "$b" "$g" "$bs" "$fill"
		done
	done
done

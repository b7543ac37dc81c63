# tools/lib.sh: set up and tear down an emulated cache (loop-device DIMMs over /dev/shm, pmem-file mirrors) for the scripts.
# Sourced, not run. Sets: tag dir mnt conf loops[]. Call nvc_setup SIZE [extra config lines]; nvc_cleanup runs on EXIT.

nvc_cleanup() {
	set +e
	mountpoint -q "$mnt" && fusermount3 -u "$mnt"
	for _ in $(seq 300); do pgrep -f "nvcachefs -c $dir/" >/dev/null || break; sleep 0.1; done
	pkill -9 -f "nvcachefs -c $dir/" 2>/dev/null
	mountpoint -q "$mnt" && fusermount3 -uz "$mnt"
	for l in "${loops[@]}"; do losetup -d "$l"; done
	rm -f /dev/shm/"$tag"-*
	rm -rf "$dir"
}

nvc_setup() {
	local size=$1 extra=${2:-}
	tag=nvc-$$-$RANDOM
	dir=/var/tmp/$tag
	mnt=$dir/mnt
	conf=$dir/nvcachefs.conf
	loops=()
	trap nvc_cleanup EXIT
	mkdir -p "$dir/backing" "$mnt"
	for i in 0 1; do
		truncate -s "$size" /dev/shm/"$tag"-dimm$i.img
		loops+=("$(losetup --find --show --direct-io=on /dev/shm/"$tag"-dimm$i.img)")
	done
	cat >"$conf" <<CONF
# two emulated DIMMs, metadata mirrored on two emulated pmem files
[cache]
devices = ${loops[0]}, ${loops[1]}
metadata = /dev/shm/$tag-meta0, /dev/shm/$tag-meta1
[backing]
path = $dir/backing
$extra
CONF
}

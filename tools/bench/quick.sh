#!/usr/bin/env bash
# tools/bench/quick.sh: fio 4 KiB random read (QD1, cached data) and 1 MiB sequential write on the raw DIMM, the backing directory and the mount, in one run.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
B=${NVC_BUILD:-$here/build}
secs=${SECS:-10}
size=${SIZE:-512M}
# shellcheck source=tools/lib.sh
. "$here/tools/lib.sh"
nvc_setup 2G "[destage]
idle_after = ${IDLE:-2s}"
"$B/tools/nvcachectl" format -c "$conf" >/dev/null
"$B/fs/nvcachefs" -c "$conf" "$mnt" 2>/dev/null

# fio JSON -> "iops lat_mean_us p99_us MB/s"
run() {
	fio --output-format=json "$@" | /usr/bin/python3 -c '
import json,sys
j=json.load(sys.stdin)["jobs"][0]
k="read" if j["read"]["io_bytes"] else "write"
x=j[k]; lat=x["clat_ns"]
p=lat.get("percentile",{})
print("%.0f %.1f %.1f %.1f %.0f" % (x["iops"], lat["mean"]/1000, p.get("50.000000",0)/1000, p.get("99.000000",0)/1000, x["bw_bytes"]/1e6))'
}
common="--ioengine=psync --time_based --runtime=$secs --group_reporting --name=j"
printf "%-48s %8s %8s %8s %8s %8s\n" target iops "mean us" "p50 us" "p99 us" "MB/s"
row() { printf "%-48s %8s %8s %8s %8s %8s\n" "$1" $2; }

# 4 KiB random read at queue depth 1 on cached data
dd if=/dev/urandom of="$dir/backing/rr" bs=1M count=${size%M} status=none
dd if=/dev/urandom of="$mnt/rr" bs=1M count=${size%M} status=none
cat "$mnt/rr" >/dev/null
row "raw DIMM  4K randread QD1 O_DIRECT" "$(run $common --filename=${loops[0]} --rw=randread --bs=4k --direct=1 --size=$size)"
row "backing   4K randread QD1 O_DIRECT" "$(run $common --filename=$dir/backing/rr --rw=randread --bs=4k --direct=1 --size=$size)"
row "mount     4K randread QD1 O_DIRECT (cache hits)" "$(run $common --filename=$mnt/rr --rw=randread --bs=4k --direct=1 --size=$size)"
cat "$mnt/rr" >/dev/null
row "mount     4K randread QD1 buffered (page cache)" "$(run $common --filename=$mnt/rr --rw=randread --bs=4k --invalidate=0 --size=$size)"
# 1 MiB sequential write
row "raw DIMM  1M seqwrite O_DIRECT" "$(run $common --filename=${loops[1]} --rw=write --bs=1M --direct=1 --size=$size)"
row "backing   1M seqwrite O_DIRECT" "$(run $common --filename=$dir/backing/sw --rw=write --bs=1M --direct=1 --size=$size)"
row "mount     1M seqwrite O_DIRECT" "$(run $common --filename=$mnt/sw --rw=write --bs=1M --direct=1 --size=$size)"
row "mount     1M seqwrite buffered" "$(run $common --filename=$mnt/sw2 --rw=write --bs=1M --size=$size)"

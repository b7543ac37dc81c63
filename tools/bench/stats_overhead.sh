#!/usr/bin/env bash
# tools/bench/stats_overhead.sh: what the statistics cost — fio through the mount with stats.latency on and off in alternating rounds: IOPS and daemon CPU per request.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
B=${NVC_BUILD:-$here/build}
secs=${SECS:-3}
rounds=${ROUNDS:-8}
# shellcheck source=tools/lib.sh
. "$here/tools/lib.sh"
nvc_setup 1G

"$B/tools/nvcachectl" format -c "$conf" >/dev/null

# fio JSON -> total IOPS and completed requests
iops() {
	fio --output-format=json "$@" | /usr/bin/python3 -c '
import json,sys
j=json.load(sys.stdin)["jobs"][0]
print("%.0f %d" % (j["read"]["iops"] + j["write"]["iops"], j["read"]["total_ios"] + j["write"]["total_ios"]))'
}

# the daemon's CPU time (user and kernel, task-clock in ms) while fio runs:
# CPU spent per request moves less with the neighbours than wall time does
daemon_pid() { pgrep -f "nvcachefs -c $dir/" | head -1; }
common="--ioengine=psync --time_based --runtime=$secs --group_reporting --name=j --direct=1 --bs=4k --size=256M"
out=$dir/results
: >"$out"
for r in $(seq "$rounds"); do
	# alternate which goes first, so that drift on the machine cancels out
	if [ $((r % 2)) = 1 ]; then order="on off"; else order="off on"; fi
	for mode in $order; do
		# no completion spinning: it would count instructions for waiting
		"$B/fs/nvcachefs" -c "$conf" -o "stats.latency=$mode" -o cache.io_poll_us=0 "$mnt" 2>/dev/null
		[ -f "$mnt/f" ] || dd if=/dev/urandom of="$mnt/f" bs=1M count=256 status=none
		for wl in "randread --numjobs=1" "randwrite --numjobs=4"; do
			perf stat -x, -e task-clock -p "$(daemon_pid)" -o "$dir/perf" &
			perf_pid=$!
			# shellcheck disable=SC2086
			set -- $(iops $common --filename="$mnt/f" --rw=$wl)
			kill -INT $perf_pid
			wait $perf_pid || true
			insns=$(awk -F, '/task-clock/ {print $1}' "$dir/perf")
			echo "$r $mode ${wl%% *} $1 $2 $insns" >>"$out"
		done
		fusermount3 -u "$mnt"
		while pgrep -f "nvcachefs -c $dir/" >/dev/null; do sleep 0.1; done
	done
done

/usr/bin/python3 - "$out" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r, mode, wl, iops, ios, insns = line.split()
    runs[(wl, r)][mode] = (float(iops), 1000 * float(insns) / max(int(ios), 1))
print("%-12s %12s %12s %10s %16s %16s %10s" % ("workload", "IOPS on", "IOPS off", "on/off",
                                            "CPU us/op on", "CPU us/op off", "on/off"))
for wl in ("randread", "randwrite"):
    pairs = [v for (w, _), v in sorted(runs.items()) if w == wl and len(v) == 2]
    ion = statistics.median(p["on"][0] for p in pairs)
    ioff = statistics.median(p["off"][0] for p in pairs)
    con = statistics.median(p["on"][1] for p in pairs)
    coff = statistics.median(p["off"][1] for p in pairs)
    iratio = statistics.median(p["on"][0] / p["off"][0] for p in pairs)
    cratio = statistics.median(p["on"][1] / p["off"][1] for p in pairs)
    print("%-12s %12.0f %12.0f %9.3fx %16.2f %16.2f %9.3fx" % (wl, ion, ioff, iratio, con, coff, cratio))
print("(%d rounds; ratios are medians of the per-round ratios; randread 1 job on cached data, randwrite 4 jobs)"
      % len(pairs))
PY

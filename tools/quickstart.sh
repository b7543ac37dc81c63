#!/usr/bin/env bash
# tools/quickstart.sh: install what is missing, build, then run the demo ("demo") or the whole test suite ("test").
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

# Every Debian package the project needs, and why, is listed in README.md.
PKGS="gcc meson ninja-build pkg-config libfuse3-dev fuse3 liburing-dev libpmem-dev
libinih-dev libblkid-dev libjson-c-dev libxxhash-dev libsystemd-dev systemd python3-pytest fio strace
util-linux e2fsprogs acl valgrind gdb prometheus rclone mergerfs bindfs bonnie++ python3-matplotlib
clang libclang-rt-dev iproute2 glusterfs-server glusterfs-client moosefs-master moosefs-chunkserver
moosefs-client ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph-common mpich libmpich-dev debhelper
dpkg-dev lintian groff-base bash-completion"

install() {
	if [ "$(id -u)" != 0 ]; then
		echo "quickstart: run as root (loop devices, FUSE mounts, apt-get)" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# The GlusterFS, MooseFS and Ceph servers are test fixtures that the tests start themselves: their packages
	# must not start glusterd, mfsmaster or ceph-mon as services. policy-rc.d (exit 101: "action forbidden") stops
	# invoke-rc.d from starting any; one the machine already has is left alone.
	local policy=""
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		policy=/usr/sbin/policy-rc.d
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		# shellcheck disable=SC2064 # expanded now: policy is local to this function
		trap "rm -f $policy" EXIT
	fi
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
	if [ -n "$policy" ]; then
		rm -f "$policy"
		trap - EXIT
	fi
	modprobe fuse 2>/dev/null || true
	modprobe loop 2>/dev/null || true
}

build() {
	[ -f build/build.ninja ] || meson setup build >/dev/null
	ninja -C build
}

demo() {
	# shellcheck source=tools/lib.sh
	. tools/lib.sh
	nvc_setup 1G "[destage]
high_watermark = 60
low_watermark = 30
max_dirty_age = 30s"
	echo "== format"
	build/tools/nvcachectl format -c "$conf"
	echo "== mount $mnt"
	build/fs/nvcachefs -c "$conf" "$mnt"
	echo "== write 256 MiB through the cache, read it back"
	head -c 256M /dev/urandom >"$dir/ref"
	dd if="$dir/ref" of="$mnt/data" bs=1M status=none
	cmp "$dir/ref" "$mnt/data" && echo "data read back equal"
	mkdir -p "$mnt/dir" && echo hello >"$mnt/dir/small"
	echo "== stats"
	build/tools/nvcachectl stats "$mnt"
	echo "== flush"
	build/tools/nvcachectl flush "$mnt"
	cmp "$dir/ref" "$dir/backing/data" && echo "backing store holds every byte"
	build/tools/nvcachectl stats "$mnt"
	echo "== unmount"
	fusermount3 -u "$mnt"
}

# The libFuzzer targets (tests/fuzz, README "Fuzzing"), each for a short run on
# a copy of its seed corpus: any crash, hang, leak or sanitizer report fails.
FUZZ_TARGETS="config superblock mirrors check"
FUZZ_SECONDS=${FUZZ_SECONDS:-20}

fuzz_short() {
	local t work rc=0
	[ -f build-fuzz/build.ninja ] ||
		CC=clang meson setup build-fuzz -Db_sanitize=address,undefined -Db_lundef=false \
			-Dc_args=-fsanitize=fuzzer-no-link -Dc_link_args=-fsanitize=fuzzer-no-link >/dev/null
	# shellcheck disable=SC2086
	ninja -C build-fuzz $(printf 'tests/fuzz_%s ' $FUZZ_TARGETS)
	work=$(mktemp -d /tmp/nvc-fuzz-XXXXXX)
	for t in $FUZZ_TARGETS; do
		cp -r "tests/fuzz/corpus/$t" "$work/$t"
		mkdir "$work/$t-found"
		if build-fuzz/tests/fuzz_"$t" -max_total_time="$FUZZ_SECONDS" -timeout=10 \
			-rss_limit_mb=2048 -max_len=20000 -close_fd_mask=2 -print_final_stats=1 \
			-artifact_prefix="$work/$t-found/" "$work/$t" >"$work/$t.log" 2>&1; then
			echo "fuzz_$t: $(grep -E '^#[0-9]+.*DONE' "$work/$t.log" | tail -1)"
		else
			rc=1
			echo "fuzz_$t FAILED; its input is kept in $work/$t-found:" >&2
			tail -n 60 "$work/$t.log" >&2
		fi
	done
	[ "$rc" = 0 ] && rm -rf "$work"
	return "$rc"
}

run_tests() {
	local rc=0
	[ -f build-asan/build.ninja ] ||
		meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
	ninja -C build-asan
	echo "== unit tests (address and undefined-behaviour sanitizers)"
	meson test -C build-asan --print-errorlogs
	echo "== unit tests"
	meson test -C build --print-errorlogs
	echo "== fuzz targets, ${FUZZ_SECONDS} s each (libFuzzer, address and undefined-behaviour sanitizers)"
	fuzz_short || rc=$?
	echo "== integration tests (real daemon, loop devices, pmem files)"
	local prc=0
	NVC_TRANSPORT=dev NVC_BUILD="$here/build" /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration || prc=$?
	[ "$prc" = 5 ] && { echo "no integration test ran" >&2; exit 1; }
	[ "$prc" = 0 ] || rc=$prc
	if [ -e /sys/module/fuse/parameters/enable_uring ]; then
		# about 3.5 minutes: what the transport could break (data, sync flags, kill -9, hostile users, the
		# workers' asynchronous path, requests per create, transport choice); the conftest turns
		# enable_uring on for the run and puts it back
		echo "== integration tests again over FUSE io_uring (fuse.transport = uring), a subset"
		prc=0
		NVC_TRANSPORT=uring NVC_BUILD="$here/build" /usr/bin/python3 -m pytest -q -p no:cacheprovider \
			tests/integration/test_data.py tests/integration/test_sync_flags.py tests/integration/test_kill.py \
			tests/integration/test_hostile.py tests/integration/test_ring_refusal.py \
			tests/integration/test_subpage.py tests/integration/test_proto.py \
			tests/integration/test_create_cost.py tests/integration/test_transport.py || prc=$?
		[ "$prc" = 0 ] || rc=$prc
	fi
	echo "== Debian package: build, lintian, dpkg -i, --version and a mount from the installed files, dpkg --purge"
	tools/package-test.sh || rc=$?
	return "$rc"
}

case "${1:-demo}" in
demo) install; build; demo ;;
test) install; build; run_tests ;;
build) install; build ;;
*) echo "usage: tools/quickstart.sh [demo|test|build]" >&2; exit 2 ;;
esac

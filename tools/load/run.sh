#!/bin/bash
# tools/load/run.sh: the load test through the mount by hand — 10 minutes of the "space" case by default; figures and
# any hang report land in $NVC_LOAD_EVIDENCE (default /var/tmp/nvc-load). Every NVC_LOAD_* knob of
# tests/integration/test_load.py passes through, and so do pytest's arguments, e.g.
#   NVC_LOAD_SECONDS=120 tools/load/run.sh -k copies2      tools/load/run.sh -k ''   (every case)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export NVC_BUILD=${NVC_BUILD:-$root/build}
export NVC_LOAD_SECONDS=${NVC_LOAD_SECONDS:-600}
export NVC_LOAD_EVIDENCE=${NVC_LOAD_EVIDENCE:-/var/tmp/nvc-load}
if [ ! -x "$NVC_BUILD/fs/nvcachefs" ]; then
	echo "run.sh: no daemon at $NVC_BUILD/fs/nvcachefs; build first (meson setup build && ninja -C build)" >&2
	exit 2
fi
[ $# -gt 0 ] || set -- -k space
mkdir -p "$NVC_LOAD_EVIDENCE"
echo "load: ${NVC_LOAD_SECONDS} s; evidence in $NVC_LOAD_EVIDENCE"
cd "$root"
exec /usr/bin/python3 -m pytest -q -s -p no:cacheprovider tests/integration/test_load.py "$@"

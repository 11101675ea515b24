#!/usr/bin/env bash
# Runs a command under a memory cgroup cap (as root), so neither the engine nor the page cache can
# use more than CAP bytes, then prints the cgroup's peak usage and how often it hit the cap.
#   tools/bench/under-memory-cap.sh 4G target/release/xtask bench decode --model bench-out/k3-proxy --mem 3G
set -euo pipefail
cap=$1; shift
bytes=$(numfmt --from=iec "$cap")
name=k3-cap-$$
if [ -d /sys/fs/cgroup/memory ]; then            # cgroup v1
  dir=/sys/fs/cgroup/memory/$name
  mkdir "$dir"
  echo "$bytes" > "$dir/memory.limit_in_bytes"
  peak_file=$dir/memory.max_usage_in_bytes; fail_file=$dir/memory.failcnt
else                                               # cgroup v2
  dir=/sys/fs/cgroup/$name
  mkdir "$dir"
  echo "$bytes" > "$dir/memory.max"
  peak_file=$dir/memory.peak; fail_file=$dir/memory.events
fi
trap 'rmdir "$dir" 2>/dev/null || true' EXIT
status=0
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$dir" "$@" || status=$?
echo "memory cap $cap: peak usage $(numfmt --to=iec "$(cat "$peak_file")"), cap events: $(tr '\n' ' ' < "$fail_file")" >&2
exit $status

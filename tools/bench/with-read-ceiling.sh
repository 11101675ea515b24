#!/usr/bin/env bash
# Runs a command (as root) with the block device under FILE throttled to BPS bytes/s of reads by a
# blkio cgroup (v1 blkio.throttle / v2 io.max). This machine's virtual disk is cached by its host,
# so its own ceiling swings 0.9-2.3 GB/s between runs; under a throttle below that, the drive has
# one known ceiling and "the I/O bound" is a stable number. O_DIRECT and io_uring reads obey it.
#   tools/bench/with-read-ceiling.sh 800M bench-out/k3-proxy target/release/xtask bench decode --model bench-out/k3-proxy --mem 3G
set -euo pipefail
bps=$(numfmt --from=iec "$1"); file=$2; shift 2
dev=$(df --output=source "$file" | tail -1)
majmin=$(lsblk -ndo MAJ:MIN "$dev" | tr -d ' ')
# A partition's reads are throttled on its disk.
if [ "$(lsblk -ndo TYPE "$dev")" = part ]; then majmin=$(lsblk -ndo PKNAME "$dev" | xargs -I{} lsblk -ndo MAJ:MIN /dev/{} | tr -d ' '); fi
name=k3-read-$$
if [ -d /sys/fs/cgroup/blkio ]; then                 # cgroup v1
  dir=/sys/fs/cgroup/blkio/$name
  mkdir "$dir"
  echo "$majmin $bps" > "$dir/blkio.throttle.read_bps_device"
else                                                  # cgroup v2
  dir=/sys/fs/cgroup/$name
  mkdir "$dir"
  echo "$majmin rbps=$bps" > "$dir/io.max"
fi
trap 'rmdir "$dir" 2>/dev/null || true' EXIT
echo "reads from $dev ($majmin) capped at $(numfmt --to=si "$bps")B/s" >&2
status=0
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$dir" "$@" || status=$?
exit $status

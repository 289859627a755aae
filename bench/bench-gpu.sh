#!/bin/sh
# bench-gpu.sh BUILD_DIR [bench_gpu options]: starts gpupoold with the cuda backend on a
# private socket, runs bench_gpu against it, and stops it. The header says when, where and
# on what it ran, so that a saved log is a complete record (bench/results/).
set -eu
B=${1:-build}
[ $# -gt 0 ] && shift
dir=$(mktemp -d /tmp/gpupool-bench-XXXXXX)
pid=
cleanup() {
        [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
        rm -rf "$dir"
}
trap cleanup EXIT INT TERM

echo "# gpupool bench-gpu, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm), $(nproc) CPUs"
echo "# gpupool $("$B/gpupoold" --version | cut -d' ' -f2), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/# gpu: /'
fi
echo "# command: bench_gpu $*"

"$B/gpupoold" --backend cuda --socket "$dir/sock" --log-level warn &
pid=$!
i=0
while [ ! -S "$dir/sock" ]; do
        kill -0 "$pid" 2>/dev/null || { echo "bench-gpu: gpupoold did not start (see above)" >&2; exit 1; }
        i=$((i + 1))
        [ $i -lt 200 ] || { echo "bench-gpu: gpupoold did not listen within 20 s" >&2; exit 1; }
        sleep 0.1
done
"$B/bench/bench_gpu" --socket "$dir/sock" "$@"

#!/bin/sh
# bench-gpu.sh BUILD_DIR [bench_gpu options]: bench_gpu (bench/bench_gpu.c) against a
# gpupoold with the cuda backend on a private socket (bench/with-gpupoold.sh).
set -eu
B=${1:-build}
[ $# -gt 0 ] && shift
exec sh bench/with-gpupoold.sh "$B" sh -c 'exec "$GPUPOOL_BUILD_DIR/bench/bench_gpu" --socket "$GPUPOOL_SOCKET" "$@"' bench_gpu "$@"

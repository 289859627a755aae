#!/bin/sh
# with-gpupoold.sh BUILD_DIR COMMAND [ARG...]: starts BUILD_DIR/gpupoold on a private socket,
# runs COMMAND with the environment pointing at it, stops the daemon and exits with COMMAND's
# status. The header says when, where and on what it ran, so that a saved log is a complete
# record (bench/results/).
#
# COMMAND sees GPUPOOL_SOCKET, GPUPOOL_LIBRARY (BUILD_DIR/libgpupool.so.1), GPUPOOL_CTL
# (BUILD_DIR/gpupoolctl), GPUPOOL_BUILD_DIR and PYTHONPATH with python/ first.
# GPUPOOLD_ARGS adds options for the daemon (default: --backend cuda --log-level warn).
set -eu
B=${1:?usage: with-gpupoold.sh BUILD_DIR COMMAND [ARG...]}
shift
[ $# -gt 0 ] || { echo "with-gpupoold.sh: no command to run" >&2; exit 2; }
daemon_args=${GPUPOOLD_ARGS:---backend cuda --log-level warn}
dir=$(mktemp -d /tmp/gpupool-bench-XXXXXX)
pid=
cleanup() {
        [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
        rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm), $(nproc) CPUs"
echo "# gpupool $("$B/gpupoold" --version | cut -d' ' -f2), commit ${GPUPOOL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/# gpu: /'
fi
echo "# gpupoold $daemon_args"
echo "# command: $*"

# shellcheck disable=SC2086 # daemon_args is a list of options
"$B/gpupoold" $daemon_args --socket "$dir/sock" &
pid=$!
i=0
while [ ! -S "$dir/sock" ]; do
        kill -0 "$pid" 2>/dev/null || { echo "with-gpupoold.sh: gpupoold did not start (see above)" >&2; exit 1; }
        i=$((i + 1))
        [ $i -lt 200 ] || { echo "with-gpupoold.sh: gpupoold did not listen within 20 s" >&2; exit 1; }
        sleep 0.1
done

GPUPOOL_SOCKET="$dir/sock" GPUPOOL_LIBRARY="$B/libgpupool.so.1" GPUPOOL_CTL="$B/gpupoolctl" \
        GPUPOOL_BUILD_DIR="$B" PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}" "$@" || exit $?

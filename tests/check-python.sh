#!/bin/sh
# The Python package's tests (tests/python) against the build's daemon, library and CLI, on the
# host backend. Skipped, saying so, where there is no python3.
set -eu
B=${B:-build}
if ! command -v python3 >/dev/null 2>&1; then
        echo "check-python: skipped: no python3 on this machine"
        exit 0
fi
# The scripts that run only on a GPU machine (the framework benchmarks and tests) parse.
python3 -c 'import ast, sys
for f in sys.argv[1:]:
    ast.parse(open(f).read(), f)' bench/frameworks/*.py tests/gpu/*.py
# A sanitizer build's library needs its runtimes loaded first into an uninstrumented python3;
# Python's own allocations are not ours to check for leaks.
preload=""
case "${SANITIZER:-}" in
*address*) preload="$(${CC:-cc} -print-file-name=libasan.so)" ;;
esac
case "${SANITIZER:-}" in
*undefined*) preload="$preload $(${CC:-cc} -print-file-name=libubsan.so)" ;;
esac

# The README's Python lines as they stand, in a fresh virtual environment (".venv" made a
# temporary directory), against a host daemon: pip installs the package offline and it finds the
# build's library with no $GPUPOOL_LIBRARY. A build other than build/ is named as a user of
# "make BUILD=..." would name it.
tmp=$(mktemp -d /tmp/gpupool-python-XXXXXX)
dpid=
cleanup() {
        [ -z "$dpid" ] || { kill "$dpid" 2>/dev/null; wait "$dpid" 2>/dev/null || :; }
        rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
awk '/^<!-- tests\/check-python.sh runs these/ { on = 1; next } on && /^```sh$/ { code = 1; next }
     code && /^```$/ { exit } code { print }' README.md > "$tmp/lines.sh"
[ "$(grep -c . "$tmp/lines.sh")" = 3 ] || { echo "check-python: the README's three Python lines were not found" >&2; exit 1; }
sed -i "s|\.venv|$tmp/venv|g" "$tmp/lines.sh"
"$B/gpupoold" --backend host --socket "$tmp/sock" --log-level warn &
dpid=$!
i=0
while [ ! -S "$tmp/sock" ]; do
        kill -0 "$dpid" 2>/dev/null || { echo "check-python: gpupoold did not start" >&2; exit 1; }
        i=$((i + 1))
        [ $i -lt 200 ] || { echo "check-python: gpupoold did not listen within 20 s" >&2; exit 1; }
        sleep 0.1
done
build_dir=""
[ "$(cd "$B" && pwd -P)" = "$(pwd -P)/build" ] || build_dir="$(cd "$B" && pwd -P)"
if ! readme=$(env -u GPUPOOL_LIBRARY -u PYTHONPATH ${build_dir:+GPUPOOL_BUILD_DIR="$build_dir"} \
        GPUPOOL_SOCKET="$tmp/sock" PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
        LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0 sh -eu "$tmp/lines.sh" 2>&1); then
        printf '%s\n' "$readme" >&2
        echo "check-python: the README's Python lines failed (above)" >&2
        exit 1
fi
case "$readme" in
*"host 0x"*) ;;
*) printf '%s\n' "$readme" >&2; echo "check-python: the README's Python lines printed no allocation" >&2; exit 1 ;;
esac

if ! out=$(GPUPOOL_BUILD_DIR="$B" LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0 \
        python3 -m unittest discover -s tests/python 2>&1); then
        printf '%s\n' "$out" >&2
        echo "check-python: the Python package's tests failed" >&2
        exit 1
fi
echo "check-python: $(printf '%s\n' "$out" | grep -E '^Ran [0-9]+ tests') of the Python package passed ($(python3 --version 2>&1)), and the README's lines in a venv"

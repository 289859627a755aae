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
if ! out=$(GPUPOOL_BUILD_DIR="$B" LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0 \
        python3 -m unittest discover -s tests/python 2>&1); then
        printf '%s\n' "$out" >&2
        echo "check-python: the Python package's tests failed" >&2
        exit 1
fi
echo "check-python: $(printf '%s\n' "$out" | grep -E '^Ran [0-9]+ tests') of the Python package passed ($(python3 --version 2>&1))"

#!/bin/sh
# gpupool-device-plugin against a fake kubelet (tests/kubelet) and the build's daemon, on
# Debian's /usr/bin/python3 with its python3-grpcio, as the plugin runs.
set -eu
B=${B:-build}
py=/usr/bin/python3
if ! $py -c 'import grpc, google.protobuf' 2>/dev/null; then
        echo "check-kubelet: $py has no grpc or protobuf module: make deps installs python3-grpcio and python3-protobuf" >&2
        exit 1
fi
# A sanitizer build's library, loaded by the tests' pod processes into an uninstrumented python3,
# needs its runtimes loaded first.
preload=""
case "${SANITIZER:-}" in
*address*) preload="$(${CC:-cc} -print-file-name=libasan.so)" ;;
esac
case "${SANITIZER:-}" in
*undefined*) preload="$preload $(${CC:-cc} -print-file-name=libubsan.so)" ;;
esac
if ! out=$(GPUPOOL_BUILD_DIR="$B" GPUPOOL_TEST_PRELOAD="$preload" $py -W error::ResourceWarning -m unittest discover \
        -s tests/kubelet 2>&1); then
        printf '%s\n' "$out" >&2
        echo "check-kubelet: the device plugin's tests failed" >&2
        exit 1
fi
echo "check-kubelet: $(printf '%s\n' "$out" | grep -E '^Ran [0-9]+ tests') of gpupool-device-plugin against a fake kubelet passed$(printf '%s\n' "$out" | grep -o ' (skipped=[0-9]*)' || :)"

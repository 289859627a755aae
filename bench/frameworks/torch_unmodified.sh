#!/bin/sh
# torch_unmodified.sh BUILD_DIR LIMIT: PyTorch with no change on gpupool, under gpupool-run,
# against the gpupoold bench/with-gpupoold.sh started ($GPUPOOL_SOCKET) with --client-limit
# LIMIT (bytes): torch_unmodified.py's limit and out-of-memory checks, then torch_train.py's
# training throughput (PyTorch's own allocator, which under gpupool-run takes its segments from
# the pool) natively and under gpupool-run, each with PyTorch's default allocator and with
# PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (every tensor a cuMemAllocAsync, which
# gpupool-run serves stream-ordered). Each run's command, output and exit status in turn;
# exits 1 if any failed.
set -u
B=${1:?usage: torch_unmodified.sh BUILD_DIR LIMIT}
limit=${2:?usage: torch_unmodified.sh BUILD_DIR LIMIT}
failed=0
run() {
        echo "# $*"
        "$@"
        rc=$?
        echo "# exit status $rc"
        [ $rc -eq 0 ] || failed=1
}
run "$B/gpupool-run" -- python3 bench/frameworks/torch_unmodified.py --limit "$limit"
for conf in "" "backend:cudaMallocAsync"; do
        echo "# PYTORCH_CUDA_ALLOC_CONF=$conf"
        PYTORCH_CUDA_ALLOC_CONF=$conf run python3 bench/frameworks/torch_train.py --allocator torch
        PYTORCH_CUDA_ALLOC_CONF=$conf run "$B/gpupool-run" -- python3 bench/frameworks/torch_train.py --allocator torch
done
exit $failed

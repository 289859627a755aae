#!/bin/sh
# gpu-validate.sh BUILD_DIR: the first run on a GPU machine, in one command (make gpu-validate).
#
# Runs, in this order, the cuda backend's tests on the real driver and the framework tests
# (what make check-gpu runs), the allocation latency benchmark (make bench-gpu), the cost of
# pending stream-ordered frees (make bench-pending), the driver calls' costs and capture rules
# (make bench-driver), the PyTorch benchmarks (make bench-frameworks) and their training
# throughput again with GPUPOOL_SEGMENTS=grow on cuda-vmm (bench-frameworks-grow) and named
# objects on cuda-vmm (make bench-objects BENCH_OBJECTS_BACKEND=cuda-vmm), each against
# build/ as it is: nothing is built here, so a build made
# elsewhere with make STATIC=1 gpu-tools runs where libuv, protobuf-c and Check are not
# installed. Each part's full output goes to bench/results/gpu-validate-DATE-GPU-PART.txt
# behind a header (date, GPU, driver, commit; GPUPOOL_COMMIT names it where there is no .git);
# each part is stopped after GPU_VALIDATE_TIMEOUT seconds (600); a summary closes the run. Exits 1 if any
# part failed, 2 if there is no GPU or no build.
set -u
B=${1:-build}
for f in gpupoold gpupoolctl libgpupool.so.1 tests/check_gpu bench/bench_gpu bench/bench_pending bench/objects; do
        [ -e "$B/$f" ] || { echo "gpu-validate: $B/$f is missing: build with make STATIC=1 gpu-tools first" >&2; exit 2; }
done
if ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu-validate: nvidia-smi finds no GPU here; nothing to validate" >&2
        exit 2
fi
day=$(date -u +%Y-%m-%d)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
mkdir -p bench/results
header() {
        echo "# gpu-validate $1, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm), $(nproc) CPUs"
        echo "# commit ${GPUPOOL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, gpupool $("$B/gpupoold" --version | cut -d' ' -f2)"
        nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,compute_mode --format=csv,noheader | sed 's/^/# gpu: /'
        nvidia-smi -L | sed 's/^/# /'
}
part_timeout=${GPU_VALIDATE_TIMEOUT:-600}
failed=
summary=
# part NAME COMMAND...: runs COMMAND with its output in the part's log (unless
# GPU_VALIDATE_PARTS, a list of names, leaves it out).
part() {
        name=$1
        shift
        case " ${GPU_VALIDATE_PARTS:-$name} " in *" $name "*) ;; *) return 0 ;; esac
        log=bench/results/gpu-validate-$day-$gpu-$name.txt
        { header "$name"; echo "# command: $*"; } >"$log"
        timeout -k 10 "$part_timeout" "$@" >>"$log" 2>&1
        rc=$?
        [ $rc -ne 124 ] || echo "# stopped after $part_timeout s (GPU_VALIDATE_TIMEOUT)" >>"$log"
        echo "# exit status $rc" >>"$log"
        tail -n 3 "$log"
        summary="$summary
$name: exit $rc ($log)"
        [ $rc -eq 0 ] || failed="$failed $name"
}
export GPUPOOL_BUILD_DIR="$B"
part check-gpu sh -c "'$B/tests/check_gpu'; c=\$?; python3 -m unittest discover -v -s tests/gpu && exit \$c"
part bench-gpu sh bench/bench-gpu.sh "$B"
part bench-pending sh bench/with-gpupoold.sh "$B" sh -c 'exec "$0" --socket "$GPUPOOL_SOCKET"' "$B/bench/bench_pending"
part bench-driver sh bench/with-gpupoold.sh "$B" sh -c 'exec "$0" --socket "$GPUPOOL_SOCKET"' "$B/bench/bench_driver"
part bench-frameworks sh -c "sh bench/with-gpupoold.sh '$B' python3 bench/frameworks/torch_alloc.py && \
        sh bench/with-gpupoold.sh '$B' python3 bench/frameworks/torch_throughput.py && \
        sh bench/with-gpupoold.sh '$B' python3 bench/frameworks/torch_elastic.py"
# The same training throughput with segments that grow in place, on cuda-vmm: what its granule
# leases, imports and moves cost a real program (each process's JSON says what its timed steps
# asked of the daemon and imported).
part bench-frameworks-grow sh -c "GPUPOOLD_ARGS='--backend cuda-vmm --log-level warn' GPUPOOL_SEGMENTS=grow \
        sh bench/with-gpupoold.sh '$B' python3 bench/frameworks/torch_throughput.py --reps 3"
# Named objects on cuda-vmm: attaching 4 GiB against loading it from the page cache onto the GPU.
part bench-objects "$B/bench/objects" --build "$B" --backend cuda-vmm --size 4294967296
echo "gpu-validate:$summary"
if [ -n "$failed" ]; then
        echo "gpu-validate: failed:$failed"
        exit 1
fi
echo "gpu-validate: every part passed"

#!/bin/sh
# gpu-validate.sh BUILD_DIR: the first run on a GPU machine, in one command (make gpu-validate).
#
# Runs, in this order (what the product promises first, then what it costs):
#
#   vmm-probe                 the driver's answers the cuda-vmm backend and the fake driver depend
#                             on (bench/vmm_probe.c: what an imported handle carries, whether the
#                             driver names allocations, whether a retained handle exports again,
#                             what a write into read-only memory does);
#   check-gpu                 the cuda backends' tests on the real driver and the framework tests
#                             (what make check-gpu runs);
#   bench-frameworks          PyTorch's allocation cost, and its training throughput through
#                             gpupool both ways against its own allocator run twice (make
#                             bench-frameworks);
#   bench-frameworks-grow     the same throughput with GPUPOOL_SEGMENTS=grow on cuda-vmm;
#   bench-frameworks-elastic  two processes whose peaks together exceed the GPU;
#   run-torch                 PyTorch with no change under gpupool-run: its limit as
#                             torch.cuda.mem_get_info()'s total, OutOfMemoryError past it, and its
#                             training throughput natively and under gpupool-run, with PyTorch's
#                             allocator and with backend:cudaMallocAsync;
#   bench-objects             attaching a 4 GiB named object against loading it from the page
#                             cache, on cuda-vmm and on the legacy cuda backend;
#   bench-gpu                 allocation latency (make bench-gpu);
#   bench-driver              the driver calls' costs and capture rules (make bench-driver);
#   bench-pending             the cost of pending stream-ordered frees (make bench-pending);
#   replay                    the traces through libgpupool (bench/replay.c) on the legacy cuda
#                             backend (whole segments) and on cuda-vmm (whole, and growing in
#                             place): round trips, imports, held/used, ns/op; and cuda-vmm's
#                             lease steps with no export kept open (export_keepalive = no);
#
# each against build/ as it is: nothing is built here, so a build made elsewhere with
# make STATIC=1 gpu-tools runs where libuv, protobuf-c and Check are not installed.
# GPU_VALIDATE_PARTS (names, space-separated) runs only those parts; GPU_VALIDATE_TRACES (files,
# space-separated) are the traces replayed: bench/traces/*.csv, the single blocks of
# bench/traces/blocks/ (one of 16 GiB) and ../shared/traces/*.csv where that folder is there.
#
# Each part's full output goes to RESULTS/gpu-validate-DATE-TIME-COMMIT-GPU-PART.txt behind a
# header (date, GPU, driver, commit; GPUPOOL_COMMIT names it where there is no .git), RESULTS
# being $GPU_VALIDATE_RESULTS or bench/results; a log that exists is never overwritten. Each
# part is stopped after GPU_VALIDATE_TIMEOUT seconds (600). GPU_VALIDATE_BUDGET (seconds, none
# by default) bounds the whole run: a part is stopped when the budget is spent, and the parts
# after it are not started, so that the logs and the closing lines are written before a
# machine lent for a fixed time is taken back. The closing lines, also kept in
# ...-summary.txt, name each part that ran with its exit status, and the parts that did not.
# Exits 1 if any part failed, 3 if none failed but the budget left some not started, 2 if there
# is no GPU, no build, an unknown part name, a bad budget or no trace to replay.
set -u
B=${1:-build}
all_parts="vmm-probe check-gpu bench-frameworks bench-frameworks-grow bench-frameworks-elastic run-torch bench-objects bench-gpu bench-driver bench-pending replay"
parts=${GPU_VALIDATE_PARTS:-$all_parts}
for p in $parts; do
        case " $all_parts " in
        *" $p "*) ;;
        *) echo "gpu-validate: no part named '$p' (GPU_VALIDATE_PARTS); the parts: $all_parts" >&2; exit 2 ;;
        esac
done
[ -n "$(echo $parts)" ] || { echo "gpu-validate: GPU_VALIDATE_PARTS names no part; the parts: $all_parts" >&2; exit 2; }
budget=${GPU_VALIDATE_BUDGET:-}
case $budget in
*[!0-9]*) echo "gpu-validate: GPU_VALIDATE_BUDGET '$budget' is not a number of seconds" >&2; exit 2 ;;
esac
traces=${GPU_VALIDATE_TRACES:-$(ls bench/traces/*.csv bench/traces/blocks/*.csv ../shared/traces/*.csv 2>/dev/null)}
# What each chosen part runs from the build.
need="gpupoold gpupoolctl libgpupool.so.1"
for p in $parts; do
        case $p in
        vmm-probe) need="$need bench/vmm_probe" ;;
        check-gpu) need="$need tests/check_gpu" ;;
        bench-gpu) need="$need bench/bench_gpu" ;;
        bench-pending) need="$need bench/bench_pending" ;;
        bench-driver) need="$need bench/bench_driver" ;;
        bench-objects) need="$need bench/objects" ;;
        run-torch) need="$need gpupool-run libgpupool-run.so" ;;
        replay) need="$need bench/replay" ;;
        esac
done
for f in $need; do
        [ -e "$B/$f" ] || { echo "gpu-validate: $B/$f is missing: build with make STATIC=1 gpu-tools first" >&2; exit 2; }
done
case " $parts " in
*" replay "*)
        [ -n "$traces" ] || { echo "gpu-validate: no trace to replay (GPU_VALIDATE_TRACES, bench/traces)" >&2; exit 2; }
        for t in $traces; do
                [ -r "$t" ] || { echo "gpu-validate: the trace $t cannot be read (GPU_VALIDATE_TRACES)" >&2; exit 2; }
        done ;;
esac
if ! nvidia-smi -L >/dev/null 2>&1; then
        echo "gpu-validate: nvidia-smi finds no GPU here; nothing to validate" >&2
        exit 2
fi
commit=${GPUPOOL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')
results=${GPU_VALIDATE_RESULTS:-bench/results}
mkdir -p "$results"
# One stem for the run's logs: its start (to the second), the commit and the GPU. A second run
# in the same second gets -2, -3...: no log is ever overwritten.
base=$results/gpu-validate-$(date -u +%Y-%m-%d-%H%M%S)-$commit-$gpu
stem=$base
n=1
while ls "$stem"-* >/dev/null 2>&1; do
        n=$((n + 1))
        stem=$base-$n
done
header() {
        echo "# gpu-validate $1, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm), $(nproc) CPUs"
        echo "# commit $commit, gpupool $("$B/gpupoold" --version | cut -d' ' -f2)"
        nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,compute_mode --format=csv,noheader | sed 's/^/# gpu: /'
        nvidia-smi -L | sed 's/^/# /'
}
part_timeout=${GPU_VALIDATE_TIMEOUT:-600}
start=$(date +%s)
failed=
passed=
late=
summary=
# part NAME COMMAND...: runs COMMAND with its output in the part's log, if NAME is one of the
# chosen parts and the budget is not spent; stops it at GPU_VALIDATE_TIMEOUT or at the end of
# the budget, whichever comes first.
part() {
        name=$1
        shift
        case " $parts " in *" $name "*) ;; *) return 0 ;; esac
        limit=$part_timeout
        why=GPU_VALIDATE_TIMEOUT
        if [ -n "$budget" ]; then
                left=$((start + budget - $(date +%s)))
                if [ $left -le 0 ]; then
                        late="$late $name"
                        return 0
                fi
                [ $left -ge "$limit" ] || { limit=$left; why="the rest of GPU_VALIDATE_BUDGET=$budget"; }
        fi
        log=$stem-$name.txt
        { header "$name"; echo "# command: $*"; } >"$log"
        timeout -k 10 "$limit" "$@" >>"$log" 2>&1
        rc=$?
        [ $rc -ne 124 ] || echo "# stopped after $limit s ($why)" >>"$log"
        echo "# exit status $rc" >>"$log"
        tail -n 3 "$log"
        summary="$summary
$name: exit $rc ($log)"
        if [ $rc -eq 0 ]; then passed="$passed $name"; else failed="$failed $name"; fi
}
export GPUPOOL_BUILD_DIR="$B"
part vmm-probe "$B/bench/vmm_probe"
part check-gpu sh -c "'$B/tests/check_gpu'; c=\$?; python3 -m unittest discover -v -s tests/gpu && exit \$c"
# PyTorch through gpupool both ways (as its allocator; its allocator over gpupool's segments)
# against PyTorch's own allocator run twice (the native/native spread), with each step's GPU
# and CPU time, allocations and memory, and the kernels' time by torch.profiler after the
# 5 repetitions.
part bench-frameworks sh -c "sh bench/with-gpupoold.sh '$B' python3 bench/frameworks/torch_alloc.py && \
        sh bench/with-gpupoold.sh '$B' python3 bench/frameworks/torch_throughput.py \
                --allocators gpupool,gpupool-mempool --profile-steps 5"
# The same training throughput with segments that grow in place, on cuda-vmm: what its granule
# leases, imports and moves cost a real program (each process's JSON says what its timed steps
# asked of the daemon and imported).
part bench-frameworks-grow sh -c "GPUPOOLD_ARGS='--backend cuda-vmm --log-level warn' GPUPOOL_SEGMENTS=grow \
        sh bench/with-gpupoold.sh '$B' python3 bench/frameworks/torch_throughput.py"
# Two processes whose peaks together exceed the GPU, with each allocator.
part bench-frameworks-elastic sh bench/with-gpupoold.sh "$B" python3 bench/frameworks/torch_elastic.py \
        --modes torch,gpupool,gpupool-mempool
# PyTorch with no change under gpupool-run, its client limited to 32 GiB.
part run-torch env GPUPOOLD_ARGS="--backend cuda --log-level warn --client-limit 32G" \
        sh bench/with-gpupoold.sh "$B" sh bench/frameworks/torch_unmodified.sh "$B" 34359738368
# Named objects: attaching 4 GiB against loading it from the page cache onto the GPU, on each
# cuda backend; both run, and the part fails if either does.
part bench-objects sh -c "'$B/bench/objects' --build '$B' --backend cuda-vmm --size 4294967296; c=\$?; \
        '$B/bench/objects' --build '$B' --backend cuda --size 4294967296 && exit \$c"
part bench-gpu sh bench/bench-gpu.sh "$B"
part bench-driver sh bench/with-gpupoold.sh "$B" sh -c 'exec "$0" --socket "$GPUPOOL_SOCKET"' "$B/bench/bench_driver"
part bench-pending sh bench/with-gpupoold.sh "$B" sh -c 'exec "$0" --socket "$GPUPOOL_SOCKET"' "$B/bench/bench_pending"
# The traces through libgpupool, one private daemon per trace and way: the legacy backend's
# whole segments, then cuda-vmm's whole and growing ones; then cuda-vmm's lease steps again
# with no export kept open (export_keepalive = no), to show what the kept one saves. All run,
# and the part fails if any does.
part replay sh -c "'$B/bench/replay' --build '$B' --backend cuda \$0 \"\$@\"; c=\$?; \
        '$B/bench/replay' --build '$B' --backend cuda-vmm \$0 \"\$@\" || c=1; \
        echo '# cuda-vmm lease steps with export_keepalive = no (bench/lease-steps-no-keepalive.conf):'; \
        '$B/bench/replay' --build '$B' --backend cuda-vmm --lease-steps \
                --daemon-conf bench/lease-steps-no-keepalive.conf || c=1; exit \$c" $traces
# The closing lines name exactly what ran: a run of some parts never reads as a run of all.
not_run=
for p in $all_parts; do
        case " $passed $failed " in *" $p "*) ;; *) not_run="$not_run $p" ;; esac
done
ran=$(echo $passed $failed | wc -w)
{
        echo "gpu-validate: commit $commit, $gpu:$summary"
        echo "gpu-validate: ran $ran of $(echo $all_parts | wc -w) parts; passed:${passed:- none}; failed:${failed:- none}; not run:${not_run:- none}"
        [ -z "$late" ] || echo "gpu-validate: GPU_VALIDATE_BUDGET=$budget s was spent before:$late"
} | tee "$stem-summary.txt"
[ -z "$failed" ] || exit 1
[ -z "$late" ] || exit 3

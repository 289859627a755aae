#!/bin/bash
# check-gpu-validate.sh: bench/gpu-validate.sh keeps every log and says exactly what it ran, on
# the fake driver behind a stand-in nvidia-smi: one part run twice leaves two logs, the closing
# line names the part that ran and the ones that did not, a failing part fails the run, the
# replay runs the traces on both cuda backends, a budget stops the part it ends in and starts
# no other, and an unknown part name, a bad budget, an unreadable trace or a missing GPU is
# refused. Environment: B (the build directory, with bench/bench_pending, bench/replay and the
# fake driver built).
set -uo pipefail
B=${B:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

say() {
        echo "check-gpu-validate: $*" >&2
        fail=1
}

mkdir -p "$tmp/bin"
cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/bin/sh
# A stand-in for nvidia-smi: one GPU, named as a query asks.
case "$*" in
-L) echo "GPU 0: Fake GPU 80GB (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
*name,driver*|*index,name*) echo "0, Fake GPU 80GB, GPU-00000000-0000-0000-0000-000000000000, 999.99, 81559 MiB, Default" ;;
*name*) echo "Fake GPU 80GB" ;;
esac
EOF
chmod +x "$tmp/bin/nvidia-smi"

# The fake GPU is as big as the stand-in says (its memory is sparse files: nothing is touched).
validate() {
        PATH="$tmp/bin:$PATH" GPU_VALIDATE_RESULTS="$tmp/results" FAKECUDA_DIR="$tmp" FAKECUDA_MEM=80G \
                GPUPOOL_LIBCUDA="$PWD/$B/tests/libfakecuda.so" GPUPOOL_COMMIT=abc1234 sh bench/gpu-validate.sh "${1:-$B}" >"$tmp/out" 2>&1
}

# One part, twice: two sets of logs, the first kept.
for run in 1 2; do
        GPU_VALIDATE_PARTS=bench-pending validate
        rc=$?
        [ $rc -eq 0 ] || { say "run $run of bench-pending exited $rc:"; cat "$tmp/out" >&2; }
        grep -q "^gpu-validate: ran 1 of 11 parts; passed: bench-pending; failed: none; not run: vmm-probe check-gpu bench-frameworks bench-frameworks-grow bench-frameworks-elastic run-torch bench-objects bench-gpu bench-driver replay$" "$tmp/out" ||
                { say "run $run: the closing line does not name exactly what ran:"; tail -3 "$tmp/out" >&2; }
done
logs=$(ls "$tmp/results"/gpu-validate-*-abc1234-Fake-GPU-80GB*-bench-pending.txt 2>/dev/null | wc -l)
[ "$logs" -eq 2 ] || { say "two runs left $logs bench-pending logs, not 2:"; ls "$tmp/results" >&2; }
sums=$(ls "$tmp/results"/gpu-validate-*-summary.txt 2>/dev/null | wc -l)
[ "$sums" -eq 2 ] || say "two runs left $sums summaries, not 2"
for f in "$tmp/results"/gpu-validate-*-bench-pending.txt; do
        grep -q "^# commit abc1234," "$f" || say "$f: no commit in its header"
        grep -q "^# exit status 0$" "$f" || say "$f: no exit status 0"
        grep -q "event queries/pair" "$f" || say "$f: no bench-pending output"
done

# The replay: one trace on the legacy backend (whole segments only) and on cuda-vmm (whole and
# growing), and cuda-vmm's lease steps with no export kept open, in one log.
GPU_VALIDATE_PARTS=replay GPU_VALIDATE_TRACES=bench/traces/inference.csv validate
rc=$?
[ $rc -eq 0 ] || { say "the replay exited $rc:"; cat "$tmp/out" >&2; }
log=$(ls "$tmp/results"/gpu-validate-*-replay.txt 2>/dev/null | head -1)
if [ -z "$log" ]; then
        say "the replay left no log"
else
        grep -q "^# backend cuda (whole segments only" "$log" || say "$log: no legacy cuda replay"
        grep -q "^# backend cuda-vmm$" "$log" || say "$log: no cuda-vmm replay"
        grep -q "^# cuda-vmm lease steps with export_keepalive = no" "$log" || say "$log: no lease steps without the kept export"
        n=$(grep -c "^inference  *process " "$log")
        [ "$n" -eq 2 ] || say "$log: $n whole-segment rows, not 2 (one per backend)"
        n=$(grep -c "^inference  *grow " "$log")
        [ "$n" -eq 1 ] || say "$log: $n growing rows, not 1 (cuda-vmm's)"
fi

# A budget: the part it ends in is stopped and says why, the next is not started, and the run
# says which parts the budget left (exit 1: a part failed). A stand-in build whose probe never
# ends plays the slow part.
mkdir -p "$tmp/slow/bench"
for f in gpupoold gpupoolctl libgpupool.so.1 bench/bench_pending; do
        ln -s "$PWD/$B/$f" "$tmp/slow/$f"
done
printf '#!/bin/sh\nexec sleep 600\n' >"$tmp/slow/bench/vmm_probe"
chmod +x "$tmp/slow/bench/vmm_probe"
t0=$(date +%s)
GPU_VALIDATE_PARTS="vmm-probe bench-pending" GPU_VALIDATE_BUDGET=3 validate "$tmp/slow"
rc=$?
took=$(($(date +%s) - t0))
[ $rc -eq 1 ] || { say "a part stopped by the budget: exit $rc, not 1"; cat "$tmp/out" >&2; }
[ $took -lt 60 ] || say "a budget of 3 s took $took s"
grep -q "^gpu-validate: GPU_VALIDATE_BUDGET=3 s was spent before: bench-pending$" "$tmp/out" ||
        { say "the run does not name the part the budget left:"; tail -3 "$tmp/out" >&2; }
grep -q "passed: none; failed: vmm-probe; not run:.* bench-pending" "$tmp/out" ||
        { say "the stopped part is not named failed, or the late one run:"; tail -3 "$tmp/out" >&2; }
log=$(ls "$tmp/results"/gpu-validate-*-vmm-probe.txt 2>/dev/null | head -1)
[ -n "$log" ] && grep -q "^# stopped after [0-9]* s (the rest of GPU_VALIDATE_BUDGET=3)$" "$log" ||
        say "the stopped part's log does not say the budget stopped it"
logs=$(ls "$tmp/results"/gpu-validate-*-bench-pending.txt 2>/dev/null | wc -l)
[ "$logs" -eq 2 ] || say "the part the budget left has a log: $logs bench-pending logs, not the first runs' 2"
# A budget spent before the first part: nothing runs, and the run exits 3.
GPU_VALIDATE_PARTS=bench-pending GPU_VALIDATE_BUDGET=0 validate
rc=$?
[ $rc -eq 3 ] && grep -q "^gpu-validate: GPU_VALIDATE_BUDGET=0 s was spent before: bench-pending$" "$tmp/out" ||
        { say "a spent budget: exit $rc"; cat "$tmp/out" >&2; }

# A part that fails fails the run, and says so.
GPU_VALIDATE_PARTS=bench-pending GPUPOOL_LIBCUDA=/nonexistent/libcuda.so.1 PATH="$tmp/bin:$PATH" \
        GPU_VALIDATE_RESULTS="$tmp/results" sh bench/gpu-validate.sh "$B" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 1 ] || say "a failing part: exit $rc, not 1"
grep -q "passed: none; failed: bench-pending;" "$tmp/out" || { say "a failing part is not named failed:"; tail -2 "$tmp/out" >&2; }

# Refusals: an unknown part, no GPU.
GPU_VALIDATE_PARTS="bench-pending check-gpus" validate
rc=$?
[ $rc -eq 2 ] && grep -q "no part named 'check-gpus'" "$tmp/out" || { say "an unknown part: exit $rc"; cat "$tmp/out" >&2; }
GPU_VALIDATE_PARTS=bench-pending GPU_VALIDATE_BUDGET=10m validate
rc=$?
[ $rc -eq 2 ] && grep -q "GPU_VALIDATE_BUDGET '10m' is not a number of seconds" "$tmp/out" || { say "a bad budget: exit $rc"; cat "$tmp/out" >&2; }
GPU_VALIDATE_PARTS=replay GPU_VALIDATE_TRACES="bench/traces/inference.csv $tmp/none.csv" validate
rc=$?
[ $rc -eq 2 ] && grep -q "the trace $tmp/none.csv cannot be read" "$tmp/out" || { say "an unreadable trace: exit $rc"; cat "$tmp/out" >&2; }
GPU_VALIDATE_PARTS=bench-pending PATH="/usr/bin:/bin" sh bench/gpu-validate.sh "$B" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "finds no GPU" "$tmp/out" || { say "no GPU: exit $rc"; cat "$tmp/out" >&2; }

[ $fail -eq 0 ] && echo "check-gpu-validate: OK (gpu-validate keeps every log, names what it ran and keeps to its budget)"
exit $fail

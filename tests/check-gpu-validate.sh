#!/bin/bash
# check-gpu-validate.sh: bench/gpu-validate.sh keeps every log and says exactly what it ran, on
# the fake driver behind a stand-in nvidia-smi: one part run twice leaves two logs, the closing
# line names the part that ran and the ones that did not, a failing part fails the run, and an
# unknown part name or a missing GPU is refused. Environment: B (the build directory, with
# bench/bench_pending and the fake driver built).
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

validate() {
        PATH="$tmp/bin:$PATH" GPU_VALIDATE_RESULTS="$tmp/results" FAKECUDA_DIR="$tmp" GPUPOOL_LIBCUDA="$PWD/$B/tests/libfakecuda.so" \
                GPUPOOL_COMMIT=abc1234 sh bench/gpu-validate.sh "$B" >"$tmp/out" 2>&1
}

# One part, twice: two sets of logs, the first kept.
for run in 1 2; do
        GPU_VALIDATE_PARTS=bench-pending validate
        rc=$?
        [ $rc -eq 0 ] || { say "run $run of bench-pending exited $rc:"; cat "$tmp/out" >&2; }
        grep -q "^gpu-validate: ran 1 of 9 parts; passed: bench-pending; failed: none; not run: vmm-probe check-gpu bench-gpu bench-driver bench-frameworks bench-frameworks-elastic bench-frameworks-grow bench-objects$" "$tmp/out" ||
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
GPU_VALIDATE_PARTS=bench-pending PATH="/usr/bin:/bin" sh bench/gpu-validate.sh "$B" >"$tmp/out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "finds no GPU" "$tmp/out" || { say "no GPU: exit $rc"; cat "$tmp/out" >&2; }

[ $fail -eq 0 ] && echo "check-gpu-validate: OK (gpu-validate keeps every log and names what it ran)"
exit $fail

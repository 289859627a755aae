#!/usr/bin/env bash
# A long fuzzing campaign that grows the committed seed corpus (make fuzz-campaign; not in CI):
# each target runs RUNS inputs over JOBS processes from tests/fuzz/corpus/TARGET, and what they
# found that adds coverage is merged back into it (libFuzzer's -merge=1 keeps the corpus's own
# files and adds only inputs that reach something new). A crash stops the campaign, its input
# kept in FB. Prints, per target, the inputs run, their rate and the corpus before and after.
# MAX_LEN bounds an input (CI's 8192 by default; shorter inputs run faster).
#   usage: FB=build/fuzz RUNS=10000000 JOBS=2 MAX_LEN=8192 tests/fuzz/campaign.sh protocol pool identity
set -euo pipefail

FB=${FB:-build/fuzz}
RUNS=${RUNS:-10000000}
JOBS=${JOBS:-2}
MAX_LEN=${MAX_LEN:-8192}

for t in "$@"; do
        work=$FB/campaign/$t
        corpus=tests/fuzz/corpus/$t
        mkdir -p "$work" "$corpus"
        cp -n "$corpus"/* "$work"/ 2>/dev/null || true
        before=$(ls "$corpus" | wc -l)
        start=$(date +%s)
        pids=()
        for j in $(seq "$JOBS"); do
                "$FB/fuzz_$t" -runs=$((RUNS / JOBS)) -max_len="$MAX_LEN" -print_final_stats=1 \
                        -artifact_prefix="$FB/crash-$t-" "$work" > "$FB/campaign/$t-$j.log" 2>&1 &
                pids+=($!)
        done
        failed=0
        for p in "${pids[@]}"; do
                wait "$p" || failed=1
        done
        runs=$(grep -h "^stat::number_of_executed_units" "$FB/campaign/$t"-*.log | awk '{ n += $2 } END { print n + 0 }')
        secs=$(( $(date +%s) - start ))
        if [ "$failed" != 0 ]; then
                echo "fuzz_$t: a job failed after $runs inputs: see $FB/campaign/$t-*.log and $FB/crash-$t-*" >&2
                exit 1
        fi
        "$FB/fuzz_$t" -merge=1 -max_len=8192 "$corpus" "$work" > "$FB/campaign/$t-merge.log" 2>&1
        echo "fuzz_$t: $runs inputs of up to $MAX_LEN bytes in $secs s ($((runs / (secs > 0 ? secs : 1)))/s) over $JOBS" \
                "processes, no crash;" \
                "corpus $before -> $(ls "$corpus" | wc -l) inputs"
done

#!/bin/bash
# check-newcomer.sh: what a newcomer meets first holds.
#   - A second "make" with nothing changed does nothing (MAKE, and the build's variables as
#     arguments: SANITIZER=, STATIC=).
#   - The numbers the docs state about limits are the code's constants: a small program prints
#     them from the headers, and each sentence below must appear, with those values, in its file
#     (whitespace and line breaks aside).
#   - The README's C example, built with the README's flags, run with no daemon, says where it
#     looked and what to do; run against a daemon, it allocates and frees, says so, and exits 0.
#   - CK_RUN_SUITE names a known suite, and one suite runs from outside the checkout; tests
#     that fail with a daemon up leave no process and no file behind.
# Environment: B (the build directory), CC, SANITIZER (as make test's), MAKE.
set -euo pipefail
B=${B:-build}
CC=${CC:-cc}
tmp=$(mktemp -d)
daemon_pid=
trap '[ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null; rm -rf "$tmp"' EXIT
MAKE=${MAKE:-make}
san=()
[ -n "${SANITIZER:-}" ] && san=(-fsanitize="$SANITIZER")
fail=0

# make test built everything first: one more "make" has nothing to do, and says nothing.
again=$($MAKE --no-print-directory all "$@" 2>&1)
if [ -n "$again" ]; then
        echo "check-newcomer: a second make with nothing changed did something:" >&2
        echo "$again" | head -5 >&2
        fail=1
fi

cat >"$tmp/constants.c" <<'PROG'
#include <stdio.h>
#include "client_common.h"
#include "closer.h"
#include "metrics.h"
#include "node.h"
#include "objects.h"
#include "options.h"
#include "reclaim.h"
#include "wire.h"
#define SHOW(x) printf("%s=%llu\n", #x, (unsigned long long) (x))
int main(void) {
        SHOW(OPTIONS_FDS_PER_CLIENT); SHOW(OPTIONS_FDS_FIXED); SHOW(OPTIONS_DEFAULT_MAX_CLIENTS);
        SHOW(OPTIONS_DEFAULT_MAX_CLIENTS_PER_UID); SHOW(OPTIONS_DEFAULT_HELLO_TIMEOUT_MS / 1000);
        SHOW(NODE_OPERATOR_ROOM); SHOW(GP_MAX_REQUEST_BYTES); SHOW(GP_MAX_NAME_BYTES);
        SHOW(GP_MAX_LEASE_GRANULES); SHOW(RECLAIM_MAX_SEGMENTS); SHOW(CLIENT_RETURN_BATCH); SHOW(CLIENT_PIPELINE);
        SHOW(METRICS_TEXT_MAX / 1024); SHOW(OBJECTS_MAX); SHOW(GP_MAX_OBJECT_NAME_BYTES);
        SHOW(OBJECTS_PER_HOLDER); SHOW(CLOSER_THREADS); SHOW(CLOSER_PER_SENDER);
        return 0;
}
PROG
"$CC" -std=gnu11 -DGP_SYSCONFDIR='"/etc"' -Iinclude -Icommon -Idaemon -Iclient -I"$B/proto" \
        -o "$tmp/constants" "$tmp/constants.c"
declare -A value
while IFS== read -r name v; do value[$name]=$v; done < <("$tmp/constants")

# file|sentence, {NAME} standing for the constant's value.
checks=(
        "docs/cli.md|Each can hold {OPTIONS_FDS_PER_CLIENT} of the daemon's file descriptors"
        "docs/cli.md|raised to {OPTIONS_FDS_FIXED} + {OPTIONS_FDS_PER_CLIENT} per client"
        "docs/cli.md|\`[daemon] max_clients\` | {OPTIONS_DEFAULT_MAX_CLIENTS} |"
        "docs/cli.md|\`[daemon] max_clients_per_uid\` | {OPTIONS_DEFAULT_MAX_CLIENTS_PER_UID} |"
        "docs/cli.md|by {NODE_OPERATOR_ROOM} connections of gpupoolctl"
        "docs/man/gpupoold.8.scd|({OPTIONS_FDS_PER_CLIENT} per client, {OPTIONS_FDS_FIXED} besides"
        "docs/man/gpupoold.8.scd|by {NODE_OPERATOR_ROOM} connections of gpupoolctl"
        "docs/operations.md|Each client can make the daemon hold {OPTIONS_FDS_PER_CLIENT} file descriptors"
        "docs/operations.md|The daemon holds {OPTIONS_FDS_FIXED} besides"
        "docs/operations.md|always have {NODE_OPERATOR_ROOM} connections"
        "docs/security.md|request packets ({GP_MAX_REQUEST_BYTES} bytes), names ({GP_MAX_NAME_BYTES} bytes of UTF-8)"
        "docs/security.md|(\`--max-clients\`, {OPTIONS_DEFAULT_MAX_CLIENTS}), connections per user or pod (\`max_clients_per_uid\`, {OPTIONS_DEFAULT_MAX_CLIENTS_PER_UID})"
        "docs/security.md|\`max_clients_per_uid\` ({OPTIONS_DEFAULT_MAX_CLIENTS_PER_UID}) refuses the rest"
        "docs/security.md|\`hello_timeout\` ({OPTIONS_DEFAULT_HELLO_TIMEOUT_MS / 1000} s)"
        "docs/security.md|get {NODE_OPERATOR_ROOM} connections past both limits"
        "docs/design.md|gets {NODE_OPERATOR_ROOM} connections past both"
        "docs/design.md|up to {GP_MAX_LEASE_GRANULES} segments of 2 MiB"
        "docs/design.md|up to {CLIENT_PIPELINE} unanswered (\`CLIENT_PIPELINE\`)"
        "docs/design.md|at most {RECLAIM_MAX_SEGMENTS} per answer"
        "docs/protocol.md|a return of over {CLIENT_RETURN_BATCH} segments"
        "docs/protocol.md|at most {METRICS_TEXT_MAX / 1024} KiB (\`METRICS_TEXT_MAX\`)"
        "docs/protocol.md|at most {OBJECTS_MAX} objects on a node"
        "docs/protocol.md|(1 to {GP_MAX_OBJECT_NAME_BYTES} bytes of UTF-8, no control characters nor any"
        "docs/design.md|At most {OBJECTS_MAX} objects on a node."
        "docs/design.md|One holder has at most {OBJECTS_PER_HOLDER} of them (\`OBJECTS_PER_HOLDER\`)"
        "docs/design.md|(up to {CLOSER_THREADS}, each with a 256 KiB stack)"
        "docs/design.md|closes what one user sent on at most {CLOSER_PER_SENDER} threads at once"
)
for c in "${checks[@]}"; do
        file=${c%%|*}
        want=${c#*|}
        for name in "${!value[@]}"; do
                want=${want//\{$name\}/${value[$name]}}
        done
        if [[ $want == *"{"* ]]; then
                echo "check-newcomer: no constant for '$want'" >&2
                fail=1
        elif ! tr -s ' \t\n' '   ' <"$file" | grep -qF -- "$want"; then
                echo "check-newcomer: $file does not say '$want' (the code's value)" >&2
                fail=1
        fi
done

# The README's C example, built with the README's flags (the build directory and compiler as make test's).
readme_build='cc example.c -Iinclude -Lbuild -lgpupool -Wl,-rpath,$PWD/build'
grep -qF -- "$readme_build" README.md || { echo "check-newcomer: the README no longer builds its example with '$readme_build'" >&2; exit 1; }
awk '/^```c$/ {on = 1; next} /^```$/ && on {exit} on' README.md >"$tmp/example.c"
"$CC" "${san[@]}" "$tmp/example.c" -Iinclude -L"$B" -lgpupool -Wl,-rpath,"$PWD/$B" -o "$tmp/example"

# No daemon: it says where it looked and what to do, and exits 1.
if out=$(GPUPOOL_SOCKET="$tmp/absent.sock" "$tmp/example" 2>&1); then
        echo "check-newcomer: the README's example exited 0 with no daemon" >&2
        fail=1
elif [[ $out != *"no gpupoold listens at $tmp/absent.sock"*"start it, or set \$GPUPOOL_SOCKET"* ]]; then
        echo "check-newcomer: with no daemon the README's example said: $out" >&2
        fail=1
fi
# A daemon: it allocates and frees a block, and exits 0.
"$B/gpupoold" --backend host --host-capacity 64M --socket "$tmp/gpupool.sock" --log-level error &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$tmp/gpupool.sock" ] && break; sleep 0.05; done
if ! out=$(GPUPOOL_SOCKET="$tmp/gpupool.sock" "$tmp/example" 2>&1); then
        echo "check-newcomer: the README's example failed against a daemon: $out" >&2
        fail=1
elif [[ $out != "allocated 1 MiB at 0x"*" on device 0 (host backend)"$'\n'"freed it" ]]; then
        echo "check-newcomer: against a daemon the README's example printed: $out" >&2
        fail=1
fi

# The suites' runner: an unknown CK_RUN_SUITE is an error naming the suites; run from outside
# the checkout with no GPUPOOL_BUILD_DIR, it finds its build from its own path.
if out=$(CK_RUN_SUITE=nosuch "$B/tests/check_gpupool" 2>&1) || [[ $out != *"no suite named 'nosuch'"*" daemon "* ]]; then
        echo "check-newcomer: CK_RUN_SUITE=nosuch said: $out" >&2
        fail=1
fi
abs_b=$(cd "$B" && pwd)
mkdir "$tmp/t"
chmod 755 "$tmp" "$tmp/t"   # the suites switch to other uids, which must reach their sockets
if ! out=$(cd "$tmp" && env -u GPUPOOL_BUILD_DIR TMPDIR="$tmp/t" CK_RUN_SUITE=daemon "$abs_b/tests/check_gpupool" 2>&1) ||
        [[ $out != *"100%: Checks: "* ]]; then
        echo "check-newcomer: the daemon suite run from outside the checkout: $out" >&2
        fail=1
fi
# Tests that fail with their daemon up leave no process and no file: the runner's directory goes.
shm_before=$(ls -d /dev/shm/gpupool-run-* 2>/dev/null || true)
out=$(TMPDIR="$tmp/t" GPUPOOL_TEST_FAIL_AT_START=1 CK_RUN_SUITE=daemon "$B/tests/check_gpupool" 2>&1) || true
shm_after=$(ls -d /dev/shm/gpupool-run-* 2>/dev/null || true)
if [[ $out != *"failing on purpose after the daemon started"* ]]; then
        echo "check-newcomer: the daemon suite did not fail on purpose: $out" >&2
        fail=1
elif [ -n "$(ls -A "$tmp/t")" ] || [ "$shm_after" != "$shm_before" ] || pgrep -f "gpupoold --socket $tmp/t/" >/dev/null; then
        echo "check-newcomer: failed tests left behind: $(ls -A "$tmp/t") $shm_after $(pgrep -af "gpupoold --socket $tmp/t/")" >&2
        fail=1
fi

[ "$fail" = 0 ] && echo "check-newcomer: a second make does nothing; ${#checks[@]} statements of limits in the docs match the code; the README's example runs with and without a daemon; one suite runs from anywhere, an unknown one is refused, failed tests leave nothing"
exit "$fail"

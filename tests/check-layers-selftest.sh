#!/bin/bash
# check-layers-selftest.sh: make layers fails where it must, on copies of the LAYERS files broken
# on purpose (the real objects): a call up the order (two of the library's layers swapped), a
# file no layer names, a name with no object, a file docs/design.md does not name, and the CUDA
# driver's header included above the library's seam; and it
# passes on the copies as they are. Environment: B (the build directory, its objects made).
set -uo pipefail
B=${B:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# A copy of what check-layers.sh reads, with edit (a sed script) applied to file.
broken() {
        rm -rf "$tmp/root"
        mkdir -p "$tmp/root/docs"
        for d in common daemon client; do
                mkdir -p "$tmp/root/$d"
                cp "$d/LAYERS" "$d"/*.[ch] "$tmp/root/$d/"
        done
        cp docs/design.md "$tmp/root/docs/design.md"
        [ -n "$1" ] && sed -i "$2" "$tmp/root/$1"
}

# Runs the check on the broken copy; it must fail, saying want.
expect() {
        local out
        if out=$(LAYERS_ROOT="$tmp/root" bash tests/check-layers.sh "$B" 2>&1); then
                echo "check-layers-selftest: $1: make layers passed" >&2
                fail=1
        elif [[ $out != *"$2"* ]]; then
                echo "check-layers-selftest: $1: make layers did not say '$2':" >&2
                echo "$out" | head -5 >&2
                fail=1
        fi
}

broken "" ""
if ! LAYERS_ROOT="$tmp/root" bash tests/check-layers.sh "$B" >/dev/null 2>&1; then
        echo "check-layers-selftest: make layers fails on unbroken copies" >&2
        fail=1
fi
broken client/LAYERS 's/^client_pool /client_poolX /; s/^client_stream /client_pool /; s/^client_poolX /client_stream /'
expect "two layers swapped" "client/client_pool.c calls up to client/client_stream.c (client_stream_collect)"
broken client/LAYERS '/^client_keep /d'
expect "a file left out" "client/client_keep.c is in no layer of"
broken daemon/LAYERS '$a ghost'
expect "a name with no object" "names ghost, which $B/obj/daemon has no object of"
broken docs/design.md 's/\bobjects\.c\b//g'
expect "a file the docs leave out" "docs/design.md does not name daemon/objects.c"
broken client/client_stream.c 's/^#include "client_grow.h"/#include "client_cuda.h"\n&/'
expect "the driver above the seam" "client/client_stream.c names the CUDA driver above the seam"

[ "$fail" = 0 ] && echo "check-layers-selftest: make layers refuses a call up its order, a file left out, a name with no object, a file the docs leave out and the driver above a seam"
exit "$fail"

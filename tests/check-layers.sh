#!/bin/bash
# make layers: calls go down only. For each directory with a LAYERS file (its files, top layer
# first; files on one line are peers), the file graph is built from the objects' symbols (who
# defines a name, who uses it; nm), and the check fails on
#   - a call up the declared order (a file using a name a file above it defines),
#   - a circle among the files of one layer,
#   - a file of the directory its LAYERS leaves out (or one LAYERS names that is not there),
#   - a name of another directory used where the directories' order forbids it: common/ uses
#     nothing of the others, and daemon/ and client/ nothing of each other,
#   - a file of a LAYERS that docs/design.md's tables of layers do not name,
#   - a file above a seam that includes the CUDA driver's header or names its types.
# Calls through a table of functions (backend.h, client_mem.h) are not names and are not seen.
# Usage: tests/check-layers.sh BUILD_DIR. $LAYERS_ROOT (default .) is where the LAYERS files,
# the sources the seam rule reads and docs/design.md are read from: tests/check-layers-selftest.sh points it at broken copies.
set -uo pipefail
B=${1:-build}
R=${LAYERS_ROOT:-.}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# "dir file kind name" for every object: D (defines) or U (uses).
for dir in common daemon client cli; do
        for o in "$B/obj/$dir"/*.o; do
                f=$(basename "$o" .o)
                [ -e "$o" ] && [ -e "$dir/$f.c" ] || continue   # an object of a file since removed: not the tree's
                nm --defined-only -g "$o" | awk -v d="$dir" -v f="$f" 'NF >= 3 {print d, f, "D", $3}'
                nm -u "$o" | awk -v d="$dir" -v f="$f" '{print d, f, "U", $NF}'
        done
done > "$tmp/syms"
# The generated protocol code sits under everything.
for o in "$B"/obj/proto/*.o; do
        nm --defined-only -g "$o" | awk '{print "proto", "gpupool.pb-c", "D", $3}'
done >> "$tmp/syms"
# "user_dir user_file definer_dir definer_file name" for every use of a name the tree defines.
awk '$3 == "D" {def[$4] = $1 " " $2; next}
     {use[++n] = $0}
     END {for (i = 1; i <= n; i++) {split(use[i], u, " "); if (u[4] in def) {split(def[u[4]], d, " ");
          if (d[1] != u[1] || d[2] != u[2]) print u[1], u[2], d[1], d[2], u[4]}}}' "$tmp/syms" | sort -u > "$tmp/edges"

# Across directories.
awk '($1 == "common" && $3 != "common" && $3 != "proto") ||
     ($1 == "daemon" && ($3 == "client" || $3 == "cli")) ||
     ($1 == "client" && ($3 == "daemon" || $3 == "cli")) ||
     ($1 == "cli" && $3 == "daemon") {
        printf "layers: %s/%s.o uses %s of %s/%s.o: the directories call down only (common at the bottom)\n", $1, $2, $5, $3, $4; bad = 1}
     END {exit bad}' "$tmp/edges" || fail=1

for dir in common daemon client; do
        layers="$R/$dir/LAYERS"
        if [ ! -f "$layers" ]; then
                echo "layers: $layers is missing"
                fail=1
                continue
        fi
        # "file layer" from the LAYERS file: comments and blank lines skipped, top layer first.
        awk '{sub(/#.*/, "")} NF {n++; for (i = 1; i <= NF; i++) print $i, n}' "$layers" > "$tmp/$dir.order"
        for o in "$B/obj/$dir"/*.o; do f=$(basename "$o" .o); [ -e "$dir/$f.c" ] && echo "$f"; done | sort > "$tmp/$dir.objs"
        cut -d' ' -f1 "$tmp/$dir.order" | sort > "$tmp/$dir.declared"
        for f in $(comm -23 "$tmp/$dir.objs" "$tmp/$dir.declared"); do
                echo "layers: $dir/$f.c is in no layer of $layers"
                fail=1
        done
        for f in $(comm -13 "$tmp/$dir.objs" "$tmp/$dir.declared"); do
                echo "layers: $layers names $f, which $B/obj/$dir has no object of"
                fail=1
        done
        # Calls up the order, and circles within a layer (Floyd-Warshall's closure: a few dozen files).
        awk -v dir="$dir" -v layers="$layers" '
                FILENAME ~ /\.order$/ {layer[$1] = $2; next}
                $1 == dir && $3 == dir {
                        if (!($2 in layer) || !($4 in layer)) next
                        if (layer[$2] > layer[$4]) {
                                printf "layers: %s/%s.c calls up to %s/%s.c (%s): %s puts it below\n", dir, $2, dir, $4, $5, layers
                                bad = 1
                        }
                        if (!(($2, $4) in why)) why[$2, $4] = $5
                        else if (index(why[$2, $4], $5) == 0) why[$2, $4] = why[$2, $4] ", " $5
                        reach[$2, $4] = 1
                }
                END {
                        for (f in layer) names[++n] = f
                        for (k = 1; k <= n; k++) for (i = 1; i <= n; i++) if ((names[i], names[k]) in reach)
                                for (j = 1; j <= n; j++) if ((names[k], names[j]) in reach) reach[names[i], names[j]] = 1
                        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) {
                                a = names[i]; b = names[j]
                                if ((a, b) in reach && (b, a) in reach) {
                                        printf "layers: %s/%s.c and %s/%s.c call each other (a circle)", dir, a, dir, b
                                        if ((a, b) in why) printf "; %s uses %s", a, why[a, b]
                                        if ((b, a) in why) printf "; %s uses %s", b, why[b, a]
                                        printf "\n"
                                        bad = 1
                                }
                        }
                        exit bad
                }' "$tmp/$dir.order" "$tmp/edges" || fail=1
done

# The GPU driver stays below each directory's seam (client_mem.h, backend.h): only the driver's
# own files, and the seam's file whose tables point at them, include its header or name its
# types, so that a second vendor's backend is one more table and one more driver file.
while read -r dir allowed; do
        for src in "$R/$dir"/*.[ch]; do
                [ -e "$src" ] || continue
                f=$(basename "${src%.*}")
                [[ " $allowed " == *" $f "* ]] && continue
                if hit=$(grep -n -m1 -E 'cudadrv\.h|client_cuda\.h|backend_cuda\.h|\b(gp_cu_|GP_CU_|gp_cuda|GP_CUDA_)' "$src"); then
                        echo "layers: $dir/$(basename "$src") names the CUDA driver above the seam (line ${hit%%:*}): only $allowed may"
                        fail=1
                fi
        done
done <<'SEAMS'
client client_mem client_cuda
daemon backend_cuda backend_cuda_vmm
SEAMS

# docs/design.md's tables of layers name every file the LAYERS files do.
for dir in common daemon client; do
        [ -f "$tmp/$dir.order" ] || continue
        for f in $(cut -d' ' -f1 "$tmp/$dir.order"); do
                if ! grep -q "\b$f\.c\b" "$R/docs/design.md"; then
                        echo "layers: docs/design.md does not name $dir/$f.c, which $dir/LAYERS puts in a layer"
                        fail=1
                fi
        done
done

if [ "$fail" = 0 ]; then
        echo "layers: $(wc -l < "$tmp/edges") uses of names between files, every one down the declared order, no circle"
fi
exit "$fail"

#!/bin/bash
# check-man.sh: each man page documents what its program really accepts, no more, no less:
# gpupoold's options (from --help), gpupoolctl's options and commands, the config keys the
# daemon accepts (a file with every documented key passes --check-config; the example file's
# keys are the page's), libgpupool's exported functions and the environment it reads.
set -euo pipefail
B=${B:-build}
fail=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# The same set, or say what differs. $1: what; $2, $3: files of one name per line.
same() {
        local what=$1 prog=$2 page=$3 d
        d=$(diff <(sort -u "$prog") <(sort -u "$page") || true)
        if [ -n "$d" ]; then
                echo "check-man: $what differ (< accepted but not documented, > documented but not accepted):" >&2
                echo "$d" | grep '^[<>]' >&2
                fail=1
        fi
}

# A section of a page: the lines after "# NAME" up to the next "# ".
section() {
        awk -v s="# $2" '$0 == s { on = 1; next } /^# / { on = 0 } on' "docs/man/$1"
}

for p in docs/man/*.scd; do
        scdoc <"$p" >/dev/null || { echo "check-man: scdoc rejects $p" >&2; fail=1; }
done

# An option's line may name its short form first: "  -h, --help".
"$B/gpupoold" --help | grep -oE '^  (-[a-z], )?--[a-z-]+' | sed 's/^ *//; s/^-[a-z], //' >"$dir/d.prog"
section gpupoold.8.scd OPTIONS | grep -oE '^\*(-[a-z]\*, \*)?--[a-z-]+\*' | sed 's/^\*-[a-z]\*, //' | tr -d '*' >"$dir/d.page"
same "gpupoold's options and gpupoold(8)" "$dir/d.prog" "$dir/d.page"

"$B/gpupoolctl" --help | awk '/^Options:/ { on = 1; next } on' | grep -oE '^  (-[a-z], )?--[a-z-]+' | sed 's/^ *//; s/^-[a-z], //' >"$dir/c.prog"
section gpupoolctl.1.scd OPTIONS | grep -oE '^\*(-[a-z]\*, \*)?--[a-z-]+\*' | sed 's/^\*-[a-z]\*, //' | tr -d '*' >"$dir/c.page"
same "gpupoolctl's options and gpupoolctl(1)" "$dir/c.prog" "$dir/c.page"
# A command's line starts two spaces in; a summary on a line of its own is further in.
"$B/gpupoolctl" --help | awk '/^Commands:/ { on = 1; next } /^$/ { on = 0 } on && /^  [a-z]/ { print $1 }' >"$dir/cc.prog"
section gpupoolctl.1.scd COMMANDS | grep -oE '^\*[a-z-]+\*' | tr -d '*' >"$dir/cc.page"
same "gpupoolctl's commands and gpupoolctl(1)" "$dir/cc.prog" "$dir/cc.page"

# gpupool-run's usage names each option in brackets; --help is the page's too.
{ "$B/gpupool-run" --help | grep -oE '\[--[a-z-]+' | tr -d '['; echo --help; } | sort >"$dir/r.prog"
section gpupool-run.1.scd OPTIONS | grep -oE '^\*(-[a-z]\*, \*)?--[a-z-]+\*' | sed 's/^\*-[a-z]\*, //' | tr -d '*' | sort >"$dir/r.page"
same "gpupool-run's options and gpupool-run(1)" "$dir/r.prog" "$dir/r.page"

# Config keys: the page's [section] keys against the example file's; then every documented key,
# set to a sample value, must pass gpupoold --check-config (an unknown key is an error there).
awk '/^# \[(daemon|pool|limits)\]$/ { s = substr($2, 2, length($2) - 2); next }
     /^# \[tenant:NAME\]$/ { s = "tenant"; next }
     /^# / { s = "" }
     s != "" && /^\*[a-z_]+\* =/ { k = $1; gsub(/\*/, "", k); print s "." k }' docs/man/gpupoold.conf.5.scd >"$dir/k.page"
awk '/^\[/ { s = substr($1, 2, length($1) - 2); next }
     /^[a-z_]+ =/ && s != "" { print s "." $1 }
     /^# \[tenant:NAME\]/ { t = 1; next }
     t && /^# [a-z_]+ =/ { print "tenant." $2 }
     t && /^#$/ { t = 0 }' systemd/gpupoold.conf.example >"$dir/k.example"
same "the example config's keys and gpupoold.conf(5)" "$dir/k.example" "$dir/k.page"
declare -A sample=([socket]="$dir/s.sock" [backend]=host [host_capacity]=64M [log_level]=info [max_clients]=8
        [send_timeout]=10s [hello_timeout]=10s [max_clients_per_uid]=64 [check_invariants]=no [state_dir]="$dir" [headroom]=512M [idle_release]=5min [idle_objects]=10min [max_cached]=25% [granule_stock]=64 [export_keepalive]=yes
        [reclaim_timeout]=100ms [metrics_listen]=127.0.0.1:9464 [client_max]=1G [match_uid]=0 [match_gid]=0 [match_name]=x [match_cgroup]=/system.slice/x.service
        [max]=1G [guarantee]=0 [device]=0)
cur=""
while IFS=. read -r s k; do
        if [ "$s" != "$cur" ]; then
                [ "$s" = tenant ] && echo "[tenant:check]" || echo "[$s]"
                cur=$s
        fi
        [ -n "${sample[$k]:-}" ] || { echo "check-man: no sample value for documented key $k" >&2; fail=1; continue; }
        echo "$k = ${sample[$k]}"
done <"$dir/k.page" >"$dir/all.conf"
out=$("$B/gpupoold" --config "$dir/all.conf" --check-config 2>&1) ||
        { echo "check-man: a config of every key gpupoold.conf(5) documents is refused: $out" >&2; fail=1; }

# libgpupool(3): the exported functions and the environment variables the library reads.
grep -oE '^GPUPOOL_EXPORT [^(]*\bgpupool_[a-z_]+\(' include/gpupool.h | grep -oE 'gpupool_[a-z_]+' >"$dir/f.prog"
section libgpupool.3.scd SYNOPSIS | grep -oE '\bgpupool_[a-z_]+\(' | tr -d '(' >"$dir/f.page"
same "libgpupool's exported functions and libgpupool(3)" "$dir/f.prog" "$dir/f.page"
cat client/*.c common/conn.c common/cudadrv.c common/wire.c | grep -oE 'getenv\("GPUPOOL_[A-Z_]+"\)' |
        grep -oE 'GPUPOOL_[A-Z_]+' >"$dir/e.prog"
section libgpupool.3.scd ENVIRONMENT | grep -oE '^\*GPUPOOL_[A-Z_]+\*' | tr -d '*' >"$dir/e.page"
same "the environment libgpupool reads and libgpupool(3)" "$dir/e.prog" "$dir/e.page"

[ $fail = 0 ] || exit 1
echo "check-man: gpupoold(8), gpupoolctl(1), gpupool-run(1), gpupoold.conf(5) and libgpupool(3) match the programs"

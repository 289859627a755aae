#!/bin/bash
# check-install.sh: "make install" into a temporary DESTDIR puts every file where it belongs,
# a program builds against it with pkg-config (shared and static) and runs, and "make
# uninstall" takes it all away again. Arguments: extra make variables (SANITIZER=, STATIC=).
set -euo pipefail
B=${B:-build}
MAKE=${MAKE:-make}
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
vars=(PREFIX=/usr LIBDIR=/usr/lib SYSCONFDIR=/etc SYSTEMDUNITDIR=/usr/lib/systemd/system
      TMPFILESDIR=/usr/lib/tmpfiles.d SYSUSERSDIR=/usr/lib/sysusers.d DESTDIR="$dest")
# The same build as the suites (SANITIZER=, STATIC=), with the install's paths.
$MAKE --no-print-directory -s install "${vars[@]}" "$@" >"$dest.log" 2>&1 || { cat "$dest.log" >&2; rm -f "$dest.log"; exit 1; }
rm -f "$dest.log"
want=(usr/sbin/gpupoold usr/bin/gpupoolctl usr/lib/libgpupool.so.1 usr/lib/libgpupool.so usr/lib/libgpupool.a
      usr/include/gpupool.h usr/lib/pkgconfig/gpupool.pc usr/lib/systemd/system/gpupoold.service
      usr/lib/systemd/system/gpupoold.socket usr/lib/tmpfiles.d/gpupool.conf usr/lib/sysusers.d/gpupool.conf
      etc/gpupool/gpupoold.conf.example)
for m in docs/man/*.scd; do
        p=$(basename "$m" .scd)
        want+=("usr/share/man/man${p##*.}/$p")
done
for f in "${want[@]}"; do
        [ -e "$dest/$f" ] || { echo "check-install: make install did not install /$f" >&2; exit 1; }
done
# The static library shows its API only, as the shared one does: no heap_*, client_* or protobuf-c names.
others=$(nm -g --defined-only "$dest/usr/lib/libgpupool.a" | awk 'NF == 3 { print $3 }' | grep -v '^gpupool_' || true)
[ -z "$others" ] || { echo "check-install: libgpupool.a exports names that are not gpupool_*:" $others >&2; exit 1; }
[ "$(readlink "$dest/usr/lib/libgpupool.so")" = libgpupool.so.1 ] || { echo "check-install: libgpupool.so is not a link to libgpupool.so.1" >&2; exit 1; }
grep -q "^ExecStart=/usr/sbin/gpupoold" "$dest/usr/lib/systemd/system/gpupoold.service" ||
        { echo "check-install: the installed unit does not start /usr/sbin/gpupoold" >&2; exit 1; }
# The config path the installed daemon reads by default.
"$dest/usr/sbin/gpupoold" --help | grep -q "/etc/gpupool/gpupoold.conf" ||
        { echo "check-install: gpupoold --help does not name /etc/gpupool/gpupoold.conf" >&2; exit 1; }

# A program built against the installed tree, found through pkg-config alone.
cat >"$dest/prog.c" <<'PROG'
#include <errno.h>
#include <stdio.h>
#include <gpupool.h>
int main(void) {
        gpupool_client *c;
        /* No daemon listens there: the library must say so, not crash. */
        int r = gpupool_connect("/nonexistent/gpupool.sock", "install-check", &c);
        printf("%s\n", gpupool_strerror(r));
        return r < 0 ? 0 : 1;
}
PROG
export PKG_CONFIG_SYSROOT_DIR="$dest" PKG_CONFIG_PATH="$dest/usr/lib/pkgconfig"
cflags=$(pkg-config --cflags gpupool)
libs=$(pkg-config --libs gpupool)
san=()
for a in "$@"; do
        case $a in SANITIZER=?*) san=(-fsanitize="${a#SANITIZER=}") ;; esac
done
cc "${san[@]}" $cflags "$dest/prog.c" -o "$dest/prog-shared" $libs
LD_LIBRARY_PATH="$dest/usr/lib" "$dest/prog-shared" >/dev/null
cc "${san[@]}" $cflags "$dest/prog.c" -o "$dest/prog-static" -Wl,-Bstatic $(pkg-config --libs --static gpupool | sed 's/-lpthread//; s/-ldl//') -Wl,-Bdynamic -lpthread -ldl
"$dest/prog-static" >/dev/null
if ldd "$dest/prog-static" | grep -q libgpupool; then
        echo "check-install: the static build still needs libgpupool.so" >&2
        exit 1
fi

$MAKE --no-print-directory -s uninstall "${vars[@]}" "$@" >/dev/null
left=$(find "$dest" -type f ! -name 'prog*' | sed "s|^$dest||")
if [ -n "$left" ]; then
        echo "check-install: make uninstall left:" >&2
        echo "$left" >&2
        exit 1
fi
echo "check-install: make install and uninstall (DESTDIR), a program built with pkg-config --libs gpupool"

#!/bin/sh
# Installs braid's C libraries under PREFIX:
#   PREFIX/lib/libexs.so.V, libbraid_dsm.so.V  shared, stripped, SONAME lib*.so.MAJOR,
#                                              with the lib*.so.MAJOR and lib*.so symlinks
#   PREFIX/lib/libexs.a, libbraid_dsm.a        static (debug info stripped)
#   PREFIX/include/sys/exs.h, braid/dsm.h      headers
#   PREFIX/lib/pkgconfig/exs.pc, braid-dsm.pc  pkg-config files
#
#   scripts/install.sh [--no-build] PREFIX
#
# Builds the two libraries (cargo build --release) first unless --no-build (then the ones
# already in target/release are installed). DESTDIR=DIR installs under DIR/PREFIX (staged
# installs for packages). When the library directory is one the dynamic loader searches
# (/usr/local/lib on most distributions) and this runs as root, ldconfig is run; for any
# other prefix, link with -Wl,-rpath,PREFIX/lib or set LD_LIBRARY_PATH=PREFIX/lib.
# The `braid` command itself: cargo install --path crates/braid-cli.
set -eu

usage() { echo "usage: $0 [--no-build] PREFIX" >&2; exit 2; }
BUILD=1
if [ "${1:-}" = "--no-build" ]; then BUILD=0; shift; fi
[ $# -eq 1 ] || usage
case "$1" in
    /) echo "install.sh: PREFIX / is not supported (use /usr or /usr/local)" >&2; exit 2 ;;
    /*) PREFIX=${1%/} ;;
    *) echo "install.sh: PREFIX must be an absolute path, not '$1'" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
DESTDIR=${DESTDIR:-}
# The version of the workspace ([workspace.package] in Cargo.toml).
VERSION=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml)
case "$VERSION" in
    [0-9]*.[0-9]*.[0-9]*) ;;
    *) echo "install.sh: cannot read the version from Cargo.toml (got '$VERSION')" >&2; exit 1 ;;
esac
MAJOR=${VERSION%%.*}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}/release

if [ "$BUILD" = 1 ]; then
    cargo build --release -p braid-exs -p braid-dsm --lib
fi
for lib in exs braid_dsm; do
    [ -f "$TARGET/lib$lib.so" ] || {
        echo "install.sh: $TARGET/lib$lib.so is missing (build it, or drop --no-build)" >&2
        exit 1
    }
    # build.rs of the crate gives the SONAME; an old build without one must not be installed.
    soname=$(readelf -d "$TARGET/lib$lib.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
    [ "$soname" = "lib$lib.so.$MAJOR" ] || {
        echo "install.sh: $TARGET/lib$lib.so has SONAME '$soname', expected lib$lib.so.$MAJOR (rebuild)" >&2
        exit 1
    }
done

# What the Rust standard library needs from the system when linked statically.
TMP=$(mktemp -d /tmp/braid-install.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
: > "$TMP/empty.rs"
NATIVE=$(rustc --crate-type staticlib --crate-name empty --print native-static-libs \
    -o "$TMP/libempty.a" "$TMP/empty.rs" 2>&1 | sed -n 's/.*native-static-libs: //p')
[ -n "$NATIVE" ] || { echo "install.sh: rustc did not print native-static-libs" >&2; exit 1; }

LIBDIR=$PREFIX/lib
INCLUDEDIR=$PREFIX/include
D=$DESTDIR
mkdir -p "$D$LIBDIR/pkgconfig" "$D$INCLUDEDIR/sys" "$D$INCLUDEDIR/braid"

for lib in exs braid_dsm; do
    real=lib$lib.so.$VERSION
    # Copy, strip, then move into place: a program running from the old file keeps it.
    cp "$TARGET/lib$lib.so" "$TMP/$real"
    strip --strip-unneeded "$TMP/$real"
    install -m 0755 "$TMP/$real" "$D$LIBDIR/$real"
    ln -sfn "$real" "$D$LIBDIR/lib$lib.so.$MAJOR"
    ln -sfn "lib$lib.so.$MAJOR" "$D$LIBDIR/lib$lib.so"
    if [ -f "$TARGET/lib$lib.a" ]; then
        cp "$TARGET/lib$lib.a" "$TMP/lib$lib.a"
        strip --strip-debug "$TMP/lib$lib.a"
        install -m 0644 "$TMP/lib$lib.a" "$D$LIBDIR/lib$lib.a"
    fi
done
install -m 0644 include/sys/exs.h "$D$INCLUDEDIR/sys/exs.h"
install -m 0644 include/braid/dsm.h "$D$INCLUDEDIR/braid/dsm.h"
for pc in exs braid-dsm; do
    sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@LIBDIR@|\${prefix}/lib|g" \
        -e "s|@INCLUDEDIR@|\${prefix}/include|g" -e "s|@VERSION@|$VERSION|g" \
        -e "s|@NATIVE_STATIC_LIBS@|$NATIVE|g" \
        "scripts/pkgconfig/$pc.pc.in" > "$D$LIBDIR/pkgconfig/$pc.pc"
    chmod 0644 "$D$LIBDIR/pkgconfig/$pc.pc"
done

# The loader's cache, where the loader looks in this directory by itself.
if [ -n "$DESTDIR" ]; then
    echo "install.sh: staged under DESTDIR=$DESTDIR (run ldconfig where it is installed)"
elif [ "$(id -u)" = 0 ] && command -v ldconfig >/dev/null 2>&1 &&
    ldconfig -v -N 2>/dev/null | grep -q "^$LIBDIR:"; then
    ldconfig
    echo "install.sh: ran ldconfig ($LIBDIR is searched by the dynamic loader)"
else
    echo "install.sh: $LIBDIR is not a directory the loader searches (or not root): link with -Wl,-rpath,$LIBDIR or set LD_LIBRARY_PATH=$LIBDIR"
fi
echo "install.sh: installed braid $VERSION C libraries under $D$PREFIX"
ls -l "$D$LIBDIR"/libexs.* "$D$LIBDIR"/libbraid_dsm.* | sed 's/^/  /'

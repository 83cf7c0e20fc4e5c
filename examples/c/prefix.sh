# Sourced by the C example scripts: installs the C libraries built in target/release into a
# temporary prefix with scripts/install.sh and points pkg-config at it, so the examples are
# built as a user builds against an installed braid:
#   cc prog.c $(pkg-config --cflags --libs exs) -Wl,-rpath,$(pkg-config --variable=libdir exs)
# (the rpath because the prefix is not in the loader's search path).
#   install_prefix DIR   sets PKG_CONFIG_PATH, and LIBDIR to DIR/lib
install_prefix() {
    sh scripts/install.sh --no-build "$1" >/dev/null
    PKG_CONFIG_PATH="$1/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export PKG_CONFIG_PATH
    LIBDIR=$(pkg-config --variable=libdir exs)
}

# needs_soname BINARY LIB: the binary loads LIB by its SONAME (lib*.so.MAJOR).
needs_soname() {
    if ! readelf -d "$1" | grep -q "NEEDED.*\[$2\.so\.[0-9]*\]"; then
        echo "$1 does not load $2 by its SONAME:" >&2
        readelf -d "$1" | grep NEEDED >&2
        exit 1
    fi
}

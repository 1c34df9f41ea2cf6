#!/usr/bin/env bash
# Choose the nbdkit server that nbdkit-zram runs on, building a fixed one
# when the system's is too old, and print its path on stdout (everything
# else goes to stderr).
#
#   tools/nbdkit-select.sh PREFIX
#
# Why: nbdkit before 1.34 (Debian 12 ships 1.32.5) aborts when a client
# hangs up with replies still pending and a connection has more than one
# worker thread (the default): "raw_send_socket: Assertion `sock >= 0'
# failed", and every client's data is gone with the process.  Upstream
# fixed it in 1.33.10 / 1.34.0 (Red Hat bug 2173054); 1.32 never got it.
#
# NBDKIT (environment) chooses:
#   unset or auto   the system's nbdkit if it is 1.34 or newer, else the
#                   built one (falling back to the system's, with a
#                   warning, if it cannot be built)
#   system          the nbdkit on PATH, whatever its version
#   built           nbdkit built from Debian 13's (trixie's) source package
#   /path/to/nbdkit that server
#
# The built server: the source comes from the system's own Debian mirror,
# through a private sources list and lists folder (the system's apt
# configuration is left alone, and no root is needed), is configured
# minimally (no language plugins, no curl/ssh/libvirt/guestfs/gnutls, no
# man pages) and installed into PREFIX (setup.sh: build/nbdkit, inside
# the build tree); its source is unpacked in a temporary folder, removed
# once built.  A later run reuses the server in PREFIX.  A
# PREFIX we cannot write (say /usr/local) is installed with sudo: that is
# the way to install the fixed server for the whole system.
#
# More environment: NBDKIT_SUITE (default trixie), DEBIAN_MIRROR (default:
# the mirror the system's apt sources use for Debian), JOBS.
set -euo pipefail

FIXED_VERSION=1.34.0        # the first release with the disconnect fix

die () { echo "nbdkit-select: $*" >&2; exit 1; }
say () { echo "nbdkit-select: $*" >&2; }

[ $# -eq 1 ] || die "usage: $0 PREFIX"
case "$1" in
    /*) prefix=$1 ;;
    *) prefix=$PWD/$1 ;;
esac
suite=${NBDKIT_SUITE:-trixie}
jobs=${JOBS:-$(nproc)}

version_of () { "$1" --version 2>/dev/null | awk '$1 == "nbdkit" { print $2; exit }'; }
is_fixed () { dpkg --compare-versions "$1" ge "$FIXED_VERSION"; }

# The URI of the system's Debian mirror: the repository that serves the
# system's own release (the one whose codename has no -updates or
# -security suffix).
debian_mirror ()
{
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local codename uri
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    uri=$(apt-get indextargets --format '$(REPO_URI) $(CODENAME)' \
              'Created-By: Packages' 2>/dev/null |
          awk -v c="$codename" '$2 == c { print $1; exit }')
    echo "${uri:-http://deb.debian.org/debian/}"
}

# Build nbdkit from $suite's source package into $prefix.
build_nbdkit ()
{
    local work apt_options mirror dsc
    work=$(mktemp -d "${TMPDIR:-/tmp}/nbdkit-source.XXXXXX")
    mkdir -p "$work/lists/partial"
    mirror=$(debian_mirror)
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" \
        > "$work/sources.list"
    apt_options=(
        -o "Dir::Etc::SourceList=$work/sources.list"
        -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$work/lists"
        -o Debug::NoLocking=1       # the lists folder is ours alone
    )
    # As root apt downloads as _apt, who cannot write into the build tree.
    [ "$(id -u)" -ne 0 ] || apt_options+=(-o APT::Sandbox::User=root)
    say "fetching nbdkit's source from $mirror ($suite)"
    apt-get -qq "${apt_options[@]}" update >&2
    (cd "$work" && apt-get -qq "${apt_options[@]}" --download-only source nbdkit) >&2
    dsc=$(ls "$work"/nbdkit_*.dsc)
    say "building $(basename "$dsc" .dsc) into $prefix (about 2 minutes on 2 cores)"
    (
        cd "$work"
        # apt checked the files against the signed index; dpkg-source has
        # no keyring for the .dsc's own signature.
        dpkg-source --no-check -x "$dsc" source
        cd source
        # Debian's patches touch configure.ac.
        autoreconf -fi
        ./configure --prefix="$prefix" \
            --disable-perl --disable-python --disable-ocaml --disable-rust \
            --disable-tcl --disable-lua --disable-golang --disable-linuxdisk \
            --disable-torrent --disable-vddk --disable-libguestfs-tests \
            --without-curl --without-ssh --without-libvirt --without-libguestfs \
            --without-gnutls --without-manpages --without-iso --without-libblkio \
            --without-ext2 --without-selinux --without-bash-completions
        make -j"$jobs"
        mkdir -p "$prefix" 2>/dev/null || :
        if [ -w "$prefix" ]; then make install; else sudo make install; fi
    ) > "$work/build.log" 2>&1 || {
        tail -n 30 "$work/build.log" >&2
        die "building nbdkit failed (whole log: $work/build.log)"
    }
    rm -rf "$work"
}

# The built server, building it on first use.
built_nbdkit ()
{
    local binary="$prefix/sbin/nbdkit" version
    version=$(version_of "$binary" || :)
    if [ -n "$version" ] && is_fixed "$version"; then
        say "reusing nbdkit $version built earlier in $prefix"
    else
        build_nbdkit
        version=$(version_of "$binary" || :)
        [ -n "$version" ] && is_fixed "$version" ||
            die "the nbdkit built in $prefix does not run, or is older than $FIXED_VERSION"
    fi
    echo "$binary"
}

warn_old ()
{
    say "WARNING: nbdkit $2 ($1) is older than $FIXED_VERSION: it aborts, losing"
    say "WARNING: every client's data, when a client disconnects with requests in"
    say "WARNING: flight; serve with -t 1, or use NBDKIT=built"
}

system=$(command -v nbdkit || :)
system_version=
[ -z "$system" ] || system_version=$(version_of "$system")

case "${NBDKIT:-auto}" in
    auto)
        if [ -n "$system_version" ] && is_fixed "$system_version"; then
            say "using the system's nbdkit $system_version ($system): it has the client-disconnect fix of $FIXED_VERSION"
            echo "$system"
        else
            say "the system's nbdkit ${system_version:-(none)} lacks the client-disconnect fix of $FIXED_VERSION: using one built from Debian $suite's source"
            # A process of its own: errexit does not apply inside an if.
            if binary=$(NBDKIT=built "$0" "$prefix"); then
                echo "$binary"
            elif [ -n "$system" ]; then
                warn_old "$system" "$system_version"
                echo "$system"
            else
                die "no nbdkit to use"
            fi
        fi ;;
    system)
        [ -n "$system" ] || die "NBDKIT=system: there is no nbdkit on PATH"
        say "using the system's nbdkit $system_version ($system), as NBDKIT=system asks"
        is_fixed "$system_version" || warn_old "$system" "$system_version"
        echo "$system" ;;
    built)
        binary=$(built_nbdkit)
        say "using nbdkit $(version_of "$binary") built from Debian $suite's source ($binary)"
        echo "$binary" ;;
    /*)
        version=$(version_of "$NBDKIT")
        [ -n "$version" ] || die "NBDKIT=$NBDKIT: not an nbdkit that runs"
        say "using nbdkit $version ($NBDKIT), as NBDKIT asks"
        is_fixed "$version" || warn_old "$NBDKIT" "$version"
        echo "$NBDKIT" ;;
    *)
        die "NBDKIT='$NBDKIT': expected auto, system, built or an absolute path" ;;
esac

#!/usr/bin/env bash
# One script owns the set-up of nbdkit-zram on a fresh Debian 12 machine:
# install the packages that are missing, generate and configure the build,
# compile, then run a job.
#
#   ./setup.sh run      set up, then serve a compressed RAM disk (Ctrl-C stops)
#   ./setup.sh check    set up, then run the whole test suite
#   ./setup.sh build    set up only
#
# Environment:
#   NBDKIT            which nbdkit to run on: auto (default), system, built
#                     or /path/to/nbdkit; see tools/nbdkit-select.sh.  auto
#                     builds nbdkit from Debian 13's source when the
#                     system's is older than 1.34 (Debian 12: 1.32.5, which
#                     aborts when a client disconnects mid-request)
#   NBDKIT_PREFIX     where the built nbdkit lives (default: build/nbdkit)
#   BUILD_DIR         build directory (default: build)
#   CONFIGURE_FLAGS   extra ./configure flags, e.g. --enable-werror or
#                     --enable-sanitizers=address,undefined
#   JOBS              parallel make jobs (default: nproc)
#   ZRAM_SIZE         size of the served device (default: 8G)
#   ZRAM_ARGS         more plugin parameters, e.g. "comp=zstd mem_limit=2G"
#   ZRAM_SOCKET       Unix socket to serve on (default: $BUILD_DIR/zram.sock)
#   ZRAM_CTL          its control socket, for nbdkit-zramctl (default:
#                     $BUILD_DIR/zram.ctl)
#   ZRAM_PORT         serve on this TCP port instead of a Unix socket
set -euo pipefail

job=${1:-build}
case "$job" in
  run|check|build) ;;
  *) echo "usage: $0 run|check|build" >&2; exit 2 ;;
esac

top=$(cd "$(dirname "$0")" && pwd)
cd "$top"
BUILD_DIR=${BUILD_DIR:-build}
CONFIGURE_FLAGS=${CONFIGURE_FLAGS:-}
JOBS=${JOBS:-$(nproc)}

# nbdsh runs "python3 -m nbd"; Debian's python3 has the nbd module, a
# python3 installed elsewhere earlier on PATH may not.
export PATH=/usr/bin:/bin:/usr/sbin:/sbin:$PATH

packages=(
  build-essential autoconf automake libtool pkg-config perl
  nbdkit nbdkit-plugin-dev libnbd-dev libnbd-bin python3-libnbd
  liblz4-dev libzstd-dev libcmocka-dev libnl-genl-3-dev
  fio qemu-utils spin
  python3-prometheus-client prometheus prometheus-node-exporter gnuplot-nox
  systemd shellcheck
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The server everything runs on (it says which, and why, on stderr).
NBDKIT=$(tools/nbdkit-select.sh "${NBDKIT_PREFIX:-$top/build/nbdkit}")
export NBDKIT

if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
  autoreconf -fi
fi

mkdir -p "$BUILD_DIR"
stamp="$BUILD_DIR/.configure-flags"
configuration="$CONFIGURE_FLAGS NBDKIT=$NBDKIT"
if [ ! -f "$BUILD_DIR/Makefile" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$configuration" ]; then
  # shellcheck disable=SC2086
  (cd "$BUILD_DIR" && "$top/configure" $CONFIGURE_FLAGS NBDKIT="$NBDKIT")
  echo "$configuration" > "$stamp"
fi
make -C "$BUILD_DIR" -j"$JOBS"

case "$job" in
  build) ;;
  check)
    make -C "$BUILD_DIR" -j"$JOBS" check || {
      # The failed tests' logs, last, so that the tail of the output (all
      # a CI summary may keep) shows why.
      for trs in "$BUILD_DIR"/tests/*.trs; do
        if grep -qE '^:test-result: (FAIL|ERROR)' "$trs"; then
          echo "=== ${trs%.trs}.log" >&2
          tail -n 200 "${trs%.trs}.log" >&2 || true
        fi
      done
      exit 1
    }
    ;;
  run)
    plugin="$top/$BUILD_DIR/plugin/.libs/nbdkit-zram-plugin.so"
    size=${ZRAM_SIZE:-8G}
    stats="$top/$BUILD_DIR/zram.stats"
    ctl=${ZRAM_CTL:-$top/$BUILD_DIR/zram.ctl}
    if [ -n "${ZRAM_PORT:-}" ]; then
      listen=(--port "$ZRAM_PORT")
      uri="nbd://localhost:$ZRAM_PORT"
    else
      socket=${ZRAM_SOCKET:-$top/$BUILD_DIR/zram.sock}
      listen=(--unix "$socket")
      uri="nbd+unix:///?socket=$socket"
      # A socket left by a server that is gone (nbdkit leaves its socket
      # behind when it is killed) would stop this one: removed.  One
      # that answers is another server's: not touched.
      if [ -S "$socket" ]; then
        if nbdinfo --size "$uri" >/dev/null 2>&1; then
          echo "setup.sh: a server already answers on $socket (stop it, or set ZRAM_SOCKET)" >&2
          exit 1
        fi
        rm -f "$socket"
      elif [ -e "$socket" ]; then
        echo "setup.sh: $socket exists and is not a socket (set ZRAM_SOCKET)" >&2
        exit 1
      fi
    fi
    cat <<EOM
Serving a $size compressed RAM disk (nbdkit-zram, on $("$NBDKIT" --version)) at
    $uri
Try, from another terminal:
    nbdinfo '$uri'
    nbdcopy /usr/lib/os-release '$uri'
    qemu-img info '$uri'
    cat $stats          # zram-style statistics, rewritten every second
    $top/$BUILD_DIR/tools/nbdkit-zramctl $ctl          # zramctl's table
    $top/$BUILD_DIR/tools/nbdkit-zramctl info $ctl     # any control command
Ctrl-C stops the server (the data is gone with it).
EOM
    # shellcheck disable=SC2086 # ZRAM_ARGS is a list of key=value words
    exec "$NBDKIT" --foreground "${listen[@]}" \
      "$plugin" "$size" stats="$stats" ctl="$ctl" ${ZRAM_ARGS:-}
    ;;
esac

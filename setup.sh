#!/usr/bin/env bash
# One script owns the set-up of nbdkit-zram on a fresh Debian 12 machine:
# install the packages that are missing, generate and configure the build,
# compile, then run a job.
#
#   ./setup.sh run      set up, then run the main job
#   ./setup.sh check    set up, then run the whole test suite
#   ./setup.sh build    set up only
#
# Environment:
#   BUILD_DIR         build directory (default: build)
#   CONFIGURE_FLAGS   extra ./configure flags, e.g. --enable-werror or
#                     --enable-sanitizers=address,undefined
#   JOBS              parallel make jobs (default: nproc)
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
  liblz4-dev libzstd-dev libcmocka-dev
  fio qemu-utils
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

if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt Makefile.in ]; then
  autoreconf -fi
fi

mkdir -p "$BUILD_DIR"
stamp="$BUILD_DIR/.configure-flags"
if [ ! -f "$BUILD_DIR/Makefile" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$CONFIGURE_FLAGS" ]; then
  # shellcheck disable=SC2086
  (cd "$BUILD_DIR" && "$top/configure" $CONFIGURE_FLAGS)
  echo "$CONFIGURE_FLAGS" > "$stamp"
fi
make -C "$BUILD_DIR" -j"$JOBS"

case "$job" in
  build) ;;
  check)
    make -C "$BUILD_DIR" -j"$JOBS" check || {
      cat "$BUILD_DIR"/tests/*.log >&2 || true
      exit 1
    }
    ;;
  run)
    # Until the plugin lands, the main job is the allocator benchmark.
    BUILD_DIR="$BUILD_DIR" exec bench/run-alloc-bench.sh
    ;;
esac

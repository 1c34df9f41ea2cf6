#!/usr/bin/env bash
# Helpers for the plugin integration tests.  Source this file:
#
#   source "$(dirname "$0")/functions.sh"
#
# It sets up:
#   SRCDIR BUILDDIR PLUGIN ZRAMCTL SANITIZERS NBDKIT (from the environment that
#                       Makefile.am passes, or defaults for a run by hand)
#   tmp                 a private temporary directory, removed at exit
#   requires CMD...     skip the test (exit 77) if a command is missing
#   zram_nbdkit ARGS... run $NBDKIT (the server configure chose) with the plugin's sanitizer runtime
#                       preloaded (sanitizer builds) for nbdkit only; fails
#                       the test if a sanitizer report shows up
#   zram_nbdsh ARGS...  serve the plugin with ARGS and run the Python on
#                       stdin in nbdsh against it (h is connected)
#   fail MESSAGE        print and exit 1
#   cleanup_add CMD     run CMD (eval'd) at exit, before $tmp is removed
#   requires_zramctl    fail unless nbdkit-zramctl is built ($ZRAMCTL,
#                       exported: the tests' Python and --run shells use it)
#   remote_start ARGS... a second nbdkit (ARGS: its plugin and parameters)
#                       serving an NBD export at $tmp/remote.sock, for a
#                       backing store; remote_stop stops it (done at exit)

set -euo pipefail

# nbdsh needs Debian's /usr/bin/python3 (it has the nbd module); another
# python3 (pyenv, venv) earlier on PATH would break it.
export PATH="/usr/bin:/bin:/usr/sbin:/sbin:${PATH:-}"

_functions_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${SRCDIR:=$(cd "$_functions_dir/.." && pwd)}"
: "${BUILDDIR:=$SRCDIR/build}"
: "${PLUGIN:=$BUILDDIR/plugin/.libs/nbdkit-zram-plugin.so}"
: "${ZRAMCTL:=$BUILDDIR/tools/nbdkit-zramctl}"
# The server to test on; configure's choice (setup.sh: a fixed one).
: "${NBDKIT:=$(sed -n 's/^NBDKIT = //p' "$BUILDDIR/Makefile" 2>/dev/null || :)}"
: "${NBDKIT:=nbdkit}"
export SRCDIR BUILDDIR PLUGIN NBDKIT ZRAMCTL

TEST_NAME="$(basename "$0" .sh)"

fail ()
{
    echo "$TEST_NAME: FAIL: $*" >&2
    exit 1
}

requires ()
{
    local cmd
    for cmd in "$@"; do
        if ! command -v "$cmd" >/dev/null 2>&1; then
            echo "$TEST_NAME: SKIP: '$cmd' is not installed" >&2
            exit 77
        fi
    done
}

requires_zramctl ()
{
    [ -x "$ZRAMCTL" ] || fail "nbdkit-zramctl not built: $ZRAMCTL"
}

# requires_disconnect_fix: skip the test (exit 77) on an nbdkit before
# 1.34, which aborts when a client disconnects with requests in flight,
# unless ZRAM_PROVE_NBDKIT_ABORT is set (CI: the test must then fail).
requires_disconnect_fix ()
{
    local version
    version=$("$NBDKIT" --version 2>/dev/null | awk '$1 == "nbdkit" { print $2 }')
    if [ -z "${ZRAM_PROVE_NBDKIT_ABORT:-}" ] &&
        [ "$(printf '%s\n1.34.0\n' "$version" | sort -V | head -n1)" != 1.34.0 ]; then
        echo "$TEST_NAME: SKIP: nbdkit $version aborts when a client disconnects with requests in flight (fixed in 1.34); ./setup.sh builds a fixed nbdkit" >&2
        exit 77
    fi
}

# ---- temporary directory and cleanup ------------------------------------
tmp="$(mktemp -d "${TMPDIR:-/tmp}/zram-$TEST_NAME.XXXXXX")"
# Every server a test starts registers in a registry of the test's own
# (registry-dir.h), not in the machine's /run/nbdkit-zram.
export NBDKIT_ZRAM_RUNTIME_DIR="$tmp/registry"
_cleanups=()
_captive_pids=()
cleanup_add ()
{
    _cleanups+=("$1")
}
_cleanup ()
{
    local rc=$? c
    for c in ${_cleanups[@]+"${_cleanups[@]}"}; do
        eval "$c" || :
    done
    # Servers started in the foreground (ThreadSanitizer) still running.
    for c in ${_captive_pids[@]+"${_captive_pids[@]}"}; do
        kill -9 "$c" 2>/dev/null || :
    done
    # A server in the background reports into a file, not to the test.
    if _sanitizer_reports; then
        echo "$TEST_NAME: FAIL: a sanitizer report from a server" >&2
        rc=1
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap _cleanup EXIT

# ---- a remote NBD export (a backing store) -------------------------------
# The remote runs without the sanitizers' preload: it is not under test.
# Its stderr accumulates in $tmp/remote.log.
remote_start ()
{
    rm -f "$tmp/remote.sock" "$tmp/remote.pid"
    env -u LD_PRELOAD "$NBDKIT" -U "$tmp/remote.sock" -P "$tmp/remote.pid" \
        "$@" 2>>"$tmp/remote.log"
    for _ in $(seq 100); do [ -s "$tmp/remote.pid" ] && return 0; sleep 0.1; done
    fail "the remote nbdkit did not start: $(cat "$tmp/remote.log")"
}
remote_stop ()
{
    if [ -s "$tmp/remote.pid" ]; then
        kill "$(cat "$tmp/remote.pid")" 2>/dev/null || :
        rm -f "$tmp/remote.pid"
    fi
}
cleanup_add remote_stop
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- the plugin and the sanitizer runtime --------------------------------
requires "$NBDKIT"
[ -f "$PLUGIN" ] || fail "plugin not found: $PLUGIN (build it first, or set PLUGIN)"

# SANITIZERS comes from configure; when run by hand, find out from the
# plugin's own dependencies.
if [ -z "${SANITIZERS:-}" ]; then
    SANITIZERS=no
    _deps="$(ldd "$PLUGIN" 2>/dev/null || :)"
    case "$_deps" in
        *libtsan*) SANITIZERS=thread ;;
        *libasan*libubsan*|*libubsan*libasan*) SANITIZERS=address,undefined ;;
        *libasan*) SANITIZERS=address ;;
        *libubsan*) SANITIZERS=undefined ;;
    esac
fi
export SANITIZERS

# The environment nbdkit (only nbdkit) runs with.  The plugin is built
# with -fsanitize but nbdkit is not, so the runtime must be preloaded.
_nbdkit_env=()
_sanitizer_lib ()
{
    local lib
    lib="$(gcc -print-file-name="$1")"
    case "$lib" in
        /*) [ -e "$lib" ] || fail "sanitizer runtime $1 not found ($lib)" ;;
        *) fail "gcc does not know the sanitizer runtime $1" ;;
    esac
    printf '%s' "$lib"
}
case "$SANITIZERS" in
    no|"") ;;
    *) requires gcc ;;
esac
case "$SANITIZERS" in
    no|"") ;;
    thread)
        _nbdkit_env=(
            "LD_PRELOAD=$(_sanitizer_lib libtsan.so)"
            "TSAN_OPTIONS=halt_on_error=1:exitcode=66:report_signal_unsafe=0:log_path=$tmp/sanitizer:suppressions=$SRCDIR/tests/tsan.supp"
        ) ;;
    *)
        _preload=
        case "$SANITIZERS" in *address*) _preload="$(_sanitizer_lib libasan.so)" ;; esac
        case "$SANITIZERS" in *undefined*)
            _preload="${_preload:+$_preload:}$(_sanitizer_lib libubsan.so)" ;; esac
        _nbdkit_env=(
            "LD_PRELOAD=$_preload"
            "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:log_path=$tmp/sanitizer"
            "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$tmp/sanitizer"
        ) ;;
esac

# Prefix of every --run command: the clients must not get the sanitizer
# runtime (zram_nbdkit adds it to --run itself; use it for other cases).
NO_PRELOAD='unset LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS;'

# Patterns of a sanitizer report.
SANITIZER_PATTERN='ERROR: AddressSanitizer|ERROR: LeakSanitizer|WARNING: ThreadSanitizer|ThreadSanitizer:|runtime error:|UndefinedBehaviorSanitizer'

# The sanitizers write their reports to $tmp/sanitizer.PID (log_path): a
# server in the background has no stderr to read.  True, with the reports
# copied to our stderr, if there is one.
_sanitizer_reports ()
{
    local report found=1
    for report in "$tmp"/sanitizer.*; do
        [ -s "$report" ] || continue
        cat "$report" >&2
        found=0
    done
    return "$found"
}

# The stderr of the latest zram_nbdkit (nbdkit and its --run command).
NBDKIT_STDERR=
_nbdkit_runs=0

# zram_nbdkit ARGS...: nbdkit ARGS with the sanitizer environment, --run
# commands prefixed with $NO_PRELOAD.  With ZRAM_CAPTIVE=1 (always under
# TSan) --run is done here, with the server in the foreground, so that the
# server's own exit status counts: nbdkit's --run ignores how the server
# ended once the command has succeeded.  Returns nbdkit's exit status (a
# test under set -e fails on non-zero); stderr is copied to $NBDKIT_STDERR
# and to our stderr.  A sanitizer report fails the test whatever the
# status.  Written without relying on set -e: it may run in an `if`.
# A hung server (or client) fails the test instead of hanging CI.
NBDKIT_TIMEOUT=${NBDKIT_TIMEOUT:-300}

zram_nbdkit ()
{
    local args=() a rc=0 run='' has_run=false
    while [ $# -gt 0 ]; do
        a="$1"; shift
        case "$a" in
            --run)
                [ $# -gt 0 ] || fail "zram_nbdkit: --run needs a command"
                run="$1"; has_run=true; shift ;;
            --run=*)
                run="${a#--run=}"; has_run=true ;;
            *) args+=("$a") ;;
        esac
    done
    _nbdkit_runs=$((_nbdkit_runs + 1))
    NBDKIT_STDERR="$(mktemp "$tmp/nbdkit-stderr.XXXXXX")"
    if $has_run && { [ "$SANITIZERS" = thread ] || [ -n "${ZRAM_CAPTIVE:-}" ]; }; then
        # A shell started with libtsan preloaded crashes (SIGSEGV), and
        # nbdkit --run starts the command with /bin/sh in its own
        # environment: serve in the foreground instead and run the
        # command here, as --run would.
        _zram_nbdkit_captive "$run" "${args[@]}" 2>"$NBDKIT_STDERR" || rc=$?
    elif $has_run; then
        timeout "$NBDKIT_TIMEOUT" env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} \
            "$NBDKIT" "${args[@]}" --run "$NO_PRELOAD $run" \
            2>"$NBDKIT_STDERR" || rc=$?
    else
        timeout "$NBDKIT_TIMEOUT" env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} \
            "$NBDKIT" "${args[@]}" 2>"$NBDKIT_STDERR" || rc=$?
    fi
    [ "$rc" != 124 ] || fail "nbdkit ${args[*]}: no exit within ${NBDKIT_TIMEOUT}s"
    cat "$NBDKIT_STDERR" >&2
    if grep -Eq "$SANITIZER_PATTERN" "$NBDKIT_STDERR" || _sanitizer_reports; then
        echo "$TEST_NAME: FAIL: sanitizer report from nbdkit (exit status $rc)" >&2
        exit 1
    fi
    case "$SANITIZERS:$rc" in
        thread:66) fail "ThreadSanitizer exit status 66 from nbdkit" ;;
    esac
    return "$rc"
}

# A child process that has not exited (kill -0 succeeds on a zombie).
_alive ()
{
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [ "${stat%% *}" != Z ]
}

# Stop a captive nbdkit: SIGTERM, then SIGKILL if it has not exited
# within 60 s (reported as a failure: nbdkit hung at exit).
_stop_captive ()
{
    local pid="$1" i
    kill "$pid" 2>/dev/null || :
    for ((i = 0; i < 600; i++)); do
        _alive "$pid" || break
        sleep 0.1
    done
    if _alive "$pid"; then
        echo "nbdkit: did not exit 60 s after SIGTERM: killed" >&2
        kill -9 "$pid" 2>/dev/null || :
        wait "$pid" 2>/dev/null || :
        _captive_pids=()
        return 124
    fi
    wait "$pid" || return $?
    _captive_pids=()
}

# _zram_nbdkit_captive COMMAND NBDKIT_ARGS...: what nbdkit -U - ... --run
# COMMAND does, with the command outside nbdkit's environment: nbdkit in
# the foreground on a socket of ours, COMMAND run by /bin/sh with $uri,
# $nbd and $unixsocket set, then nbdkit stopped with SIGTERM.  The exit
# status is COMMAND's, or nbdkit's if nbdkit failed (at startup, or with
# a sanitizer's exit code).
_zram_nbdkit_captive ()
{
    local cmd="$1" args=() a pid rc=0 nbdkit_rc=0 i dir sock pidfile
    # Unique names: this may run in a $(...) subshell, where counters
    # do not carry over.
    dir="$(mktemp -d "$tmp/nbdkit.XXXXXX")"
    sock="$dir/socket"
    pidfile="$dir/pid"
    shift
    while [ $# -gt 0 ]; do
        a="$1"; shift
        case "$a" in
            -U|--unix|--unix-socket)
                [ "${1:-}" = - ] || sock="$1"
                shift; args+=(-U "$sock") ;;
            --unix=*|--unix-socket=*)
                a="${a#*=}"; [ "$a" = - ] || sock="$a"; args+=(-U "$sock") ;;
            -P|--pidfile|--pid-file)
                pidfile="$1"; shift ;;
            --pidfile=*|--pid-file=*)
                pidfile="${a#*=}" ;;
            *) args+=("$a") ;;
        esac
    done
    rm -f "$pidfile"
    # nbdkit writes the PID file once it accepts connections.
    env ${_nbdkit_env[@]+"${_nbdkit_env[@]}"} "$NBDKIT" -f -P "$pidfile" "${args[@]}" &
    pid=$!
    _captive_pids+=("$pid")
    for ((i = 0; i < 600; i++)); do
        [ -s "$pidfile" ] && break
        _alive "$pid" || break
        sleep 0.1
    done
    if ! [ -s "$pidfile" ]; then
        _stop_captive "$pid" || nbdkit_rc=$?
        [ "$nbdkit_rc" != 0 ] || nbdkit_rc=1
        return "$nbdkit_rc"
    fi
    uri="nbd+unix://?socket=$sock" nbd="nbd+unix://?socket=$sock" \
        unixsocket="$sock" exportname='' \
        /bin/sh -c "$cmd" || rc=$?
    _stop_captive "$pid" || nbdkit_rc=$?
    if [ "$nbdkit_rc" != 0 ]; then
        echo "nbdkit: server exited with status $nbdkit_rc" >&2
        [ "$rc" != 0 ] || rc="$nbdkit_rc"
    fi
    return "$rc"
}

# zram_nbdsh PLUGIN_ARGS... <<'EOF' ... EOF
# Serve the plugin on a private unix socket and run the Python on stdin
# with nbdsh, h connected to it.  The test's exported variables reach the
# Python through os.environ.
zram_nbdsh ()
{
    local py
    py="$(mktemp "$tmp/nbdsh.XXXXXX.py")"
    cat > "$py"
    zram_nbdkit -U - "$PLUGIN" "$@" --run "nbdsh -u \"\$uri\" -c - < '$py'"
}


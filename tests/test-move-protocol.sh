#!/usr/bin/env bash
# The move protocol (store/block-store.h, MOVING A BLOCK) as a Promela
# model, tests/move-protocol.pml, searched exhaustively by spin.  The old
# identity rule (also with full writes only: handle recycling alone) and
# the one-bit claim rule must each lose a write (an assertion violation);
# the two-bit rule the code uses must lose none in a complete search.
# Needs spin and a C compiler, not nbdkit (so no functions.sh).
set -euo pipefail

TEST_NAME="$(basename "$0" .sh)"
model="$(cd "$(dirname "$0")" && pwd)/move-protocol.pml"

fail ()
{
    echo "$TEST_NAME: FAIL: $*" >&2
    exit 1
}

if ! command -v spin >/dev/null 2>&1; then
    echo "$TEST_NAME: SKIP: spin not installed: apt-get install spin" >&2
    exit 77
fi
if ! command -v cc >/dev/null 2>&1; then
    echo "$TEST_NAME: SKIP: 'cc' is not installed" >&2
    exit 77
fi
[ -f "$model" ] || fail "$model does not exist"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/zram-$TEST_NAME.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The model's deepest path is under 100 steps; far more stack than that,
# and a search that hit the bound anyway fails below.
DEPTH=100000

# verify NAME EXPECT SPIN-FLAGS...: generate, compile and run the verifier
# for one rule; EXPECT is "violation" (the rule must lose a write) or
# "holds" (no error in the whole state space).
verify ()
{
    local name="$1" expect="$2"
    shift 2
    local dir="$tmp/$name" errors states
    mkdir "$dir"
    cp "$model" "$dir/"
    (cd "$dir" && spin "$@" -a move-protocol.pml >spin.log 2>&1) || {
        cat "$dir/spin.log" >&2
        fail "$name: spin $* -a failed"
    }
    (cd "$dir" && cc -O1 -DSAFETY -o pan pan.c >cc.log 2>&1) || {
        cat "$dir/cc.log" >&2
        fail "$name: compiling pan.c failed"
    }
    (cd "$dir" && ./pan -m"$DEPTH" >pan.log 2>&1) || {
        cat "$dir/pan.log" >&2
        fail "$name: pan failed"
    }
    if grep -q "depth too small" "$dir/pan.log"; then
        cat "$dir/pan.log" >&2
        fail "$name: search truncated (search depth too small)"
    fi
    if grep -qi "out of memory" "$dir/pan.log"; then
        cat "$dir/pan.log" >&2
        fail "$name: pan ran out of memory"
    fi
    errors="$(sed -n 's/.*, errors: \([0-9][0-9]*\)$/\1/p' "$dir/pan.log")"
    states="$(sed -n 's/^ *\([0-9][0-9.e+]*\) states, stored.*/\1/p' "$dir/pan.log")"
    if [ -z "$errors" ] || [ -z "$states" ]; then
        cat "$dir/pan.log" >&2
        fail "$name: no 'errors:' or 'states, stored' in pan's output"
    fi
    echo "$name (spin $*): errors: $errors, $states states stored"
    case "$expect" in
        violation)
            if [ "$errors" -lt 1 ] || ! grep -q "assertion violated" "$dir/pan.log"; then
                cat "$dir/pan.log" >&2
                fail "$name: expected a lost write (an assertion violation), found none"
            fi
            grep "assertion violated" "$dir/pan.log" | sed 's/^/    /'
            ;;
        holds)
            if [ "$errors" -ne 0 ] || grep -q "Search not completed" "$dir/pan.log"; then
                cat "$dir/pan.log" >&2
                echo "$TEST_NAME: the counterexample:" >&2
                (cd "$dir" && spin "$@" -t -p move-protocol.pml) >&2 || :
                fail "$name: the rule loses a write"
            fi
            ;;
        *) fail "verify: bad expectation '$expect'" ;;
    esac
}

verify identity violation -DRULE=1
verify identity-full-writes violation -DRULE=1 -DNO_PARTIAL -DNO_TRIM
verify one-bit violation -DRULE=2
verify two-bit holds -DRULE=3
echo "ok: the identity and one-bit rules lose writes, the two-bit rule none"

#!/usr/bin/env bash
# The fuzzers' entry points (tests/fuzz/) on their committed corpora, every
# crash found so far among them, and on 200 inputs made from a seed: the
# short fuzz run of make check, with whatever compiler and sanitizers the
# build has.  Long runs: configure --enable-fuzzing (clang), make fuzz.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
for fuzzer in alloc store; do
    "$BUILDDIR/tests/fuzz-$fuzzer-replay" "$SRCDIR/tests/fuzz/corpus-$fuzzer" \
        --random 200 "${FUZZ_SEED:-1}" || fail "fuzz-$fuzzer: an input failed"
done

#!/usr/bin/env bash
# The NBD request stream fuzzer (tests/fuzz/nbd_stream.py): nbdkit -s
# serving the plugin, stdin a whole client stream - handshake, options,
# requests, good and hostile.  Replays the committed corpus
# (tests/fuzz/corpus-nbd, every finding so far among it) and 50 streams
# made from a seed, under whatever sanitizer build this is; fails on a
# crash, a sanitizer report, a hang or a wrong answer (READ data against
# a shadow of the stream's own writes, errors against what nbdkit refuses).
# Long runs: see the top of tests/fuzz/nbd_stream.py.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires_disconnect_fix
requires /usr/bin/python3

case "$SANITIZERS" in
    # Reports take the place of crashes; a slower server needs longer.
    thread) timeout=120 ;;
    *) timeout=60 ;;
esac

# nbdkit's environment: the sanitizer runtime as functions.sh preloads it
# (--env "" alone: none).
env_args=(--env "")
for e in ${_nbdkit_env[@]+"${_nbdkit_env[@]}"}; do
    env_args+=(--env "$e")
done

/usr/bin/python3 "$SRCDIR/tests/fuzz/nbd_stream.py" \
    --nbdkit "$NBDKIT" --plugin "$PLUGIN" "${env_args[@]}" \
    --timeout "$timeout" --jobs 2 --out "$BUILDDIR/fuzz-nbd-findings" \
    --replay "$SRCDIR/tests/fuzz/corpus-nbd" \
    --random 50 --seed "${FUZZ_SEED:-2}" ||
    fail "a stream failed (kept in $BUILDDIR/fuzz-nbd-findings; replay one with nbd_stream.py --replay FILE)"

#!/usr/bin/env bash
# What the server tells clients and its operator: the block size limits,
# and the statistics printed with nbdkit's debug output at exit.
set -euo pipefail
source "$(dirname "$0")/functions.sh"
requires nbdinfo nbdsh

info="$(zram_nbdkit -U - "$PLUGIN" 16M --run 'nbdinfo "$uri"')"
for expected in "block_size_minimum: 1" "block_size_preferred: 4096" \
                "block_size_maximum: 33554432"; do
    grep -q "$expected" <<<"$info" || fail "nbdinfo does not report '$expected'"
done

# -v: the exit statistics go to nbdkit's debug output, one line each.
zram_nbdkit -v -U - "$PLUGIN" 16M \
    --run 'nbdsh -u "$uri" -c "h.pwrite(b\"z\" * 8192, 0)"' 2>/dev/null
grep -q "zram: mm_stat 8192 " "$NBDKIT_STDERR" ||
    fail "no 'zram: mm_stat 8192 ...' line in nbdkit's debug output at exit"
grep -q "zram: same_pages: 2" "$NBDKIT_STDERR" ||
    fail "no 'zram: same_pages: 2' line in nbdkit's debug output at exit"
echo "ok: block sizes and exit statistics reported"

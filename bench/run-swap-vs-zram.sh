#!/usr/bin/env bash
# Swap to nbdkit-zram against swap to the kernel's own zram, side by side
# in the guest of `make check-swap` (tests/test-vm-nbd-swap.sh: 384 MiB
# RAM, 2 vCPUs, QEMU TCG; a 480 MiB tmpfs fill and two processes touching
# 192 MiB each, 2.25x RAM at once, every page written and verified twice).
#
#   kernel  the guest kernel's zram.ko as swap: the same comp, mem_limit
#           (160M) and size (1G), vm.min_free_kbytes 12288, swapon with
#           discard
#   nbd     nbdkit-zram by the documented recipe: `nbdkit-zramctl swap on`
#           (swap=on, nbd-client -swap -b 4096, swapon with discard)
#
# For each of lz4 and zstd, ROUNDS rounds, the two kinds alternating (the
# order swapped every round); medians are printed with the ratio to the
# kernel's.  Each run first measures each side of swap alone (SIDES_MB,
# default 64, pushed out at once with MADV_PAGEOUT then read back in
# order: microseconds a page, second of its two rounds), then the
# workload (fill to last verify).  The profile columns say where the
# workload's time went, per page swapped (in or out): the guest's CPU
# time in user space, in its kernel (system + irq + softirq) and idle,
# and, for nbd, the server's own CPU time (user: nbdkit and the plugin;
# system: its socket and memory calls) and context switches.
#
#   bench/run-swap-vs-zram.sh      # about 4 minutes a run under TCG: 25 min
#
# Environment: BUILD_DIR (build), ROUNDS (3), COMPS ("lz4 zstd"),
# KINDS ("kernel nbd"), SIDES_MB (64), NBD_EXTRA (more plugin parameters
# for the nbd runs, e.g. "threads=..."), NBD_CLIENT_EXTRA (more
# nbd-client arguments for the nbd runs), MAX_SECTORS_KB (the nbd
# queue's largest request for the nbd runs; the driver's default is
# 128), APPEND (more guest kernel
# command line, both kinds), KEEP (a folder: each run's output kept
# there), RAW=1 (every run's figures too).
set -euo pipefail
# shellcheck source=bench/functions.sh
source "$(dirname "$(readlink -f "$0")")/functions.sh"

ROUNDS=${ROUNDS:-3}
COMPS=${COMPS:-lz4 zstd}
KINDS=${KINDS:-kernel nbd}
SIDES_MB=${SIDES_MB:-64}
KEEP=${KEEP:-}

die () { echo "run-swap-vs-zram: $*" >&2; exit 1; }
[ -f "$PLUGIN" ] || die "no plugin at $PLUGIN: build first"
[ -x "$BUILD_DIR/tools/nbdkit-zram-swap" ] || die "no tools/nbdkit-zram-swap in $BUILD_DIR: build first"
[ -z "$KEEP" ] || mkdir -p "$KEEP"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One run: its figures as "key=value ..." on one line, or a FAIL line.
run_one ()
{
    local kind=$1 comp=$2 out=$tmp/run.out r=0
    NBDKIT=$NBDKIT PLUGIN=$PLUGIN SRCDIR=$PWD BUILDDIR=$(readlink -f "$BUILD_DIR") \
        SANITIZERS=no VM_REQUIRED=1 COMP=$comp SWAP_MODE=on \
        ZRAM_VM_SWAP_KIND=$kind ZRAM_VM_SIDES_MB=$SIDES_MB \
        ZRAM_VM_EXTRA="$([ "$kind" = nbd ] && echo "${NBD_EXTRA:-}")" \
        ZRAM_VM_NBD_CLIENT_EXTRA="$([ "$kind" = nbd ] && echo "${NBD_CLIENT_EXTRA:-}")" \
        ZRAM_VM_APPEND="${APPEND:-}" \
        ZRAM_VM_MAX_SECTORS_KB="$([ "$kind" = nbd ] && echo "${MAX_SECTORS_KB:-}")" \
        bash tests/test-vm-nbd-swap.sh > "$out" 2>&1 || r=$?
    [ -z "$KEEP" ] || cp "$out" "$KEEP/$kind-$comp-$(date +%H%M%S).out"
    local result profile sides
    result=$(grep -a '^RESULT: ' "$out" | tail -1)
    profile=$(grep -a 'guest: profile: ' "$out" | tail -1 | sed 's/.*profile: //')
    sides=$(grep -a 'guest: touch sides2: sides ' "$out" | tail -1 | sed 's/.*sides //')
    if [ "$r" != 0 ] || [ -z "$profile" ]; then
        echo "FAIL exit=$r $(sed -n 's/^RESULT: //p' "$out" | tail -1)"
        return
    fi
    echo "$profile $sides verified=$(sed -n 's/.* verified=\([^ ]*\).*/\1/p' <<< "$result")"
}

val () { sed -n "s/.*\(^\| \)$1=\([^ ]*\).*/\2/p" <<< "$2"; }

declare -A runs=()
echo "# swap to nbdkit-zram vs the kernel's zram, in the check-swap guest"
echo
echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), host: $(nproc) CPUs, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "- plugin: $PLUGIN; rounds: $ROUNDS (medians); sides: $SIDES_MB MiB"
[ -z "${NBD_EXTRA:-}${NBD_CLIENT_EXTRA:-}${APPEND:-}${MAX_SECTORS_KB:-}" ] ||
    echo "- nbd runs: plugin '${NBD_EXTRA:-}', nbd-client '${NBD_CLIENT_EXTRA:-}', max_sectors_kb '${MAX_SECTORS_KB:-}'; guest append '${APPEND:-}'"
for round in $(seq 1 "$ROUNDS"); do
    for comp in $COMPS; do
        order=$KINDS
        [ $((round % 2)) = 1 ] || order=$(tr ' ' '\n' <<< "$KINDS" | tac | tr '\n' ' ')
        for kind in $order; do
            echo "run-swap-vs-zram: round $round $comp $kind ($(date +%T))" >&2
            line=$(run_one "$kind" "$comp")
            runs[$kind-$comp-$round]=$line
            [ -z "${RAW:-}" ] || echo "- $kind $comp round $round: $line"
        done
    done
done

# per_page KEY LINE: ticks (10 ms) of KEY per page swapped, in microseconds.
per_page ()
{
    awk -v t="$(val "$1" "$2")" -v i="$(val pswpin "$2")" -v o="$(val pswpout "$2")" \
        'BEGIN { if (i + o > 0) printf "%.1f", t * 10000 / (i + o); else print "-" }'
}
column_median ()
{
    local kind=$1 comp=$2 what=$3 values=() round line v
    for round in $(seq 1 "$ROUNDS"); do
        line=${runs[$kind-$comp-$round]:-}
        # Not run (a kind left out of KINDS), or failed.
        [ -n "$line" ] && [[ "$line" != FAIL* ]] || continue
        case "$what" in
            time) v=$(awk -v c="$(val time_cs "$line")" 'BEGIN { printf "%.1f", c / 100 }') ;;
            out_us) v=$(awk -v s="$(val pageout_s "$line")" -v n="$(val out "$line")" 'BEGIN { if (n > 0) printf "%.1f", s * 1e6 / n; else print "-" }') ;;
            in_us) v=$(awk -v s="$(val swapin_s "$line")" -v n="$(val out "$line")" 'BEGIN { if (n > 0) printf "%.1f", s * 1e6 / n; else print "-" }') ;;
            pages) v=$(( $(val pswpin "$line") + $(val pswpout "$line") )) ;;
            guest_user) v=$(per_page user "$line") ;;
            guest_kernel) v=$(awk -v a="$(per_page system "$line")" -v b="$(per_page irq "$line")" -v c="$(per_page softirq "$line")" 'BEGIN { printf "%.1f", a + b + c }') ;;
            guest_idle) v=$(awk -v a="$(per_page idle "$line")" -v b="$(per_page iowait "$line")" 'BEGIN { printf "%.1f", a + b }') ;;
            server_user) v=$(per_page server_user "$line") ;;
            server_system) v=$(per_page server_system "$line") ;;
            server_ctxt) v=$(awk -v c="$(val server_ctxt "$line")" -v i="$(val pswpin "$line")" -v o="$(val pswpout "$line")" 'BEGIN { if (i + o > 0) printf "%.2f", c / (i + o); else print "-" }') ;;
        esac
        values+=("$v")
    done
    if [ ${#values[@]} = 0 ]; then echo "FAIL"; else median "${values[@]}"; fi
}

echo
echo "## the workload (fill to last verify), medians of $ROUNDS"
echo
echo "| comp | swap | time s | vs kernel zram | pages swapped | swap-out alone µs/page | swap-in alone µs/page | runs failed |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for comp in $COMPS; do
    base=$(column_median kernel "$comp" time)
    for kind in $KINDS; do
        t=$(column_median "$kind" "$comp" time)
        failed=0
        for round in $(seq 1 "$ROUNDS"); do
            [[ "${runs[$kind-$comp-$round]}" != FAIL* ]] || failed=$((failed + 1))
        done
        ratio=$(awk -v a="$t" -v b="$base" 'BEGIN { if (b > 0 && a > 0) printf "%.2fx", a / b; else print "-" }')
        echo "| $comp | $kind | $t | $ratio | $(column_median "$kind" "$comp" pages) | $(column_median "$kind" "$comp" out_us) | $(column_median "$kind" "$comp" in_us) | $failed |"
    done
done
echo
echo "## where the workload's time went, µs per page swapped (in or out)"
echo
echo "Guest CPU time (2 vCPUs: the sum of both) by kind, and the server's own"
echo "CPU time (nbd only; it is part of the guest's user and kernel time)."
echo
echo "| comp | swap | guest user | guest kernel | guest idle | server user | server system | server context switches a page |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for comp in $COMPS; do
    for kind in $KINDS; do
        echo "| $comp | $kind | $(column_median "$kind" "$comp" guest_user) | $(column_median "$kind" "$comp" guest_kernel) | $(column_median "$kind" "$comp" guest_idle) | $(column_median "$kind" "$comp" server_user) | $(column_median "$kind" "$comp" server_system) | $(column_median "$kind" "$comp" server_ctxt) |"
    done
done
for key in "${!runs[@]}"; do
    [[ "${runs[$key]}" != FAIL* ]] || echo "- $key: ${runs[$key]}"
done

#!/usr/bin/env bash
# metrics=PATH and nbdkit-zramctl metrics|plot: the Prometheus text
# exposition parsed by a real parser (python3-prometheus-client's, and
# promtool's lint where it is installed); every figure of the stats file
# has its metric, with the value of the same sample; every family has
# HELP and TYPE, the nbdkit_zram_ namespace and a device label; counters
# end in _total; the per-class table adds up to the pool; the file is
# replaced atomically (mode 0644, no temporary left); nbdkit-zramctl
# metrics merges two servers into one valid exposition; node_exporter's
# textfile collector serves the file (where prometheus-node-exporter is
# installed); nbdkit-zramctl plot draws a PNG (where gnuplot is).
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"
requires nbdsh python3
if ! /usr/bin/python3 -c 'import prometheus_client' 2>/dev/null; then
    echo "$TEST_NAME: SKIP: python3-prometheus-client is not installed" >&2
    exit 77
fi

export METRICS="$tmp/textfile/nbdkit-zram.prom" STATS="$tmp/stats"
export CTL="$tmp/ctl" CTL2="$tmp/ctl2" SOCK2="$tmp/sock2"
export ZRAMCTL="$BUILDDIR/tools/nbdkit-zramctl" PLUGIN NBDKIT TMP="$tmp"
export PNG="$tmp/history.png"
# The second server's environment: the sanitizer runtime as functions.sh
# preloads it for nbdkit.
NBDKIT_ENV="$(printf '%s\n' ${_nbdkit_env[@]+"${_nbdkit_env[@]}"})"
export NBDKIT_ENV
mkdir "$tmp/textfile"
export PROMTOOL="$(command -v promtool || :)"
export NODE_EXPORTER="$(command -v prometheus-node-exporter || :)"
export GNUPLOT_BIN="$(command -v gnuplot || :)"
[ -n "$PROMTOOL" ] || echo "$TEST_NAME: promtool not installed: its lint is skipped" >&2
[ -n "$NODE_EXPORTER" ] || echo "$TEST_NAME: prometheus-node-exporter not installed: the textfile collector check is skipped" >&2
[ -n "$GNUPLOT_BIN" ] || echo "$TEST_NAME: gnuplot not installed: the plot check is skipped" >&2

zram_nbdsh 64M comp=zstd stats="$STATS" metrics="$METRICS" ctl="$CTL" \
    'name=disk "one"\' <<'EOF'
import os, re, socket, stat, subprocess, time, urllib.request
from prometheus_client.parser import text_string_to_metric_families

B = 4096
env = os.environ
DEVICE = 'disk "one"\\'

def read_stats():
    lines = open(env["STATS"]).read().splitlines()
    return dict(l.split(": ", 1) for l in lines[3:])

def parse(text):
    """{family name: family}, failing on anything the parser refuses."""
    return {f.name: f for f in text_string_to_metric_families(text)}

def same_moment():
    """The stats file and the metrics file of one sample."""
    for _ in range(100):
        try:
            stats = read_stats()
            text = open(env["METRICS"]).read()
        except FileNotFoundError:
            time.sleep(0.1)
            continue
        families = parse(text)
        number = families["nbdkit_zram_samples"].samples[0].value
        if int(stats["sample"]) == number:
            return stats, families, text
        time.sleep(0.1)
    raise AssertionError("no stats and metrics files of the same sample")

def lint(text, what):
    if env["PROMTOOL"]:
        r = subprocess.run([env["PROMTOOL"], "check", "metrics"], input=text,
                           capture_output=True, text=True)
        assert r.returncode == 0, "promtool check metrics (%s): %s%s" % (
            what, r.stdout, r.stderr)

# Some of everything: compressible, same-filled, random and trimmed blocks.
text_block = b"".join(b"metrics line %06d of the test\n" % i for i in range(160))[:B]
for i in range(256):
    h.pwrite(text_block, i * B)
h.pwrite(b"\x07" * (16 * B), 512 * B)
h.pwrite(os.urandom(8 * B), 1024 * B)
h.trim(4 * B, 0)
buf = h.pread(64 * B, 0)
time.sleep(1.2)

stats, families, text = same_moment()
lint(text, "metrics=")

# The stats file's keys, each with its metric; scale: what the metric is
# in the stats file's unit (compact_ms is milliseconds, the metric
# seconds).  A stats key without a metric fails here.
STATS_TO_METRIC = {
    "sample": ("nbdkit_zram_samples", 1),
    "disk_size": ("nbdkit_zram_disk_size_bytes", 1),
    "orig_data_size": ("nbdkit_zram_orig_data_bytes", 1),
    "compr_data_size": ("nbdkit_zram_compr_data_bytes", 1),
    "mem_used_total": ("nbdkit_zram_mem_used_bytes", 1),
    "mem_limit": ("nbdkit_zram_mem_limit_bytes", 1),
    "limit_used": ("nbdkit_zram_mem_limit_used_bytes", 1),
    "mem_used_max": ("nbdkit_zram_mem_used_max_bytes", 1),
    "same_pages": ("nbdkit_zram_same_blocks", 1),
    "pages_compacted": ("nbdkit_zram_compacted_pages", 1),
    "pages_freeable": ("nbdkit_zram_freeable_pages", 1),
    "compact_ms": ("nbdkit_zram_compact_seconds", 1000),
    "huge_pages": ("nbdkit_zram_huge_blocks", 1),
    "huge_pages_since": ("nbdkit_zram_huge_blocks_stored", 1),
    "failed_reads": ("nbdkit_zram_failed_reads", 1),
    "failed_writes": ("nbdkit_zram_failed_writes", 1),
    "invalid_io": ("nbdkit_zram_invalid_io", 1),
    "notify_free": ("nbdkit_zram_notify_free", 1),
    "reads": ("nbdkit_zram_reads", 1),
    "writes": ("nbdkit_zram_writes", 1),
    "table_bytes": ("nbdkit_zram_table_bytes", 1),
    "metadata_bytes": ("nbdkit_zram_metadata_bytes", 1),
    "codec_bytes": ("nbdkit_zram_codec_bytes", 1),
    "reserve_bytes": ("nbdkit_zram_reserve_bytes", 1),
    "reserve_refills": ("nbdkit_zram_reserve_refilled_bytes", 1),
    "reserve_misses": ("nbdkit_zram_reserve_misses", 1),
    "reserve_metadata_misses": ("nbdkit_zram_reserve_metadata_misses", 1),
    "recomp_blocks": ("nbdkit_zram_recompressed_blocks", 1),
    "recomp_bytes_saved": ("nbdkit_zram_recompress_saved_bytes", 1),
    "packed_blocks": ("nbdkit_zram_packed_blocks", 1),
    "pack_units": ("nbdkit_zram_pack_units", 1),
    "pack_dictionaries": ("nbdkit_zram_pack_dictionaries", 1),
    "pack_dictionary_bytes": ("nbdkit_zram_pack_dictionary_bytes", 1),
    "decode_cache_bytes": ("nbdkit_zram_decode_cache_bytes", 1),
    "decode_cache_hits": ("nbdkit_zram_decode_cache_hits", 1),
    "decode_cache_misses": ("nbdkit_zram_decode_cache_misses", 1),
    "bd_count": ("nbdkit_zram_backing_blocks", 1),
    "bd_reads": ("nbdkit_zram_backing_block_reads", 1),
    "bd_writes": ("nbdkit_zram_backing_block_writes", 1),
    "bd_bytes": ("nbdkit_zram_backing_stored_bytes", 1),
    "bd_failed_reads": ("nbdkit_zram_backing_failed_reads", 1),
    "bd_readbacks": ("nbdkit_zram_backing_readbacks", 1),
    "backing_capacity": ("nbdkit_zram_backing_capacity_bytes", 1),
    "backing_used": ("nbdkit_zram_backing_used_bytes", 1),
    "backing_map_bytes": ("nbdkit_zram_backing_map_bytes", 1),
    "backing_failed": ("nbdkit_zram_backing_failed", 1),
    "backing_reconnects": ("nbdkit_zram_backing_reconnects", 1),
    "backing_timeouts": ("nbdkit_zram_backing_timeouts", 1),
    "backing_corrupt": ("nbdkit_zram_backing_corrupt", 1),
    "backing_abandoned": ("nbdkit_zram_backing_abandoned", 1),
    "backing_quarantined_bytes": ("nbdkit_zram_backing_quarantined_bytes", 1),
    "backing_errors_nospace": ("nbdkit_zram_backing_errors_nospace", 1),
    "backing_errors_io": ("nbdkit_zram_backing_errors_io", 1),
    "cap": ("nbdkit_zram_cap_bytes", 1),
    "floor": ("nbdkit_zram_floor_bytes", 1),
    "quota_bytes": ("nbdkit_zram_quota_bytes", 1),
    "refused_for_budget": ("nbdkit_zram_refused_for_budget", 1),
    "budget_floors": ("nbdkit_zram_budget_floors_bytes", 1),
    "budget_unmet_floors": ("nbdkit_zram_budget_unmet_floors_bytes", 1),
    "writeback_limit": ("nbdkit_zram_writeback_limit_bytes", 1),
    "process_rss": ("nbdkit_zram_process_resident_bytes", 1),
    "process_rss_files": ("nbdkit_zram_process_resident_file_bytes", 1),
    "process_rss_beyond_store": ("nbdkit_zram_process_resident_beyond_store_bytes", 1),
    "swap_mode": ("nbdkit_zram_swap_mode", None),
    "swap_locked_bytes": ("nbdkit_zram_swap_locked_bytes", 1),
    "swap_locked_mappings_bytes": ("nbdkit_zram_swap_locked_mappings_bytes", 1),
    "swap_memory_locked": ("nbdkit_zram_swap_memory_locked", 1),
    "swap_realtime_priority": ("nbdkit_zram_swap_realtime_priority", 1),
    "swap_io_flusher": ("nbdkit_zram_swap_io_flusher", 1),
    "swap_io_flusher_worker": ("nbdkit_zram_swap_io_flusher_worker", 1),
    "swap_oom_score_adj": ("nbdkit_zram_swap_oom_score_adj", 1),
    "swap_write_faults": ("nbdkit_zram_swap_write_faults", 1),
    "swap_read_faults": ("nbdkit_zram_swap_read_faults", 1),
    "swap_stacks_ready": ("nbdkit_zram_swap_stacks_ready", 1),
    "swap_stack_faults": ("nbdkit_zram_swap_stack_faults", 1),
    "swap_full_refusals": ("nbdkit_zram_swap_full_refusals", 1),
    "swap_full_now": ("nbdkit_zram_swap_full_now", 1),
    "swap_full_oom_kills": ("nbdkit_zram_swap_full_oom_kills", 1),
    "swap_full_kill_delay_max_ms": ("nbdkit_zram_swap_full_kill_delay_max_seconds", 1000),
    "compression_ratio": ("nbdkit_zram_compression_ratio", 0.005),
    "memory_ratio": ("nbdkit_zram_memory_ratio", 0.005),
}
CLASS_METRICS = {"nbdkit_zram_class_objects", "nbdkit_zram_class_object_slots",
                 "nbdkit_zram_class_pages", "nbdkit_zram_class_freeable_pages"}

def value(family):
    samples = [s for s in family.samples if not s.name.endswith("_created")]
    assert len(samples) == 1, "%s: %d samples" % (family.name, len(samples))
    assert samples[0].labels == {"device": DEVICE}, samples[0]
    return samples[0].value

missing = set(stats) - set(STATS_TO_METRIC)
assert not missing, "stats keys without a metric: %s" % sorted(missing)
checked = 0
for key, (name, scale) in STATS_TO_METRIC.items():
    if key not in stats:
        # Only writeback_limit comes and goes (a limit is set or not).
        assert key == "writeback_limit" and name not in families, key
        continue
    assert name in families, "stats key %s: no metric %s" % (key, name)
    got = value(families[name])
    if key == "swap_mode":
        assert ["off", "on", "try"][int(got)] == stats[key], (got, stats[key])
    elif scale in (0.005,):
        assert abs(got - float(stats[key])) <= scale, (key, got, stats[key])
    else:
        want = int(stats[key])
        assert abs(got * scale - want) < 1, "%s: metric %r, stats %d" % (key, got, want)
    checked += 1

# No mem_limit: nothing is borrowed (test-plugin-devices checks a sum).
assert value(families["nbdkit_zram_budget_borrowed_bytes"]) == 0

# Every family: the namespace, HELP, TYPE; counters named _total.
seen = set(n for n, _ in STATS_TO_METRIC.values()) | CLASS_METRICS \
    | {"nbdkit_zram_info", "nbdkit_zram_budget_borrowed_bytes"}
for name, family in families.items():
    assert name.startswith("nbdkit_zram_"), name
    assert name in seen, "metric %s is not checked against anything" % name
    assert family.documentation, "%s has no HELP" % name
    assert family.type in ("gauge", "counter"), (name, family.type)
    for s in family.samples:
        if family.type == "counter":
            assert s.name == name + "_total", (name, s.name)
        assert s.labels["device"] == DEVICE, s
assert re.search(r'^# TYPE nbdkit_zram_reads_total counter$', text, re.M), \
    "counters are typed by their sample name"

# The man page lists every metric, and nothing that is not one.
man = open(os.path.join(env["SRCDIR"], "man", "nbdkit-zram-metrics.pod")).read()
documented = set(re.findall(r"^=item C<(nbdkit_zram_\w+)>", man, re.M))
exposed = {name + "_total" if f.type == "counter" else name
           for name, f in families.items()}
assert exposed - documented == set(), "not in the man page: %s" % (exposed - documented)
# Shown only with writeback_limit= or region=.
conditional = {"nbdkit_zram_writeback_limit_bytes", "nbdkit_zram_generation",
               "nbdkit_zram_restarts_total", "nbdkit_zram_recoveries_total",
               "nbdkit_zram_recovery_restarts_total",
               "nbdkit_zram_recovered_blocks", "nbdkit_zram_recovery_seconds",
               "nbdkit_zram_downtime_seconds"}
assert documented - exposed <= conditional, \
    "in the man page, not exposed: %s" % (documented - exposed - conditional)

# The per-class table adds up to the pool (a quiet server: the same).
pages = sum(s.value for s in families["nbdkit_zram_class_pages"].samples)
assert pages * 4096 == int(stats["mem_used_total"]), (pages, stats["mem_used_total"])
objects = families["nbdkit_zram_class_objects"].samples
assert objects and all(set(s.labels) == {"device", "class", "size"} for s in objects)
# The device's constants, as Prometheus' _info convention has them.
info = families["nbdkit_zram_info"].samples
assert len(info) == 1 and info[0].value == 1, info
assert info[0].labels["device"] == DEVICE and info[0].labels["algorithm"] == "zstd", info
assert info[0].labels["level"].lstrip("-").isdigit(), info
assert info[0].labels["swap_mode"] == "off" and info[0].labels["version"], info

# The file: mode 0644, replaced whole, no temporary left behind.
mode = stat.S_IMODE(os.stat(env["METRICS"]).st_mode)
assert mode == 0o644, oct(mode)
leftovers = [n for n in os.listdir(os.path.dirname(env["METRICS"]))
             if n != "nbdkit-zram.prom"]
assert not leftovers, leftovers

# The control channel's metrics, merged for two servers by zramctl.
second_env = dict(os.environ)
second_env.update(l.split("=", 1) for l in env["NBDKIT_ENV"].splitlines() if l)
second = subprocess.Popen([env["NBDKIT"], "-f", "-U", env["SOCK2"], env["PLUGIN"],
                           "16M", "ctl=" + env["CTL2"], "name=disk2"], env=second_env)
try:
    for _ in range(600):          # a minute: sanitizer builds start slowly
        if os.path.exists(env["CTL2"]):
            break
        time.sleep(0.1)
    r = subprocess.run([env["ZRAMCTL"], "metrics", env["CTL"], env["CTL2"]],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    merged = parse(r.stdout)
    lint(r.stdout, "nbdkit-zramctl metrics")
    assert set(merged) == set(families) - {"nbdkit_zram_writeback_limit_bytes"}, \
        set(merged) ^ set(families)
    for name, family in merged.items():
        devices = {s.labels["device"] for s in family.samples}
        assert devices == {DEVICE, "disk2"} or name in CLASS_METRICS, (name, devices)
    assert r.stdout.count("# HELP nbdkit_zram_orig_data_bytes ") == 1
    got = [s.value for s in merged["nbdkit_zram_disk_size_bytes"].samples
           if s.labels["device"] == "disk2"]
    assert got == [16 * 1024 * 1024], got
    # A server that is not there: the others are still printed, and it fails.
    r = subprocess.run([env["ZRAMCTL"], "metrics", env["CTL"], env["TMP"] + "/none"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "nbdkit_zram_reads_total" in r.stdout, r
    # Two servers of one name (here one server twice): its series once,
    # the second left out and said so, exit status 1.
    r = subprocess.run([env["ZRAMCTL"], "metrics", env["CTL"], env["CTL"]],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "both call their device" in r.stderr, r
    again = parse(r.stdout)
    assert len(again["nbdkit_zram_disk_size_bytes"].samples) == 1, again
finally:
    second.terminate()
    second.wait()

# node_exporter's textfile collector serves the file as it is.
if env["NODE_EXPORTER"]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exporter = subprocess.Popen(
        [env["NODE_EXPORTER"], "--web.listen-address=127.0.0.1:%d" % port,
         "--collector.disable-defaults", "--collector.textfile",
         "--collector.textfile.directory=" + os.path.dirname(env["METRICS"])],
        stderr=subprocess.DEVNULL)
    try:
        scraped = None
        for _ in range(100):
            try:
                scraped = urllib.request.urlopen(
                    "http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert scraped, "node_exporter never answered"
        served = parse(scraped)
        assert 'node_textfile_scrape_error 0' in scraped, \
            [l for l in scraped.splitlines() if "textfile" in l]
        for name in ("nbdkit_zram_orig_data_bytes", "nbdkit_zram_reads",
                     "nbdkit_zram_class_pages"):
            assert name in served, name
            assert served[name].samples[0].labels["device"] == DEVICE
        print("node_exporter served %d nbdkit_zram families" %
              sum(1 for n in served if n.startswith("nbdkit_zram_")))
    finally:
        exporter.terminate()
        exporter.wait()

# A PNG of the run's history, from the samples zramctl reads.
if env["GNUPLOT_BIN"]:
    plot = subprocess.Popen([env["ZRAMCTL"], "plot", env["CTL"], env["PNG"], "3", "0.2"],
                            stderr=subprocess.PIPE, text=True)
    for i in range(64):
        h.pwrite(text_block, (2048 + i) * B)
        time.sleep(0.02)
    _, err = plot.communicate(timeout=60)
    assert plot.returncode == 0, err
    assert open(env["PNG"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    rows = [l for l in open(env["PNG"] + ".dat") if not l.startswith("#")]
    assert len(rows) >= 5, rows
    stored = [float(l.split()[1]) for l in rows]
    assert stored[-1] > stored[0], "the plot's samples do not show the writes"

print("metrics: %d stats figures checked, %d families" % (checked, len(families)))
EOF

# Bad parameters name themselves; a file that cannot be written is refused.
if zram_nbdkit "$PLUGIN" 1M metrics="$tmp/no/such/dir/m.prom" --run true 2>/dev/null; then
    fail "metrics= in a missing directory was accepted"
fi
grep -q "metrics: cannot write" "$NBDKIT_STDERR" || fail "no 'metrics:' error: $(cat "$NBDKIT_STDERR")"
if zram_nbdkit "$PLUGIN" 1M name= --run true 2>/dev/null; then
    fail "an empty name= was accepted"
fi
grep -q "name: " "$NBDKIT_STDERR" || fail "no 'name:' error: $(cat "$NBDKIT_STDERR")"
echo "$TEST_NAME: ok"

#!/usr/bin/env bash
# Metrics for the monitoring you already run: a compressed RAM disk whose
# metrics node_exporter's textfile collector picks up, so Prometheus
# scrapes them with the host's (and Grafana shows them:
# examples/grafana-dashboard.json).  The server rewrites the .prom file
# every second, atomically, in the collector's directory.
# Usage: node-exporter.sh [SIZE] [NAME]
#   Debian: apt-get install prometheus-node-exporter (its textfile
#   directory is /var/lib/prometheus/node-exporter), then
#   curl -s localhost:9100/metrics | grep ^nbdkit_zram_
set -euo pipefail
PLUGIN=${PLUGIN:-zram}   # or the path of a built nbdkit-zram-plugin.so
# nbdkit 1.34 or later: older ones abort when a client dies mid-request.
NBDKIT=${NBDKIT:-nbdkit}
TEXTFILE_DIR=${TEXTFILE_DIR:-/var/lib/prometheus/node-exporter}

SIZE=${1:-4G}
NAME=${2:-zram0}   # the metrics' device label: one per server on a host
SOCKET=${SOCKET:-/run/nbdkit-$NAME.sock}

[ -d "$TEXTFILE_DIR" ] || {
    echo "node-exporter.sh: $TEXTFILE_DIR does not exist: install" \
         "prometheus-node-exporter or set TEXTFILE_DIR" >&2
    exit 1
}
# The collector reads *.prom; the server never leaves a partial file
# there (it writes a temporary beside it and renames it over).
exec "$NBDKIT" -f -U "$SOCKET" "$PLUGIN" "$SIZE" comp=zstd mem_limit=1G \
    name="$NAME" metrics="$TEXTFILE_DIR/nbdkit-zram-$NAME.prom" \
    ctl="/run/nbdkit-$NAME.ctl"

#!/usr/bin/env bash
# The files in examples/ are well-formed: shell scripts parse (bash -n),
# start with a #! line and pass shellcheck (when installed) at warning
# level; systemd units have [Unit], [Service] and ExecStart= and pass
# systemd-analyze verify (when installed); Grafana dashboards (*.json)
# load as JSON, have panels with queries, and every nbdkit_zram_ metric a
# query names is one the plugin exposes (its man page's Metrics list,
# which tests/test-plugin-metrics.sh checks against a real exposition).
# An empty examples/ or a file of another type fails.
set -euo pipefail
# shellcheck source=tests/functions.sh
source "$(dirname "$0")/functions.sh"

examples="$SRCDIR/examples"
[ -d "$examples" ] || fail "$examples does not exist"

count=0
errors=0
bad ()
{
    echo "FAIL: $*" >&2
    errors=$((errors + 1))
}

shopt -s nullglob dotglob
for file in "$examples"/*; do
    name="$(basename "$file")"
    count=$((count + 1))
    errors_before=$errors
    # A unit template: the unit make writes from it, with this build's
    # paths (what make install puts in the systemd unit directory).
    if [[ $name == *.service.in ]]; then
        grep -q '%BINDIR%\|%NBDKIT%' "$file" || bad "$name: no %BINDIR% or %NBDKIT% to fill in"
        name=${name%.in}
        file="$BUILDDIR/examples/$name"
        if grep -q '%[A-Z]*%' "$file"; then
            bad "$name: make left a placeholder: $(grep '%[A-Z]*%' "$file")"
        fi
        # It runs the programs where make install puts them.
        for program in $(sed -n 's/^Exec[A-Za-z]*=[-@!+:]*\([^ ]*\).*/\1/p' "$file"); do
            case "$(basename "$program")" in
                nbdkit-zramctl) [ "$program" = "${INSTALL_BINDIR:?}/nbdkit-zramctl" ] ||
                    bad "$name: runs $program, make install puts nbdkit-zramctl in $INSTALL_BINDIR" ;;
                nbdkit) [ "$program" = "$NBDKIT" ] ||
                    bad "$name: runs $program, the build is for $NBDKIT" ;;
            esac
        done
    fi
    case "$name" in
        *.sh)
            [ -f "$file" ] || { bad "$name: not a regular file"; continue; }
            head -n1 "$file" | grep -q '^#!' || bad "$name: no #! line"
            bash -n "$file" || bad "$name: bash -n failed"
            if command -v shellcheck >/dev/null 2>&1; then
                shellcheck -S warning "$file" || bad "$name: shellcheck warnings"
            fi
            [ "$errors" != "$errors_before" ] || echo "ok: $name" ;;
        *.service)
            [ -f "$file" ] || { bad "$name: not a regular file"; continue; }
            grep -qx '\[Unit\]' "$file" || bad "$name: no [Unit] section"
            grep -qx '\[Service\]' "$file" || bad "$name: no [Service] section"
            grep -q '^ExecStart=' "$file" || bad "$name: no ExecStart= line"
            grep '^ExecStart=' "$file" | grep -q nbdkit ||
                bad "$name: ExecStart= runs neither nbdkit nor nbdkit-zramctl"
            if command -v systemd-analyze >/dev/null 2>&1; then
                # Verified in a root of its own holding the unit and the
                # programs its Exec lines run, at those paths (this
                # build's nbdkit-zramctl at the bindir it installs to):
                # what make install gives.  The documentation (man:) is
                # not installed when testing from the build tree: that
                # complaint alone is ignored.
                root="$tmp/root-$name"
                mkdir -p "$root/etc/systemd/system" "$root/usr/lib/systemd"
                # The system's own units (the targets a unit's default
                # dependencies name).
                [ ! -d /usr/lib/systemd/system ] ||
                    cp -r /usr/lib/systemd/system "$root/usr/lib/systemd/"
                cp "$file" "$root/etc/systemd/system/$name"
                for program in $(sed -n 's/^Exec[A-Za-z]*=[-@!+:]*\([^ ]*\).*/\1/p' "$file"); do
                    mkdir -p "$root$(dirname "$program")"
                    if [ "$(basename "$program")" = nbdkit-zramctl ]; then
                        cp "$BUILDDIR/tools/nbdkit-zramctl" "$root$program"
                    elif [ -x "$program" ]; then
                        cp "$program" "$root$program"
                    fi
                done
                rc=0
                out="$(systemd-analyze verify --root="$root" "/etc/systemd/system/$name" 2>&1)" || rc=$?
                problems="$(grep -v -e "Command 'man " <<<"$out" |
                    grep -v '^$' || :)"
                if grep -Eq "Failed to (initialize|create|set up|allocate) (the )?manager|not been booted with systemd" <<<"$out"; then
                    # A container where systemd-analyze cannot work at all.
                    echo "note: $name: systemd-analyze verify cannot run here:" >&2
                    echo "$out" | sed 's/^/    /' >&2
                elif [ -n "$problems" ]; then
                    echo "$out" | sed 's/^/    /' >&2
                    bad "$name: systemd-analyze verify reported problems"
                elif [ "$rc" != 0 ] && [ -z "$problems" ] && ! grep -q "Command " <<<"$out"; then
                    bad "$name: systemd-analyze verify failed (exit status $rc)"
                fi
            fi
            [ "$errors" != "$errors_before" ] || echo "ok: $name" ;;
        *.json)
            /usr/bin/python3 - "$file" "$SRCDIR/man/nbdkit-zram-metrics.pod" <<'EOF' ||
import json, re, sys
dashboard = json.load(open(sys.argv[1]))
documented = set(re.findall(r"^=item C<(nbdkit_zram_\w+)>",
                            open(sys.argv[2]).read(), re.M))
assert documented, "no metrics in the man page"
panels = dashboard["panels"]
assert panels, "no panels"
queries = [t["expr"] for p in panels for t in p["targets"]]
assert len(queries) >= len(panels), "a panel without a query"
queries += [v["query"] for v in dashboard.get("templating", {}).get("list", [])
            if v.get("type") == "query"]
named = set()
for q in queries:
    named |= set(re.findall(r"\bnbdkit_zram_\w+", q))
unknown = named - documented
assert not unknown, "queries name metrics that do not exist: %s" % sorted(unknown)
print("%d panels, %d queries, %d metrics named" % (len(panels), len(queries), len(named)))
EOF
                bad "$name: not a dashboard whose queries name existing metrics"
            [ "$errors" != "$errors_before" ] || echo "ok: $name" ;;
        *)
            bad "$name: unknown kind of example (expected *.sh, *.service or *.json)" ;;
    esac
done

[ "$count" -gt 0 ] || fail "$examples is empty"
[ "$errors" = 0 ] || fail "$errors problem(s) in examples/ (see above)"
echo "examples ok: $count files"

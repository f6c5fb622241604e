#!/bin/sh
# daemon/tuttid.service checked by systemd itself: `systemd-analyze verify` parses every directive, the
# system-call set names of SystemCallFilter, the capabilities, the device rules and the unit's ordering, and
# fails on an unknown or misspelled one. The unit's ExecStart paths (/usr/local/sbin/tuttid) are pointed at
# the tuttid just built, so the check also needs the command to exist and be executable.
# Usage: systemd_unit_test.sh UNIT TUTTID. Exit 77 (skipped) where systemd-analyze is not installed.
# What this does not do: start the unit. A machine whose PID 1 is not systemd (CI's) cannot; docs/daemon.md,
# "Deployment", says what was run where.
set -eu
unit=$1
tuttid=$(readlink -f "$2")
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "systemd-analyze not installed: skipped"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed "s|/usr/local/sbin/tuttid|$tuttid|g" "$unit" > "$dir/tuttid.service"
grep -q "^ExecStart=$tuttid " "$dir/tuttid.service" || { echo "FAIL: no ExecStart naming $tuttid"; exit 1; }
if ! out=$(systemd-analyze verify --man=no "$dir/tuttid.service" 2>&1); then
  echo "FAIL: systemd-analyze verify: $out"
  exit 1
fi
# verify reports some problems as messages without failing: any line naming the unit is one.
if printf '%s\n' "$out" | grep -q 'tuttid.service'; then
  echo "FAIL: systemd-analyze verify reported: $out"
  exit 1
fi
echo "ok: systemd-analyze verify accepts tuttid.service ($(systemd-analyze --version | head -n 1))"

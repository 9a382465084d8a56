#!/usr/bin/env bash
# The tests run a real InfluxDB 1.x (Debian's influxd). Install it when missing and we are root.
set -euo pipefail
if command -v influxd >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian's influxdb (InfluxDB 1.x) for the tests..." >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq influxdb >/dev/null
  # The package may start a system server on :8086; the tests start their own on free ports.
  (command -v systemctl >/dev/null && systemctl stop influxdb 2>/dev/null) || true
  exit 0
fi
echo "the tests need influxd (InfluxDB 1.x): run 'sudo apt-get install influxdb'" >&2
exit 1

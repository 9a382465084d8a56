#!/usr/bin/env bash
# make test: the programs the tests run besides Python, installed when missing (as root, with apt)
# or named with the command that installs them:
#   influxd   Debian's influxdb (InfluxDB 1.x): the real server the database tests start on free ports
#   chromium  Debian's chromium (headless): renders the HTML report for the layout and screenshot test
#   node/npm  run InfluxData's Flux parser and type checker (tests/flux) and Grafana's own types,
#             unit formatter and transformers for the dashboards (tests/grafana-types), each npm ci
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '== make test: %s\n' "$*"; }
missing=()
command -v influxd >/dev/null 2>&1 || [ -x /usr/bin/influxd ] || missing+=(influxdb)
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${missing[*]} with apt-get (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
    # the influxdb package may start a system server on :8086; the tests start their own
    (command -v systemctl >/dev/null && systemctl stop influxdb 2>/dev/null) || true
  else
    say "the tests need: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi
if [ ! -f tests/flux/node_modules/@influxdata/flux-lsp-browser/package.json ]; then
  say "InfluxData's Flux checker: npm ci --prefix tests/flux (about 4 MB from the npm registry)"
  npm ci --prefix tests/flux --no-audit --no-fund
fi
if [ ! -f tests/grafana-types/node_modules/.package-lock.json ] \
  || [ tests/grafana-types/package-lock.json -nt tests/grafana-types/node_modules/.package-lock.json ]; then
  say "Grafana 13.2's types, unit formatter and transformers: npm ci --prefix tests/grafana-types (@grafana/schema, @grafana/data)"
  npm ci --prefix tests/grafana-types --no-audit --no-fund
fi
say "influxd $(influxd version 2>/dev/null | head -1 | awk '{print $2}'), $(chromium --version 2>/dev/null || chromium-browser --version), node $(node --version): ready"

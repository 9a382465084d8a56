#!/usr/bin/env bash
# The stack's secrets, generated once: random, mode 0600, in the git-ignored secrets/ (0700).
# File names and uses: influxdb/README.md and .env.example. An existing non-empty file is never
# replaced (InfluxDB keeps only token hashes: these files are the only copies). Nothing secret is
# printed; only the names of the files created.
set -euo pipefail
cd "$(dirname "$0")/.."
umask 077
mkdir -p secrets
chmod 700 secrets

random_secret() { # $1 = bytes of entropy; URL-safe text, one line
  python3 -c 'import secrets, sys; print(secrets.token_urlsafe(int(sys.argv[1])))' "$1"
}

for spec in influxdb-admin-password:24 influxdb-admin-token:48 grafana-admin-password:24; do
  name=${spec%%:*}
  if [ ! -s "secrets/$name" ]; then
    random_secret "${spec##*:}" >"secrets/$name.tmp"
    mv "secrets/$name.tmp" "secrets/$name"
    echo "gpulse up: generated secrets/$name"
  fi
done
# Grafana's read-only InfluxDB token: created empty here, written by `gpulse setup` (the compose
# `setup` service) once InfluxDB runs; it must exist as a file before compose bind-mounts it.
if [ ! -e secrets/grafana-influx-token ]; then
  : >secrets/grafana-influx-token
fi
chmod 600 secrets/influxdb-admin-password secrets/influxdb-admin-token secrets/grafana-admin-password secrets/grafana-influx-token

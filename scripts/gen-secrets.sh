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
# InfluxDB 3 (compose profile v3): an admin token in the form the server requires (apiv3_...), as a
# plain file for gpulse and Grafana, and as the JSON `influxdb3 serve --admin-token-file` reads
# (influxdb3/src/commands/serve.rs; fields of create/token.rs AdminTokenFile). The JSON is 0640 in
# this user's group: the server runs as the image's uid 1500 with that group (docker-compose.yml).
if [ ! -s secrets/influxdb3-admin-token ]; then
  printf 'apiv3_%s\n' "$(random_secret 48)" >secrets/influxdb3-admin-token.tmp
  mv secrets/influxdb3-admin-token.tmp secrets/influxdb3-admin-token
  rm -f secrets/influxdb3-admin-token.json
  echo "gpulse up: generated secrets/influxdb3-admin-token"
fi
if [ ! -s secrets/influxdb3-admin-token.json ]; then
  python3 -c 'import json, sys; print(json.dumps({"token": open(sys.argv[1]).read().strip(), "name": "gpulse-admin"}))' \
    secrets/influxdb3-admin-token >secrets/influxdb3-admin-token.json.tmp
  mv secrets/influxdb3-admin-token.json.tmp secrets/influxdb3-admin-token.json
fi
chmod 600 secrets/influxdb3-admin-token
chmod 640 secrets/influxdb3-admin-token.json

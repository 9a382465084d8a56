#!/usr/bin/env bash
# make backup-grafana: a copy of the grafana-data volume (users, dashboards edited in the UI,
# alert state) in backups/, taken with Grafana stopped so its SQLite database is consistent.
#
# Grafana 13's first start migrates dashboards and folders into unified storage, one way: a 12.x
# volume that 13 has opened cannot be opened by 12 again. Take this copy before the first
# `make up` with a new major version; to go back, stop the stack, restore the copy into the volume
# (scripts/backup-grafana.sh restore FILE) and pin the old image in docker-compose.yml.
# The tar runs inside the grafana service's own image, so nothing else is pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'gpulse backup-grafana: %s\n' "$*"; }
command -v docker >/dev/null 2>&1 || { say "needs Docker (the volume lives in Docker): nothing to back up here" >&2; exit 2; }

if [ "${1:-}" = restore ]; then
  file=${2:?usage: scripts/backup-grafana.sh restore backups/grafana-data-....tgz}
  test -s "$file" || { say "$file is missing or empty: nothing restored" >&2; exit 2; }
  say "stopping grafana, then restoring $file into the grafana-data volume"
  docker compose stop grafana
  docker compose run --rm --no-deps -T --user 0 --entrypoint sh grafana \
    -c 'find /var/lib/grafana -mindepth 1 -maxdepth 1 ! -name dashboards -exec rm -rf {} + && tar xzf - -C /var/lib/grafana' <"$file"
  say "restored; start the stack with the image the copy came from (docker-compose.yml) and make up"
  exit 0
fi

mkdir -p backups
out="backups/grafana-data-$(date -u +%Y%m%dT%H%M%SZ).tgz"
tmp="$out.partial"
say "stopping grafana, then copying the grafana-data volume to $out"
docker compose stop grafana
# --exclude: the dashboards directory is the provisioned, read-only mount of ./grafana/dashboards
docker compose run --rm --no-deps -T --entrypoint tar grafana czf - --exclude ./dashboards -C /var/lib/grafana . >"$tmp"
test -s "$tmp" || { rm -f "$tmp"; say "the copy came out empty: nothing written" >&2; exit 1; }
mv "$tmp" "$out"
say "done: $out ($(du -h "$out" | cut -f1)); start the stack again with: make up"

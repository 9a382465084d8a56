#!/usr/bin/env bash
# make e2e: the whole stack in Docker. Brings up InfluxDB 2 + Grafana + setup (a separate compose
# project with its own secrets, ports and volumes, so a running `make up` stack is not touched), runs the
# agent with --simulate and the demo training run into it, checks through the InfluxDB and Grafana HTTP
# APIs that data arrives, the downsampling tasks exist and succeed, and every dashboard panel returns
# data (scripts/e2e_check.py), then tears everything down.
# Where no Docker engine runs (CI), it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
py=${PY:-.venv/bin/python}

if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  echo "make e2e: skipped: no Docker engine reachable here ('docker info' failed); run it on a workstation with Docker"
  exit 0
fi
if ! docker compose version >/dev/null 2>&1; then
  echo "make e2e: skipped: the Docker Compose v2 plugin ('docker compose') is missing"
  exit 0
fi

work=$(mktemp -d)
project=gpulse-e2e-$$
export GPULSE_INFLUX_PORT=${E2E_INFLUX_PORT:-18086} GPULSE_GRAFANA_PORT=${E2E_GRAFANA_PORT:-13000}
export GPULSE_UID=$(id -u) GPULSE_GID=$(id -g) GPULSE_BIND=127.0.0.1
# The compose file's relative paths (./agent, ./grafana, ./secrets) resolve in $work: the code is the
# repository's, the secrets are fresh ones for this run.
ln -s "$repo/agent" "$work/agent"
ln -s "$repo/grafana" "$work/grafana"
mkdir -m 700 "$work/secrets"
for name in influxdb-admin-password influxdb-admin-token grafana-admin-password; do
  (umask 077 && "$py" -c 'import secrets; print(secrets.token_urlsafe(32))' > "$work/secrets/$name")
done
(umask 077 && : > "$work/secrets/grafana-influx-token")
dc() { docker compose -p "$project" --project-directory "$work" -f "$repo/docker-compose.yml" "$@"; }

cleanup() {
  rc=$?
  if [ $rc -ne 0 ]; then dc logs --no-color --tail 80 || true; fi
  dc down -v --remove-orphans >/dev/null 2>&1 || true
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT

echo "make e2e: building and starting the stack (project $project)"
dc up -d --build --wait --wait-timeout 300 influxdb grafana
setup_id=$(dc ps -aq setup)
[ "$(docker inspect -f '{{.State.ExitCode}}' "$setup_id")" = 0 ] || { echo "the setup service failed"; exit 1; }
dc logs --no-color setup | tail -n 20

influx=http://127.0.0.1:$GPULSE_INFLUX_PORT
echo "make e2e: agent --simulate 4 for 45 s, and the demo training run"
"$py" -m gpulse agent --simulate 4 --interval 1 --duration 45 --url "$influx" --org gpulse --bucket gpulse \
  --token-file "$work/secrets/influxdb-admin-token" --no-socket --spool-dir "$work/spool" --host e2e-node &
agent=$!
"$py" -m gpulse demo --url "$influx" --org gpulse --bucket gpulse --token-file "$work/secrets/influxdb-admin-token" \
  --out "$work/demo"
wait "$agent"

PYTHONPATH="$repo/agent/tests${PYTHONPATH:+:$PYTHONPATH}" "$py" scripts/e2e_check.py --influx "$influx" --grafana "http://127.0.0.1:$GPULSE_GRAFANA_PORT" \
  --secrets "$work/secrets" --dashboards grafana/dashboards
echo "make e2e: passed"

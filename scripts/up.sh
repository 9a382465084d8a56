#!/usr/bin/env bash
# make up / make demo: from a fresh clone to a running stack, on whatever this machine has.
#
#   scripts/up.sh        (make up)   .env + secrets on first run, the agent's virtualenv, then
#       Docker engine  -> docker compose up -d --wait (its one-shot `setup` service runs `gpulse setup`
#                         with the admin token), then the agent in the foreground with its status line;
#                         GPULSE_INFLUX=v3 (environment or .env): InfluxDB 3 Core instead, the compose
#                         profile v3 (influxdb3, setup-v3, grafana-v3 on port 3001) and the agent with --api v3;
#       no Docker      -> the agent records locally (--record), viewable with `gpulse report` (a node
#                         report), uploadable with `gpulse upload`; and how to use an existing InfluxDB instead;
#       no NVIDIA GPU  -> one sentence, and the agent runs 8 simulated GPUs, asked for with --simulate 8
#                         (gpulse never simulates unasked; GPULSE_SIMULATE=8 does it for any command).
# Every command printed as advice works where it is printed (tests/test_up.py runs each one).
#   scripts/up.sh demo   (make demo) the same preparation, then `gpulse demo` into the local stack
#                        (started if needed), or, without Docker, a local demo: a recording file and
#                        the run's HTML report. With GPULSE_URL set, into that InfluxDB instead, said first.
#
# Secrets live in files (0600, git-ignored) and are never printed. For tests: GPULSE_UP_DURATION=S
# stops the agent after S seconds; GPULSE_UP_DEMO_HOURS=H makes the demo H hours long;
# VENV=path uses another virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-agent}
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
STATE=.gpulse
say() { printf 'gpulse up: %s\n' "$*"; }

# Which InfluxDB: v2 (InfluxDB 2.9, the default) or v3 (InfluxDB 3 Core). Set in the environment it
# wins over .env, as it does for docker compose. Checked before anything starts (a value from the
# environment before anything is installed).
influx_choice=${GPULSE_INFLUX:-}
check_influx() {
  case "$1" in
    v2 | v3) ;;
    *)
      say "GPULSE_INFLUX is '$1' ($2): it must be v2 (InfluxDB 2.9, the default) or v3 (InfluxDB 3 Core), e.g. \`GPULSE_INFLUX=v3 make up\`, or GPULSE_INFLUX=v3 in .env." >&2
      exit 2
      ;;
  esac
}
if [ -n "$influx_choice" ]; then check_influx "$influx_choice" "from the environment"; fi

# 1. the agent's virtualenv (the package with its agent extra; `make test` adds the test tools later)
if ! "$PY" -c 'import gpulse, pynvml, tenacity, docker' >/dev/null 2>&1; then
  say "installing the gpulse agent into $VENV ..."
  test -x "$PY" || python3 -m venv "$VENV"
  "$PY" -m pip install -q --disable-pip-version-check -e 'agent[agent]'
fi

# 2. settings for this machine, and the secrets (first run only; never overwritten, never printed)
if [ ! -f .env ]; then
  socket_dir=$("$PY" -c 'import os; from gpulse.channel.protocol import default_socket_path as p; print(os.path.dirname(p()))')
  docker_gid=$(stat -c %g /var/run/docker.sock 2>/dev/null || echo 999)
  sed -e "s|^GPULSE_UID=.*|GPULSE_UID=$(id -u)|" \
    -e "s|^GPULSE_GID=.*|GPULSE_GID=$(id -g)|" \
    -e "s|^GPULSE_DOCKER_GID=.*|GPULSE_DOCKER_GID=$docker_gid|" \
    -e "s|^GPULSE_HOSTNAME=.*|GPULSE_HOSTNAME=$(uname -n)|" \
    -e "s|^GPULSE_SOCKET_DIR=.*|GPULSE_SOCKET_DIR=$socket_dir|" \
    .env.example >.env
  chmod 600 .env
  say "created .env for this machine (uid $(id -u), host $(uname -n)); edit it to change ports or names"
fi
bash scripts/gen-secrets.sh
set -a
# shellcheck disable=SC1091
. ./.env
set +a
GPULSE_INFLUX=${influx_choice:-${GPULSE_INFLUX:-v2}}
check_influx "$GPULSE_INFLUX" "from .env"
if [ "$GPULSE_INFLUX" = v3 ]; then
  # compose profile v3: InfluxDB 3 Core, its one-shot setup-v3 and a Grafana provisioned for its tier
  # databases, plus alert-log for Grafana's default contact point; none of the 2.9 stack.
  influx="InfluxDB 3 Core"
  influx_url="http://127.0.0.1:${GPULSE_INFLUX3_PORT:-8181}"
  grafana_url="http://127.0.0.1:${GPULSE_GRAFANA_V3_PORT:-3001}"
  TOKEN_FILE=secrets/influxdb3-admin-token
  api=(--api v3)
  compose_up=(docker compose --profile v3 up -d --wait grafana-v3 alert-log)
  setup_service="setup-v3 service runs \`gpulse setup --api v3\`"
  dest_args="--api v3 --url https://influxdb.example:8181 --token-file PATH"
else
  influx="InfluxDB"
  influx_url="http://127.0.0.1:${GPULSE_INFLUX_PORT:-8086}"
  grafana_url="http://127.0.0.1:${GPULSE_GRAFANA_PORT:-3000}"
  TOKEN_FILE=secrets/influxdb-admin-token
  api=()
  compose_up=(docker compose up -d --wait)
  setup_service="setup service runs \`gpulse setup\`"
  dest_args="--url https://influxdb.example:8086 --org ORG --bucket gpulse --token-file PATH"
fi

docker_engine() { docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; }
influx_answers() { "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)' "$influx_url" >/dev/null 2>&1; }
start_stack() {
  say "starting $influx and Grafana: ${compose_up[*]} (the $setup_service) ..."
  "${compose_up[@]}"
  say "$influx $influx_url, Grafana $grafana_url (user ${GPULSE_GRAFANA_ADMIN_USER:-admin}, password in secrets/grafana-admin-password)"
}

# 3a. make demo
if [ "$MODE" = demo ]; then
  if [ -n "${GPULSE_URL:-}" ]; then
    say "GPULSE_URL is set, so the demo goes to the InfluxDB at $GPULSE_URL, with its GPULSE_* settings (unset GPULSE_URL for the local stack, or a local demo without Docker)."
    exec "$PY" -m gpulse demo --out "$STATE/demo"
  fi
  if ! influx_answers && docker_engine; then
    start_stack
  fi
  if influx_answers; then
    exec "$PY" -m gpulse demo "${api[@]}" --url "$influx_url" --token-file "$TOKEN_FILE" --grafana-url "$grafana_url" \
      ${GPULSE_UP_DEMO_HOURS:+--hours "$GPULSE_UP_DEMO_HOURS"} --out "$STATE/demo"
  fi
  mkdir -p "$STATE"
  say "No Docker engine and no $influx at $influx_url, so the demo runs locally: points to $STATE/demo.lp (replaced once complete), the run's report to $STATE/demo/."
  "$PY" -m gpulse demo --record "$STATE/demo.lp" ${GPULSE_UP_DEMO_HOURS:+--hours "$GPULSE_UP_DEMO_HOURS"} --out "$STATE/demo"
  echo "  open the report:   $STATE/demo/metrics_report.html"
  if [ "$GPULSE_INFLUX" = v3 ]; then
    cat <<EOF
  into an InfluxDB 3: $PY -m gpulse setup --api v3 --url URL --token-file PATH && $PY -m gpulse upload $STATE/demo.lp --api v3 --url URL --token-file PATH
                     (Core or Enterprise, port 8181; an admin token, apiv3_..., in the token file)
EOF
  else
    cat <<EOF
  into an InfluxDB:  $PY -m gpulse setup --url URL --token-file PATH && $PY -m gpulse upload $STATE/demo.lp --url URL --token-file PATH
                     (InfluxDB 1.x: add --api v1 to both and put user:password in the token file)
EOF
  fi
  exit 0
fi

# 3b. make up: GPUs (the agent reads NVML; without a driver it runs simulated GPUs instead)
sim_args=()
if ! "$PY" -c 'import pynvml; pynvml.nvmlInit()' >/dev/null 2>&1; then
  say "No NVIDIA driver here (NVML does not load), so the agent runs 8 simulated GPUs (--simulate 8; GPULSE_SIMULATE=8 does the same for any gpulse command, doctor included); \`make demo\` shows every dashboard filled with a simulated node and training run."
  sim_args+=(--simulate 8)
fi
agent_args=("${sim_args[@]}")
if [ -n "${GPULSE_UP_DURATION:-}" ]; then
  agent_args+=(--duration "$GPULSE_UP_DURATION")
fi

if docker_engine; then
  start_stack
  say "the agent follows (Ctrl-C stops it; the stack keeps running, \`make down\` stops it)"
  exec "$PY" -m gpulse agent "${api[@]}" --url "$influx_url" --token-file "$TOKEN_FILE" "${agent_args[@]}"
fi

# 3c. no Docker engine: record locally
mkdir -p "$STATE"
record="$STATE/agent.lp"
say "No Docker engine reachable (\`docker info\` fails), so no stack is started; the agent records to $record instead."
cat <<EOF
  look at it:      $PY -m gpulse report --from-file $record --html --out $STATE/node-report
                   (a node report: each GPU's utilisation, memory, power, energy, throttling, events;
                   a training run's report instead once a run sent its steps to this agent)
EOF
if [ "$GPULSE_INFLUX" = v3 ]; then
  cat <<EOF
  set it up once:  $PY -m gpulse setup $dest_args
                   (an InfluxDB 3 Core or Enterprise of yours; an admin token, apiv3_..., in the token file)
  upload it later: $PY -m gpulse upload $record $dest_args
  or send to an existing InfluxDB 3 instead of recording:
                   $PY -m gpulse agent ${sim_args[*]:+${sim_args[*]} }$dest_args
EOF
else
  cat <<EOF
  upload it later: $PY -m gpulse upload $record $dest_args
  or send to an existing InfluxDB instead of recording:
                   $PY -m gpulse agent ${sim_args[*]:+${sim_args[*]} }$dest_args
                   (InfluxDB 1.x: add --api v1 and put user:password in the token file)
EOF
fi
exec "$PY" -m gpulse agent --record "$record" "${agent_args[@]}"

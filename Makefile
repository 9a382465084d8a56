# gpulse: `make up` brings up the stack and the agent; `make test` runs every test.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gpulse-installed

.PHONY: help venv test test-fast lint format generate bench up down demo e2e gpu-check gpu-wheels clean backup-grafana

help:
	@echo "make up        start InfluxDB 2 (3 Core with GPULSE_INFLUX=v3) + Grafana (docker compose) and the gpulse agent"
	@echo "make test      install what the tests need (venv with CPU torch, influxd, chromium, node) and run them all"
	@echo "make test-fast the unit and component tests only (no browser, Node, multi-process torch, wheel builds"
	@echo "               or fresh clones; see agent/tests/support/lanes.py), for while you work: two workers a CPU (pytest-xdist)"
	@echo "make demo      fill the stack with a simulated 8-GPU node and training run (no Docker: a local demo)"
	@echo "make down      stop the stack (data stays in the Docker volumes)"
	@echo "make backup-grafana  copy the grafana-data volume to backups/ (before a Grafana major upgrade)"
	@echo "make lint      ruff"
	@echo "make bench     benchmarks (figures side by side with baselines)"
	@echo "make generate  regenerate docs/schema.md, dashboards and Flux tasks from the code"

# The virtualenv, step by step: torch first, its CPU build where the CPU index answers (see scripts/venv.sh);
# rebuilt when the package's dependencies change.
$(STAMP): agent/pyproject.toml scripts/venv.sh
	@VENV=$(VENV) bash scripts/venv.sh
	@touch $(STAMP)

venv: $(STAMP)

# make up / make demo: the agent alone is installed into $(VENV) when missing (see scripts/up.sh).
up:
	@VENV=$(VENV) bash scripts/up.sh

demo:
	@VENV=$(VENV) bash scripts/up.sh demo

# Every profile named, so that `down` covers the v3 stack and the agent container as well as the default
# services (which services `down` acts on follows the active profiles: docker/compose#12648, docker/docs#22278).
down:
	docker compose --profile v3 --profile agent down

backup-grafana:
	@bash scripts/backup-grafana.sh

test: $(STAMP)
	@bash scripts/test-tools.sh
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest

# The fast lane: no ruff, no tools to install (influxd is the only program it starts); its tests take
# free ports and their own temp dirs, so they run side by side. Two pytest-xdist workers a CPU: the
# lane waits on servers and subprocesses more than it computes; work stealing, so that the few
# tests of several seconds do not end the run on one worker while the others wait.
FAST_WORKERS ?= $(shell echo $$(( 2 * $$(nproc) )))

test-fast: $(STAMP)
	$(PY) -m pytest --fast -q -n $(FAST_WORKERS) --dist worksteal

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .

generate: $(STAMP)
	$(PY) -m gpulse schema > docs/schema.md
	$(PY) -m gpulse.docs.report > docs/report.md
	$(PY) -m gpulse.cli.configdoc > docs/configuration.md
	$(PY) -m gpulse.influx.render --write influxdb
	$(PY) -m gpulse.influx.engine_plugin --write influxdb
	$(PY) -m gpulse.dashboards .

bench: $(STAMP)
	@bash scripts/ensure-influxd.sh
	cd bench && ../$(PY) run.py

# On a GPU machine, offline: no venv build here (see scripts/gpu-check.sh for what it uses).
gpu-check:
	bash scripts/gpu-check.sh

# The wheels gpu-check needs besides torch, for a GPU machine without network (git-ignored; see
# scripts/GPU-CHECK.md for another Python version or platform than this machine's).
gpu-wheels:
	python3 -m pip download -q -d wheels $(GPU_WHEELS_ARGS) nvidia-ml-py tenacity docker tomli

clean:
	rm -rf $(VENV) agent/src/*.egg-info

# The whole stack in Docker (skips with a message where no Docker engine runs, e.g. CI).
e2e: $(STAMP)
	bash scripts/e2e.sh

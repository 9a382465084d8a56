#!/usr/bin/env bash
# A finding raised while the run is going, end to end, on this machine's CPU (no GPU, no database):
# a real agent (2 simulated GPUs, recording to a file, the rolling findings on a short window so the
# demo takes under a minute) and a real training run (scripts/live_finding_loop.py) whose DataLoader
# turns slow halfway and fast again. It prints, with UTC timestamps: the change, `gpulse status` and
# `gpulse status --json` while the data_loading finding is open, the agent's log lines of its raise
# and clear, and `gpulse status` after the clear.
#
#   scripts/live-finding-demo.sh [OUT]      (default out/live-finding-demo; PY=python to choose one)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
out=${1:-out/live-finding-demo}
rm -rf "$out"
mkdir -p "$out"
sock="$out/agent.sock"
utc() { date -u +%H:%M:%S.%3N' UTC'; }
gpulse() { "$py" -m gpulse "$@"; }
log_line() {  # the agent's log line matching $1 (written just after the status changes: a moment to wait)
  for _ in $(seq 50); do grep -q "$1" "$out/agent.log" && break; sleep 0.1; done
  grep "$1" "$out/agent.log" | sed 's/^/    /'
}
open_findings() {  # how many findings `gpulse status --json` lists as open
  gpulse status --json --socket "$sock" | "$py" -c 'import json, sys; print(sum(map(len, json.load(sys.stdin)["findings"].values())))'
}

live=(--live-window-steps 30 --live-window-s 2.5 --live-every-s 0.25)
echo "$(utc)  gpulse agent --simulate 2 --record $out/agent.lp ${live[*]}"
TZ=UTC "$py" -m gpulse agent --simulate 2 --interval 0.2 --record "$out/agent.lp" --socket "$sock" \
  --spool-dir "$out/spool" "${live[@]}" 2>"$out/agent.log" &
agent=$!
loop=""
trap 'kill $loop $agent 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "the agent did not start:"; cat "$out/agent.log"; exit 1; }

"$py" scripts/live_finding_loop.py "$out/run" "$sock" 2>"$out/run.log" &  # its stderr: torch's profiler says much
loop=$!
seen=0
while kill -0 "$loop" 2>/dev/null; do
  n=$(open_findings)
  if [ "$seen" = 0 ] && [ "$n" -gt 0 ]; then
    seen=1
    echo "$(utc)  the agent's log:"
    log_line "finding: .* raised"
    echo "$(utc)  gpulse status:"
    gpulse status --socket "$sock" | sed 's/^/    /'
    echo "$(utc)  gpulse status --json (its findings):"
    gpulse status --json --socket "$sock" | "$py" -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["findings"], indent=2))' | sed 's/^/    /'
  elif [ "$seen" = 1 ] && [ "$n" = 0 ]; then
    seen=2
    echo "$(utc)  the agent's log:"
    log_line "finding: .* cleared"
    echo "$(utc)  gpulse status, after the clear:"
    gpulse status --socket "$sock" | grep -A3 "Open findings" | sed 's/^/    /'
  fi
  sleep 0.5
done
wait "$loop" || { echo "the training run failed:"; cat "$out/run.log"; exit 1; }
loop=""
kill -TERM "$agent"
wait "$agent" || true
echo "$(utc)  the run's metrics_report.json, live_findings (what the agent told the run):"
"$py" -c 'import json, sys
report = json.load(open(sys.argv[1]))
for f in report["live_findings"]:
    print("    %s %s, held steps %s-%s" % (f["rule"], f["state"], f["first_step"], f["last_step"]))
print("and the profiler window its raise asked for (profiles):")
for p in report["profiles"]:
    s = p["summary"] or {}
    ops = ", ".join("%s %.1f ms" % (o["name"], o["self_ms"]) for o in s.get("top_ops", [])[:3])
    print("    %s, steps %s: top self time %s; DataLoader wait %.1f ms" % (p["rule"], p["steps"], ops, s.get("dataloader_wait_ms", 0)))
    print("    trace %s" % p["path"])
    print("    py-spy dump %s" % (p["pyspy_path"] or "none: " + str(p["pyspy"])))' "$out/run/metrics_report.json"
if [ "$seen" != 2 ]; then
  echo "no finding was raised and cleared while the run went (the agent's log: $out/agent.log)"
  exit 1
fi

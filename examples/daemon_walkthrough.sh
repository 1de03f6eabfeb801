#!/usr/bin/env bash
# The trainer daemon, end to end on the demo: start it, queue two runs, follow one to the end, read it back,
# stop the other. Run from any directory; it works in a temporary one and stops the daemon when it ends.
#   bash examples/daemon_walkthrough.sh
set -euo pipefail
cd "$(mktemp -d)"
export GRPO_SENTINEL_URL=http://127.0.0.1:8765

grpo-sentinel serve --listen 127.0.0.1:8765 --state-dir state 2> daemon.log &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
until curl -fs "$GRPO_SENTINEL_URL/readyz" >/dev/null; do sleep 0.2; done   # ready in a second or two

# A run is a config, as `grpo-sentinel train --config` reads it; `--set` changes a field.
grpo-sentinel runs submit --set run.run_id=first --set run.steps=20 --set run.sample_every=10 --follow
grpo-sentinel runs submit --set run.run_id=second --set run.steps=2000   # queued behind nothing: it starts
until grpo-sentinel runs show second --output json | grep -q '"status": "running"'; do sleep 0.2; done
grpo-sentinel runs list
grpo-sentinel runs show first
grpo-sentinel runs report first | head -20
grpo-sentinel runs stop second            # it checkpoints at its step boundary and ends `stopped`
until grpo-sentinel runs show second --output json | grep -q '"status": "stopped"'; do sleep 0.5; done
grpo-sentinel runs show second | head -1

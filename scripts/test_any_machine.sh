#!/usr/bin/env bash
# `make test-any-machine`: the suite as other machines run it, four times
# (about 4 x `make test`): with oneDNN forced on and forced off (TensorFlow
# turns it on by itself on some CPUs, AMX ones among them, and its allocator
# and numerics differ), then twice beside a CPU hog of two busy processes (a
# shared or loaded machine: every wait on another process must be for an
# event, never a race). Stops at the first run that fails, naming it.
set -euo pipefail
cd "$(dirname "$0")/.."

run() {
    echo "=== make test: $1" >&2
    if ! make test; then
        echo "error: make test failed with $1" >&2
        exit 1
    fi
}

TF_ENABLE_ONEDNN_OPTS=1 run "TF_ENABLE_ONEDNN_OPTS=1"
TF_ENABLE_ONEDNN_OPTS=0 run "TF_ENABLE_ONEDNN_OPTS=0"

hogs=()
stop_hogs() {
    if ((${#hogs[@]})); then
        kill "${hogs[@]}" 2>/dev/null || true
        wait "${hogs[@]}" 2>/dev/null || true
    fi
}
trap stop_hogs EXIT
for _ in 1 2; do
    python3 -c "while True: pass" &
    hogs+=("$!")
done
run "two busy processes beside it (1 of 2)"
run "two busy processes beside it (2 of 2)"
echo "=== all four runs passed" >&2

#!/usr/bin/env bash
# `make test-any-machine`: the suite as other machines run it, four times
# (about 4 x `make test`): with oneDNN forced on and forced off (TensorFlow
# turns it on by itself on some CPUs, AMX ones among them, and its allocator
# and numerics differ), then twice beside a CPU hog of two busy processes (a
# shared or loaded machine: every wait on another process must be for an
# event, never a race). Stops at the first run that fails, naming it; the hog
# is stopped on every way out. `--help` says how to call it.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    cat <<'USAGE'
usage: scripts/test_any_machine.sh [--dry-run] [--] [COMMAND ...]
Runs COMMAND four times: with TF_ENABLE_ONEDNN_OPTS=1, with =0, then twice
beside two busy processes (python3 -c "while True: pass").
  COMMAND     default: make test (the whole suite); a few tests instead:
              scripts/test_any_machine.sh .venv/bin/python -m pytest -q tests/test_keys.py
  --dry-run   print the four runs, run nothing
USAGE
}

dry_run=0
while (($#)); do
    case "$1" in
    -h | --help)
        usage
        exit 0
        ;;
    --dry-run)
        dry_run=1
        shift
        ;;
    --)
        shift
        break
        ;;
    -*)
        echo "error: unknown option $1 (a COMMAND that starts with - goes after --; --help says more)" >&2
        exit 2
        ;;
    *) break ;;
    esac
done
if (($# == 0)); then
    set -- make test
fi

run() {
    local name=$1
    shift
    echo "=== $*: $name" >&2
    if ((dry_run)); then
        return
    fi
    if ! "$@"; then
        echo "error: $* failed with $name" >&2
        exit 1
    fi
}

TF_ENABLE_ONEDNN_OPTS=1 run "TF_ENABLE_ONEDNN_OPTS=1" "$@"
TF_ENABLE_ONEDNN_OPTS=0 run "TF_ENABLE_ONEDNN_OPTS=0" "$@"

hogs=()
stop_hogs() {
    if ((${#hogs[@]})); then
        kill "${hogs[@]}" 2>/dev/null || true
        wait "${hogs[@]}" 2>/dev/null || true
        hogs=()
    fi
}
# bash runs the EXIT trap on Ctrl-C and on a kill too.
trap stop_hogs EXIT
if ((!dry_run)); then
    for _ in 1 2; do
        python3 -c "while True: pass" &
        hogs+=("$!")
    done
fi
run "two busy processes beside it (1 of 2)" "$@"
run "two busy processes beside it (2 of 2)" "$@"
stop_hogs
if ((dry_run)); then
    echo "=== dry run: nothing ran" >&2
else
    echo "=== all four runs passed" >&2
fi

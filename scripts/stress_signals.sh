#!/usr/bin/env bash
# Repeat the scheduler-signal and elastic-restart tests N times (default 20); print each repeat's result and the
# tally. Each test itself checks that no process and no /dev/shm entry outlives its runs.
# Usage: scripts/stress_signals.sh [N]
set -u
cd "$(dirname "$0")/.."
n=${1-20}
if ! [[ $n =~ ^0*[1-9][0-9]*$ ]]; then
    echo "stress_signals.sh: error: N must be a whole number of at least 1, got '$n'" >&2
    exit 2
fi
passed=0
for i in $(seq "$n"); do
    if .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_signals.py \
        tests/test_distributed.py::test_a_group_torchrun_restarts_resumes_from_its_checkpoint_by_itself \
        > "/tmp/stress_signals_$i.log" 2>&1; then
        passed=$((passed + 1))
    fi
    echo "repeat $i: $(tail -n 1 "/tmp/stress_signals_$i.log")"
done
echo "$passed/$n repeats passed; leftover /dev/shm entries now: $(ls /dev/shm | wc -l)"
[ "$passed" -eq "$n" ]

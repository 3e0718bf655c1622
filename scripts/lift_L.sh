#!/usr/bin/env bash
# Issue 49's Lift check L (docs/results/amd-epyc-avx512-bf16-2c/preregistrations.txt), across sessions: runs its
# remaining runs in the registered order from a clone of the commit that registered it, one at a time, and copies
# each ended run's summary.json, metrics.csv and config.yaml into this checkout's runs/lift_L/ for a commit made
# without reading them. A run counts as ended only when its summary says total_steps (a SIGTERM writes one too).
#   setsid nohup bash scripts/lift_L.sh [WORK_DIR] > /dev/null 2>&1 &      (WORK_DIR: /work/runs/L)
# Progress without figures: grep -o 'update [0-9]*' WORK_DIR/<label>_<seed>.log | tail -1; WORK_DIR/chain.out.
set -u
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/work/runs/L}
keep=$repo/docs/results/amd-epyc-avx512-bf16-2c/runs/lift_L
ended() { grep -qs '"stop_reason": "total_steps"' "$1/summary.json"; }
mkdir -p "$work"
if [ ! -d "$work/tree" ]; then
    git clone -q "$repo" "$work/tree" && git -C "$work/tree" checkout -q 565367d || exit 1
    ln -s "$repo/.venv" "$work/tree/.venv"
fi
cd "$work/tree" || exit 1
for seed in 17 18 19; do
    for label in synchronous overlapped; do
        [ -f "$keep/$label/seed_$seed/summary.json" ] && continue  # committed in an earlier session
        run=$work/$label/seed_$seed
        if ! ended "$run"; then
            extra=(); [ "$label" = overlapped ] && extra=(--set parallel.overlap=true)
            echo "$(date -u +%FT%TZ) start $label $seed" >> "$work/chain.out"
            .venv/bin/python train_parallel_timed.py --config config/robosuite_lift.yaml --seeds "$seed" \
                --duration 3h --output-dir "$work/$label" --resume-if-exists --set run.total_steps=500000 \
                --set training.anneal_steps=1000000 "${extra[@]}" > "$work/${label}_$seed.log" 2>&1
            echo "$(date -u +%FT%TZ) end $label $seed rc=$?" >> "$work/chain.out"
            ended "$run" || exit 1
        fi
        mkdir -p "$keep/$label/seed_$seed"
        cp "$run/summary.json" "$run/metrics.csv" "$run/config.yaml" "$keep/$label/seed_$seed/"
        echo "$(date -u +%FT%TZ) copied $label $seed: commit it unread" >> "$work/chain.out"
    done
done

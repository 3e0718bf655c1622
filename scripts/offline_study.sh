#!/usr/bin/env bash
# The many-core study on a machine with no package index, in one command: installs the wheels staged in .whl/ and
# the libraries staged in .gl/ (scripts/offline_stage.sh) into /tmp, then runs `bench.py study` family by family in
# the order that matters most when the machine may be taken back at any moment (the 1-core base, the workers at 8
# and 16, the CUDA learner at 16, the ranks, then the rest). Results are rewritten after every point, so whatever
# finished survives a cut-off.
#   bash scripts/offline_study.sh [RESULTS_DIR] [SECONDS]      (defaults docs/results and 20 s per run)
# PLAN="threads:1 workers:16 cuda:16" (family:counts, counts comma-separated) runs those points, in that order, instead.
# Budget: 19 points × (SECONDS + start-up); on a 16-core H100 box each run's start-up was ~25 s (every process
# imports torch with CUDA), so ~15 minutes at 20 s: split the families over two calls where one call is capped.
set -uo pipefail
cd "$(dirname "$0")/.."
results="${1:-docs/results}"
seconds="${2:-20}"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/offline_site \
        .whl/*.whl >/dev/null 2>&1 || { echo "offline_study: installing .whl failed" >&2; exit 1; }
    export PYTHONPATH="/tmp/offline_site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
# Procgen's libenv.so links libGL; copy in only the libraries the machine lacks, from the staged packages.
libenv=$(python3 -c "import procgen, pathlib; print(pathlib.Path(procgen.__file__).parent / 'data/prebuilt/libenv.so')")
[ -f "$libenv" ] || { echo "offline_study: procgen is not importable here (stage .whl/ first)" >&2; exit 1; }
if [ -d .gl ] && ldd "$libenv" | grep -q "not found"; then
    mkdir -p /tmp/offline_gl/all /tmp/offline_gl/lib
    for f in .gl/*.deb; do dpkg -x "$f" /tmp/offline_gl/all; done
    export LD_LIBRARY_PATH="/tmp/offline_gl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    for _ in 1 2 3 4 5; do  # each pass resolves one more level of dependencies
        for lib in $(ldd "$libenv" | awk '/not found/{print $1}'); do
            cp -L /tmp/offline_gl/all/usr/lib/x86_64-linux-gnu/"$lib" /tmp/offline_gl/all/lib/x86_64-linux-gnu/"$lib" \
                /tmp/offline_gl/lib/ 2>/dev/null
        done
    done
fi
if ldd "$libenv" | grep "not found"; then echo "offline_study: Procgen cannot load (libraries above)" >&2; exit 1; fi
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

study() {  # FAMILY "COUNTS"
    date +%T
    python3 bench.py study --seconds "$seconds" --runs-dir /tmp/offline_study_runs --results-dir "$results" \
        --families "$1" --processes "$2" 2>&1 | grep --line-buffered -iE "steps/s|failed|wrote|error|traceback|skipped"
}
if [ -n "${PLAN:-}" ]; then
    for point in $PLAN; do study "${point%%:*}" "$(tr , ' ' <<< "${point#*:}")"; done
else
    study threads 1
    study workers "8 16"
    study cuda 16
    study ranks "8 16"
    study workers "1 2 4"
    study cuda "1 4 8"
    study ranks "2 4"
    study threads "2 4 8 16"
fi
date +%T

#!/usr/bin/env bash
# The many-core study on a machine with no package index, in one command: installs the wheels staged in .whl/ (or
# .robot/) and the libraries staged in .gl/ (scripts/offline_stage.sh) into /tmp, and the GL loaders of .robot/ into /
# where the machine lacks them, then runs `bench.py study` family by family in the order that matters most when the
# machine may be taken back at any moment (the 1-core base, the workers at 8 and 16, synchronous then overlapped, the
# machine's yardstick there (as many one-core runs at once), the CUDA learner at 16, synchronous then overlapped, the
# ranks at 8 and 16, then the workers, CUDA learner, ranks and threads at the smaller counts; overlap only at 8 and 16).
# Results are rewritten after every point, so whatever finished survives a cut-off.
#   bash scripts/offline_study.sh [RESULTS_DIR] [SECONDS]      (defaults docs/results and 20 s per run)
# A study joins the committed one of its machine and task only with the same settings, SECONDS too (the 16-core H200's
# were measured at 15 s for starpilot, 30 s for Lift from state, 40 s for the camera drawn by Mesa); a study of other
# settings in its place is refused, and the script stops, as at any call bench.py refuses (exit 2) but one that fits
# nothing here (cuda without a GPU), which goes on; it exits 1 where a point failed and the rest ran.
# PLAN="threads:1 workers:16 cuda:16" (family:counts, counts comma-separated) runs those points, in that order, instead
# (every item, and INFERENCE, checked before the first point runs).
# SETS="parallel.learner_threads=4 ..." passes each KEY=VALUE to every point as a --set (the study's own give way, but
# for the threads, copies and ranks families' thread counts and the update's chunk: the CPU's resolved from the config
# and SETS, a GPU's the whole minibatch; a file's points of other chunks are dropped); such a study's files are named
# for its settings (study-...-parallel-learner-threads-4), beside the default's.
# ENV (and CONFIG) study another task: `ENV=robosuite/Lift` (staged by `offline_stage.sh 3.12 robot` in .robot/, which
# travels alone: with .whl/ it is over a device call's 64 MiB), `CONFIG=config/robosuite_lift_camera.yaml` its camera;
# without ENV, the env SETS (env.id=...) or CONFIG names.
# INFERENCE=16 then times the task's inference (scripts/inference_cost.py): a worker's own against 16 workers' batched
# on the GPU (or every core), into the machine's folder under RESULTS_DIR (seconds).
# GL=mesa draws the camera with Mesa's llvmpipe on the CPU instead of the GPU (staged by `offline_stage.sh 3.12 mesa`
# in .mesa/, unpacked to /tmp/offline_mesa by a call that carries it; LP_NUM_THREADS is passed on as set).
# Budget: 23 points × (SECONDS + start-up); on a 16-core H100 box each run's start-up was ~25 s (every process
# imports torch with CUDA; 16 copies importing at once take longer), so ~18 minutes at 20 s: split the families over
# two calls where one call is capped.
set -uo pipefail
cd "$(dirname "$0")/.."
results="${1:-docs/results}"
seconds="${2:-20}"
export PYTHONUNBUFFERED=1
case "${GL:-}" in ""|mesa) ;; *) echo "offline_study: GL is mesa or unset, not '$GL'" >&2; exit 2 ;; esac
read -ra plan <<< "${PLAN:-}"  # every item checked here, not once the points before it have run
families=" $(python3 -c 'from parallel_ppo.bench.study_pages import FAMILIES; print(*FAMILIES)') " || exit 2
for point in "${plan[@]}"; do
    if [[ "$families" != *" ${point%%:*} "* || ! "$point" =~ ^[a-z_]+:[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
        [ -n "$(tr , '\n' <<< "${point#*:}" | sort | uniq -d)" ]; then  # a count twice: bench.py refuses it
        echo "offline_study: PLAN items are family:counts (families:${families% }; distinct counts such as 8,16)," \
            "not '$point'" >&2; exit 2
    fi
done
if [[ -n "${INFERENCE:-}" && ! "$INFERENCE" =~ ^[1-9][0-9]*$ ]]; then
    echo "offline_study: INFERENCE is a number of workers such as 16, not '$INFERENCE'" >&2; exit 2
fi
site=/tmp/offline_site
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .whl/*.whl >/dev/null 2>&1 || { echo "offline_study: installing .whl failed" >&2; exit 1; }
fi
if [ -d .robot ]; then  # robosuite, MuJoCo and the GL loaders, which go to / as the device's notes advise
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        .robot/whl/*.whl >/dev/null 2>&1 || { echo "offline_study: installing .robot/whl failed" >&2; exit 1; }
    tar -C "$site" -xJf .robot/robosuite.tar.xz
    if [[ "$(ldconfig -p)" != *"libEGL.so.1 "* ]]; then  # MuJoCo's EGL needs the loaders; keep the machine's own
        for f in .robot/deb/lib{egl1,glvnd0,opengl0,gl1,glx0,gles2}_*.deb; do dpkg -x "$f" /; done; ldconfig
    fi
    mkdir -p /tmp/offline_x11
    for f in .robot/deb/lib{x11-6,xcb1,xau6,xdmcp6,bsd0,md0}_*.deb; do dpkg -x "$f" /tmp/offline_x11; done
    if [[ "$(ldd /usr/lib/x86_64-linux-gnu/libGLX.so.0 2>&1)" == *"not found"* ]]; then
        export LD_LIBRARY_PATH="/tmp/offline_x11/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    nvidia_egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json  # where the GPU image keeps NVIDIA's EGL
    [ -f "$nvidia_egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES="$nvidia_egl"
fi
if [ "${GL:-}" = mesa ]; then  # draw on the CPU with Mesa's llvmpipe (a no-GPU machine's case), staged in .mesa/
    mesa=/tmp/offline_mesa
    if [ -f .mesa/mesa.tar.xz ]; then mkdir -p "$mesa"; tar -C "$mesa" -xJf .mesa/mesa.tar.xz; fi
    if [ ! -f "$mesa/lib/libEGL_mesa.so.0" ]; then
        echo "offline_study: GL=mesa needs .mesa/ (carried here, or unpacked by an earlier call)" >&2; exit 1
    fi
    printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s/lib/libEGL_mesa.so.0"}}\n' "$mesa" \
        > "$mesa/50_mesa.json"
    export __EGL_VENDOR_LIBRARY_FILENAMES="$mesa/50_mesa.json" LIBGL_DRIVERS_PATH="$mesa/lib/dri" MUJOCO_GL=egl
    export LD_LIBRARY_PATH="$mesa/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "offline_study: drawing with Mesa, LP_NUM_THREADS ${LP_NUM_THREADS:-as the trainer plans it}"
fi
[ -d "$site" ] && export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
read -ra items <<< "${SETS:-}"  # split on spaces, never globbed (model.impala_depths=[16,32,32])
env_of=$'import sys\nfrom parallel_ppo.core.config_yaml import config_env\nfrom parallel_ppo.errors import ConfigError\n'\
$'try:\n    print(config_env(sys.argv[1], sys.argv[3:], sys.argv[2] or None))\n'\
$'except ConfigError as e:\n    sys.exit(f"offline_study: {e}")'
env=$(python3 -c "$env_of" "${CONFIG:-config/ppo_parallel.yaml}" "${ENV:-}" "${items[@]}") || exit 2  # as the study
procgen_game="import sys; from parallel_ppo.envs.procgen_envs import PROCGEN_GAMES as g; sys.exit(sys.argv[1] not in g)"
if python3 -c "$procgen_game" "$env"; then
    # Procgen's libenv.so links libGL; copy in only the libraries the machine lacks, from the staged packages.
    procgen_dir=$(python3 -c "import procgen, pathlib; print(pathlib.Path(procgen.__file__).parent)")
    libenv=$procgen_dir/data/prebuilt/libenv.so
    [ -f "$libenv" ] || { echo "offline_study: procgen is not importable here (stage .whl/ first)" >&2; exit 1; }
    slim=$procgen_dir/SLIM_GAME  # a wheel slimmed for one game (offline_stage.sh)
    if [ -f "$slim" ] && [ "$(cat "$slim")" != "$env" ]; then
        echo "offline_study: the procgen installed here draws $(cat "$slim") alone, not $env (stage the whole wheel)" >&2
        exit 2
    fi
    if [ -d .gl ] && [[ "$(ldd "$libenv")" == *"not found"* ]]; then
        mkdir -p /tmp/offline_gl/all /tmp/offline_gl/lib
        for f in .gl/*.deb; do dpkg -x "$f" /tmp/offline_gl/all; done
        export LD_LIBRARY_PATH="/tmp/offline_gl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        for _ in 1 2 3 4 5; do  # each pass resolves one more level of dependencies
            for lib in $(ldd "$libenv" | awk '/not found/{print $1}'); do
                cp -L /tmp/offline_gl/all/usr/lib/x86_64-linux-gnu/"$lib" \
                    /tmp/offline_gl/all/lib/x86_64-linux-gnu/"$lib" /tmp/offline_gl/lib/ 2>/dev/null
            done
        done
    fi
    if ldd "$libenv" | grep "not found"; then
        echo "offline_study: Procgen cannot load (libraries above)" >&2; exit 1
    fi
fi
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
if [[ "$env" == robosuite/* ]] && ! python3 -c "import robosuite" 2>/dev/null; then  # every point would fail
    echo "offline_study: robosuite is not importable here: carry .robot/ in this call or an earlier one" >&2; exit 2
fi

sets=()
for s in "${items[@]}"; do sets+=(--set "$s"); done
status=0  # the script's: 1 where a point failed, so a caller sees it
study() {  # FAMILY "COUNTS"
    date +%T
    python3 bench.py study --env "$env" ${CONFIG:+--config "$CONFIG"} --seconds "$seconds" "${sets[@]}" \
        --runs-dir /tmp/offline_study_runs --results-dir "$results" \
        --families "$1" --processes "$2" 2>&1 | tee /tmp/offline_study_last.log |
        grep --line-buffered -iE "steps/s|failed|wrote|error|traceback|skipped|dropping"
    local rc=${PIPESTATUS[0]}
    if grep -q "holds a study of other settings" /tmp/offline_study_last.log; then  # so would every later call
        echo "offline_study: stopped: the results in place are of other settings (above)" >&2; exit 2
    fi
    if [ "$rc" = 2 ] && ! grep -q "no points to run here" /tmp/offline_study_last.log; then  # so would the rest
        echo "offline_study: stopped: bench.py refused the call (above)" >&2; exit 2
    fi
    [ "$rc" = 0 ] || [ "$rc" = 2 ] || status=1
}
if [ "${#plan[@]}" -gt 0 ]; then
    for point in "${plan[@]}"; do study "${point%%:*}" "$(tr , ' ' <<< "${point#*:}")"; done
else
    study threads 1
    study workers "8 16"
    study overlap "8 16"
    study copies "8 16"
    study cuda 16
    study cuda_overlap 16
    study ranks "8 16"
    study workers "1 2 4"
    study cuda "1 4 8"
    study ranks "2 4"
    study threads "2 4 8 16"
fi
if [ -n "${INFERENCE:-}" ]; then
    python3 scripts/inference_cost.py --env "$env" ${CONFIG:+--config "$CONFIG"} --workers "$INFERENCE" \
        --results-dir "$results" "${sets[@]}" 2>&1 |
        grep --line-buffered -iE "error|traceback|observations a second|wrote" || status=1
fi
date +%T
exit "$status"

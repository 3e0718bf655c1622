# parallel_ppo: every target creates .venv and installs the project first when needed.
# The Python that creates $(VENV): PYTHON=... names one; otherwise the first of python3.12, python3.11, python3.10,
# python3 on PATH that runs and is one of PYTHON_VERSIONS (pyproject's requires-python), looked for only when needed.
PYTHON_VERSIONS := 3.12 3.11 3.10
PRINT_VERSION   := -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
PYTHON_VERSION   = $(shell $(1) $(PRINT_VERSION))
FIND_PYTHON      = for p in $(addprefix python,$(PYTHON_VERSIONS)) python3; do v=$$($$p $(PRINT_VERSION)) && \
                   case " $(PYTHON_VERSIONS) " in *" $$v "*) echo $$p; break;; esac; done
ifeq ($(strip $(PYTHON)),)
PYTHON = $(eval PYTHON := $(shell $(FIND_PYTHON)))$(PYTHON)
endif
NO_PYTHON = no Python $(lastword $(PYTHON_VERSIONS))-$(firstword $(PYTHON_VERSIONS)) found \
            ($(or $(addprefix python3 is ,$(call PYTHON_VERSION,python3)),no python3 on PATH)): install one \
            (apt-get install python3.11 python3.11-venv where the release has it; pyenv or uv otherwise) \
            or name it: make install PYTHON=/path/to/python3.11
VENV     ?= .venv
PY       := $(VENV)/bin/python
DURATION ?= 1h
# TAG names the runs' folders (benchmarks/sequential_$(TAG), ...); by default their DURATION, after ENV where one is
# given, so that runs of two envs never share a folder (characters other than letters, digits and . _ + - as -):
# ENV=CartPole-v1 → benchmarks/sequential_CartPole-v1_1h
TAG      ?= $(shell printf '%s' $(call shq,$(if $(ENV),$(ENV)_)$(DURATION)) | tr -c 'A-Za-z0-9._+-' -)
SEED     ?= 1
ENV      ?=
# ENV=<id> trains or measures that env; unset, a target runs the env its config names (starpilot in the shipped
# Procgen configs; ARGS="--config config/cartpole.yaml" with a benchmark, CartPole)
# shq quotes a value for the shell (an id's options hold ? and &, as in sim/Sleep?step_ms=7&horizon=50; a path may
# hold spaces or ;)
shq       = '$(subst ','\'',$(1))'
ENV_FLAG  = $(if $(ENV),--env $(call shq,$(ENV)))
# The trainers' config: the Procgen one given, or for ENV of another family that family's shipped config (as bench.py
# picks it: cli.common.default_config), its step budget lifted so that DURATION bounds the run (TIMED); ARGS="--config
# FILE" comes later and wins
TRAIN_CONFIG = "$$($(PY) -c 'import sys; from parallel_ppo.cli.common import default_config; \
               print(default_config(sys.argv[1] or None, sys.argv[2]))' $(call shq,$(ENV)) $(1) 2>/dev/null \
               || echo config/$(1))"
TIMED        = $(if $(ENV),--total-steps 0)
# The parallel layout is the config's (each shipped config's sequential and parallel runs step as many envs), or
# WORKERS × ENVS where either is given; then compare's sequential run takes as many envs (SEQ_ENVS)
LAYOUT_GIVEN  = $(filter command line environment,$(origin WORKERS) $(origin ENVS))
LAYOUT_FLAGS  = $(if $(LAYOUT_GIVEN),--num-workers $(WORKERS) --num-envs-per-worker $(ENVS))
SEQ_ENVS_FLAG = $(if $(SEQ_ENVS),--num-envs $(SEQ_ENVS))
ARGS     ?=
WORKERS  ?= 2
ENVS     ?= 8
BENCH_SECONDS   ?= 60
ENVS_PER_WORKER ?= 8
AUTOTUNE_SECONDS ?= 20
MINUTES          ?= 10
SEEDS            ?= 1,2,3
NPROC            ?= 2
ENVS_TOTAL       ?= 16
PROCS            ?= 2
TEST_WORKERS     ?= 2
STUDY_SECONDS    ?= 30
SIM_SECONDS      ?= 60
CHECKPOINT       ?= benchmarks/parallel_$(TAG)
TB_HOST          ?= 127.0.0.1
# `make bench` sweeps WORKERS only when given on the command line; by default 1, 2, 4, ... the physical cores under
# the CPUs this process may use.
BENCH_WORKERS    = $(if $(filter command line,$(origin WORKERS)),--workers "$(WORKERS)",)
ENVS_PER_RANK    ?= 16
DIST_ENVS        = $(if $(filter command line environment,$(origin ENVS_TOTAL)),--num-envs-total $(ENVS_TOTAL),--num-envs $(ENVS_PER_RANK))

.PHONY: install smoke test test-fast lint docs train train-parallel train-distributed eval demo compare roofline bench-speed bench-envs \
        bench bench-layouts autotune bench-learning bench-mujoco bench-atari bench-pixels bench-robot camera-recipe-speed overlap-speed study study-sim \
        tensorboard \
        clean distclean

# Where torch's CPU build comes from (docs/install.md): PyTorch's CPU wheel index, added as an extra index, unless
# pip is already configured with package sources of its own (index-url, extra-index-url or find-links in a pip config
# file or PIP_* variable: a mirror, a proxy, a wheel cache), which are then used alone. TORCH_INDEX=URL names the
# index; TORCH_INDEX=none adds none. Decided from configuration only: no host is asked.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
PIP_FILES        = $(if $(filter /dev/null,$(PIP_CONFIG_FILE)),,$(wildcard /etc/pip.conf /etc/xdg/pip/pip.conf \
                   $(HOME)/.config/pip/pip.conf $(HOME)/.pip/pip.conf $(PIP_CONFIG_FILE)))
PIP_SOURCES      = $(PIP_INDEX_URL)$(PIP_EXTRA_INDEX_URL)$(PIP_FIND_LINKS)$(shell grep -sE \
                   '^[[:space:]]*(index-url|extra-index-url|find-links)[[:space:]]*=' $(PIP_FILES) /dev/null)$(shell \
                   $(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m pip config list 2>/dev/null \
                   | grep -E '\.(index-url|extra-index-url|find-links)=')
TORCH_INDEX     ?= $(if $(strip $(PIP_SOURCES)),none,$(TORCH_CPU_INDEX))
PIP_INDEX        = $(if $(filter none,$(TORCH_INDEX)),,--extra-index-url $(TORCH_INDEX))
EXTRAS          ?= dev

# Before anything is installed, scripts/check_system.py checks the system libraries Procgen and MuJoCo's EGL
# rendering load and prints the apt-get line for those missing (Procgen's stop the install), and, before a fresh
# .venv, the free disk space (too little stops it); CHECK_SYSTEM=no skips it.
CHECK_SYSTEM    ?= yes
HOST_PYTHON      = $(if $(wildcard $(PY)),$(PY),$(or $(PYTHON),$(error $(NO_PYTHON))))

# One stamp per set of extras: `make install EXTRAS=genesis` adds that extra to an existing venv (the targets that
# need dev install it themselves).
comma := ,
empty :=
space := $(empty) $(empty)
EXTRA_LIST = $(subst $(space),$(comma),$(strip $(subst $(comma),$(space),$(EXTRAS))))
STAMP  = $(VENV)/.installed-$(subst $(comma),+,$(EXTRA_LIST))

install: $(STAMP)

# A download that breaks off (a dropped connection) is resumed 20 times by pip and the whole install tried three times,
# 20 s apart, before the install fails.
RETRY = for n in 1 2 3; do $(1) && break; [ $$n -lt 3 ] || exit 1; \
        echo "install: attempt $$n of 3 failed; trying again in 20 s" >&2; sleep 20; done

# A Python of another version (PYTHON=..., or the one $(VENV) was made with) or a $(VENV) without pip (made where
# python3-venv was missing) stops the install in one line, where pip's refusal would be tried three times.
OTHER_PYTHON = make install: error: $(HOST_PYTHON) is Python $${v:-that does not run}, not one of \
               $(PYTHON_VERSIONS)$(if $(wildcard $(PY)),: rm -rf $(VENV) and run make again)
NO_PIP       = make install: error: $(VENV) has no pip (made where python3-venv was missing?): rm -rf $(VENV), \
               install python3-venv, and run make again
CHECK_PYTHON = v=$$($(HOST_PYTHON) $(PRINT_VERSION)); case " $(PYTHON_VERSIONS) " in *" $$v "*) ;; \
               *) echo "$(OTHER_PYTHON)" >&2; exit 2;; esac
$(STAMP): pyproject.toml
	@$(CHECK_PYTHON)
	$(if $(filter no,$(CHECK_SYSTEM)),,$(HOST_PYTHON) scripts/check_system.py --venv $(VENV))
	test -x $(PY) || $(HOST_PYTHON) -m venv $(VENV)
	@$(PY) -m pip --version >/dev/null 2>&1 || { echo "$(NO_PIP)" >&2; exit 2; }
	$(call RETRY,$(PY) -m pip install --quiet --upgrade pip)
	$(call RETRY,PIP_RESUME_RETRIES=20 $(PY) -m pip install --quiet $(PIP_INDEX) -e '.[$(EXTRA_LIST)]')
	touch $@

## Every test (what CI runs), two test files at a time (TEST_WORKERS=1: one); `make test-fast`, the edit-test loop,
## skips the ones marked slow (they train, start trainers or build simulators for seconds).
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-fast: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow"

lint: install
	$(VENV)/bin/ruff check .

## The documentation site (mkdocs.yml, docs/) → build/site/; --strict fails on a broken link, a missing image or anchor,
## or a page left out of the navigation
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

## Sequential timed run: make train DURATION=30m OUT=benchmarks/mine
train: install
	$(PY) train_timed.py --config $(call TRAIN_CONFIG,ppo_sequential.yaml) $(ENV_FLAG) $(TIMED) $(SEQ_ENVS_FLAG) \
		--duration $(call shq,$(DURATION)) --seed $(SEED) \
		--output-dir $(call shq,$(or $(OUT),benchmarks/sequential_$(TAG))) $(ARGS)

## Proof that an install works: CartPole for 10 s in each trainer → benchmarks/smoke_{sequential,parallel}/
smoke: install
	$(PY) train_timed.py --config config/cartpole.yaml --duration 10s --set run.limit_seconds=0 \
		--output-dir benchmarks/smoke_sequential --overwrite
	$(PY) train_parallel_timed.py --config config/cartpole.yaml --duration 10s --set run.limit_seconds=0 \
		--output-dir benchmarks/smoke_parallel --overwrite

## Parallel timed run, the config's workers × envs per worker unless WORKERS or ENVS is given:
## make train-parallel DURATION=30m WORKERS=4 ENVS=8 OUT=benchmarks/mine
train-parallel: install
	$(PY) train_parallel_timed.py --config $(call TRAIN_CONFIG,ppo_parallel.yaml) $(ENV_FLAG) $(TIMED) \
		--duration $(call shq,$(DURATION)) $(LAYOUT_FLAGS) --seed $(SEED) \
		--output-dir $(call shq,$(or $(OUT),benchmarks/parallel_$(TAG))) $(ARGS)

## Distributed run on this host, NPROC ranks (each a sequential collector and learner, gradients all-reduced), by the
## scaling rule: each rank runs ENVS_PER_RANK envs and the config's minibatch, the global figures NPROC × those;
## ENVS_TOTAL=N on the command line splits N envs and the minibatch over the ranks instead:
## make train-distributed NPROC=4 DURATION=30m; across hosts see docs/distributed.md
## (OMP_NUM_THREADS only quiets torchrun's notice: each rank sets its threads itself, cores / ranks on the host).
## torchrun runs as parallel_ppo.cli.torchrun: Ctrl-C ends as the ranks do (status 130), without torchrun's traceback.
## NPROC and the trainer's flags are checked first (rank 0's --print-config under torchrun's variables, nothing run):
## a bad value is one line and exit status 2, not torchrun's report of failed ranks.
DIST_FLAGS = --config $(call TRAIN_CONFIG,ppo_sequential.yaml) $(ENV_FLAG) $(TIMED) --duration $(call shq,$(DURATION)) \
             $(DIST_ENVS) \
             --seed $(SEED) --output-dir $(call shq,$(or $(OUT),benchmarks/distributed_$(TAG))) $(ARGS)
train-distributed: install
	@case "$(NPROC)" in *[!0-9]*|'') ok=;; *[1-9]*) ok=1;; *) ok=;; esac; test -n "$$ok" || \
		{ echo "make train-distributed: error: NPROC must be a whole number above 0, got '$(NPROC)'" >&2; exit 2; }
	@RANK=0 LOCAL_RANK=0 WORLD_SIZE=$(NPROC) LOCAL_WORLD_SIZE=$(NPROC) MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
		$(PY) train_timed.py --distributed --print-config $(DIST_FLAGS) > /dev/null
	OMP_NUM_THREADS=1 $(PY) -m parallel_ppo.cli.torchrun --standalone --nproc_per_node $(NPROC) train_timed.py --distributed \
		$(DIST_FLAGS)

## Compare benchmarks/sequential_$(TAG) with benchmarks/parallel_$(TAG), training whichever has no
## summary.json yet first (DURATION each, 90m or 1.5h): make compare TAG=30m DURATION=30m. The trainer refuses a
## directory holding a run killed before its summary: ARGS=--resume-if-exists continues it, ARGS=--overwrite starts
## over. A run stopped by Ctrl-C wrote its summary and is compared as it is (with a warning): to finish it first,
## make train (or train-parallel) ARGS=--resume-if-exists with the same TAG and DURATION
compare: install
	@case "$(TAG)" in ''|*[!A-Za-z0-9._:+-]*) \
		echo "make compare: error: TAG names the runs: letters, digits and . _ : + - only, got '$(TAG)'" >&2; exit 2;; esac
	test -f benchmarks/sequential_$(TAG)/summary.json || $(MAKE) --no-print-directory train OUT= \
		$(if $(LAYOUT_GIVEN),SEQ_ENVS=$$(($(WORKERS) * $(ENVS))))
	test -f benchmarks/parallel_$(TAG)/summary.json || $(MAKE) --no-print-directory train-parallel OUT=
	$(PY) compare_results.py --sequential benchmarks/sequential_$(TAG) --parallel benchmarks/parallel_$(TAG) \
		--output-dir benchmarks/comparison_$(TAG)

## The bare network's compute limit: forward and PPO-train rates, limit = 1/(1/fwd + epochs/train) SPS, for each
## precision/microbatch left auto; FLOPs per env step and matmul peaks; ARGS="--run DIR": a run's share of the peak
roofline: install
	$(PY) bench.py roofline $(ENV_FLAG) $(ARGS)

## Sequential trainer SPS as a fraction of the compute limit, measured in one sitting (16 envs × 64 steps)
bench-speed: install
	$(PY) bench.py speed-check $(ENV_FLAG) $(ARGS)

## Raw env steps/s (no learning): bare envs, sequential and parallel paths, random actions and the network
bench-envs: install
	$(PY) bench.py envs $(ENV_FLAG) --num-workers $(WORKERS) \
		--num-envs-per-worker $(ENVS) --seconds 10 $(ARGS)

## Scaling sweep (workers, and as many distributed ranks): make bench BENCH_SECONDS=20 WORKERS="1 2"
## → benchmarks/scaling/scaling.{json,md,png}
bench: install
	$(PY) bench.py scaling $(ENV_FLAG) $(BENCH_WORKERS) \
		--envs-per-worker $(ENVS_PER_WORKER) --seconds $(BENCH_SECONDS) --output-dir benchmarks/scaling $(ARGS)

## Sequential, parallel and distributed uses of the same PROCS processes on ENVS_TOTAL envs, one run each:
## make bench-layouts PROCS="2 4" BENCH_SECONDS=120 → benchmarks/layouts/layouts.{json,md,png}
bench-layouts: install
	$(PY) bench.py layouts $(ENV_FLAG) --processes "$(PROCS)" \
		--envs $(ENVS_TOTAL) --seconds $(BENCH_SECONDS) --output-dir benchmarks/layouts $(ARGS)

## The fastest layout (workers × envs × threads, or distributed ranks) for this machine → benchmarks/autotune/ppo_autotuned.yaml
autotune: install
	$(PY) bench.py autotune $(ENV_FLAG) \
		--seconds $(AUTOTUNE_SECONDS) --output-dir benchmarks/autotune $(ARGS)

## Learning benchmark: config variants × seeds (one run at a time, MINUTES each), compared across seeds:
## make bench-learning ENV=starpilot MINUTES=10 SEEDS=1,2,3 → benchmarks/learning_<env>/ (reruns keep finished runs)
bench-learning: install
	$(PY) bench.py learning $(ENV_FLAG) --minutes $(MINUTES) --seeds "$(SEEDS)" \
		$(if $(OUT),--output-dir $(call shq,$(OUT))) $(ARGS)

## Continuous control at equal steps, to set beside CleanRL's published ppo_continuous_action returns (quoted in
## docs/results/amd-epyc-2c/mujoco.md): STEPS (1M) per run, SEEDS, one run at a time per env, config/mujoco.yaml
## → benchmarks/mujoco_<env>/ with the across-seed comparison (run times: docs/results/)
MUJOCO_ENVS ?= HalfCheetah-v5 Hopper-v5
STEPS       ?= 1000000
bench-mujoco: install
	for env in $(MUJOCO_ENVS); do $(PY) bench.py learning --config config/mujoco.yaml --env $$env --minutes 600 \
		--seeds "$(SEEDS)" --variant "ppo:" --set run.total_steps=$(STEPS) --output-dir benchmarks/mujoco_$$env $(ARGS) \
		|| exit $$?; done

## Atari at equal steps, to set beside CleanRL's published ppo_atari curve (quoted in docs/results/amd-epyc-avx512-bf16-2c/atari.md):
## ATARI_STEPS (1M) per run on CleanRL's 10M-step learning-rate schedule, SEEDS, one run at a time, the parallel trainer,
## config/atari.yaml → benchmarks/atari_<env>/ with the across-seed comparison (run times: docs/results/)
ATARI_ENV   ?= BreakoutNoFrameskip-v4
ATARI_STEPS ?= 1000000
bench-atari: install
	$(PY) bench.py learning --config config/atari.yaml --env $(ATARI_ENV) --minutes 600 --seeds "$(SEEDS)" --parallel \
		--variant "ppo:" --set run.total_steps=$(ATARI_STEPS) --set training.anneal_steps=10000000 \
		--output-dir benchmarks/atari_$(ATARI_ENV) $(ARGS)

## Image-based control: sequential against parallel (2 workers) on MuJoCo from pixels (learner-bound with the config's
## fast_render, env-bound with ARGS="--set env.fast_render=false": the slow renderer), in PAIRS interleaved pairs of
## PAIR_MINUTES each → benchmarks/pixel_pairs/pairs.md
PAIRS        ?= 2
PAIR_MINUTES ?= 3
bench-pixels: install
	$(PY) scripts/mode_pairs.py --config config/mujoco_pixels.yaml --pairs $(PAIRS) --minutes $(PAIR_MINUTES) \
		--output-dir $(call shq,$(or $(OUT),benchmarks/pixel_pairs)) -- $(ARGS)

## The robot arm (robosuite Lift, the extra `robot`): what a camera frame costs against the physics (fast and default
## render settings), then sequential against parallel (2 workers) from state and from the wrist camera, PAIRS
## interleaved pairs of PAIR_MINUTES each → benchmarks/robot/{render_cost.json,state/pairs.md,camera/pairs.md}
bench-robot: install
	@for config in robosuite_lift robosuite_lift_camera; do $(PY) scripts/mode_pairs.py --check \
		--config config/$$config.yaml --pairs $(PAIRS) --minutes $(PAIR_MINUTES) \
		--output-dir $(call shq,$(or $(OUT),benchmarks/robot)) -- $(ARGS) || exit $$?; done
	$(PY) scripts/render_cost.py --env robosuite/Lift --camera robot0_eye_in_hand --steps 100 \
		--output $(call shq,$(or $(OUT),benchmarks/robot)/render_cost.json)
	$(PY) scripts/mode_pairs.py --config config/robosuite_lift.yaml --pairs $(PAIRS) --minutes $(PAIR_MINUTES) \
		--output-dir $(call shq,$(or $(OUT),benchmarks/robot)/state) -- $(ARGS)
	$(PY) scripts/mode_pairs.py --config config/robosuite_lift_camera.yaml --pairs $(PAIRS) --minutes $(PAIR_MINUTES) \
		--output-dir $(call shq,$(or $(OUT),benchmarks/robot)/camera) -- $(ARGS)

## What a privileged critic (also reading object-state) and the frame shift cost in speed: config/robosuite_lift_camera.yaml
## with both against itself without them (the critic reading the actor's keys, no shift), PAIRS interleaved pairs of
## PAIR_MINUTES each → benchmarks/camera_recipe_speed/pairs.{md,json}
camera-recipe-speed: install
	$(PY) scripts/setting_pairs.py --config config/robosuite_lift_camera.yaml --pairs $(PAIRS) \
		--minutes $(PAIR_MINUTES) --output-dir $(call shq,$(or $(OUT),benchmarks/camera_recipe_speed)) \
		--b "both: --set model.critic_keys=[robot0_eye_in_hand_image,robot0_proprio-state,object-state] $(ARGS)" \
		--a "neither: --set training.augment_shift=0 --set model.critic_keys=[robot0_eye_in_hand_image,robot0_proprio-state] $(ARGS)"

## robosuite Lift from state: the sequential trainer against 2 overlapped workers (parallel.overlap), in PAIRS
## interleaved pairs of PAIR_MINUTES → benchmarks/overlap_speed/pairs.{md,json}
overlap-speed: install
	$(PY) scripts/setting_pairs.py --config config/robosuite_lift.yaml --pairs $(PAIRS) --minutes $(PAIR_MINUTES) \
		--output-dir $(call shq,$(or $(OUT),benchmarks/overlap_speed)) --sequential-a --a "sequential: $(ARGS)" \
		--b "overlapped: --set parallel.overlap=true $(ARGS)"

## The many-core study: threads, copies (the machine's yardstick), workers (synchronous and overlapped), distributed
## ranks and (with CUDA) a GPU learner at 1, 2, 4, ... usable
## logical CPUs, STUDY_SECONDS per run, one at a time → docs/results/<cpu>[-avx512][-bf16][-family<F>-model<M>]-<cores>c[-<gpu>]/study.{md,json,png}
## (study-<config>.* or study-<env>.* for another task: ENV=robosuite/Lift; -<sets> for ARGS="--set K=V";
## -mesa, -lp<N> where drawn otherwise).
## ARGS="--families workers --processes '8 16'" for a part.
study: install
	$(PY) bench.py study $(ENV_FLAG) --seconds $(STUDY_SECONDS) $(ARGS)

## The study simulated on this machine's cores: robosuite Lift from state with its physics a sleep of 7 ms a step
## (sim/Sleep, config/sim_lift.yaml), threads up to the cores, and synchronous workers against overlapped ones at 1, 2,
## 4, 8 and 16, so 16 workers fit 2 cores → docs/results/<machine>/study-sim_lift.{md,json,png}, marked simulated.
study-sim: install
	$(PY) bench.py study --config config/sim_lift.yaml --env sim/Sleep --families threads,workers,overlap \
		--processes "1 2 4 8 16" --seconds $(SIM_SECONDS) $(ARGS)

## A trained policy on held-out test levels: make eval CHECKPOINT=benchmarks/parallel_1h ARGS="--episodes 50"
eval: install
	$(PY) -m parallel_ppo eval --checkpoint $(call shq,$(CHECKPOINT)) $(ARGS)

## A video of a trained policy playing: make demo CHECKPOINT=benchmarks/parallel_1h → <run>/demo.mp4
demo: install
	$(PY) -m parallel_ppo demo --checkpoint $(call shq,$(CHECKPOINT)) $(ARGS)

## TensorBoard for every run under benchmarks/, on this machine only; TB_HOST=0.0.0.0 serves it to the network.
tensorboard: install
	$(VENV)/bin/tensorboard --logdir benchmarks --host $(TB_HOST)

## Removes run outputs under benchmarks/ and caches (not the virtual environment; `make distclean` does).
clean:
	[ ! -d benchmarks ] || find benchmarks -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
	rm -rf .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

## Also removes the virtual environment $(VENV) (only where it holds a pyvenv.cfg: a virtual environment).
distclean: clean
	[ ! -f $(VENV)/pyvenv.cfg ] || rm -rf $(VENV)

# parallel_ppo: every target creates .venv and installs the project first when needed.
PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
DURATION ?= 1.0
TAG      ?= 1h
SEED     ?= 1
ENV      ?= starpilot
ARGS     ?=

.PHONY: install test lint train tensorboard clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check .

## Sequential timed run: make train DURATION=0.5 OUT=benchmarks/mine
train: install
	$(PY) train_timed.py --config config/ppo_sequential.yaml --env $(ENV) --duration $(DURATION) \
		--seed $(SEED) --output-dir $(or $(OUT),benchmarks/sequential_$(TAG)) $(ARGS)

tensorboard: install
	$(VENV)/bin/tensorboard --logdir benchmarks --bind_all

## Removes run outputs under benchmarks/ and caches (not the virtual environment; `make distclean` does).
clean:
	find benchmarks -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
	rm -rf .pytest_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

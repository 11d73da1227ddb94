# Two entry points that work on a fresh clone with only python3 (and make):
#   make demo   set up .venv, then run the built-in demo end to end
#   make test   set up .venv, then run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= runs/demo
PYTEST_ARGS ?=
# Test processes (pytest-xdist): compiling, a large share of the suite, runs on one core, so
# two processes keep a 2-core machine busy; 0 runs the suite in this process alone.
TEST_WORKERS ?= 2

# pip byte-compiles every module it installs, 20,000 of them, most never imported here
# (TensorFlow's, torch's, transformers'): it installs with --no-compile, and Python compiles
# a module when it is first imported, into the venv, also where PYTHONDONTWRITEBYTECODE is set.
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast lint bench setup setup-test

# Two stamps: the demo installs the package alone, without TensorFlow (the extra `wmt`, for
# config.dataset='tfds' only); the tests add the extra `test`, which pulls `wmt` in.
setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

# A python3 older than requires-python fails here, in one line, before a .venv is made.
define make_venv
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo \
	  "t2t_jax needs Python >= 3.11 (pyproject.toml), $(PYTHON) is $$($(PYTHON) -V 2>&1):" \
	  "make $(or $(MAKECMDGOALS),setup) PYTHON=python3.11 (or newer)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
endef

$(VENV)/.installed: pyproject.toml
	$(make_venv)
	$(PY) -m pip install --quiet --no-compile -e .
	touch $@

# The package and the test extras in one pip run: a second run would resolve and build the
# package again. It is then set up for the demo too.
$(VENV)/.installed-test: pyproject.toml
	$(make_venv)
	$(PY) -m pip install --quiet --no-compile -e '.[test]'
	touch $(VENV)/.installed $@

DEMO = $(PY) -m t2t_jax.main --config=experiments/demo.py --workdir=$(WORKDIR)

# Train (resumes if interrupted), average the last checkpoints, translate five held-out
# sentences, score the whole held-out test split, then draw the run's curves.
demo: setup
	$(DEMO) --mode=train
	$(DEMO) --mode=average
	@echo '--- five held-out test sentences and their translations ---'
	@head -n 5 $(WORKDIR)/demo_corpus/test.en > $(WORKDIR)/examples.en
	$(DEMO) --mode=translate --input=$(WORKDIR)/examples.en --output=$(WORKDIR)/examples.de
	@paste -d '\n' $(WORKDIR)/examples.en $(WORKDIR)/examples.de | sed 'n;s/^/  -> /'
	$(DEMO) --mode=eval
	$(DEMO) --mode=plot

# Style and likely bugs (pyproject.toml's [tool.ruff]) and the package's layers
# ([tool.importlinter]); `make test` runs it first, so a lint error fails the suite.
lint: setup-test
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache

test: setup-test lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The edit loop's tier: everything but the tests marked slow or e2e (those that start processes
# of their own); CONTRIBUTING.md says what each tier holds.
test-fast: setup-test lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m 'not slow and not e2e' $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/decode.py
	$(PY) benchmarks/input_pipeline.py
	$(PY) benchmarks/checkpoint.py
	$(PY) benchmarks/data_memory.py encode
	$(PY) benchmarks/data_memory.py iterator
	$(PY) benchmarks/compilation.py
	$(PY) benchmarks/grad_accum_memory.py

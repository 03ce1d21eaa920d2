# The two commands: `make demo` runs the main job on the embedded model; `make test` runs the tests.
# Both set up .venv first (idempotent, about a second when nothing changed).
PY := .venv/bin/python

.PHONY: setup demo test check lint bench mutants
setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) -m rlvr.demo

# two workers (pytest-xdist): one runs the modules that start servers, in order, on one set of
# shared servers; the other takes the modules that start none (tests/conftest.py)
XDIST := -n 2

test: setup
	@$(PY) -m pytest $(XDIST)

# the inner loop (docs/development.md): lint, then the tests that start no server and are not slow
check: lint
	@$(PY) -m pytest $(XDIST) -q -m "not integration and not slow"

# the loss path's wrong formulas (tests/unit/trainer/mutants.py) against its whole test files
mutants: setup
	@PYTHONPATH=tests $(PY) -m unit.trainer.mutants

lint: setup
	@.venv/bin/ruff check . && .venv/bin/ruff format --check .

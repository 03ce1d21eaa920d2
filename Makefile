# The two commands: `make demo` runs the main job on the embedded model; `make test` runs the tests.
# Both set up .venv first (idempotent, about a second when nothing changed).
PY := .venv/bin/python

.PHONY: setup demo test lint bench mutants
setup:
	@bash scripts/setup.sh

demo: setup
	@$(PY) -m rlvr.demo

test: setup
	@$(PY) -m pytest

# the loss path's wrong formulas (tests/unit/trainer/mutants.py) against its whole test files
mutants: setup
	@PYTHONPATH=tests $(PY) -m unit.trainer.mutants

lint: setup
	@.venv/bin/ruff check . && .venv/bin/ruff format --check .

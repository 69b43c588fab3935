# One command each: `make test` and `make demo` create .venv when it is missing, install
# everything the project needs into it, then run.  torch is pinned here (a local CPU wheel on
# these machines); pyproject keeps a looser range so the package installs elsewhere too.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
TORCH   := torch==2.13.0
export NO_MKDOCS_2_WARNING := 1  # mkdocs-material prints an end-of-life banner otherwise

.PHONY: install test test-long test-explore lint docs demo bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e '.[test,docs,ray,hf,rg]'
	touch $(STAMP)

install: $(STAMP)

# ruff, the layer contract (pyproject's [tool.importlinter]) and the type checker
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts examples
	$(BIN)/ruff format --check src tests benchmarks scripts examples
	$(BIN)/lint-imports
	$(BIN)/mypy

# the site's tables are filled from benchmarks/results/*.json, then built with --strict
docs: $(STAMP)
	$(BIN)/python scripts/doc_tables.py
	$(BIN)/mkdocs build --strict

# two tiers (tests/conftest.py): `make test` is CI's - unit, property, distributed-correctness
# and smoke tests, nothing timed; `make test-long` holds what takes minutes or reads a clock
# (learning to a target, the full fault matrix, accepted-size budgets, solver proofs)
test: lint
	$(BIN)/mkdocs build --strict --quiet --site-dir "$$(mktemp -d)"
	$(BIN)/python -m pytest -m "not long" -n 2 --dist loadgroup --durations=25

test-long: $(STAMP)
	$(BIN)/python -m pytest -m long --durations=25

# the property tests with fresh random examples, 500 each where a test does not set its own
test-explore: $(STAMP)
	HYPOTHESIS_PROFILE=explore $(BIN)/python -m pytest -m "property and not long" --durations=10

demo: $(STAMP)
	$(BIN)/nobubble demo
	$(BIN)/python examples/train_gpt.py --ranks 2 --schedule zb-2p --steps 20
	$(BIN)/python examples/train_moe.py --ranks 2 --steps 20
	$(BIN)/python examples/train_pp_ep.py --steps 20
	$(BIN)/python examples/rl_own_model.py --steps 200

bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	for f in benchmarks/[!_]*.py; do $(BIN)/python -m benchmarks.$$(basename $$f .py) || exit 1; done

clean:
	rm -rf $(VENV) nobubble-out site .pytest_cache .ruff_cache .mypy_cache

# trainplan: `make demo` and `make test` work on a fresh machine (they create .venv first).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test processes at once: most process tests wait on their workers more than they compute.
TEST_PROCESSES ?= 3

.PHONY: demo test lint typecheck layers unit docs bench clean mutate mutate-score mutate-sample

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: this machine holds the 2.13.0 CPU build locally; a bare `torch` would pull a CUDA build.
	# trainplan itself needs no torch; its `torch` extra (launch, metrics, runtime) and the tests do.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[torch,dev,lightning,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/trainplan
	@echo
	$(BIN)/trainplan plan --assume cuda=8 --strategy ddp --devices 0,2,5 --precision bf16-mixed

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks typings tools
	$(BIN)/ruff format --check src tests benchmarks typings tools

typecheck: $(STAMP)
	$(BIN)/mypy --strict src tests typings benchmarks tools
	$(BIN)/mypy --strict tests/typing/check_public_types.py

layers: $(STAMP)
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile

# The documentation site, into site/ (tests/unit/test_docs.py builds it the same way, warnings as errors).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: lint typecheck layers unit

$(VENV)/.bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[torch,dev,bench]"
	touch $(VENV)/.bench

bench: $(VENV)/.bench
	$(BIN)/python -m benchmarks

# Mutation testing of resolve/ and rules/ with the fast tests (tests/mutation.py): hours on two cores, so not part of
# `make test`; run it in shards, e.g. `make mutate MUTANTS="resolve/steps rules/coherence"`. `make mutate-score`
# prints the score of what has run (mutmut keeps its results in mutants/).
MUTANTS ?=
mutate: $(STAMP)
	nice -n 15 $(BIN)/python -m tests.mutation run $(MUTANTS)

mutate-score: $(STAMP)
	$(BIN)/python -m tests.mutation score $(MUTANTS)

# A seeded random sample of N of all the mutants of resolve/ and rules/: its score with a Wilson 95% interval, the
# interval the whole score lies in (the same N, SEED and source draw the same mutants).
N ?= 150
SEED ?= 1
mutate-sample: $(STAMP)
	nice -n 19 $(BIN)/python -m tests.mutation sample $(N) --seed $(SEED)

clean:
	rm -rf mutants $(VENV) site .mypy_cache .pytest_cache .ruff_cache .hypothesis

# The two set-up commands are `make run` and `make test`; each creates .venv and installs
# what it needs, so they work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench schema scenarios clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,ops]'
	touch $(STAMP)

# The product on one machine: kliqued on estate/ (watched) with run/kliqued.duckdb, a local
# worker for the bare-metal pool, a token per example user in run/tokens/; Ctrl-C stops it.
run: $(STAMP)
	@$(BIN)/kliqued validate estate
	@$(BIN)/kliqued dev --estate estate --dir run

test: $(STAMP)
	$(BIN)/python -m pytest

# Figures for docs/benchmarks.md (not a test: nothing here fails the build).
bench: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m tests.bench

# The conformance scenarios (../shared) and the project's own, on the real engine.
scenarios: $(STAMP)
	$(BIN)/kliqued simulate $(wildcard ../shared/scenarios/*.yaml) tests/scenarios/*.yaml

schema: $(STAMP)
	$(BIN)/kliqued schema -o schemas/estate.schema.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info

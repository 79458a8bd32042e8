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
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/kliqued validate estate
	$(BIN)/kliqued compile estate --summary

test: $(STAMP)
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m tests.bench

schema: $(STAMP)
	$(BIN)/kliqued schema -o schemas/estate.schema.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info

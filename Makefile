# The two set-up commands are `make run` and `make test`; each creates .venv and installs
# what it needs, so they work on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

.PHONY: run check test system-packages bench schema scenarios screenshots clean

# The suite in parallel (pytest-xdist): most tests wait on subprocesses and sockets, so more
# workers than the 2 cores pay (docs/decisions.md, issue 27 part 5; 4 since issue 32). `make test WORKERS=1`
# runs it in one process.
WORKERS ?= 4
# What `make check` leaves to `make test` (the markers: CONTRIBUTING.md).
QUICK := not (slow or daemon or slurm or podman or postgres or browser or oidc)
# pytest's assertion rewriting caches its result as bytecode: with PYTHONDONTWRITEBYTECODE
# set, every run (and every xdist worker) rewrites ~600 modules again (25-30 s of collection).
export PYTHONDONTWRITEBYTECODE :=

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The product alone (`make run`): no test or Ansible packages.
$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $(RUN_STAMP)

# The product with what the tests use (`make test`, `make bench`).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,ops]'
	touch $(STAMP)

# The product on one machine: kliqued on estate/ (watched) with run/kliqued.duckdb, a local
# worker for the bare-metal pool, a token per example user in run/tokens/; Ctrl-C stops it.
run: $(RUN_STAMP)
	@$(BIN)/kliqued validate estate
	@$(BIN)/kliqued dev --estate estate --dir run

# Slurm, Podman and the rest from Debian's packages when root with apt-get (else it says
# which tests will skip), the import contracts (pyproject.toml), then every test.
test: $(STAMP) system-packages
	@tests/setup/oidc-provider.sh $(VENV)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy
	$(BIN)/lint-imports
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -n $(WORKERS)

# The quick loop (under 2 minutes): lint, types, the import contracts, and the tests that
# start no daemon, cluster, container, database or browser, on Hypothesis's `dev` profile.
# The lint's rules: [tool.ruff.lint] in pyproject.toml.
check: $(STAMP)
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy
	$(BIN)/lint-imports
	HYPOTHESIS_PROFILE=dev $(BIN)/python -m pytest -q -n $(WORKERS) -m "$(QUICK)"

system-packages:
	@tests/setup/system-packages.sh

# Figures for docs/benchmarks.md (not a test: nothing here fails the build).
bench: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m tests.bench

# The conformance scenarios (../shared) and the project's own, on the real engine.
scenarios: $(RUN_STAMP)
	$(BIN)/kliqued simulate $(wildcard ../shared/scenarios/*.yaml ../shared/scenarios/organisation/*.yaml ../shared/scenarios/lending/*.yaml) tests/scenarios/*.yaml

# The dashboard's screenshots in docs/img (docs/dashboards.md), taken by its browser test.
screenshots: $(STAMP)
	KLIQUE_SCREENSHOTS=$(CURDIR)/docs/img $(BIN)/python -m pytest tests/web/test_browser.py tests/web/test_dashboard_browser.py -q

schema: $(RUN_STAMP)
	$(BIN)/kliqued schema -o schemas/estate.schema.json
	$(BIN)/kliqued schema --pipeline -o schemas/pipeline.schema.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info

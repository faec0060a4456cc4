# CityCube: every target creates or reuses .venv and installs what it needs first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export CITYCUBE_DATA ?= $(CURDIR)/data
export CITYCUBE_RELEASE ?= sample-0.1.0

CITIES ?= default
YEARS ?= default
WORKERS ?= 2
TEST_WORKERS ?= 2
DEV_PORT ?= 3000

.PHONY: install pgbouncer run agents test dev lint bench docs fresh-runs represent clean

install: $(STAMP)

# dagster-postgres (PostgreSQL instance storage) has no release for dagster 1.13.28: its 0.29.27
# asks for dagster 1.13.27 exactly, so it is added without its requirements (constraints.txt
# pins it); its driver, psycopg2-binary, is a dependency in pyproject.toml.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt dagster-postgres
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

## Build the default sample release as a Dagster asset backfill and print a DuckDB summary.
run: install
	$(BIN)/python -m pipelines.cli build --cities '$(CITIES)' --years '$(YEARS)' --workers '$(WORKERS)'

## Build the smallest scope whose forecasting targets all have cases (Boston, 2010-2024) and that
## has cases of the EV charging, school capacity (London) and food access tasks, as its own
## release; run the scripted agents over MCP (10 forecasting cases per target, every planning
## case) and print their scores.
AGENTS_RELEASE ?= agents-sample-0.1.0
AGENTS_CITIES ?= Boston,London
agents: export CITYCUBE_PLANNING_AGENTS = 1
agents: install
	$(BIN)/python -m pipelines.cli --release '$(AGENTS_RELEASE)' build --cities '$(AGENTS_CITIES)' --years 2010-2024 --workers '$(WORKERS)'
	$(BIN)/python -m pipelines.cli --release '$(AGENTS_RELEASE)' agents show

## Evaluate the built-in embeddings on the built release (CityRep protocol; docs/representation.md).
represent: install
	$(BIN)/python -m pipelines.cli represent

## Run the test suite, spread over TEST_WORKERS processes by file, the most builds first
## (pytest-xdist; TEST_WORKERS=0 runs it in one).
test: install pgbouncer
	$(BIN)/python -m pytest -q -n '$(TEST_WORKERS)' --dist loadfile --no-loadscope-reorder

# PgBouncer in front of PostgreSQL (docs/operations.md, "Instance storage"): Debian's package,
# installed where apt-get can run as root; elsewhere its test is skipped and says why.
pgbouncer:
	@PATH="$$PATH:/usr/sbin" command -v pgbouncer >/dev/null 2>&1 || { \
	  [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  { apt-get install -y -qq pgbouncer >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq pgbouncer >/dev/null 2>&1; }; }; \
	} || echo "pgbouncer is not installed (Debian's pgbouncer package): its test is skipped"

## Serve the Dagster UI and daemon offline (http://127.0.0.1:3000); runs use WORKERS dask workers.
## SIGTERM or Ctrl-C stops all of it (pipelines/dev.py); the command has no shell in front of it.
dev: export CITYCUBE_WORKERS = $(WORKERS)
dev: install
	$(BIN)/python -m pipelines.cli dagster-home
	$(BIN)/python -m pipelines.dev --host 127.0.0.1 --port $(DEV_PORT)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python -m benchmarks.run

## Write docs/performance.md and the querying guide's figures from benchmarks/results/*.json.
docs: install
	$(BIN)/python -m benchmarks.render_docs

## Fresh clone, then `make run` TIMES times, each on a new empty DAGSTER_HOME and data root.
TIMES ?= 10
fresh-runs: install
	$(BIN)/python -m benchmarks.fresh_runs --times '$(TIMES)' --workers '$(WORKERS)'

clean:
	rm -rf data .dagster_home

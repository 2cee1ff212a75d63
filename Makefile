# iox-batch: `make demo` runs the main job end to end, `make test` runs the whole suite. Both set up what they
# need: the virtualenv with pinned packages, the project's local Postgres, the catalog schema.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYSPARK_PIN := $(shell grep -E '^pyspark==' requirements.lock)
PYTEST_ARGS ?=

.PHONY: all venv nginx test test-all test-fast soak faults demo typecheck bench bench-compaction bench-late-batch bench-tsbs bench-objectstore lock clean stop-postgres airflow-setup

all: test

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip wheel setuptools
	$(BIN)/pip install -q -r requirements.lock
	@# The Spark provider pulls in pyspark-client, which overwrites pyspark's Python files: put ours back.
	$(BIN)/pip install -q --force-reinstall --no-deps "$(PYSPARK_PIN)"
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

# Two runs, each on two workers (each worker with its own SparkSession and catalog database): everything but
# Airflow, then the Airflow tests, where each worker has its own AIRFLOW_HOME, metadata DB and dag.test()
# process. The first run deals out tests one by one, except every test on the Spark Connect runner, which go
# together to one worker, first, so one Connect server (a JVM of about 1 GB) starts in all (tests/conftest.py's
# scheduler, tests/connect_support.py). The Airflow run deals out whole files (a module's
# scheduler, api-server or Postgres cluster is started once, on one worker) in file order, so the longest, the
# backfill, starts first instead of holding up the end.
# The slowest tests are listed at the end of each run, so CI shows where its time budget goes.
# The Spark Connect TLS proxy's test (tests/spark_jobs/test_connect_auth.py) runs Debian's nginx, as
# docker-compose.yml's proxy does: installed when missing (as root; otherwise that test is skipped, and says so).
nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { test "$$(id -u)" = 0 \
	  && { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx >/dev/null 2>&1 \
	       || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx; }; }; } \
	  || echo "nginx is not installed (apt-get install nginx as root): the TLS proxy test will be skipped"

test: venv nginx
	$(BIN)/iox-batch catalog migrate
	$(BIN)/python -m pytest -n 2 --ignore=tests/airflow --durations=40 $(PYTEST_ARGS)
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder tests/airflow --durations=40 $(PYTEST_ARGS)

# The same, with every case of the suites CI samples (IOX_TEST_ALL=1: the object-store legs, the Connect
# supervisor's restarts; README: Tests): before a release, not on every change.
test-all:
	IOX_TEST_ALL=1 $(MAKE) test

# Everything that needs neither Spark nor Airflow (no JVM, no scheduler: planner, catalog, ingest, maintenance
# without Spark, runs, security, type and layer checks): the quick loop while changing code.
test-fast: venv
	$(BIN)/iox-batch catalog migrate
	$(BIN)/python -m pytest -n 2 -m "not spark and not airflow and not slow" --ignore=tests/airflow $(PYTEST_ARGS)

# The soak / race test at full length (make test runs it for IOX_SOAK_SECONDS=30), and the fault-injection suite
# (tests/faults and the Airflow fault tests) with ten kill points per operation (make test samples a few: README).
IOX_SOAK_SECONDS ?= 60
soak: venv
	IOX_SOAK_SECONDS=$(IOX_SOAK_SECONDS) $(BIN)/python -m pytest -q -s tests/test_soak.py $(PYTEST_ARGS)

IOX_FAULT_POINTS ?= 10
faults: venv
	IOX_FAULT_POINTS=$(IOX_FAULT_POINTS) $(BIN)/python -m pytest -q -s tests/faults $(PYTEST_ARGS)
	IOX_FAULT_POINTS=$(IOX_FAULT_POINTS) $(BIN)/python -m pytest -q -s tests/airflow/test_airflow_faults.py $(PYTEST_ARGS)

demo: venv
	bash scripts/demo.sh

typecheck: venv
	$(BIN)/python -m mypy

bench: venv
	$(BIN)/python benchmarks/bench_catalog.py
	$(BIN)/python benchmarks/bench_planner.py
	$(BIN)/python benchmarks/bench_spark.py
	$(BIN)/python benchmarks/bench_compact.py
	$(BIN)/python benchmarks/bench_lineprotocol.py
	$(BIN)/python benchmarks/bench_ingest.py
	$(BIN)/python benchmarks/bench_wide_overlap.py
	$(BIN)/python benchmarks/bench_wide_designs.py
	$(BIN)/python benchmarks/bench_staleness.py
	$(BIN)/python benchmarks/bench_merge.py
	$(BIN)/python benchmarks/bench_persist.py
	$(BIN)/python benchmarks/bench_late_batch.py
	$(BIN)/python benchmarks/bench_tsbs.py
	$(BIN)/python benchmarks/bench_read_once.py
	$(BIN)/python benchmarks/bench_write_shapes.py
	$(BIN)/python benchmarks/bench_objectstore.py

# Compaction and persist speed (issue 25's figures, see benchmarks/README.md): the merge kernel against DuckDB, Polars
# (when installed) and Arrow on one core; persist rows/s; compaction rows/s against the query-time merge on Spark; a
# compaction task reading a file shared by its slices once against once per slice. BENCH_HOSTS sizes all four
# (default: each script's own).
bench-compaction: venv
	$(BIN)/python benchmarks/bench_merge.py $(if $(BENCH_HOSTS),--hosts $(BENCH_HOSTS))
	$(BIN)/python benchmarks/bench_persist.py $(if $(BENCH_HOSTS),--hosts $(BENCH_HOSTS))
	$(BIN)/python benchmarks/bench_compact.py $(if $(BENCH_HOSTS),--hosts $(BENCH_HOSTS))
	$(BIN)/python benchmarks/bench_read_once.py $(if $(BENCH_HOSTS),--hosts $(BENCH_HOSTS))

# A late batch on the 8.6 M-row wide shape (1,000 hosts; BENCH_HOSTS=20 is a smoke test): seconds from its landing
# until queries are back within 1.05x a plain scan, with persist --compact's functions.
bench-late-batch: venv
	$(BIN)/python benchmarks/bench_late_batch.py $(if $(BENCH_HOSTS),--hosts $(BENCH_HOSTS))

# The TSBS cpu-only query types, iox-batch against a plain Spark scan of the same files: in one session and as whole
# processes (in-process, over Spark Connect, the plain script). BENCH_HOSTS sizes it (default 200 hosts x 24 h).
bench-tsbs: venv
	$(BIN)/python benchmarks/bench_tsbs.py $(if $(BENCH_HOSTS),--hosts $(BENCH_HOSTS))

# The executor's object-store read path (benchmarks/README.md): (a) its scan against Spark's own reader on local
# disk, (b) a query over an s3:// warehouse (a local S3 API server) against a local one, (c) the local warehouse's
# query before and after the object-store reader came in.
bench-objectstore: venv
	$(BIN)/python benchmarks/bench_objectstore.py

# Regenerate the lock from requirements.in (needs the registry).
lock:
	rm -rf .lockenv && $(PYTHON) -m venv .lockenv && .lockenv/bin/pip install -q -r requirements.in
	(echo "# Generated by 'make lock' from requirements.in: the whole resolved set, pinned."; \
	 .lockenv/bin/pip freeze --exclude-editable) > requirements.lock
	rm -rf .lockenv

airflow-setup: venv
	source scripts/env.sh && $(BIN)/python dags/iox_airflow/setup_airflow.py

stop-postgres: venv
	$(BIN)/python -c "from iox_planner.catalog import localpg; localpg.stop()"

clean:
	rm -rf $(VENV) .iox warehouse .pytest_cache

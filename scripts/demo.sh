#!/usr/bin/env bash
# `make demo`: the h2o example of InfluxDB 3's query plan documentation, end to end. Rerunnable: it starts from
# an empty `demo` database each time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "catalog (starts the project's local Postgres if needed)"
iox-batch catalog migrate
if iox-batch show --db demo >/dev/null 2>&1; then
    iox-batch drop --db demo --yes
fi

step "load examples/h2o.yaml: chunk C4 persisted as Parquet, chunk C5 still in the ingester"
iox-batch load examples/h2o.yaml --db demo

step "catalog state"
iox-batch show --db demo

QUERY="SELECT state, city, min_temp, max_temp, area, time FROM h2o ORDER BY state, city, time"
step "EXPLAIN $QUERY"
iox-batch explain --db demo "$QUERY"

step "the project's Spark Connect server (warm Spark for every query; iox-batch spark stop ends it)"
iox-batch spark start

step "the deduplicated rows (over Spark Connect): C5's SJ@600 replaces C4's, every other point stays"
iox-batch query --db demo "$QUERY"

step "the same query as a triggered Airflow run, its Spark job on the same server: airflow dags test iox_query"
python dags/iox_airflow/setup_airflow.py
OUT="$PWD/output/demo_h2o.jsonl"
mkdir -p output
# The demo owns this file. A run replaces only what the catalog records as published; after a catalog reset
# (.iox removed) that record is gone, so the demo clears its own output rather than fail on it.
rm -f "$OUT"
CONF=$(python -c 'import json, sys; print(json.dumps({"db": "demo", "sql": sys.argv[1], "output": sys.argv[2], "format": "jsonl"}))' "$QUERY" "$OUT")
if ! airflow dags test iox_query -c "$CONF" > .iox/airflow/demo-dags-test.log 2>&1; then
    tail -40 .iox/airflow/demo-dags-test.log
    echo "iox_query failed; its whole log is in .iox/airflow/demo-dags-test.log" >&2
    exit 1
fi
cat "$OUT"
